"""A sweep's count follows the code: kept while the project's files its clean run imported
are unchanged, counted again once one is edited, and counted again (once) where a case's
run contradicts it."""

from __future__ import annotations

import os
import re

import pytest

LIBRARY = """
import torch
import torch.distributed as dist


def step():
    for _ in range({steps}):
        dist.all_reduce(torch.ones(1))
"""

STEPPED = """
import os
import pathlib

import pytest
import torch.distributed as dist
from harness import faults

import mylib

HERE = pathlib.Path(__file__).parent


@pytest.mark.distributed(world_size=2, faults=faults.sweep("kill", ranks=[1], at="all"))
def test_step(rank):
    if rank == 0:  # which run this is: a counting run's ranks see the test it counts
        with open(HERE / "runs.log", "a") as log:
            log.write("count\\n" if os.environ.get("HARNESS_SWEEP_COUNT") else "case\\n")
    try:
        mylib.step()
    except RuntimeError:  # the peer was killed
        pass
"""


def _cases(result: pytest.RunResult) -> list[str]:
    return re.findall(r"test_lib\.py::test_step\[(kill-r1-at\d+)\]", result.stdout.str())


def _runs(pytester: pytest.Pytester) -> list[str]:
    log = pytester.path / "runs.log"
    return log.read_text().split() if log.exists() else []


def test_editing_the_library_counts_again_and_touching_it_does_not(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(mylib=LIBRARY.format(steps=2), test_lib=STEPPED)
    first = pytester.runpytest("-p", "no:randomly", "--collect-only", "-q")
    assert _cases(first) == ["kill-r1-at1", "kill-r1-at2"]
    assert _runs(pytester) == ["count", "count"]  # one count: its two clean runs
    library = pytester.path / "mylib.py"
    stat = library.stat()
    os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched, not edited
    touched = pytester.runpytest("-p", "no:randomly", "--collect-only", "-q")
    assert _cases(touched) == ["kill-r1-at1", "kill-r1-at2"]
    assert _runs(pytester) == ["count", "count"]
    # The library under test edited, its test file not: a new kill point.
    library.write_text(LIBRARY.format(steps=3))
    edited = pytester.runpytest("-p", "no:randomly", "--collect-only", "-q")
    assert _cases(edited) == ["kill-r1-at1", "kill-r1-at2", "kill-r1-at3"]
    assert _runs(pytester) == ["count"] * 4


READ_STEPS = """
import torch
import torch.distributed as dist
import pathlib


def step():
    # What the key cannot see: a file the test reads rather than imports.
    steps = (pathlib.Path(__file__).parent / "steps.txt").read_text().strip()
    if steps == "hang":
        if dist.get_rank() == 0:
            dist.barrier()  # a planted hang: rank 1 never enters it
        return
    for _ in range(int(steps)):
        dist.all_reduce(torch.ones(1))
"""


def test_a_case_that_contradicts_its_count_counts_again_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(mylib=READ_STEPS, test_lib=STEPPED)
    steps = pytester.path / "steps.txt"
    steps.write_text("3")
    counted = pytester.runpytest("-p", "no:randomly", "--collect-only", "-q")
    assert _cases(counted) == ["kill-r1-at1", "kill-r1-at2", "kill-r1-at3"]
    steps.write_text("1")  # the count is stale now: rank 1 makes 1 collective, not 3
    result = pytester.runpytest("-p", "no:randomly", "-rA")
    result.assert_outcomes(passed=1, failed=2)
    # Case 1 fires as counted; case 2's fault never fires: one count again (two clean
    # runs), after which case 3, whose kill point is gone, fails without running.
    assert _runs(pytester) == ["count", "count", "case", "case", "count", "count"]
    result.stdout.fnmatch_lines(
        [
            "*DistributedError: the sweep's count of a clean run no longer holds: its fault "
            "never fired: the run ended in FaultNotFired before it did, though the count has "
            "3 collectives of rank 1 on the default group; counted again: rank 1 now makes 1 "
            "collective on the default group; this session's cases were made from the old "
            "count: run again for the new one",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_step[[]kill-r1-at3[]] _*",
            "*DistributedError: the sweep's count of a clean run no longer holds: an earlier "
            "case of the test contradicted its count; counted again: rank 1 now makes 1 "
            "collective on the default group; *",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "test_lib.py::test_step: kill, 3 cases, 2 failed",
            "  kill at #1 on rank 1: passed",
            "  kill at #2 on rank 1: failed (DistributedError: the sweep's count of a clean "
            "run no longer holds: *",
        ]
    )
    # The next run makes its cases from the new count.
    again = pytester.runpytest("-p", "no:randomly", "--collect-only", "-q")
    assert _cases(again) == ["kill-r1-at1"]
    assert _runs(pytester).count("count") == 4


def test_a_count_again_that_hangs_fails_the_later_cases_at_once(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(mylib=READ_STEPS, test_lib=STEPPED)
    steps = pytester.path / "steps.txt"
    steps.write_text("2")
    pytester.runpytest("-p", "no:randomly", "--collect-only", "-q")
    steps.write_text("hang")  # a planted hang the count cannot see
    result = pytester.runpytest("-p", "no:randomly", "-rA")
    result.assert_outcomes(failed=2)
    # Case 1's run ends before its fault fires (rank 1 issues nothing): counted again, the
    # clean run hangs, and case 2 fails with that, without running.
    assert _runs(pytester) == ["count", "count", "case", "count"]
    result.stdout.fnmatch_lines(
        [
            "*_ test_step[[]kill-r1-at1[]] _*",
            "*DistributedError: the sweep's count of a clean run no longer holds: its fault "
            "never fired: the run ended in WorldHang before it did, though the count has 2 "
            "collectives of rank 1 on the default group; counted again, and its clean run "
            "failed: WorldHang: *",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_step[[]kill-r1-at2[]] _*",
            "*DistributedError: the sweep's count of a clean run no longer holds: an earlier "
            "case of the test contradicted its count; counted again, and its clean run "
            "failed: WorldHang: *",
        ]
    )
    # Nothing of the counting runs is left: their ranks' files and directories.
    [sweeps] = pytester.path.rglob("harness-sweeps")
    assert not [path for path in sweeps.iterdir() if path.is_dir()]
