"""What the ranks' replies amount to (values, a skip, or a harness error): pure logic, no
files, no processes, so every case is unit-tested on plain data."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TypeVar

from harness.controller import verdicts
from harness.controller.outcome import Classified, Died, Evidence, Faulted, Reply
from harness.errors import (
    CollectiveMismatch,
    DistributedError,
    FaultNotFired,
    RankCrash,
    RankError,
    WorldHang,
    WorldTimeout,
)
from harness.faults import FaultFired
from harness.protocol.failures import (
    EXIT_MAIN_REIMPORTED,
    MAIN_GUARD_HINT,
    RankFailure,
    ranks_phrase,
    skip_line,
)
from harness.protocol.messages import Done, Failed, Fired, Ready, Skipped
from harness.protocol.traces import RankTrace


def classify(seen: Evidence) -> Classified:
    """Decide what a call (or the start of a world) amounts to.

    Args:
        seen: What was seen of the ranks, and what the call asked for.

    Returns:
        For a call: the values (``suspect`` when the fingerprints differ), the skip when
        every rank skipped, or the error with the ranks' collectives and verdicts (a rank a
        fault ended is no failure). For a start: an error unless every rank is ``Ready``.
    """
    ending = _ending(seen)
    return ending(seen)


def _ending(seen: Evidence) -> Callable[[Evidence], Classified]:
    """Which way the call (or the start) ended, told apart here alone, the first that holds
    taking precedence: the function that judges that way. A desync (``suspect``) and a leak
    are judged afterwards (:func:`desync`, :mod:`~harness.controller.leak_reports`)."""
    replies = list(seen.replies.values())
    returned = sum(isinstance(reply, (Done, Faulted)) for reply in replies)
    skipped = sum(isinstance(reply, Skipped) for reply in replies)
    first = _first_failure(seen)
    if seen.starting is not None:
        return _start
    if returned == seen.world_size:
        return _fault_ended if any(isinstance(r, Faulted) for r in replies) else _returned
    if skipped == seen.world_size:
        return _skipped
    if first is not None:  # the rank that raised or died first is the root cause
        return _crashed if isinstance(seen.replies[first], Died) else _raised
    if skipped:
        return _skipped_on_some
    # Ranks still silent. A collective that differs is the root cause, whether the backend
    # completes it (then the desync check finds it) or hangs in it, and whether the hang
    # was proven before the deadline: the verdict must not depend on which came first.
    found = _first_mismatch(seen) if seen.check_collectives else None
    if found is not None:
        return functools.partial(_mismatched, found)
    return _hung if seen.certain else _timed_out


def desync(
    outcome: Classified, traces: Mapping[int, RankTrace | None], world_size: int
) -> Classified:
    """The desync check's second half, for a ``suspect`` outcome: the ranks' whole traces
    compared; ``outcome`` when they agree after all, else a ``CollectiveMismatch`` outcome."""
    states = dict.fromkeys(range(world_size), verdicts.DONE)
    # A collective that raised where the test handled the error is no desync, nor is what
    # followed it on its group: only what completed on every member is compared.
    marks = _verdicts(traces, states, world_size, until_raised=True)
    found = [mark.text for mark in marks]
    missing = [rank for rank, trace in traces.items() if trace is None]
    if not found and not missing:
        return outcome
    if not found:
        found = [
            "the ranks' collectives differ (their counts or ops per group), but "
            f"{ranks_phrase(missing)} did not say which"
        ]
    error = CollectiveMismatch(
        "every rank returned, but their collectives do not match, so the results may be "
        f"wrong: {found[0]}"
    )
    error.collectives = dict(traces)
    error.verdicts = found
    error.marks = [(mark.group, mark.seq, mark.kind) for mark in marks]
    return Classified(
        error=error, outputs=outcome.outputs, notice=outcome.notice, leaks=outcome.leaks
    )


def _start(seen: Evidence) -> Classified:
    """A world's start (or a fresh default group): no values, unless a rank is not ``Ready``."""
    replies = seen.replies
    if all(isinstance(replies.get(rank), Ready) for rank in range(seen.world_size)):
        return Classified(values=[])
    bound = f" after {seen.timeout:g} s" if seen.timeout is not None else ""
    failures: dict[int, RankFailure] = {}
    for rank in range(seen.world_size):
        reply = replies.get(rank)
        if isinstance(reply, (Failed, Died)):
            failures[rank] = _failure_of(rank, reply)
        elif reply is None:
            what = f"not up{bound} (or torn down after a peer failed)"
            failures[rank] = RankFailure.still_running(rank, what, seen.stacks.get(rank, ""))
    names = ", ".join(f"rank {rank}" for rank in failures)
    exits = {reply.exitcode for reply in replies.values() if isinstance(reply, Died)}
    hint = MAIN_GUARD_HINT if EXIT_MAIN_REIMPORTED in exits else ""
    summary = f"{seen.starting} did not start: {names} did not come up"
    return Classified(error=DistributedError(summary, failures, hint=hint))


