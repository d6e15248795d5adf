"""Faults given to the marker: one test case per fault of a sweep, each judged by what the
other ranks did, and a marker whose faults do not fit its world failing that test alone."""

from __future__ import annotations

import pytest

BODY = """
import pytest
import torch
import torch.distributed as dist
from harness import faults

EVERY_POINT = faults.sweep(faults.kill, ranks=range(3), at=range(1, 4))


def step():
    for _ in range(3):  # three collectives
        dist.all_reduce(torch.ones(2))


@pytest.mark.distributed(world_size=3, faults=EVERY_POINT)
def test_copes(rank):
    with pytest.raises(RuntimeError):
        step()


@pytest.mark.distributed(world_size=3, faults=EVERY_POINT)
def test_does_not_cope(rank):
    step()
"""


def test_a_sweep_is_one_case_per_fault_judged_by_the_survivors(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=BODY)
    result = pytester.runpytest("-p", "no:randomly", "-rA")
    result.assert_outcomes(passed=9, failed=9)
    ids = [f"kill-r{rank}-at{at}" for rank in range(3) for at in range(1, 4)]
    for case in ids:
        result.stdout.fnmatch_lines([f"PASSED test_sweep.py::test_copes[[]{case}[]]*"])
        rank, at = case[6], case[-1]
        result.stdout.fnmatch_lines(
            [
                f"*_ test_does_not_cope[[]{case}[]] _*",
                f"RankError: rank * raised RuntimeError: *; rank {rank} killed (SIGKILL) before "
                f"collective #{at} (all_reduce at test_sweep.py:*) on the default group "
                "(injected)",
            ]
        )


def test_a_marked_fault_that_never_fires_fails_the_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch.distributed as dist
        from harness import faults


        @pytest.mark.distributed(world_size=2, faults=[faults.hang(1, 2)])
        def test_one_barrier(rank):
            dist.barrier()


        @pytest.mark.distributed(world_size=2, faults=[faults.hang(1, 2, strict=False)])
        def test_not_strict(rank):
            dist.barrier()
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*FaultNotFired: fault hang(rank=1, at=2) never fired: rank 1 made 1 collective on*"]
    )


def test_faults_that_do_not_fit_the_world_fail_that_test_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        from harness import faults


        @pytest.mark.distributed(world_size=2, faults=[faults.kill(rank=2, at=1)])
        def test_bad(rank):
            pass


        @pytest.mark.distributed(world_size=2, faults=faults.kill(rank=0, at=1))
        def test_not_a_list(rank):
            pass


        @pytest.mark.distributed(world_size=2)
        def test_fine(rank):
            pass
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*invalid @pytest.mark.distributed: fault kill(rank=2, at=1): rank 2 is not in a "
            "world of 2 (valid ranks: 0 to 1)*",
            "*invalid @pytest.mark.distributed: faults must be a list of faults made by "
            "harness.faults*",
        ],
        consecutive=False,
    )


def test_a_bad_fault_argument_fails_that_test_alone_when_it_runs(
    pytester: pytest.Pytester,
) -> None:
    # Made at the module's import, checked when the test runs: the module's other tests,
    # and the other cases of a sweep, run as ever.
    pytester.makepyfile(
        """
        import pytest
        import torch.distributed as dist
        from harness import faults


        @pytest.mark.distributed(world_size=2, faults=[faults.kill(rank=1, at=0)])
        def test_at_zero(rank):
            dist.barrier()


        @pytest.mark.distributed(
            world_size=2, faults=faults.sweep("kill", ranks=[1], at=[0, 1], strict=False)
        )
        def test_swept(rank):
            try:
                dist.barrier()
            except RuntimeError:  # rank 1 was killed
                pass


        @pytest.mark.distributed(world_size=2, faults=faults.sweep("explode", ranks=[1], at=[1]))
        def test_no_such_kind(rank):
            dist.barrier()


        @pytest.mark.distributed(world_size=2, faults=[faults.kill(rank="1", at=1)])
        def test_rank_as_text(rank):
            dist.barrier()


        @pytest.mark.distributed(world_size=2)
        def test_fine(rank):
            dist.barrier()
        """
    )
    result = pytester.runpytest("-p", "no:randomly", "-rA")
    result.assert_outcomes(passed=2, failed=4)
    result.stdout.fnmatch_lines(
        [
            "PASSED test_a_bad_fault_argument_fails_that_test_alone_when_it_runs.py::"
            "test_swept[[]kill-r1-at1[]]",
            "PASSED *::test_fine",
        ],
        consecutive=False,
    )
    message = (
        "invalid @pytest.mark.distributed: fault kill(rank=1, at=0): at must be an int >= 1 "
        "(collectives are counted from 1) or a faults.Collective, not 0"
    )
    explode = (
        "invalid @pytest.mark.distributed: sweep('explode', ranks=[1], at=[1]): unknown fault "
        "kind 'explode'; valid: kill, exit, error, delay, hang, corrupt"
    )
    text = "invalid @pytest.mark.distributed: fault kill(rank='1', at=1): rank must be an int"
    result.stdout.fnmatch_lines(
        [
            "*_ test_at_zero _*",
            message,
            "*_ test_swept[[]kill-r1-at0[]] _*",
            message,
            "*_ test_no_such_kind _*",
            explode,
            "*_ test_rank_as_text _*",
            text + "*",
        ]
    )
    assert "Traceback" not in result.stdout.str()
