"""Sweeps over every rank and collective: the clean run that counts them at collection, one
case per (rank, collective), ``verify=`` after each case, the summary in ranges, and the
same cases on every pytest-xdist worker."""

from __future__ import annotations

import re

import pytest

STEPS = """
import pytest
import torch
import torch.distributed as dist
from harness import faults


def steps():
    try:
        for _ in range(2):
            dist.all_reduce(torch.ones(2))  # collectives #1 and #2
    except RuntimeError:  # a peer was killed
        pass


def survived(rank, world_size, fault, tmp_path):
    assert (rank, world_size) == (rank, 2)
    assert fault.rank != 1 or fault.at != 2, f"{tmp_path.name}: lost rank 1 at #2"
"""

EVERY_POINT = """

@pytest.mark.distributed(world_size=2, faults=faults.sweep("kill", ranks="all", at="all"))
def test_every_point(rank):
    steps()
"""

VERIFIED = """

@pytest.mark.distributed(
    world_size=2, faults=faults.sweep("kill", ranks="all", at="all"), verify=survived
)
def test_verified(rank, tmp_path):
    steps()
"""

COPES = STEPS + EVERY_POINT + VERIFIED

CASES = ["kill-r0-at1", "kill-r0-at2", "kill-r1-at1", "kill-r1-at2"]


def test_all_ranks_and_collectives_are_counted_once_then_swept(
    pytester: pytest.Pytester,
) -> None:
    # One run of both tests: every case's outcome, then test_verified's failing case (its
    # report and its summary), then the count's cache.
    pytester.makepyfile(test_sweep=COPES)
    result = pytester.runpytest("-p", "no:randomly", "-rA")
    result.assert_outcomes(passed=7, failed=1)
    for test in ("test_every_point", "test_verified"):
        for case in CASES:
            if (test, case) != ("test_verified", "kill-r1-at2"):
                result.stdout.fnmatch_lines([f"PASSED test_sweep.py::{test}[[]{case}[]]"])
    # A failing verify fails the case, naming the kill point.
    result.stdout.fnmatch_lines(
        [
            "RankError: verify survived failed after kill(rank=1, at=2) (collective #2: "
            "all_reduce at test_sweep.py:10): rank * raised AssertionError: *: lost rank 1 "
            "at #2*",
            "run (2 ranks, gloo): pytest 'test_sweep.py::test_verified[[]kill-r1-at2[]]' "
            "--dist-backend=gloo",
        ]
    )
    # The summary: cases that agree in ranges, the failing one with its kill point.
    result.stdout.fnmatch_lines(
        [
            "*= harness: fault sweeps =*",
            "test_sweep.py::test_every_point: kill, 4 cases, 0 failed",
            "  kill at #1-#2 on any rank: passed",
            "test_sweep.py::test_verified: kill, 4 cases, 1 failed",
            "  kill at #1 on any rank: passed",
            "  kill at #2 on rank 0: passed",
            "  kill at #2 on rank 1: failed (verify survived: AssertionError: *: lost rank 1 "
            "at #2*",
            "  failed at rank 1, #2 (all_reduce at test_sweep.py:10): pytest "
            "'test_sweep.py::test_verified[[]kill-r1-at2[]]' --dist-backend=gloo",
        ]
    )
    # One count per test, kept under pytest's cache: a second run collects from it.
    counted = list((pytester.path / ".pytest_cache").rglob("harness-sweeps/*.json"))
    assert len(counted) == 2
    again = pytester.runpytest("-p", "no:randomly", "--collect-only", "-q")
    again.stdout.fnmatch_lines(["test_sweep.py::test_every_point[[]kill-r1-at2[]]"])
    assert sorted((pytester.path / ".pytest_cache").rglob("harness-sweeps/*.json")) == sorted(
        counted
    )


def test_xdist_workers_collect_the_same_cases_and_run_each_once(
    pytester: pytest.Pytester,
) -> None:
    # One sweep is enough to see every worker collect its cases alike (each worker resolves
    # it at collection, from one count; xdist fails a run whose workers collected
    # differently) and every case run once. verify= and its failure are the worker's own
    # business, as without xdist (the test above).
    pytester.makepyfile(test_sweep=STEPS + EVERY_POINT)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-n", "2", "-rA")
    result.assert_outcomes(passed=4)
    ran = re.findall(r"^(?:PASSED|FAILED) (test_sweep\.py::\S+)", result.stdout.str(), re.M)
    assert sorted(ran) == [f"test_sweep.py::test_every_point[{case}]" for case in CASES]
    result.stdout.fnmatch_lines(
        [
            "test_sweep.py::test_every_point: kill, 4 cases, 0 failed",
            "  kill at #1-#2 on any rank: passed",
        ]
    )


def test_explicit_sweeps_are_summarised_too(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch
        import torch.distributed as dist
        from harness import faults


        @pytest.mark.distributed(
            world_size=2, faults=faults.sweep("kill", ranks=[1], at=[1, 2], when="after")
        )
        def test_copes(rank):
            with pytest.raises(RuntimeError):
                for _ in range(3):
                    dist.all_reduce(torch.ones(2))
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "test_*.py::test_copes: kill after, 2 cases, 0 failed",
            "  kill after #1-#2 on rank 1: passed",
        ]
    )