def _returned(seen: Evidence) -> Classified:
    """Every rank returned: their values, unless a fault never acted; ``suspect`` when their
    fingerprints differ."""
    done = _of(seen, Done)
    outcome = _values(done, seen.init)
    if outcome.error is not None:
        return outcome
    unfired = [line for reply in done.values() for line in reply.unfired]
    if unfired:
        outcome.error = FaultNotFired("; ".join(unfired))
    elif seen.check_collectives:
        prints = {rank: reply.collectives for rank, reply in done.items()}
        outcome.suspect = not verdicts.agree(prints, seen.world_size)
    return outcome


def _fault_ended(seen: Evidence) -> Classified:
    """Every rank returned or its fault ended it: the values, with a ``FaultFired`` in the slot
    of each rank a fault ended; the world is not reused."""
    outcome = _values(_of(seen, Done), seen.init)
    if outcome.values is not None:
        for rank, reply in sorted(_of(seen, Faulted).items()):
            outcome.values.insert(rank, _fault_fired(seen, reply.fired))
        outcome.reusable = False  # a rank died, hangs, or its collective raised
    return outcome


def _skipped(seen: Evidence) -> Classified:
    """Every rank skipped: the earliest skip."""
    return Classified(skip=min(_of(seen, Skipped).values(), key=lambda m: m.at))


def _raised(seen: Evidence) -> Classified:
    """A rank raised first (others may have failed or died after it)."""
    failures, summary = _rank_failures(seen)
    return _failed(seen, RankError(summary, failures), returned=_returned_values(seen))


def _crashed(seen: Evidence) -> Classified:
    """A rank's process died first (others may have failed or died after it)."""
    failures, summary = _rank_failures(seen)
    codes = {r: m.exitcode or 0 for r, m in seen.replies.items() if isinstance(m, Died)}
    error = RankCrash(summary, failures, codes)
    return _failed(seen, error, returned=_returned_values(seen))


def _skipped_on_some(seen: Evidence) -> Classified:
    """Some ranks skipped, the others did not (and none failed)."""
    skipped = _of(seen, Skipped)
    reasons = "; ".join(skip_line(r, m.reason, m.site) for r, m in sorted(skipped.items()))
    others = [rank for rank in range(seen.world_size) if rank not in skipped]
    in_order = sorted(skipped.items(), key=lambda item: item[1].at)
    summary = (
        f"{ranks_phrase(list(skipped))} skipped but {ranks_phrase(others)} did not; a "
        f"distributed run must skip on every rank or on none ({reasons})"
    )
    failures = {rank: RankFailure.skipped(rank, skip.reason, skip.site) for rank, skip in in_order}
    return _failed(seen, RankError(summary, failures))


