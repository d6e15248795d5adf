"""Runs with restarts, as torchrun's agent restarts its worker group: a rank dies or fails,
the whole world ends, a fresh one (of the schedule's size) runs the body again."""

from __future__ import annotations

import faults_rankfns as fns
import pytest

import harness
from harness import faults


def test_a_killed_rank_restarts_the_world_and_the_next_attempt_runs_clean() -> None:
    values = harness.run(
        fns.attempt_steps, world_size=2, backend="gloo", restarts=1, faults=[faults.kill(1, 2)]
    )
    assert values == [(1, 2, 3.0), (1, 2, 3.0)]


def test_a_schedule_of_sizes_resizes_each_restart() -> None:
    values = harness.run(
        fns.attempt_steps, world_size=3, backend="gloo", restarts=[2], faults=[faults.kill(2, 1)]
    )
    assert values == [(1, 2, 3.0), (1, 2, 3.0)]


def test_a_world_restarts_at_its_own_size_and_counts_from_zero_again() -> None:
    with harness.World(2, backend="gloo") as world:
        kills = [faults.exit(0, 1, 3), faults.hang(1, 2, attempt=1)]
        assert world.run(fns.attempt_steps, restarts=2, faults=kills) == [(2, 2, 3.0)] * 2
        assert world.run(fns.attempt_steps) == [(0, 2, 3.0)] * 2, "a new run: attempt 0"
        with pytest.raises(ValueError, match=r"a World restarts at its own size \(2\), not \[1\]"):
            world.run(fns.attempt_steps, restarts=[1])


def test_exhausted_restarts_raise_the_last_failure_with_the_earlier_attempts() -> None:
    kills = [faults.kill(1, 1), faults.kill(0, 2, attempt=1)]
    with pytest.raises(harness.DistributedError) as raised:
        harness.run(fns.steps, world_size=2, backend="gloo", restarts=1, faults=kills)
    error = raised.value
    assert "rank 0 killed (SIGKILL) before collective #2 (all_reduce at " in error.summary
    assert len(error.attempts) == 1
    assert error.attempts[0].startswith("attempt 0 (2 ranks): ")
    assert error.attempts[0].endswith(
        f"rank 1 killed (SIGKILL) before collective #1 (all_reduce at {fns.line_of('steps')}) on "
        "the default group (injected)"
    )
    assert "---------- attempts ----------" in str(error)


def test_a_failure_of_the_body_restarts_too() -> None:
    # Under torchrun, a worker that raises exits non-zero: the agent restarts the group.
    values = harness.run(
        fns.attempt_steps,
        world_size=2,
        backend="gloo",
        restarts=1,
        faults=[faults.error(0, 1, ValueError("flaky"))],
    )
    assert values == [(1, 2, 3.0)] * 2


@pytest.mark.parametrize(
    ("restarts", "faults_given", "error", "message"),
    [
        (-1, [], ValueError, "restarts must be >= 0, got -1"),
        (1.5, [], TypeError, "restarts must be a number of restarts (an int >= 0) or the world"),
        ([0], [], ValueError, "restarts has world size 0; each must be >= 1"),
        (
            0,
            [faults.kill(1, 1, attempt=1)],
            ValueError,
            "fault kill(rank=1, at=1, attempt=1) acts in attempt 1, but the run has 0 restarts",
        ),
        (
            [1],
            [faults.kill(1, 1, attempt=1)],
            ValueError,
            "fault kill(rank=1, at=1, attempt=1): rank 1 is not in a world of 1",
        ),
    ],
)
def test_bad_restarts_fail_before_any_rank_starts(
    restarts: object, faults_given: list[faults.Fault], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        harness.run(fns.steps, world_size=2, backend="gloo", restarts=restarts, faults=faults_given)  # type: ignore[arg-type]
    assert str(raised.value).startswith(message)


def test_the_ranks_see_torchruns_restart_variables() -> None:
    kill = faults.kill(1, 1)
    with harness.World(2, backend="gloo") as world:
        assert world.run(fns.restart_variables) == [("0", "0")] * 2
        ran = world.run(fns.steps_then_restart_variables, restarts=2, faults=[kill])
        assert ran == [("1", "2")] * 2
        assert world.run(fns.restart_variables) == [("0", "0")] * 2, "a new run: fresh ranks"


def test_the_harnesss_own_verdicts_end_the_run_without_a_restart() -> None:
    # A fault that never fired is no failure of a rank: torchrun would not restart for it.
    never = faults.kill(1, 50)
    with pytest.raises(harness.FaultNotFired) as raised:
        harness.run(fns.steps, world_size=2, backend="gloo", restarts=2, faults=[never])
    assert raised.value.attempts == []


def test_faults_of_different_attempts_may_act_at_the_same_place() -> None:
    twice = [faults.kill(1, 1), faults.exit(1, 1, 3, attempt=1)]
    values = harness.run(fns.attempt_steps, world_size=2, backend="gloo", restarts=2, faults=twice)
    assert values == [(2, 2, 3.0)] * 2