def test_a_case_that_hangs_reads_alike_in_its_report_and_the_summary(
    pytester: pytest.Pytester,
) -> None:
    # Rank 1 returns after #1, rank 0 waits in #2: a hang its collectives prove (the
    # test's timeout is only a bound).
    pytester.makepyfile(
        """
        import pytest
        import torch.distributed as dist
        from harness import faults


        @pytest.mark.distributed(
            world_size=2, faults=faults.sweep("delay", ranks=[1], at=[1], seconds=0)
        )
        def test_one_barrier_too_many(rank):
            dist.barrier()
            if rank == 0:
                dist.barrier()
        """
    )
    result = pytester.runpytest("-p", "no:randomly", "--dist-timeout=600")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "WorldHang: the run can never finish: rank 0 waits in a collective that *",
            "test_*.py::test_one_barrier_too_many: delay, 1 case, 1 failed",
            "  delay at #1 on rank 1: failed (WorldHang: blocked in a collective that can "
            "never complete)",
        ],
        consecutive=False,
    )


def test_a_count_that_differs_between_clean_runs_fails_the_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_moody="""
        import pathlib
        import pytest
        import torch
        import torch.distributed as dist
        from harness import faults

        RUNS = pathlib.Path(__file__).parent / "runs"


        @pytest.mark.distributed(world_size=2, faults=faults.sweep("kill", ranks="all", at="all"))
        def test_moody(rank):
            RUNS.mkdir(exist_ok=True)
            earlier = len(list(RUNS.iterdir()))
            dist.barrier()
            if rank == 0:
                (RUNS / str(earlier)).touch()
            for _ in range(earlier):  # one more in each run
                dist.all_reduce(torch.ones(1))
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "test_moody.py::test_moody: sweep('kill', ranks='all', at='all'): two clean runs "
            "issued different collectives (test_moody[[]clean1[]] and test_moody[[]clean2[]]: "
            "rank 0 made 1 collective on the default "
            "group, then 2); a sweep over 'all' needs the same ones in every run*"
        ]
    )


def test_more_than_500_cases_fail_the_test_saying_how_many(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_long="""
        import pytest
        import torch
        import torch.distributed as dist
        from harness import faults


        @pytest.mark.distributed(world_size=2, faults=faults.sweep("kill", ranks="all", at="all"))
        def test_long(rank):
            for _ in range(251):
                dist.all_reduce(torch.ones(1))
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_long[[]kill-unresolved[]] _*",
            "test_long.py::test_long: a sweep over every collective would make 502 cases "
            "(collectives of a clean run: rank 0: 251, rank 1: 251), more than 500: sweep "
            "some of them, e.g. at=range(1, 50)*",
        ]
    )


def test_bad_sweeps_and_verify_values_are_named(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_bad="""
        import pytest
        import torch.distributed as dist
        from harness import faults

        ALL = faults.sweep("kill", ranks="all", at=[1])


        @pytest.mark.distributed(world_size=2, faults=ALL, verify=lambda tmp_path: None)
        def test_lambda(rank):
            try:
                dist.barrier()
            except RuntimeError:
                pass


        def needs_a_fixture(checkpoints):
            pass


        @pytest.mark.distributed(world_size=2, faults=ALL, verify=needs_a_fixture)
        def test_unknown_argument(rank):
            try:
                dist.barrier()
            except RuntimeError:
                pass
        """,
        test_sizes="""
        import pytest
        from harness import faults


        @pytest.mark.distributed(
            world_size=[2, 3], faults=faults.sweep("kill", ranks="all", at="all")
        )
        def test_sizes(rank):
            pass
        """,
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=6)  # test_sizes: a case per world size
    result.stdout.fnmatch_lines(
        [
            "*invalid @pytest.mark.distributed: verify must be a module-level function (it "
            "runs in the ranks of a fresh world, by reference), not <function <lambda>*",
            "*verify needs_a_fixture asks for 'checkpoints', which the test has no value for; "
            "valid: fault, rank, world_size*",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(["*a sweep over 'all' needs one world_size, not [[]2, 3[]]*"])


def test_a_failing_clean_run_fails_its_sweep_alone_with_its_own_failure_first(
    pytester: pytest.Pytester,
) -> None:
    # A regression that breaks the test without any fault: its one case fails, saying that
    # the clean run failed and then how (the clean run's own report, not a transcript of the
    # counting run); the other tests of the run are collected and run as ever.
    pytester.makepyfile(
        test_regressed="""
        import pytest
        import torch.distributed as dist
        from harness import faults


        @pytest.mark.distributed(world_size=2, faults=faults.sweep("kill", ranks="all", at="all"))
        def test_broken(rank):
            dist.barrier()
            assert rank == 5, "broken without any fault"


        @pytest.mark.distributed(world_size=2)
        def test_fine(rank):
            dist.barrier()


        def test_plain():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:randomly", "-rA")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["PASSED test_regressed.py::test_fine", "PASSED *::test_plain"])
    result.stdout.fnmatch_lines(
        [
            "*_ test_broken[[]kill-unresolved[]] _*",
            "test_regressed.py::test_broken: sweep('kill', ranks='all', at='all'): its clean "
            "run failed: RankError: rank ? raised AssertionError: broken without any fault*",
            "*rank ? (root cause)*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "  #1 barrier() at test_regressed.py:8",
            "(a sweep over 'all' counts the collectives of a run without faults, which must "
            "pass; the counting run's exit status: 1)",
        ]
    )
    text = result.stdout.str()
    assert "test session starts" not in text.split("test_broken[kill-unresolved]")[-1]
    assert "[clean1]" not in text