def _mismatched(found: verdicts.Finding, seen: Evidence) -> Classified:
    """Ranks were still silent when the wait stopped (at the deadline, or once their traces
    proved the call could not pass), and the ranks' collectives differ: ``found``, the first
    collective that does."""
    silent = _silent(seen)
    if seen.certain:
        what = "stopped: the ranks' collectives differ"
        stopped = f"the run was stopped with {ranks_phrase(silent)} still running"
        stacks = "their stacks follow"
    else:
        what = "still running" + (f" after {seen.timeout:g} s" if seen.timeout is not None else "")
        stopped, stacks = f"{ranks_phrase(silent)} {what}", "their stacks at the deadline follow"
    summary = (
        f"the ranks' collectives do not match: {found.text}; {stopped} ({stacks}; the ranks "
        f"were then killed){_by_faults(seen)}"
    )
    return _failed(seen, CollectiveMismatch(summary, _still_running(seen, what)))


def _hung(seen: Evidence) -> Classified:
    """The ranks' traces proved that the silent ranks' collectives can never complete."""
    silent = _silent(seen)
    failures = _still_running(seen, "blocked in a collective that can never complete", "WorldHang")
    waits = "waits in a collective that" if len(silent) == 1 else "wait in collectives that"
    summary = (
        f"the run can never finish: {ranks_phrase(silent)} {waits} cannot complete "
        f"(their stacks follow; the ranks were then killed){_by_faults(seen)}"
    )
    return _failed(seen, WorldHang(summary, failures, _every_stack(seen)))


def _timed_out(seen: Evidence) -> Classified:
    """The deadline passed with ranks still silent."""
    timeout = seen.timeout
    bound = f" within {timeout:g} s" if timeout is not None else ""
    what = f"still running after {timeout:g} s" if timeout is not None else "still running"
    silent = _silent(seen)
    failures = _still_running(seen, what)
    after = ""
    if seen.fired:
        rank, first = _fired_in_order(seen)[0]
        after = f" {max(seen.stopped - first.at, 0.0):.1f} s after rank {rank} {first.what}"
    summary = (
        f"the run did not finish{bound}: {ranks_phrase(silent)} still running{after} "
        "(their stacks at the deadline follow; the ranks were then killed)"
    )
    return _failed(seen, WorldTimeout(summary, failures, _every_stack(seen), timeout))


def _values(done: dict[int, Done], init: bool) -> Classified:
    """The values of the ranks that returned, by rank, and what the call left of the world;
    a ``RankError`` when a value does not unpickle."""
    values = []
    for rank in sorted(done):
        try:
            values.append(pickle.loads(done[rank].value))
        except Exception as exc:
            message = (
                f"could not unpickle the return value of rank {rank}: {type(exc).__name__}: {exc}"
            )
            failure = RankFailure(rank, type(exc).__name__, message, message + "\n")
            return Classified(error=RankError(message, {rank: failure}))
    # Without a harness group, groups out of step do not matter: every group is destroyed
    # before the next call, which resets the counters too.
    notice = _out_of_step(done) if init else ""
    reusable = all(reply.reusable for reply in done.values()) and not notice
    regroup = init and reusable and not any(reply.grouped for reply in done.values())
    leaks = {rank: reply.leaks for rank, reply in sorted(done.items()) if reply.leaks}
    return Classified(values=values, reusable=reusable, notice=notice, regroup=regroup, leaks=leaks)


def _out_of_step(done: dict[int, Done]) -> str:
    """Why a call that returned left the world unfit for the next one ('' when it did not):
    it destroyed the default group on some ranks only, or made groups on some ranks only."""
    gone = [rank for rank, reply in sorted(done.items()) if not reply.grouped]
    if 0 < len(gone) < len(done):
        kept = [rank for rank in sorted(done) if rank not in gone]
        return (
            f"the call destroyed the default process group on {ranks_phrase(gone)} only "
            f"({ranks_phrase(kept)} kept it), which leaves the ranks out of step; the world "
            "is rebuilt before the next call"
        )
    counts = {rank: reply.group_count for rank, reply in sorted(done.items())}
    if not gone and len(set(counts.values())) > 1:
        made = ", ".join(f"rank {rank}: {count}" for rank, count in counts.items())
        return (
            f"the call left the ranks' process-group counters out of step ({made}): "
            "new_group was called on some ranks only, so the ranks could not meet in their "
            "next group; the world is rebuilt before the next call"
        )
    return ""


