"""The wait's rules (:class:`harness.controller.wait_rules.Supervision`), driven by scripted
messages on a fake clock: no process, no pipe, no sleep."""

from __future__ import annotations

import pytest

from harness.controller.outcome import Died, Faulted, Reply
from harness.controller.wait_rules import (
    CERTAIN,
    DEADLINE,
    FAILURE_GRACE_S,
    SKIP_GRACE_S,
    State,
    Supervision,
)
from harness.protocol.failures import RankFailure
from harness.protocol.messages import Done, Failed, Failing, Fired, Ready, Skipped


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeWatch:
    """A hang watch whose verdict is scripted; it records each time it is consulted."""

    def __init__(self, next_at: float, proves: bool = False) -> None:
        self.active = True
        self.next_at = next_at
        self.proves = proves
        self.steps: list[dict[int, Reply]] = []

    def step(self, replies: dict[int, Reply]) -> bool:
        self.steps.append(dict(replies))
        self.next_at += 0.5
        return self.proves


def failure(rank: int, message: str = "boom") -> RankFailure:
    try:
        raise ValueError(message)
    except ValueError as exc:
        return RankFailure.from_exception(exc, rank, hidden_dir="/nonexistent")


def done() -> Done:
    return Done(b"value")


def fired(ends: bool, at: float = 100.0) -> Fired:
    return Fired(0, "killed (SIGKILL) before collective #1", at, ends)


def supervision(
    clock: Clock,
    world_size: int = 3,
    deadline: float | None = None,
    fired: dict[int, Fired] | None = None,
    watch: FakeWatch | None = None,
) -> Supervision:
    return Supervision(range(world_size), deadline, fired, watch, clock=clock)


def test_every_rank_done_ends_the_wait() -> None:
    clock = Clock()
    sup = supervision(clock)
    assert sup.wake() == (None, None)  # no deadline, no watch: only a message wakes it
    for rank in range(3):
        sup.receive(rank, done())
        assert sup.state(rank) is State.ANSWERED
        assert not sup.waits_for(rank)
    assert sup.wake() == ("", None)
    assert sup.replies == {rank: done() for rank in range(3)}


def test_ready_answers_without_a_grace() -> None:
    clock = Clock()
    sup = supervision(clock, world_size=2, deadline=110.0)
    sup.receive(0, Ready(1, 2, "/code"))
    assert sup.wake() == (None, 10.0)  # the deadline, not a grace
    sup.receive(1, Ready(1, 2, "/code"))
    assert sup.wake() == ("", None)


def test_a_failure_gives_the_silent_ranks_a_grace_then_ends_the_wait() -> None:
    clock = Clock()
    sup = supervision(clock, deadline=200.0)
    sup.receive(0, done())
    failed = Failed(failure(1), at=99.0)
    sup.receive(1, failed)
    assert sup.wake() == (None, FAILURE_GRACE_S)
    clock.now += FAILURE_GRACE_S
    assert sup.wake() == ("", None)  # the grace ran out: not the deadline's verdict
    assert sup.replies == {0: done(), 1: failed}
    assert sup.waits_for(2) is False  # the wait is over


def test_the_first_grace_stands_against_a_later_failure() -> None:
    clock = Clock()
    sup = supervision(clock)
    sup.receive(0, Failed(failure(0), at=100.0))
    clock.now += 0.3
    sup.receive(1, Died(1, at=100.3))
    assert sup.wake() == (None, pytest.approx(FAILURE_GRACE_S - 0.3))


def test_failing_then_failed_keeps_the_body_time_and_extends_the_grace() -> None:
    clock = Clock()
    sup = supervision(clock, world_size=2)
    body = failure(0, "body")
    sup.receive(0, Failing(body, at=99.5))
    assert sup.state(0) is State.FAILING
    assert sup.waits_for(0)
    assert sup.replies[0] == Failed(body, 99.5)  # its failure until the teardown ends
    assert sup.wake() == (None, FAILURE_GRACE_S)
    clock.now += 0.4
    final = Failed(body, at=100.4, trace=None)
    sup.receive(0, final)
    assert sup.state(0) is State.ANSWERED
    assert sup.replies[0] == Failed(body, 99.5)  # dated when the body failed
    # The peers fail once the rank exits, now: the grace runs from here (max, not min).
    assert sup.wake() == (None, pytest.approx(FAILURE_GRACE_S))
    clock.now += FAILURE_GRACE_S
    assert sup.wake() == ("", None)


