"""Finding hangs that can never end while a call runs.

The ranks' traces are asked for once a call has run :data:`FIRST_PROBE_S`, then every
:data:`PROBE_EVERY_S`, and judged by :func:`verdicts.can_never_finish`. What ends a call
early is the proof, not its verdict: with the desync check on, ranks inside collectives that
differ are a mismatch, reported as one (:mod:`~harness.controller.classify`) as it would be
had the backend completed them or the deadline come first.

A call that returns sooner costs nothing. The request is answered by each rank's watchdog
thread (as at a deadline), and read back without blocking: the supervisor keeps reading
replies meanwhile. Only what the traces prove ends a call early (a rank inside a collective,
a rank that returned), never how long anything took: a rank still running Python code, however
slowly, leaves the call to its deadline.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from harness.controller import verdicts
from harness.controller.outcome import Faulted, Reply
from harness.controller.spawn import RankProcess
from harness.faults import Fault
from harness.protocol.messages import Done
from harness.protocol.traces import RankTrace

FIRST_PROBE_S = 0.1
"""How long a call runs before the ranks are first asked for their traces: a call that
blocks at once for good (a rank that returned early, mismatched ops) is reported about this
soon, and the many calls that end sooner never pay for a round."""

PROBE_EVERY_S = 0.5
"""How long after each round the next one starts: a hang that can never end is reported
about this long after the ranks block."""

_READ_EVERY_S = 0.01
"""While a round is out, how often the answers are looked for."""


class HangWatch:
    """Ask the silent or returned ranks for their traces, round after round, and say when one
    round proves the call can never finish, or never pass.

    A rank that an injected ``hang`` fault holds is judged as one that ended where the fault
    acted: it never issues another collective. So is one that returned after an injected
    ``error`` raised in place of a collective: that collective never ran there. A rank a
    fault killed or made exit is not: its peers fail by themselves as its connections close,
    and that failure is the verdict.

    ``desync_check`` and ``deadline`` are as :func:`verdicts.can_never_finish` takes them.
    """

    def __init__(
        self,
        ranks: list[RankProcess],
        *,
        desync_check: bool,
        deadline: float | None = None,
        faults: Sequence[Fault] = (),
    ) -> None:
        self._ranks = ranks
        self._faults = faults
        self._hang_faults = {index for index, fault in enumerate(faults) if fault.kind == "hang"}
        # The ranks a hang fault holds, with their traces when it acted: known without asking.
        self._held: dict[int, RankTrace | None] = {}
        self._desync_check = desync_check
        self._deadline = deadline
        self._asked: dict[int, RankProcess] = {}
        # Each asked rank's state when asked: one that returned later is judged as running,
        # its trace being of that time (a trace older than the return proves nothing).
        self._states: dict[int, str] = {}
        self._traces: dict[int, RankTrace] = {}
        self.next_at = time.monotonic() + FIRST_PROBE_S
        """``time.monotonic()`` value at which :meth:`step` has work to do."""
        self.active = True
        """False once a round was given up (a rank failed or died meanwhile): an answer to
        it could come late and pass for a later round's, so the call is not judged again."""

    def step(self, replies: dict[int, Reply]) -> bool:
        """Start a round, or read the answers to the one out; whether they prove a hang."""
        if not self._asked:
            self._ask(replies)
            self.next_at = time.monotonic() + (_READ_EVERY_S if self._asked else PROBE_EVERY_S)
            return False
        for rank, proc in list(self._asked.items()):
            if rank in self._traces:
                continue
            trace = proc.files.trace()
            if trace is not None:
                self._traces[rank] = trace
            elif not proc.alive():
                self.active = False  # a death: the supervisor sees it and decides
                return False
        if len(self._traces) < len(self._asked):
            self.next_at = time.monotonic() + _READ_EVERY_S
            return False
        asked, traces, states = self._asked, self._traces, self._states
        self._asked, self._traces, self._states = {}, {}, {}
        self.next_at = time.monotonic() + PROBE_EVERY_S
        # A rank that failed or died meanwhile: the supervisor's to report.
        if any(rank in replies and not isinstance(replies[rank], Done) for rank in asked):
            return False
        found: dict[int, RankTrace | None] = {**traces, **self._held}
        states.update(dict.fromkeys(self._held, verdicts.DIED))
        for fault in self._faults:
            trace = found.get(fault.rank)
            if fault.kind == "error" and trace is not None and states[fault.rank] == verdicts.DONE:
                found[fault.rank] = _without(trace, fault)
        return verdicts.can_never_finish(
            found,
            states,
            len(self._ranks),
            desync_check=self._desync_check,
            deadline=self._deadline,
        )

    def settle(self, timeout_s: float = 2.0) -> None:
        """Wait at most ``timeout_s`` for the answers to a round still out, which the next
        call's first round must not read as its own."""
        if not self._asked:  # as after every call that ended within FIRST_PROBE_S
            return
        end = time.monotonic() + timeout_s
        waiting = [p for rank, p in self._asked.items() if rank not in self._traces]
        while waiting and time.monotonic() < end:
            waiting = [p for p in waiting if p.alive() and p.files.trace() is None]
            if waiting:
                time.sleep(_READ_EVERY_S)
        self._asked, self._traces, self._states = {}, {}, {}

    def _ask(self, replies: dict[int, Reply]) -> None:
        """Ask every silent or returned rank (each alive) for its trace."""
        self._held = {}
        hangs = self._hang_faults
        for proc in self._ranks:
            reply = replies.get(proc.rank)
            # A rank a hang fault holds is alive, never to go on.
            if isinstance(reply, Faulted) and reply.then is None and reply.fired.index in hangs:
                self._held[proc.rank] = reply.fired.trace
                continue
            if (reply is not None and not isinstance(reply, Done)) or not proc.ask_trace():
                continue
            self._asked[proc.rank] = proc
            self._states[proc.rank] = verdicts.DONE if reply is not None else verdicts.RUNNING
        if len(self._asked) + len(self._held) < len(self._ranks):
            # A rank that failed is the supervisor's to report; one we could not ask leaves
            # the round without proof, and the requests sent make the next ones ambiguous.
            self.active = not self._asked
            self._asked.clear()
            self._states.clear()


def _without(trace: RankTrace, fault: Fault) -> RankTrace:
    """``trace`` as though the rank had stopped before the collective ``fault`` (an
    ``error``) raised in place of."""
    groups = dict(trace.groups)
    for key, history in groups.items():
        # A fault placed by what its collective is has its number in the rank alone: the
        # group's first collective that raised is taken for the one it raised in place of.
        placed = fault.at if isinstance(fault.at, int) else history.raised
        if history.ranks == fault.group and history.raised and history.raised == placed:
            groups[key] = replace(history, count=history.raised - 1)
    return replace(trace, groups=groups)