def _failed(
    seen: Evidence, error: DistributedError, returned: dict[int, bytes] | None = None
) -> Classified:
    """A failed call's outcome: ``error``, given the ranks' collectives and the verdicts on
    them, and the pickled values of the ranks that had ``returned``."""
    _add_collectives(error, seen)
    return Classified(error=error, returned=returned or {})


def _first_failure(seen: Evidence) -> int | None:
    """The rank that raised or died first (None: none did)."""
    events = [(m.at, rank) for rank, m in seen.replies.items() if isinstance(m, (Failed, Died))]
    return min(events)[1] if events else None


def _rank_failures(seen: Evidence) -> tuple[dict[int, RankFailure], str]:
    """Each rank's failure, the root cause (the earliest) first, then the skips; and the
    summary: the root cause, who failed after it, who was torn down, what the faults did."""
    events = sorted((m.at, r) for r, m in seen.replies.items() if isinstance(m, (Failed, Died)))
    failures = {rank: _failure_of(rank, seen.replies[rank]) for _, rank in events}
    failures.update((r, RankFailure.skipped(r, m.reason)) for r, m in _of(seen, Skipped).items())
    root = next(iter(failures.values()))
    summary = f"rank {root.rank} {root.what_happened()}"
    later = [rank for rank in failures if rank != root.rank]
    if later:
        summary += f"; then {ranks_phrase(later)} failed"
    silent = _silent(seen)
    if silent:
        summary += f"; {ranks_phrase(silent)} torn down"
    return failures, summary + _by_faults(seen)


def _failure_of(rank: int, reply: Reply) -> RankFailure:
    """The failure a ``Failed`` or ``Died`` reply stands for."""
    if isinstance(reply, Failed):
        return reply.failure
    assert isinstance(reply, Died)
    failure = RankFailure.crash(rank, reply.exitcode, reply.dump)
    if reply.exit_call is None:
        return failure
    # It left through os._exit: the stack there stands for the traceback it does not have.
    where, stack = reply.exit_call
    message = f"{failure.message} through os._exit at {where}"
    return replace(failure, message=message, traceback=f"{stack}RankCrash: {message}\n")


def _returned_values(seen: Evidence) -> dict[int, bytes]:
    """The pickled values of the ranks that returned, by rank."""
    return {rank: reply.value for rank, reply in _of(seen, Done).items()}


def _silent(seen: Evidence) -> list[int]:
    """The ranks that had not answered when the wait stopped."""
    return [rank for rank in range(seen.world_size) if rank not in seen.replies]


def _still_running(
    seen: Evidence, what: str, error: str = "WorldTimeout"
) -> dict[int, RankFailure]:
    """The failure of each rank silent when the wait stopped: ``what`` it was doing, its stack."""
    return {
        rank: RankFailure.still_running(rank, what, seen.stacks.get(rank, ""), error)
        for rank in _silent(seen)
    }


def _every_stack(seen: Evidence) -> dict[int, str]:
    """Every rank's stack ('' where none was taken), by rank."""
    return {rank: seen.stacks.get(rank, "") for rank in range(seen.world_size)}


def faults_fired(seen: Evidence) -> tuple[FaultFired, ...]:
    """What each fault that acted during the call did, earliest first."""
    return tuple(_fault_fired(seen, message) for _, message in _fired_in_order(seen))


