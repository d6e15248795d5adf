"""A sweep's count, without ranks: which files it depends on and when they changed, when a
case's run contradicts it, and how the summary reads cases placed by what they are."""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest

from harness import faults
from harness.controller.outcome import Outcome
from harness.errors import FaultNotFired, WorldHang
from harness.faults import Collective, FaultFired
from harness.plugin import sweep_key
from harness.plugin.sweep_recount import contradiction
from harness.plugin.sweep_summary import Case, range_lines, summary

# ------------------------------------------------------------------------- the key


def test_the_projects_files_are_neither_the_standard_librarys_nor_installed(
    tmp_path: Path,
) -> None:
    library = tmp_path / "src" / "mylib" / "core.py"
    installed = tmp_path / ".venv" / "lib" / "site-packages" / "numpy" / "core.py"
    debian = tmp_path / "dist-packages" / "x.py"
    for path in (library, installed, debian):
        path.parent.mkdir(parents=True)
        path.write_text("")
    stdlib = os.path.join(sysconfig.get_paths()["stdlib"], "json", "__init__.py")
    given = [str(library), str(installed), str(debian), stdlib, "<frozen abc>", str(library)]
    given.append(str(tmp_path / "gone.py"))  # imported, then deleted
    assert sweep_key.project_files(given) == [str(library)]
    assert sweep_key.project_files([sys.modules["json"].__file__ or ""]) == []


def test_a_file_is_unchanged_until_its_content_changes(tmp_path: Path) -> None:
    library = tmp_path / "mylib.py"
    library.write_text("STEPS = 2\n")
    notes = sweep_key.noted([str(library)])
    assert sweep_key.unchanged(notes) == (True, notes)
    # Touched: its time differs, its content does not; the notes take its new time, so
    # that the next check reads nothing.
    stat = library.stat()
    os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    same, refreshed = sweep_key.unchanged(notes)
    assert same
    assert refreshed[str(library)][1] == stat.st_mtime_ns + 10**9
    assert refreshed[str(library)][2] == notes[str(library)][2]
    library.write_text("STEPS = 3\n")  # the same size: its content tells
    assert sweep_key.unchanged(refreshed)[0] is False
    library.unlink()
    assert sweep_key.unchanged(notes)[0] is False


# ------------------------------------------------------------------------- contradictions

COUNTED = [["all_reduce", "train.py:12", ""], ["broadcast", "train.py:14", ""]]
KILL = faults.kill(1, 2)


def _fired(fault: faults.Fault, number: int, op: str, site: str) -> FaultFired:
    return FaultFired(fault, "killed", 0.0, number, op, site)


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(values=[None, None], fired=(_fired(KILL, 2, "broadcast", "train.py:14"),)),
        Outcome(error=WorldHang("x"), fired=(_fired(KILL, 2, "broadcast", "train.py:14"),)),
        Outcome(values=[None, None], skip=object()),  # type: ignore[arg-type]
    ],
)
def test_a_run_whose_fault_fired_where_counted_agrees(outcome: Outcome) -> None:
    assert contradiction(KILL, COUNTED, outcome) == ""


def test_a_run_whose_fault_never_fired_contradicts() -> None:
    ended = Outcome(error=FaultNotFired("fault kill(rank=1, at=2) never fired: ..."))
    assert contradiction(KILL, COUNTED, ended) == (
        "its fault never fired: the run ended in FaultNotFired before it did, though the "
        "count has 2 collectives of rank 1 on the default group"
    )
    # Another fault of the run fired, not the case's.
    other = Outcome(values=[None, None], fired=(_fired(faults.kill(0, 2), 2, "x", ""),))
    assert contradiction(KILL, COUNTED[:1], other) == (
        "its fault never fired: the run ended before it did, though the count has 1 "
        "collective of rank 1 on the default group"
    )


def test_a_run_whose_fault_fired_elsewhere_contradicts() -> None:
    moved = Outcome(values=[None, None], fired=(_fired(KILL, 2, "all_reduce", "train.py:20"),))
    assert contradiction(KILL, COUNTED, moved) == (
        "collective #2 was all_reduce at train.py:20, counted as broadcast at train.py:14"
    )
    # Past the kept sequence, the count knows no op: nothing to hold the run against.
    unknown = [*COUNTED[:1], ["?", "", ""]]
    assert contradiction(KILL, unknown, moved) == ""


# ------------------------------------------------------------------------- the summary


def test_cases_placed_by_what_they_are_read_one_by_one_with_their_collective() -> None:
    first = Case("t.py::t", "kill", 1, 5, "all_reduce at x.py:3", "passed", "pytest a")
    unfired = Case("t.py::t", "kill", 1, 0, "", "failed (FaultNotFired: ...)", "pytest b")
    placed = [
        replace(first, placed="the 1st all_reduce"),
        replace(unfired, placed="the 2nd all_reduce"),
    ]
    assert range_lines(placed) == [
        "kill at the 2nd all_reduce on rank 1: failed (FaultNotFired: ...)",
        "kill at the 1st all_reduce on rank 1: passed",
    ]
    assert summary(placed)[-1] == "  failed at rank 1, the 2nd all_reduce: pytest b"
    assert placed[0].point == "rank 1, the 1st all_reduce (#5: all_reduce at x.py:3)"
    assert Case.loads(placed[0].dumps()) == placed[0]
    # A case noted before cases could be placed so reads as before.
    assert (
        Case.loads(
            '{"test": "t", "fault": "kill", "rank": 0, "at": 1, "site": "", "verdict": "passed", '
            '"repro": "r"}'
        ).placed
        == ""
    )


def test_a_numbered_case_names_its_collectives_origin() -> None:
    case = Case("t.py::t", "kill", 1, 3, "all_reduce in backward (DDP) at x.py:9", "passed", "r")
    assert case.point == "rank 1, #3 (all_reduce in backward (DDP) at x.py:9)"


def test_collective_is_the_fault_places_value() -> None:
    assert isinstance(faults.kill(1, Collective("barrier")).at, Collective)