def test_failing_grace_takes_the_earlier_end() -> None:
    clock = Clock()
    sup = supervision(clock)
    sup.receive(0, Skipped("no gpu", "pytest", at=100.0))
    assert sup.wake() == (None, SKIP_GRACE_S)
    clock.now += 0.1
    sup.receive(1, Failing(failure(1), at=100.1))
    assert sup.wake() == (None, pytest.approx(FAILURE_GRACE_S))  # min(skip's, failing's)


def test_failing_then_death_is_the_body_failure() -> None:
    clock = Clock()
    sup = supervision(clock, world_size=2)
    body = failure(0, "body")
    sup.receive(0, Failing(body, at=99.5))
    clock.now += 0.2
    sup.receive(0, Died(-9, at=100.2))
    assert sup.state(0) is State.DIED
    assert sup.replies[0] == Failed(body, 99.5)
    assert sup.wake() == (None, pytest.approx(FAILURE_GRACE_S))


def test_failing_then_done_is_still_the_body_failure() -> None:
    clock = Clock()
    sup = supervision(clock, world_size=2)
    body = failure(0)
    sup.receive(0, Failing(body, at=99.5))
    sup.receive(0, done())
    assert sup.replies[0] == Failed(body, 99.5)


def test_a_skip_gives_skip_grace() -> None:
    clock = Clock()
    sup = supervision(clock, deadline=1000.0)
    skip = Skipped("no gpu", "pytest", at=100.0)
    sup.receive(0, skip)
    assert sup.wake() == (None, SKIP_GRACE_S)
    sup.receive(1, Skipped("no gpu", "pytest", at=100.0))
    clock.now += SKIP_GRACE_S
    assert sup.wake() == ("", None)
    assert sup.replies == {0: skip, 1: skip}


def test_a_fault_that_ends_a_rank_makes_it_faulted_and_ends_the_wait() -> None:
    clock = Clock()
    fired_by_rank: dict[int, Fired] = {}
    sup = supervision(clock, deadline=200.0, fired=fired_by_rank)
    sup.receive(0, done())
    kill = fired(ends=True)
    sup.receive(1, kill)
    assert fired_by_rank == {1: kill}
    assert sup.state(1) is State.FAULT_ENDED
    assert sup.replies[1] == Faulted(kill)
    assert sup.ends_returned  # rank 0 returned: its peers must not hang on it
    assert sup.wake() == (None, 100.0)  # rank 2 is still waited for
    sup.receive(2, done())
    assert sup.wake() == ("", None)  # only the fault-ended rank is left
    assert sup.replies == {0: done(), 1: Faulted(kill), 2: done()}


def test_a_failing_rank_its_fault_ends_keeps_its_failure_and_ends_the_wait() -> None:
    clock = Clock()
    sup = supervision(clock, world_size=2, deadline=200.0)
    sup.receive(1, done())
    body = failure(0)
    sup.receive(0, Failing(body, at=99.5))
    sup.receive(0, fired(ends=True))  # a fault of its teardown: waited for no longer
    assert sup.state(0) is State.FAULT_ENDED
    assert sup.replies[0] == Failed(body, 99.5)
    assert sup.wake() == ("", None)


def test_the_death_a_fault_caused_is_faulted_without_a_grace() -> None:
    clock = Clock()
    sup = supervision(clock, world_size=2, deadline=200.0)
    kill = fired(ends=True)
    sup.receive(0, kill)
    assert sup.waits_for(0)  # its death still counts
    death = Died(-9, at=100.0)
    sup.receive(0, death)
    assert sup.replies[0] == Faulted(kill, death)
    assert sup.state(0) is State.DIED
    assert sup.ends_returned  # rank 1 is still waited for
    assert sup.wake() == (None, 100.0)  # no failure, no grace
    sup.receive(1, done())
    assert not sup.ends_returned  # nobody is waited for any more
    assert sup.wake() == ("", None)


def test_a_death_after_a_fault_that_does_not_end_the_rank_is_a_death() -> None:
    clock = Clock()
    sup = supervision(clock, world_size=2)
    sup.receive(0, fired(ends=False))
    assert sup.state(0) is State.RUNNING
    death = Died(1, at=100.0)
    sup.receive(0, death)
    assert sup.replies[0] == death
    assert sup.wake() == (None, FAILURE_GRACE_S)


