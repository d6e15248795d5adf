"""``--dist-trace-dir``: a folder with ``timeline.html``, ``trace.json`` and ``fr/`` for every
failing distributed test (a desync, a hang, a crash) and for one whose injected fault fired,
named on the failure report's last line; none for a passing test unless
``--dist-trace-all``; an unwritable directory is a usage error. Real ranks, real Gloo; the
hang is one the ranks' traces prove at once (a rank returned early)."""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
from plugin_testutil import TWO_RANKS, reports

from harness.timeline.folder import folder_name

BODY = """
import os
import pytest
import torch
import torch.distributed as dist
from harness import faults


def two_groups(rank):
    evens = dist.new_group([0, 2])
    dist.all_reduce(torch.ones(4))
    if rank in (0, 2):
        dist.all_reduce(torch.ones(4), group=evens)


@pytest.mark.distributed(world_size=4, backend="gloo")
def test_mismatch(rank):
    two_groups(rank)
    dist.all_reduce(torch.ones(4), op=dist.ReduceOp.MAX if rank == 3 else dist.ReduceOp.SUM)


@pytest.mark.distributed(world_size=4, backend="gloo", timeout=60)
def test_hang(rank):
    two_groups(rank)
    if rank == 3:
        return
    dist.all_reduce(torch.ones(4))


@pytest.mark.distributed(world_size=2, backend="gloo", timeout=60)
def test_crash(rank):
    dist.all_reduce(torch.ones(4))
    if rank == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(4))


@pytest.mark.distributed(world_size=2, backend="gloo", faults=[faults.kill(1, at=2)])
def test_fault(rank):
    dist.all_reduce(torch.ones(2))
    with pytest.raises(RuntimeError):
        dist.all_reduce(torch.ones(2))


@pytest.mark.distributed(world_size=2, backend="gloo")
def test_pass(rank):
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
"""

FAILING = ("test_mismatch", "test_hang", "test_crash")


def folder_of(out: Path, test: str) -> Path:
    return out / folder_name(f"test_traced.py::{test}")


def assert_folder(folder: Path, known: int) -> list[dict[str, Any]]:
    """The folder holds the three files, whole, a dump for each of the ``known`` ranks (a
    rank that died has no trace); returns the trace events."""
    assert sorted(os.listdir(folder)) == ["fr", "timeline.html", "trace.json"]
    page = (folder / "timeline.html").read_text(encoding="utf-8")
    assert "<html" in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # opens offline
    dumps = sorted(os.listdir(folder / "fr"))
    assert len(dumps) == known
    for dump in dumps:
        with open(folder / "fr" / dump, "rb") as handle:
            assert "entries" in pickle.load(handle)
    events: list[dict[str, Any]] = json.loads((folder / "trace.json").read_text())["traceEvents"]
    assert events
    return events


