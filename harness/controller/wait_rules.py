"""The rules of waiting for a call's ranks: one state per rank, one case per message.

:class:`Supervision` is what :func:`harness.controller.waiting.gather` feeds with what each
rank says (or how it died), and asks when to wake next and whether the wait is over. It does
no I/O and reads the time from the clock it is given, so the rules can be driven by a script.

The rules: once a rank fails or skips, the others get a grace period to report (a peer
blocked in a collective with a rank that exited fails at once), after which the wait is over
and the caller tears down those still silent. A pytest test whose body failed says so before
its fixtures' teardown (``Failing``): that is the rank's ``Failed`` from then on, dated when
the body failed, also when it is torn down before it answers. A rank whose injected fault
ended it (``Fired.ends``) is waited for no longer. With a watch
(:class:`~harness.controller.certain.HangWatch`), the wait also ends once the ranks' traces
prove the call can never finish, or never pass.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Protocol

from harness.controller.outcome import Died, Faulted, Reply
from harness.protocol.messages import Done, Failed, Failing, Fired, RankMessage, Ready, Skipped

FAILURE_GRACE_S = 0.5
"""After the first failure, how long the other ranks get to report before they are torn down."""

SKIP_GRACE_S = 2.0
"""After the first skip, how long the other ranks get to finish (a skip is usually unanimous)."""

DEADLINE = "deadline"
"""Why the wait stopped: the deadline passed."""
CERTAIN = "certain"
"""Why the wait stopped: the ranks' traces prove the call can never finish, or never pass."""


class State(enum.Enum):
    """Where one rank stands in the wait."""

    RUNNING = "running"
    """Silent so far: waited for."""
    FAILING = "failing"
    """Its test body failed and it tears down its fixtures: waited for its ``Failed``."""
    FAULT_ENDED = "fault-ended"
    """Its injected fault ended it: waited for no longer, though a death still counts."""
    ANSWERED = "answered"
    """It answered (returned, failed, skipped, is ready)."""
    DIED = "died"
    """Its process ended without answering."""


_WAITED = (State.RUNNING, State.FAILING, State.FAULT_ENDED)
"""The states in which what the rank says next is taken."""


class HangCheck(Protocol):
    """What :class:`Supervision` asks of a ``HangWatch``."""

    active: bool
    next_at: float

    def step(self, replies: dict[int, Reply]) -> bool:
        """Do the work due at ``next_at``; whether the ranks' traces prove a hang."""


class Supervision:
    """The wait for one reply (or death) per rank: each rank's state, the deadline and grace.

    ``deadline`` is a value of ``clock`` (None: no bound); ``fired`` is filled with the
    ``Fired`` each rank sent. ``replies`` holds each rank's final reply, or while it is
    waited for, the ``Failed`` of its ``Failing`` or the ``Faulted`` of the fault that ended
    it; ``stopped_by`` says why the wait is over (see :meth:`wake`), None while it goes on.
    """

    def __init__(
        self,
        ranks: Iterable[int],
        deadline: float | None,
        fired: dict[int, Fired] | None = None,
        watch: HangCheck | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replies: dict[int, Reply] = {}
        self.fired = {} if fired is None else fired
        self.stopped_by: str | None = None
        self._states = dict.fromkeys(ranks, State.RUNNING)
        self._deadline = deadline
        self._grace_end: float | None = None
        self._watch = watch
        self._clock = clock

    def state(self, rank: int) -> State:
        """Where ``rank`` stands."""
        return self._states[rank]

    def waits_for(self, rank: int) -> bool:
        """Whether what ``rank`` says next is taken: it has not answered, nor the wait ended."""
        return self.stopped_by is None and self._states[rank] in _WAITED

    @property
    def ends_returned(self) -> bool:
        """Whether the ranks that returned should end now: a fault ended a rank while others
        are waited for (a peer blocked on a returned rank then fails instead of hanging)."""
        if not self.fired:  # as in nearly every call: no fault acted
            return False
        pending = any(state in _WAITED for state in self._states.values())
        return pending and any(fired.ends for fired in self.fired.values())

    def wake(self) -> tuple[str | None, float | None]:
        """Whether the wait is over, or how long to sleep.

        Returns:
            Why the wait is over: ``DEADLINE``, ``CERTAIN``, or '' (every rank answered,
            only ranks a fault ended are left, or a failure's grace ran out), and None; or
            None and the seconds until it must be asked again (None: not before a message).
        """
        if self.stopped_by is None:
            self.stopped_by, timeout = self._wake()
            return self.stopped_by, timeout
        return self.stopped_by, None

    def _wake(self) -> tuple[str | None, float | None]:
        pending = [state for state in self._states.values() if state in _WAITED]
        if all(state is State.FAULT_ENDED for state in pending):
            return "", None  # also when none is left
        now = self._clock()
        limits = [t for t in (self._deadline, self._grace_end) if t is not None]
        if limits and now >= min(limits):
            past_deadline = self._deadline is not None and now >= self._deadline
            return (DEADLINE if self._grace_end is None or past_deadline else ""), None
        watch = self._watch
        # Not during a failure's grace: the failure is the verdict. After a fault, yes: the
        # watch judges what the fault left (a rank it hangs, a rank that handled its error).
        if watch is not None and watch.active and self._grace_end is None:
            if now >= watch.next_at and watch.step(self.replies):
                return CERTAIN, None
            limits.append(watch.next_at)
        return None, (min(limits) - now if limits else None)

    def receive(self, rank: int, message: RankMessage | Died) -> None:
        """Take what ``rank`` said, or its death, if the wait still takes it."""
        if not self.waits_for(rank):
            return
        fired = self.fired.get(rank)
        match message:
            case Failing():
                self.replies[rank] = Failed(message.failure, message.at, message.trace)
                self._grace(FAILURE_GRACE_S)
                if self._states[rank] is State.RUNNING:
                    self._states[rank] = State.FAILING
            case Fired():
                self.fired[rank] = message
                if message.ends:
                    self._states[rank] = State.FAULT_ENDED
                    self.replies.setdefault(rank, Faulted(message))
            case Died() if fired is not None and fired.ends:
                self._answer(rank, Faulted(fired, message), State.DIED)
            case Died():
                self._answer(rank, message, State.DIED)
            case Failed() if fired is not None and message.fault:
                self._answer(rank, Faulted(fired, message), State.ANSWERED)
            case Ready() | Done() | Failed() | Skipped():
                self._answer(rank, message, State.ANSWERED)

    def _answer(self, rank: int, reply: Reply, state: State) -> None:
        """Record the rank's final reply; after a failure, start the others' grace."""
        early = self.replies.get(rank)
        if isinstance(early, Failed):  # only a Failing leaves a Failed while waited for
            # The call's end after a Failing: dated when the body failed; a rank that died in
            # its teardown is reported with the body's failure. Peers blocked in a collective
            # with it fail once it exits, which is now: they get their grace from here.
            reply = replace(reply, at=early.at) if isinstance(reply, Failed) else early
            self._grace(FAILURE_GRACE_S, extend=True)
        self.replies[rank] = reply
        self._states[rank] = state
        if not isinstance(reply, (Ready, Done, Faulted)):
            self._grace(SKIP_GRACE_S if isinstance(reply, Skipped) else FAILURE_GRACE_S)

    def _grace(self, seconds: float, extend: bool = False) -> None:
        """Give the others ``seconds`` from now: the earliest end stands, unless ``extend``."""
        end = self._clock() + seconds
        if self._grace_end is None:
            self._grace_end = end
        else:
            self._grace_end = max(self._grace_end, end) if extend else min(self._grace_end, end)