def test_the_fault_error_after_fired_is_faulted() -> None:
    clock = Clock()
    sup = supervision(clock, world_size=2, deadline=200.0)
    raised = fired(ends=False)
    sup.receive(0, raised)
    error = Failed(failure(0), at=100.0, fault=True)
    sup.receive(0, error)
    assert sup.replies[0] == Faulted(raised, error)
    assert sup.wake() == (None, 100.0)  # no grace


def test_a_failure_not_raised_by_the_fault_stays_a_failure() -> None:
    clock = Clock()
    sup = supervision(clock, world_size=2)
    sup.receive(0, fired(ends=False))
    error = Failed(failure(0), at=100.0, fault=False)
    sup.receive(0, error)
    assert sup.replies[0] == error


def test_the_deadline_ends_the_wait() -> None:
    clock = Clock()
    sup = supervision(clock, deadline=105.0)
    sup.receive(0, done())
    assert sup.wake() == (None, 5.0)
    clock.now = 105.0
    assert sup.wake() == (DEADLINE, None)
    assert sup.replies == {0: done()}


def test_the_deadline_during_a_grace_is_the_deadline() -> None:
    clock = Clock()
    sup = supervision(clock, deadline=100.2)
    sup.receive(0, Failed(failure(0), at=100.0))
    assert sup.wake() == (None, pytest.approx(0.2))
    clock.now = 100.5
    assert sup.wake() == (DEADLINE, None)


def test_a_watch_proving_a_hang_ends_the_wait() -> None:
    clock = Clock()
    watch = FakeWatch(next_at=100.5, proves=True)
    sup = supervision(clock, deadline=200.0, watch=watch)
    sup.receive(0, done())
    assert sup.wake() == (None, 0.5)  # the watch's next round comes before the deadline
    assert watch.steps == []
    clock.now = 100.5
    assert sup.wake() == (CERTAIN, None)
    assert watch.steps == [{0: done()}]


def test_a_watch_without_proof_sets_the_next_wake() -> None:
    clock = Clock(now=100.5)
    watch = FakeWatch(next_at=100.5)
    sup = supervision(clock, deadline=200.0, watch=watch)
    assert sup.wake() == (None, 0.5)  # stepped, and asked again at its new next_at
    assert len(watch.steps) == 1


def test_an_inactive_watch_is_not_consulted() -> None:
    clock = Clock(now=101.0)
    watch = FakeWatch(next_at=100.5, proves=True)
    watch.active = False
    sup = supervision(clock, deadline=200.0, watch=watch)
    assert sup.wake() == (None, 99.0)
    assert watch.steps == []


@pytest.mark.parametrize("ends", [False, True])
def test_the_watch_judges_what_a_fault_left(ends: bool) -> None:
    # A rank a hang fault holds, or one that handled an injected error: the watch says
    # whether its peers can still finish.
    clock = Clock()
    watch = FakeWatch(next_at=100.5, proves=True)
    sup = supervision(clock, world_size=2, deadline=200.0, watch=watch)
    sup.receive(0, fired(ends=ends))
    clock.now = 101.0
    assert sup.wake() == (CERTAIN, None)
    assert len(watch.steps) == 1


def test_the_watch_is_not_consulted_during_a_grace() -> None:
    clock = Clock()
    watch = FakeWatch(next_at=100.1, proves=True)
    sup = supervision(clock, deadline=200.0, watch=watch)
    sup.receive(0, Failing(failure(0), at=100.0))
    clock.now = 100.2
    assert sup.wake() == (None, pytest.approx(FAILURE_GRACE_S - 0.2))
    assert watch.steps == []


def test_nothing_is_taken_after_the_wait_ended() -> None:
    clock = Clock()
    sup = supervision(clock, world_size=2, deadline=101.0)
    first = Failed(failure(0), at=100.0)
    sup.receive(0, first)
    sup.receive(0, done())  # the rank answered already: ignored
    assert sup.replies == {0: first}
    clock.now = 101.0
    assert sup.wake() == (DEADLINE, None)
    sup.receive(1, done())  # too late: the caller tears it down
    assert sup.replies == {0: first}
    assert not sup.waits_for(1)
    assert sup.wake() == (DEADLINE, None)
