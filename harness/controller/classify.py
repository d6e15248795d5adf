"""What the ranks' replies amount to (values, a skip, or a harness error): pure logic, no
files, no processes, so every case is unit-tested on plain data."""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import replace

from harness.controller import verdicts
from harness.controller.outcome import Classified, Died, Faulted, Reply
from harness.errors import (
    CollectiveMismatch,
    DistributedError,
    FaultNotFired,
    RankCrash,
    RankError,
    RankLeak,
    WorldHang,
    WorldTimeout,
)
from harness.faults import Fault, FaultFired
from harness.protocol.failures import (
    EXIT_MAIN_REIMPORTED,
    MAIN_GUARD_HINT,
    RankFailure,
    ranks_phrase,
    skip_line,
)
from harness.protocol.messages import Done, Failed, Fired, Ready, Skipped
from harness.protocol.traces import RankTrace


def classify(
    replies: Mapping[int, Reply],
    world_size: int,
    *,
    timeout: float | None,
    stacks: Mapping[int, str] | None = None,
    starting: str | None = None,
    init: bool = True,
    traces: Mapping[int, RankTrace | None] | None = None,
    check_collectives: bool = True,
    faults: Sequence[Fault] = (),
    fired: Mapping[int, Fired] | None = None,
    stopped: float = 0.0,
    certain: bool = False,
) -> Classified:
    """Decide what a call (or the start of a world) amounts to.

    Args:
        replies: What was seen of each rank; a missing rank had not answered when the
            supervisor stopped waiting.
        timeout: The bound the supervisor waited under (None: none).
        stacks: The readable stacks of the ranks that had not answered.
        starting: For a world's start, how to name it (``"a world of 2 ranks (gloo)"``).
        init: Whether the world has a harness default group (without one, every group a
            call leaves is destroyed before the next call: none makes it unfit).
        traces: The traces of the ranks that had not answered or that returned while others
            failed (a failure's reply carries its own).
        check_collectives: Whether the desync check's first half runs (see :func:`desync`).
        faults, fired: The call's faults, and what each rank said as its fault acted.
        stopped: ``time.monotonic()`` when the wait ended.
        certain: The ranks' traces proved the call can never finish: a ``WorldHang``.

    Returns:
        For a call: the values (``suspect`` when the fingerprints differ), the skip when
        every rank skipped, or the error with the ranks' collectives and verdicts (a rank a
        fault ended is no failure). For a start: an error unless every rank is ``Ready``.
    """
    stacks = stacks or {}
    if starting is not None:
        return _start(replies, world_size, timeout, stacks, starting)
    done = {r: m for r, m in replies.items() if isinstance(m, Done)}
    faulted = {r: m for r, m in replies.items() if isinstance(m, Faulted)}
    skipped = {r: m for r, m in replies.items() if isinstance(m, Skipped)}
    if len(done) + len(faulted) == world_size:
        unfired = [line for reply in done.values() for line in reply.unfired]
        outcome = _values(done, init)
        if faulted and outcome.values is not None:
            for rank, reply in sorted(faulted.items()):
                act = reply.fired
                outcome.values.insert(rank, FaultFired(faults[act.index], act.what, act.at))
            outcome.reusable = False  # a rank died, hangs, or its collective raised
        elif unfired and outcome.error is None:
            outcome.error = FaultNotFired("; ".join(unfired))
        elif check_collectives and outcome.error is None:
            prints = {rank: reply.collectives for rank, reply in done.items()}
            outcome.suspect = not verdicts.agree(prints, world_size)
        return outcome
    if len(skipped) == world_size:
        return Classified(skip=min(skipped.values(), key=lambda m: m.at))
    outcome = _failed(
        replies, world_size, timeout, stacks, skipped, fired or {}, stopped, certain=certain
    )
    if outcome.error is not None:
        _add_collectives(outcome.error, replies, traces or {}, world_size, faults)
    return outcome


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


def leak_report(leaks: Mapping[int, tuple[str, ...]], call: str) -> str:
    """The warning for what ``call`` (``"test test_x.py::test_a"``) left behind: each finding
    once, with the ranks it was found on (a body alike on every rank leaks alike)."""
    items = "; ".join(f"{ranks}: {line}" for line, ranks in _grouped(leaks))
    return f"{call} left behind in a reused rank: {items}"


