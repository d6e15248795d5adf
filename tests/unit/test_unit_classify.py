"""Each way a call can end, judged by ``classify`` from one :class:`Evidence`.

Every case is built from the records a call's end is judged from (the replies, the faults
that fired, the stacks and traces taken), as the controller builds them, and checks the
``Classified`` that comes out: which ending won where several hold, and what it says.
"""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from harness import faults
from harness.controller.classify import classify
from harness.controller.outcome import Died, Evidence, Faulted, Reply
from harness.errors import FaultNotFired, RankCrash, RankError, WorldHang, WorldTimeout
from harness.faults import FaultFired
from harness.protocol.failures import RankFailure
from harness.protocol.messages import Done, Failed, Fired, Skipped
from harness.protocol.traces import COMPLETED, DEFAULT_GROUP, IN_FLIGHT, Collective, Op, RankTrace

SUM = Op("all_reduce", "all_reduce(SUM, float32[4])", "all_reduce(SUM, float32[4])", "SUM")
KILLED = "killed (SIGKILL) before collective #2 (all_reduce) on the default group"
HUNG = "hung before collective #2 (all_reduce) on the default group"
DELAYED = "delayed by 30 s before collective #1 (all_reduce) on the default group"


def done(value: object, *, collectives: int = 1, unfired: tuple[str, ...] = ()) -> Done:
    """A rank that returned ``value`` after ``collectives`` all-reduces on the default group."""
    fingerprint = ((DEFAULT_GROUP, None, collectives, 7 * collectives),)
    return Done(pickle.dumps(value), collectives=fingerprint, unfired=unfired)


def failed(rank: int, at: float) -> Failed:
    failure = RankFailure(rank, "ValueError", "boom", "Traceback...\nValueError: boom\n")
    return Failed(failure, at)


def trace(state: str) -> RankTrace:
    """A trace of one all-reduce on the default group, in ``state``."""
    return RankTrace((Collective(DEFAULT_GROUP, 1, SUM, "/src/test_x.py", 3, state),))


# ---------------------------------------------------------------- the record


