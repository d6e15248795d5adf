"""One round with a world's ranks: send every rank a message, wait, gather evidence, judge."""

from __future__ import annotations

import os
import pickle
import time
from dataclasses import dataclass

from harness import compat
from harness.controller import spawn, waiting
from harness.controller.certain import HangWatch
from harness.controller.classify import classify, desync, faults_fired
from harness.controller.leak_reports import leak_error
from harness.controller.outcome import Classified, Evidence, Faulted, Reply
from harness.controller.spawn import RankProcess
from harness.controller.wait_rules import CERTAIN
from harness.errors import note_interrupt
from harness.protocol.messages import Call, CallOptions, Done, Fired, Regroup
from harness.protocol.traces import RankTrace, render


def call_message(
    payload: bytes,
    options: CallOptions,
    started: dict[bytes, bytes],
    rendezvous_file: str | None,
    check_leaks: bool,
    memory_growth: int = 0,
) -> Call:
    """The ``Call`` of ``payload`` run as ``options`` say: ``env`` is how ``os.environ``
    changed since the ranks ``started``; ``rendezvous_file``, a private rendezvous for a
    world without a group; ``check_leaks`` and ``memory_growth``, the world's."""
    rendezvous = None
    if rendezvous_file is not None:
        port = str(spawn.free_port())
        rendezvous = {"MASTER_PORT": port, "INIT_METHOD": "file://" + rendezvous_file}
    changes = _environ_changes(started)
    return Call(payload, options, changes, rendezvous, check_leaks, memory_growth)


def _environ_changes(started: dict[bytes, bytes]) -> dict[str, str | None] | None:
    """How ``os.environ`` differs from ``started``: new values, None for removed variables."""
    now = compat.environ_bytes()
    if now == started:
        return None
    # Set operations on the dicts' views: a test changes a variable or two of a hundred.
    changes: dict[str, str | None] = {
        os.fsdecode(k): os.fsdecode(v) for k, v in now.items() - started.items()
    }
    changes.update((os.fsdecode(k), None) for k in started.keys() - now.keys())
    return changes or None


def exchange(
    ranks: list[RankProcess],
    message: Call | Regroup | None,
    timeout: float | None,
    what: str,
    *,
    init: bool,
    leaks: str,
) -> tuple[Classified, dict[int, Reply]]:
    """Send ``message`` (None: the ranks are starting) to every rank, gather their replies
    within ``timeout`` and classify them; ``what`` names the call or what starts. A Ctrl-C
    during a call is re-raised with the ranks' collectives and stacks noted."""
    options = message.options if isinstance(message, Call) else None
    try:
        _send(ranks, message)
        waited = _wait(ranks, timeout, options)
        seen = _evidence(ranks, waited, timeout, what, init=init, options=options)
        return _judge(ranks, seen, what, leaks, options), waited.replies
    except KeyboardInterrupt as interrupt:
        if options is not None:
            _note_where(interrupt, ranks, what)
        raise


@dataclass(frozen=True)
class _Waited:
    """How the wait for a round's replies ended.

    Attributes:
        replies: What was seen of each rank, by rank (a rank still silent is missing).
        stopped_by: Why the wait stopped (``Supervision.stopped_by``).
        fired: What each rank said as its fault acted, by rank.
        stopped: ``time.monotonic()`` when the wait ended.
    """

    replies: dict[int, Reply]
    stopped_by: str
    fired: dict[int, Fired]
    stopped: float


def _send(ranks: list[RankProcess], message: Call | Regroup | None) -> None:
    """Send ``message`` to every rank (None: nothing, the ranks are starting)."""
    if message is None:
        return
    data = pickle.dumps(message)  # once for every rank: once per rank costs more
    for proc in ranks:
        try:
            proc.conn.send_bytes(data)
        except OSError:
            pass  # died while idle; its sentinel reports it


def _wait(ranks: list[RankProcess], timeout: float | None, options: CallOptions | None) -> _Waited:
    """Wait for every rank's reply (or death) within ``timeout``; a call's wait also ends
    once the ranks' traces prove it can never finish, or never pass."""
    deadline = time.monotonic() + timeout if timeout is not None else None
    fired: dict[int, Fired] = {}
    watch = None
    if options is not None:
        checks = options.check_collectives
        watch = HangWatch(ranks, desync_check=checks, deadline=timeout, faults=options.faults)
    replies, stopped_by = waiting.gather(ranks, deadline, fired, watch)
    if watch is not None:
        watch.settle()
    return _Waited(replies, stopped_by, fired, time.monotonic())


def _evidence(
    ranks: list[RankProcess],
    waited: _Waited,
    timeout: float | None,
    what: str,
    *,
    init: bool,
    options: CallOptions | None,
) -> Evidence:
    """What the round's end is judged from: the replies, and for a failed call what the ranks
    that did not answer, or returned, were doing: their collectives (asked first, answered at
    once by their watchdog), then their stacks. A failure's own reply carries its
    collectives."""
    replies = waited.replies
    done = [proc for proc in ranks if isinstance(replies.get(proc.rank), Done)]
    asked = [proc for proc in ranks if proc.rank not in replies] + done
    failed = options is not None and len(done) < len(ranks) and asked
    traces = waiting.traces_now(asked) if failed else {}
    return Evidence(
        replies,
        len(ranks),
        timeout=timeout,
        stacks=waiting.stacks_now(ranks) if waited.stopped_by else {},
        starting=what if options is None else None,
        init=init,
        traces=traces,
        check_collectives=options is not None and options.check_collectives,
        faults=options.faults if options is not None else (),
        fired=waited.fired,
        stopped=waited.stopped,
        certain=waited.stopped_by == CERTAIN,
    )


def _judge(
    ranks: list[RankProcess], seen: Evidence, what: str, leaks: str, options: CallOptions | None
) -> Classified:
    """What the round amounts to: ``classify``'s verdict, completed by the desync check's
    second half and, with ``leaks="error"``, a leak made an error."""
    outcome = classify(seen)
    if outcome.suspect:
        # The ranks' fingerprints differ: their traces say how (kept since the call).
        outcome = desync(outcome, waiting.traces_now(ranks), seen.world_size)
    if outcome.leaks and leaks == "error" and outcome.error is None:
        outcome = leak_error(outcome, what)
    outcome.fired = faults_fired(seen)
    if options is not None and options.keep_traces and outcome.values is not None:
        kept = {rank: _kept_trace(seen.replies.get(rank)) for rank in range(seen.world_size)}
        outcome.traces = kept
    return outcome


def _kept_trace(reply: Reply | None) -> RankTrace | None:
    """A rank's trace of a call that succeeded, or of a rank a fault ended, when it acted."""
    if isinstance(reply, Faulted):
        return reply.fired.trace
    return reply.trace if isinstance(reply, Done) else None


def _note_where(interrupt: KeyboardInterrupt, ranks: list[RankProcess], what: str) -> None:
    """Note on a Ctrl-C during a call where each rank was, as a timeout says (a second
    Ctrl-C meanwhile leaves the caller to stop them all the same)."""
    traces, stacks = waiting.traces_now(ranks), waiting.stacks_now(ranks)
    note_interrupt(
        interrupt,
        f"{what} was interrupted (KeyboardInterrupt); each rank's collectives and "
        "stack at the interrupt follow (the ranks were then stopped)",
        stacks,
        render(traces, len(ranks)),
    )