def leak_error(outcome: Classified, call: str) -> Classified:
    """A successful outcome with ``leaks`` made a ``RankLeak`` (``leaks="error"``): the call,
    the ranks and the first finding, each rank's findings as its failure; not reusable
    (stopping the ranks ends what they leaked)."""
    leaks = outcome.leaks
    grouped = _grouped(leaks)
    line, ranks = grouped[0]
    also = f" (and {len(grouped) - 1} more, below)" if len(grouped) > 1 else ""
    summary = f"{call} left behind on {ranks}: {line}{also}; the ranks were stopped"
    failures = {
        rank: RankFailure(rank, "RankLeak", "; ".join(found), "".join(f"{f}\n" for f in found))
        for rank, found in sorted(leaks.items())
    }
    return Classified(
        error=RankLeak(summary, failures),
        outputs=outcome.outputs,
        reusable=False,
        notice=outcome.notice,
        leaks=leaks,
    )


def _grouped(leaks: Mapping[int, tuple[str, ...]]) -> list[tuple[str, str]]:
    """Each distinct finding with the ranks it was found on (``"ranks 0, 1"``), in order."""
    ranks_of: dict[str, list[int]] = {}
    for rank, found in sorted(leaks.items()):
        for line in found:
            ranks_of.setdefault(line, []).append(rank)
    return [(line, ranks_phrase(ranks)) for line, ranks in ranks_of.items()]


def _values(done: dict[int, Done], init: bool) -> Classified:
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
    # A call that destroyed the default group on some ranks only, or made groups on some
    # ranks only, leaves its result valid but the world unfit for the next call. Without a
    # harness group none of this matters: every group is destroyed before the next call,
    # which resets the counters too.
    counts = {rank: reply.group_count for rank, reply in sorted(done.items())}
    gone = [rank for rank, reply in sorted(done.items()) if not reply.grouped]
    notice = ""
    if init and 0 < len(gone) < len(done):
        kept = [rank for rank in sorted(done) if rank not in gone]
        notice = (
            f"the call destroyed the default process group on {ranks_phrase(gone)} only "
            f"({ranks_phrase(kept)} kept it), which leaves the ranks out of step; the world "
            "is rebuilt before the next call"
        )
    elif init and not gone and len(set(counts.values())) > 1:
        made = ", ".join(f"rank {rank}: {count}" for rank, count in counts.items())
        notice = (
            f"the call left the ranks' process-group counters out of step ({made}): "
            "new_group was called on some ranks only, so the ranks could not meet in their "
            "next group; the world is rebuilt before the next call"
        )
    reusable = all(reply.reusable for reply in done.values()) and not notice
    regroup = init and reusable and len(gone) == len(done)
    leaks = {rank: reply.leaks for rank, reply in sorted(done.items()) if reply.leaks}
    return Classified(values=values, reusable=reusable, notice=notice, regroup=regroup, leaks=leaks)


def _failed(
    replies: Mapping[int, Reply],
    world_size: int,
    timeout: float | None,
    stacks: Mapping[int, str],
    skipped: dict[int, Skipped],
    fired: Mapping[int, Fired],
    stopped: float,
    *,
    certain: bool,
) -> Classified:
    silent = [rank for rank in range(world_size) if rank not in replies]
    # What the faults did, for the summary: the reader needs it to judge the survivors.
    by_time = sorted(fired.items(), key=lambda item: item[1].at)
    by_faults = "".join(f"; rank {rank} {f.what} (injected)" for rank, f in by_time)
    events = sorted((m.at, rank) for rank, m in replies.items() if isinstance(m, (Failed, Died)))
    if events:
        failures = {rank: _failure_of(rank, replies[rank]) for _, rank in events}
        failures.update((r, RankFailure.skipped(r, m.reason)) for r, m in skipped.items())
        root = next(iter(failures.values()))
        summary = f"rank {root.rank} {root.what_happened()}"
        later = [rank for rank in failures if rank != root.rank]
        if later:
            summary += f"; then {ranks_phrase(later)} failed"
        if silent:
            summary += f"; {ranks_phrase(silent)} torn down"
        summary += by_faults
        error: DistributedError = RankError(summary, failures)
        if isinstance(replies[root.rank], Died):
            codes = {r: m.exitcode or 0 for r, m in replies.items() if isinstance(m, Died)}
            error = RankCrash(summary, failures, codes)
        returned = {r: m.value for r, m in replies.items() if isinstance(m, Done)}
        return Classified(error=error, returned=returned)
    if skipped:
        reasons = "; ".join(skip_line(r, m.reason, m.site) for r, m in sorted(skipped.items()))
        others = [rank for rank in range(world_size) if rank not in skipped]
        in_order = sorted(skipped.items(), key=lambda item: item[1].at)
        summary = (
            f"{ranks_phrase(list(skipped))} skipped but {ranks_phrase(others)} did not; a "
            f"distributed run must skip on every rank or on none ({reasons})"
        )
        failures = {
            rank: RankFailure.skipped(rank, skip.reason, skip.site) for rank, skip in in_order
        }
        return Classified(error=RankError(summary, failures))
    every_stack = {rank: stacks.get(rank, "") for rank in range(world_size)}
    if certain:
        what = "blocked in a collective that can never complete"
        failures = {rank: RankFailure.still_running(rank, what, stacks[rank]) for rank in silent}
        waits = "waits in a collective that" if len(silent) == 1 else "wait in collectives that"
        summary = (
            f"the run can never finish: {ranks_phrase(silent)} {waits} cannot complete "
            f"(their stacks follow; the ranks were then killed){by_faults}"
        )
        return Classified(error=WorldHang(summary, failures, every_stack))
    bound = f" within {timeout:g} s" if timeout is not None else ""
    what = f"still running after {timeout:g} s" if timeout is not None else "still running"
    failures = {
        rank: RankFailure.still_running(rank, what, stacks.get(rank, "")) for rank in silent
    }
    after = ""
    if by_time:
        rank, first = by_time[0]
        after = f" {max(stopped - first.at, 0.0):.1f} s after rank {rank} {first.what}"
    summary = (
        f"the run did not finish{bound}: {ranks_phrase(silent)} still running{after} "
        "(their stacks at the deadline follow; the ranks were then killed)"
    )
    return Classified(error=WorldTimeout(summary, failures, every_stack, timeout))


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


