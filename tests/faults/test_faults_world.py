"""Faults injected through ``World.run`` and ``harness.run``: each kind's effect on real Gloo
ranks, the value or report a user gets, and what is rebuilt. No assertion on time: a
survivor either gets an error (its peer is gone) or is blocked for good (the deadline)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import faults_rankfns as fns
import pytest

import harness
from harness import faults

TIMEOUT = 60.0
STEPS = fns.line_of("steps")
UNTIL = fns.line_of("until an error")
BIG = fns.line_of("big")
WATCHED = fns.line_of("watched")
SUBGROUP = fns.line_of("on the subgroup")


@pytest.fixture(scope="module")
def world() -> Iterator[harness.World]:
    with harness.World(2, backend="gloo", timeout=TIMEOUT) as w:
        yield w


def fired(value: object, what: str) -> bool:
    return isinstance(value, faults.FaultFired) and value.what == what


@pytest.mark.parametrize(
    ("fault", "what"),
    [
        (
            faults.kill(1, 2),
            f"killed (SIGKILL) before collective #2 (all_reduce at {STEPS}) on the default group",
        ),
        (
            faults.kill(1, 2, when="after", signal=signal.SIGTERM),
            f"killed (SIGTERM) after collective #2 (all_reduce at {STEPS}) on the default group",
        ),
        (
            faults.exit(1, 2, 3),
            f"exited with code 3 before collective #2 (all_reduce at {STEPS}) on the default group",
        ),
        (
            faults.error(1, 2, RuntimeError("injected")),
            f"raised RuntimeError('injected') at collective #2 (all_reduce at {STEPS}) "
            "on the default group",
        ),
    ],
    ids=lambda v: v.id if isinstance(v, faults.Fault) else "",
)
def test_a_rank_lost_to_a_fault_is_no_failure_when_the_survivor_copes(
    world: harness.World, fault: faults.Fault, what: str
) -> None:
    before = world.generation
    survivor, lost = world.run(fns.survives_a_lost_peer, faults=[fault])
    assert survivor == "caught RuntimeError"
    assert fired(lost, what)
    assert lost.fault == fault
    assert str(lost) == f"rank 1 {what}"
    # The world is rebuilt after a run whose fault ended a rank, and works as before.
    assert world.run(fns.steps) == [[3.0] * 3, [3.0] * 3]
    assert world.generation == before + 1


def test_a_survivor_that_does_not_cope_fails_the_run_naming_the_fault(
    world: harness.World,
) -> None:
    with pytest.raises(harness.RankError) as raised:
        world.run(fns.steps, faults=[faults.kill(1, 2)])
    summary = raised.value.summary
    assert summary.startswith("rank 0 raised ")
    assert summary.endswith(
        f"; rank 1 killed (SIGKILL) before collective #2 (all_reduce at {STEPS}) "
        "on the default group "
        "(injected)"
    )
    assert list(raised.value.failures) == [0]  # the killed rank is not a failure
    # The killed rank's trace shows what it did: it stopped after #1, never entered #2.
    assert raised.value.verdicts == ["rank 1 died after #1; rank 0 was in #2 (all_reduce)"]
    lost = raised.value.collectives[1]
    assert lost is not None
    assert lost.count("") == 1


@pytest.mark.parametrize(
    ("fault", "state"),
    [(faults.kill(1, 2, when="after"), "completed"), (faults.error(1, 2, OSError), "raised")],
    ids=["kill-after", "error"],
)
def test_the_faulted_rank_trace_says_how_its_collective_ended(
    world: harness.World, fault: faults.Fault, state: str
) -> None:
    with pytest.raises(harness.RankError) as raised:
        world.run(fns.steps, faults=[fault])
    lost = raised.value.collectives[1]
    assert lost is not None
    last = lost.last("")
    assert last is not None
    assert (last.seq, last.state) == (2, state)


def test_survivors_of_a_kill_during_a_collective_get_an_error(world: harness.World) -> None:
    survivor, lost = world.run(fns.big_steps, faults=[faults.kill(1, 2, when="during")])
    assert survivor == "caught RuntimeError"
    assert fired(
        lost,
        f"killed (SIGKILL) during collective #2 (all_reduce at {BIG}) on the default group",
    )


def test_a_hung_rank_ends_its_part_and_a_monitored_barrier_names_it(
    world: harness.World,
) -> None:
    survivor, lost = world.run(fns.watched_barrier, faults=[faults.hang(1, 1)])
    assert survivor == "a peer never arrived"
    assert fired(
        lost,
        f"hung before collective #1 (monitored_barrier at {WATCHED}) on the default group",
    )


def test_a_survivor_blocked_for_good_by_a_hung_peer_ends_at_once_naming_the_fault(
    world: harness.World,
) -> None:
    # The hung rank never issues collective #2, which its peer waits in: certain, at once.
    with pytest.raises(harness.WorldHang) as raised:
        world.run(fns.steps, faults=[faults.hang(1, 2)], timeout=120)
    assert raised.value.summary == (
        "the run can never finish: rank 0 waits in a collective that cannot complete (their "
        "stacks follow; the ranks were then killed); rank 1 hung before collective #2 "
        f"(all_reduce at {STEPS}) on the default group (injected)"
    )
    assert raised.value.timeout is None
    assert list(raised.value.failures) == [0]
    assert "all_reduce" in raised.value.stacks[0] or raised.value.collectives


def test_a_peer_that_handled_an_injected_error_and_returned_ends_the_run_at_once(
    world: harness.World,
) -> None:
    # Rank 0's collective #2 raised in place of running, and rank 0 went on to return: rank
    # 1, inside #2, can never finish it.
    nic_down = faults.error(0, 2, RuntimeError("nic down"))
    with pytest.raises(harness.WorldHang) as raised:
        world.run(fns.steps_until_an_error, faults=[nic_down], timeout=120)
    assert raised.value.summary == (
        "the run can never finish: rank 1 waits in a collective that cannot complete (their "
        "stacks follow; the ranks were then killed); rank 0 raised RuntimeError('nic down') "
        f"at collective #2 (all_reduce at {UNTIL}) on the default group (injected)"
    )


def test_a_straggler_is_waited_for(world: harness.World) -> None:
    assert world.run(fns.steps, faults=[faults.delay(1, 2, 0.2)]) == [[3.0] * 3, [3.0] * 3]
    with pytest.raises(harness.WorldTimeout) as raised:
        world.run(fns.steps, faults=[faults.delay(1, 1, 3600)], timeout=1)
    assert "after rank 1 was delayed 3600 s before collective #1 (all_reduce at" in str(
        raised.value
    )


def test_a_corrupted_input_changes_what_every_rank_gets(world: harness.World) -> None:
    # Rank 1's first input is doubled: 1 + 2 * 2 = 5 everywhere, then 3 again.
    result = world.run(fns.steps, faults=[faults.corrupt(1, 1, fns.double)])
    assert result == [[5.0, 3.0, 3.0]] * 2


def test_a_fault_on_a_group_counts_that_groups_collectives(world: harness.World) -> None:
    with pytest.raises(harness.RankError) as raised:
        world.run(fns.on_subgroup, faults=[faults.error(0, 1, ValueError("x"), group=(0, 1))])
    # The default group's all_reduce was #1 there; the subgroup's first is #1 of its own.
    assert (
        f"rank 0 raised ValueError('x') at collective #1 (all_reduce at {SUBGROUP}) on group (0, 1)"
    ) in str(raised.value)


def test_a_fault_that_never_fires_is_an_error_unless_not_strict(world: harness.World) -> None:
    with pytest.raises(harness.FaultNotFired) as raised:
        world.run(fns.steps, faults=[faults.kill(1, 5)])
    assert raised.value.summary == (
        "fault kill(rank=1, at=5) never fired: rank 1 made 3 collectives on the default group"
    )
    assert world.run(fns.steps, faults=[faults.kill(1, 5, strict=False)]) == [[3.0] * 3] * 2


def test_harness_run_takes_faults() -> None:
    survivor, lost = harness.run(
        fns.survives_a_lost_peer,
        world_size=2,
        backend="gloo",
        faults=[faults.exit(0, 1, 7)],
        timeout=TIMEOUT,
    )
    assert fired(
        survivor,
        f"exited with code 7 before collective #1 (all_reduce at {STEPS}) on the default group",
    )
    assert lost == "caught RuntimeError"


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        ([faults.kill(2, 1)], ValueError, "rank 2 is not in a world of 2 (valid ranks: 0 to 1)"),
        (faults.kill(0, 1), TypeError, "faults must be a list of faults"),
        (faults.sweep("kill", ranks=[0], at=[1]), TypeError, "a sweep of faults is meant one"),
        ([faults.corrupt(0, 1, lambda t: t)], TypeError, "does not pickle"),
    ],
)
def test_bad_faults_fail_before_anything_runs(
    world: harness.World, given: object, error: type[Exception], message: str
) -> None:
    pids = world.pids
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        world.run(fns.steps, faults=given)  # type: ignore[arg-type]
    assert world.pids == pids