def test_evidence_is_a_frozen_record_whose_options_are_named() -> None:
    seen = Evidence({}, 2, timeout=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen.certain = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        Evidence({}, 2, None)  # type: ignore[misc]
    # What a call without faults, stacks or traces is judged from.
    assert (seen.stacks, seen.traces, seen.fired, seen.faults) == ({}, {}, {}, ())
    assert (seen.starting, seen.init, seen.check_collectives, seen.certain) == (
        None,
        True,
        True,
        False,
    )


# ---------------------------------------------------------------- every rank returned


def test_ranks_that_returned_with_differing_fingerprints_are_suspect() -> None:
    replies: dict[int, Reply] = {0: done("a"), 1: done("b", collectives=2)}
    outcome = classify(Evidence(replies, 2, timeout=None))
    assert (outcome.values, outcome.error, outcome.suspect) == (["a", "b"], None, True)
    # Without the check, the same replies are plain values.
    unchecked = classify(Evidence(replies, 2, timeout=None, check_collectives=False))
    assert (unchecked.values, unchecked.suspect) == (["a", "b"], False)


def test_a_fault_that_never_fired_wins_over_differing_fingerprints() -> None:
    replies: dict[int, Reply] = {
        0: done("a", unfired=("kill of rank 0 at collective #9 never fired",)),
        1: done("b", collectives=2, unfired=("hang of rank 1 at collective #8 never fired",)),
    }
    outcome = classify(Evidence(replies, 2, timeout=None))
    assert isinstance(outcome.error, FaultNotFired)
    assert outcome.error.summary == (
        "kill of rank 0 at collective #9 never fired; hang of rank 1 at collective #8 never fired"
    )
    assert outcome.suspect is False


def test_a_rank_its_fault_ended_gets_its_fault_fired_in_its_slot() -> None:
    kill = faults.kill(1, 2)
    replies: dict[int, Reply] = {
        0: done("zero", unfired=("not judged: a fault ended a rank",)),
        1: Faulted(Fired(0, KILLED, 1.5, True), Died(-9, 2.0)),
        2: done("two", collectives=5),
    }
    outcome = classify(Evidence(replies, 3, timeout=None, faults=[kill]))
    assert outcome.values == ["zero", FaultFired(kill, KILLED, 1.5), "two"]
    assert (outcome.error, outcome.suspect, outcome.reusable) == (None, False, False)


def test_a_value_that_does_not_unpickle_beside_a_fault_is_the_error() -> None:
    replies: dict[int, Reply] = {
        0: Done(b"not a pickle"),
        1: Faulted(Fired(0, KILLED, 1.5, True)),
    }
    outcome = classify(Evidence(replies, 2, timeout=None, faults=[faults.kill(1, 2)]))
    assert isinstance(outcome.error, RankError)
    assert outcome.error.summary.startswith("could not unpickle the return value of rank 0")
    assert outcome.values is None


# ---------------------------------------------------------------- a rank raised or died


@pytest.mark.parametrize(
    ("first", "then", "kind"),
    [(failed(0, 1.0), Died(-9, 2.0), RankError), (failed(0, 2.0), Died(-9, 1.0), RankCrash)],
    ids=["raised-first", "died-first"],
)
def test_the_earliest_failure_decides_between_raised_and_crashed(
    first: Failed, then: Died, kind: type[RankError]
) -> None:
    replies: dict[int, Reply] = {0: first, 1: then, 2: done("two")}
    outcome = classify(Evidence(replies, 4, timeout=5.0))
    assert type(outcome.error) is kind
    # The values of the ranks that returned are kept, for the --dist-mptc check.
    assert outcome.returned == {2: pickle.dumps("two")}
    assert outcome.error.summary.endswith("; rank 3 torn down")


def test_a_failure_names_what_the_faults_did_in_the_order_they_acted() -> None:
    fired = {2: Fired(0, HUNG, 2.0, True), 1: Fired(1, KILLED, 1.0, True)}
    replies: dict[int, Reply] = {0: failed(0, 3.0), 2: Faulted(fired[2]), 1: Faulted(fired[1])}
    seen = Evidence(replies, 4, timeout=5.0, fired=fired, certain=True)
    outcome = classify(seen)
    assert type(outcome.error) is RankError  # a failure wins over a proven hang
    assert outcome.error.summary == (
        f"rank 0 raised ValueError: boom; rank 3 torn down; rank 1 {KILLED} (injected); "
        f"rank 2 {HUNG} (injected)"
    )


def test_a_failed_calls_error_shows_each_ranks_collectives_from_where_they_were_kept() -> None:
    own, fetched, silent = trace(COMPLETED), trace(COMPLETED), trace(IN_FLIGHT)
    replies: dict[int, Reply] = {0: Failed(failed(0, 1.0).failure, 1.0, own), 1: done("one")}
    traces = {1: fetched, 2: silent}
    outcome = classify(Evidence(replies, 3, timeout=5.0, traces=traces))
    assert outcome.error is not None
    assert outcome.error.collectives == {0: own, 1: fetched, 2: silent}


def test_a_failed_call_that_issued_no_collective_shows_none() -> None:
    outcome = classify(Evidence({0: failed(0, 1.0)}, 2, timeout=5.0))
    assert outcome.error is not None
    assert (outcome.error.collectives, outcome.error.verdicts) == ({}, [])


# ---------------------------------------------------------------- skips


def test_a_skip_on_some_ranks_wins_over_ranks_still_silent() -> None:
    replies: dict[int, Reply] = {0: Skipped("no GPU", "pytest", at=1.0)}
    outcome = classify(Evidence(replies, 2, timeout=5.0, certain=True))
    assert type(outcome.error) is RankError
    assert outcome.error.summary == (
        "rank 0 skipped but rank 1 did not; a distributed run must skip on every rank or on "
        "none (rank 0: no GPU)"
    )
    assert outcome.returned == {}


# ---------------------------------------------------------------- ranks still silent


def test_a_proven_hang_names_the_silent_ranks_and_what_the_faults_did() -> None:
    stacks = {0: "", 1: "stack one\n"}
    fired = {0: Fired(0, HUNG, 1.0, True)}
    replies: dict[int, Reply] = {0: Faulted(fired[0])}
    seen = Evidence(replies, 2, timeout=60.0, stacks=stacks, fired=fired, certain=True)
    error = classify(seen).error
    assert type(error) is WorldHang
    assert error.summary == (
        "the run can never finish: rank 1 waits in a collective that cannot complete (their "
        f"stacks follow; the ranks were then killed); rank 0 {HUNG} (injected)"
    )
    assert list(error.failures) == [1]


@pytest.mark.parametrize(("stopped", "after"), [(11.0, "10.0"), (0.5, "0.0")])
def test_a_timeout_after_a_fault_says_how_long_after_the_first_one(
    stopped: float, after: str
) -> None:
    fired = {0: Fired(1, DELAYED, 3.0, False), 1: Fired(0, DELAYED, 1.0, False)}
    seen = Evidence({}, 2, timeout=10.0, fired=fired, stopped=stopped)
    error = classify(seen).error
    assert type(error) is WorldTimeout
    assert error.summary == (
        f"the run did not finish within 10 s: ranks 0, 1 still running {after} s after rank 1 "
        f"{DELAYED} (their stacks at the deadline follow; the ranks were then killed)"
    )
    assert error.timeout == 10.0