def _add_collectives(
    error: DistributedError,
    replies: Mapping[int, Reply],
    fetched: Mapping[int, RankTrace | None],
    world_size: int,
    faults: Sequence[Fault],
) -> None:
    """Give a failed call's error each rank's collectives and the verdicts on them."""
    traces: dict[int, RankTrace | None] = {}
    states: dict[int, str] = {}
    for rank in range(world_size):
        reply = replies.get(rank)
        if isinstance(reply, Done):
            traces[rank], states[rank] = fetched.get(rank), verdicts.DONE
        elif isinstance(reply, (Failed, Skipped)):
            traces[rank], states[rank] = reply.trace, verdicts.FAILED
        elif isinstance(reply, Died):
            traces[rank], states[rank] = None, verdicts.DIED
        elif isinstance(reply, Faulted):
            # A kill or an exit ends the rank even where its death was not seen yet (a
            # peer's failure can end the wait first): the verdict must not depend on that.
            kind = faults[reply.fired.index].kind if reply.fired.index < len(faults) else ""
            died = reply.fired.ends and (reply.then is not None or kind in ("kill", "exit"))
            state = verdicts.DIED if died else verdicts.FAILED if reply.then else verdicts.RUNNING
            traces[rank], states[rank] = fetched.get(rank) or reply.fired.trace, state
        else:
            traces[rank], states[rank] = fetched.get(rank), verdicts.RUNNING
    if not any(trace is not None and trace.recent for trace in traces.values()):
        return  # the call issued no collective: nothing to show
    error.collectives = traces
    found = _verdicts(traces, states, world_size)
    error.verdicts = [mark.text for mark in found]
    error.marks = [(mark.group, mark.seq, mark.kind) for mark in found]


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


def _start(
    replies: Mapping[int, Reply],
    world_size: int,
    timeout: float | None,
    stacks: Mapping[int, str],
    world: str,
) -> Classified:
    if all(isinstance(replies.get(rank), Ready) for rank in range(world_size)):
        return Classified(values=[])
    bound = f" after {timeout:g} s" if timeout is not None else ""
    failures: dict[int, RankFailure] = {}
    for rank in range(world_size):
        reply = replies.get(rank)
        if isinstance(reply, (Failed, Died)):
            failures[rank] = _failure_of(rank, reply)
        elif reply is None:
            failures[rank] = RankFailure.still_running(
                rank, f"not up{bound} (or torn down after a peer failed)", stacks.get(rank, "")
            )
    names = ", ".join(f"rank {rank}" for rank in failures)
    exits = {reply.exitcode for reply in replies.values() if isinstance(reply, Died)}
    hint = MAIN_GUARD_HINT if EXIT_MAIN_REIMPORTED in exits else ""
    summary = f"{world} did not start: {names} did not come up"
    return Classified(error=DistributedError(summary, failures, hint=hint))