def test_failing_and_faulted_tests_get_a_folder_named_in_the_report(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(test_traced=BODY)
    out = tmp_path / "traces"
    result = pytester.runpytest("-p", "no:randomly", f"--dist-trace-dir={out}")
    result.assert_outcomes(passed=2, failed=3)
    found = reports(result)
    for test in FAILING:
        folder = folder_of(out, test)
        assert_folder(folder, 1 if test == "test_crash" else 4)
        last = str(found[test].longrepr).splitlines()[-1]
        assert last == f"trace folder: {folder}{os.sep} (timeline.html, trace.json, fr/)"
    assert_folder(folder_of(out, "test_fault"), 2)
    assert not folder_of(out, "test_pass").exists()
    assert len(os.listdir(out)) == 4


@pytest.mark.parametrize(
    ("test", "kind", "verdict"),
    [
        ("test_mismatch", "mismatch", "collective #2 on the default group differs: "),
        ("test_hang", "hang", "rank 3 finished the call after #1; ranks 0-2 wait in #2"),
    ],
)
def test_the_trace_marks_the_collective_the_report_names(
    pytester: pytest.Pytester, tmp_path: Path, test: str, kind: str, verdict: str
) -> None:
    pytester.makepyfile(test_traced=BODY)
    out = tmp_path / "traces"
    result = pytester.runpytest("-p", "no:randomly", f"--dist-trace-dir={out}", "-k", test)
    result.assert_outcomes(failed=1)
    text = str(reports(result)[test].longrepr)
    line = next(line for line in text.splitlines() if verdict in line)
    events = assert_folder(folder_of(out, test), 4)
    ranks = {event["pid"] for event in events if event.get("ph") == "X"}
    assert ranks == {0, 1, 2, 3}
    marks = [event for event in events if event.get("cat") == "mark"]
    assert len(marks) == 1
    assert marks[0]["args"]["kind"] == kind
    assert marks[0]["name"] in line  # the report's verdict, whole


def test_trace_all_writes_the_folder_of_a_passing_test(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(test_traced=BODY)
    out = tmp_path / "traces"
    args = ("-p", "no:randomly", "-k", "test_pass", f"--dist-trace-dir={out}")
    result = pytester.runpytest(*args, "--dist-trace-all")
    result.assert_outcomes(passed=1)
    events = assert_folder(folder_of(out, "test_pass"), 2)
    spans = [e for e in events if e.get("ph") == "X"]
    assert len(spans) == 2 * 3


def test_the_ini_option_is_read_relative_to_the_ini_file(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\ndist_trace_dir = traces\n")
    pytester.makepyfile(test_traced=BODY)
    result = pytester.runpytest("-p", "no:randomly", "-k", "test_crash")
    result.assert_outcomes(failed=1)
    assert_folder(folder_of(pytester.path / "traces", "test_crash"), 1)


def test_an_unwritable_trace_dir_is_a_usage_error(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    pytester.makepyfile(test_traced=BODY)
    result = pytester.runpytest(f"--dist-trace-dir={blocker / 'traces'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --dist-trace-dir '{blocker / 'traces'}' cannot be used*"])


def test_trace_all_needs_a_trace_dir(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_traced=BODY)
    result = pytester.runpytest("--dist-trace-all")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --dist-trace-all writes each test's trace folder*"])


MPTC = (
    TWO_RANKS
    + """

class TestCase(TwoRanks):
    def test_fails(self):
        self.init_gloo()
        dist.all_reduce(torch.ones(2))
        if self.rank == 1:
            raise ValueError("rank 1 gives up")
        dist.barrier()
"""
)


@pytest.mark.usefixtures("torch_test_modules")
def test_a_failing_mptc_case_gets_a_folder_too(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_case=MPTC)
    out = tmp_path / "traces"
    saved = dict(os.environ)  # the case's setUp sets variables here, as torch's do
    try:
        result = pytester.runpytest("-p", "no:randomly", "--dist-mptc", f"--dist-trace-dir={out}")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    result.assert_outcomes(failed=1)
    folder = out / folder_name("test_case.py::TestCase::test_fails")
    assert_folder(folder, 2)
    text = str(reports(result)["TestCase::test_fails"].longrepr)
    assert text.splitlines()[-1].startswith(f"trace folder: {folder}{os.sep}")


def test_a_test_past_its_timeout_gets_a_folder_with_the_collective_in_flight(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_slow="""
        import threading
        import pytest
        import torch
        import torch.distributed as dist

        @pytest.mark.distributed(world_size=2, backend="gloo", timeout=2)
        def test_straggler(rank):
            dist.all_reduce(torch.ones(4))
            if rank == 1:
                threading.Event().wait()
            dist.all_reduce(torch.ones(4))
        """
    )
    out = tmp_path / "traces"
    result = pytester.runpytest("-p", "no:randomly", f"--dist-trace-dir={out}")
    result.assert_outcomes(failed=1)
    text = str(reports(result)["test_straggler"].longrepr)
    assert text.splitlines()[0].startswith("WorldTimeout: ")
    events = assert_folder(out / folder_name("test_slow.py::test_straggler"), 2)
    spans = [e for e in events if e.get("ph") == "X"]
    assert sorted((e["pid"], e["args"]["state"]) for e in spans) == [
        (0, "completed"),
        (0, "in flight"),
        (1, "completed"),
    ]
