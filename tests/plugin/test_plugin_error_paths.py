"""Tests that exercise error paths on purpose get the verdict fresh processes would give:
a collective one rank skips, whose error the other rank handles, passes (as PyTorch's own
``test_monitored_barrier_gloo`` does); and a rank whose body failed is the root cause even
while a slow fixture teardown keeps it from answering. Real ranks, real Gloo; no outcome
depends on how long anything takes."""

from __future__ import annotations

import pytest
from plugin_testutil import assert_no_internal_frames, reports


def test_a_skipped_monitored_barrier_whose_error_is_handled_passes(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import os
        from datetime import timedelta

        import pytest
        import torch
        import torch.distributed as dist

        PIDS = {}

        @pytest.mark.distributed(world_size=2, backend="gloo")
        def test_monitored_barrier(rank):
            for _ in range(3):
                dist.all_reduce(torch.ones(2))
            if rank == 1:
                return  # skips the barrier on purpose
            with pytest.raises(RuntimeError, match="1"):
                dist.monitored_barrier(timeout=timedelta(seconds=1))

        @pytest.mark.distributed(world_size=2, backend="gloo")
        def test_after(rank):
            tensor = torch.ones(4)
            dist.all_reduce(tensor)
            assert tensor.tolist() == [2.0] * 4
        """
    )
    result = pytester.runpytest("-p", "no:randomly", "-W", "error::RuntimeWarning")
    result.assert_outcomes(passed=2)


def test_a_body_failure_is_the_root_cause_while_its_teardown_runs(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import os
        import threading
        import time

        import pytest

        import harness

        @harness.fixture
        def slow_teardown(rank, tmp_path):
            yield
            if rank == 1:
                # Tell rank 0 that this rank's body is over, then never finish.
                (tmp_path / "rank1-in-teardown").touch()
                threading.Event().wait()

        @pytest.mark.distributed(world_size=2, backend="gloo", timeout=60)
        def test_root_cause(rank, slow_teardown, tmp_path):
            if rank == 1:
                assert False, "the root cause"
            # Rank 0 fails because rank 1 did: a consequence.
            while not (tmp_path / "rank1-in-teardown").exists():
                time.sleep(0.01)
            raise RuntimeError("a consequence of rank 1")
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=1)
    text = str(reports(result)["test_root_cause"].longrepr)
    first = text.splitlines()[0]
    assert first.startswith("RankError: rank 1 raised AssertionError: the root cause"), text
    assert "AssertionError: the root cause" in text
    # Rank 0's own failure is listed after it when it comes within the grace period that
    # rank 1's failure started (on a loaded machine it may not: rank 0 is then torn down).
    consequence = text.find("RuntimeError: a consequence of rank 1")
    assert consequence == -1 or text.index("AssertionError: the root cause") < consequence
    assert_no_internal_frames(text)
