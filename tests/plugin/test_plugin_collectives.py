"""What a distributed test's report says about its collectives: the verdicts and the
collectives section of a failure, and the desync check that fails a passing test whose ranks'
collectives differ (marker ``check_collectives=False`` and ``--dist-no-collective-check``
turn it off). Real ranks, real Gloo; hangs are bounded only as a safety."""

from __future__ import annotations

import sys

import pytest
from plugin_testutil import assert_no_internal_frames, reports

SUM_AGAINST_MAX = """\
import pytest
import torch
import torch.distributed as dist

@pytest.mark.distributed(world_size=2, backend="gloo"{marker})
def test_reduce(rank):
    tensor = torch.ones(4) * (rank + 1)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)

@pytest.mark.distributed(world_size=2, backend="gloo")
def test_after(rank):
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [2.0] * 4
"""


def test_a_passing_test_whose_collectives_differ_fails_with_the_verdict(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(SUM_AGAINST_MAX.format(marker=""))
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    text = str(reports(result)["test_reduce"].longrepr)
    verdict = (
        "collective #1 on the default group differs: "
        "rank 0 all_reduce(SUM, float32[4]) at test_a_passing_test_whose_collectives_differ_"
        "fails_with_the_verdict.py:8; rank 1 all_reduce(MAX, float32[4]) at "
        "test_a_passing_test_whose_collectives_differ_fails_with_the_verdict.py:8"
    )
    assert text.splitlines()[0] == (
        "CollectiveMismatch: every rank returned, but their collectives do not match, so the "
        f"results may be wrong: {verdict}"
    )
    assert "- collectives -" in text
    assert "rank 0: (1 on the default group)" in text
    assert_no_internal_frames(text)


@pytest.mark.parametrize("how", ["marker", "option"])
def test_the_desync_check_can_be_switched_off(pytester: pytest.Pytester, how: str) -> None:
    marker = ", check_collectives=False" if how == "marker" else ""
    pytester.makepyfile(SUM_AGAINST_MAX.format(marker=marker))
    args = ["--dist-no-collective-check"] if how == "option" else []
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=2)


def test_an_invalid_check_collectives_fails_that_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUM_AGAINST_MAX.format(marker=', check_collectives="no"'))
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*invalid @pytest.mark.distributed: check_collectives must be True or False, not 'no'*"]
    )


def test_subgroup_collectives_are_not_a_desync(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch
        import torch.distributed as dist

        @pytest.mark.distributed(world_size=3, backend="gloo")
        def test_subgroup(rank):
            pair = dist.new_group([0, 1])
            tensor = torch.ones(2)
            if rank in (0, 1):
                dist.all_reduce(tensor, group=pair)
                dist.barrier(group=pair)
            dist.all_reduce(tensor)
            assert tensor.tolist() == [5.0, 5.0]
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_a_hang_report_names_the_rank_that_never_arrived(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import threading
        import pytest
        import torch
        import torch.distributed as dist

        @pytest.mark.distributed(world_size=3, backend="gloo", timeout=3)
        def test_straggler(rank):
            dist.all_reduce(torch.ones(4))
            if rank == 2:
                threading.Event().wait()
            dist.all_gather([torch.empty(4) for _ in range(3)], torch.ones(4))
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    text = str(reports(result)["test_straggler"].longrepr)
    lines = text.splitlines()
    assert lines[0].startswith("WorldTimeout: the run did not finish within 3 s")
    name = "test_a_hang_report_names_the_rank_that_never_arrived.py"
    # A function's qualified name is in its code from Python 3.11; 3.10's has its name only.
    wait = "Event.wait" if sys.version_info >= (3, 11) else "wait"
    assert lines[1] == (
        "rank 2 never reached collective #2 (all_gather) that ranks 0, 1 wait in; "
        f"rank 2 is in {wait} at {name}:10"
    )
    section = text.split("- collectives -", 1)[1]
    assert f"  #2 all_gather(float32[4]) at {name}:11  [in flight]" in section
    assert "rank 2: (1 on the default group)" in section
    assert_no_internal_frames(text)


def test_a_failing_test_reports_the_collectives_of_every_rank(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch
        import torch.distributed as dist

        @pytest.mark.distributed(world_size=2, backend="gloo", timeout=5)
        def test_early(rank):
            dist.broadcast(torch.ones(3), src=0)
            if rank == 1:
                return
            dist.barrier()
        """
    )
    result = pytester.runpytest()
    # Rank 1 returned and waits for the next test: rank 0 waits in the barrier until the
    # deadline.
    result.assert_outcomes(failed=1)
    text = str(reports(result)["test_early"].longrepr)
    assert "rank 1 finished the call after #1; rank 0 waits in #2 (barrier)" in text
    assert "#2 barrier() at test_a_failing_test_reports_the_collectives_of_every_rank.py:10" in text