def _fault_fired(seen: Evidence, message: Fired) -> FaultFired:
    """What a rank said as its fault acted, as the public record of it."""
    fault = seen.faults[message.index]
    return FaultFired(
        fault, message.what, message.at, message.number, message.op, message.site, message.origin
    )


def _fired_in_order(seen: Evidence) -> list[tuple[int, Fired]]:
    """What each rank said as its fault acted, earliest first."""
    return sorted(seen.fired.items(), key=lambda item: item[1].at)


def _by_faults(seen: Evidence) -> str:
    """What the faults did, for a summary: the reader needs it to judge the survivors."""
    return "".join(f"; rank {rank} {f.what} (injected)" for rank, f in _fired_in_order(seen))


_Kind = TypeVar("_Kind", Done, Faulted, Skipped)


def _of(seen: Evidence, kind: type[_Kind]) -> dict[int, _Kind]:
    """The replies of one kind, by rank."""
    return {rank: reply for rank, reply in seen.replies.items() if isinstance(reply, kind)}


def _add_collectives(error: DistributedError, seen: Evidence) -> None:
    """Give a failed call's error each rank's collectives and the verdicts on them."""
    traces, states = _traces_and_states(seen)
    if not any(trace is not None and trace.recent for trace in traces.values()):
        return  # the call issued no collective: nothing to show
    error.collectives = traces
    found = _verdicts(traces, states, seen.world_size)
    error.verdicts = [mark.text for mark in found]
    error.marks = [(mark.group, mark.seq, mark.kind) for mark in found]


def _first_mismatch(seen: Evidence) -> verdicts.Finding | None:
    """The first collective that differs between the ranks, compared as the desync check
    compares them (before a collective that raised); None where they agree."""
    traces, states = _traces_and_states(seen)
    found = _verdicts(traces, states, seen.world_size, until_raised=True)
    return next((finding for finding in found if finding.kind == verdicts.MISMATCH), None)


def _traces_and_states(seen: Evidence) -> tuple[dict[int, RankTrace | None], dict[int, str]]:
    """Each rank's trace of the failed call, and where it stood, by rank."""
    traces: dict[int, RankTrace | None] = {}
    states: dict[int, str] = {}
    for rank in range(seen.world_size):
        traces[rank], states[rank] = _trace_and_state(rank, seen)
    return traces, states


def _trace_and_state(rank: int, seen: Evidence) -> tuple[RankTrace | None, str]:
    """A rank's trace of the failed call, and where it stood (a ``verdicts`` state)."""
    reply, fetched = seen.replies.get(rank), seen.traces.get(rank)
    if isinstance(reply, Done):
        return fetched, verdicts.DONE
    if isinstance(reply, (Failed, Skipped)):
        return reply.trace, verdicts.FAILED
    if isinstance(reply, Died):
        return None, verdicts.DIED
    if isinstance(reply, Faulted):
        # A kill or an exit ends the rank even where its death was not seen yet (a peer's
        # failure can end the wait first): the verdict must not depend on that.
        faults, index = seen.faults, reply.fired.index
        kind = faults[index].kind if index < len(faults) else ""
        died = reply.fired.ends and (reply.then is not None or kind in ("kill", "exit"))
        state = verdicts.DIED if died else verdicts.FAILED if reply.then else verdicts.RUNNING
        return fetched or reply.fired.trace, state
    return fetched, verdicts.RUNNING


def _verdicts(
    traces: Mapping[int, RankTrace | None],
    states: Mapping[int, str],
    world_size: int,
    *,
    until_raised: bool = False,
) -> list[verdicts.Finding]:
    """``verdicts.findings``, never raising: the traces are whatever the ranks' code left."""
    try:
        return verdicts.findings(traces, states, world_size, until_raised=until_raised)
    except Exception as exc:
        text = f"the ranks' collectives could not be compared ({type(exc).__name__}: {exc})"
        return [verdicts.Finding("", 0, "", text)]
