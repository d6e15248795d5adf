"""Where what came back from the ranks is turned into an outcome: pure logic, no processes.

:func:`classify` takes what the supervisor saw of each rank (a message, a death, or nothing
before it stopped waiting) and decides what the call, or the start of a world, amounts to:
return values, a skip, or one of the harness errors with its failures in the right order.
It reads no files and touches no process, so every case is unit-tested on plain data
(``tests/harness/test_harness_outcome.py``).
"""

from __future__ import annotations

import pickle
import unittest
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from harness import compat
from harness.controller import verdicts
from harness.errors import (
    CollectiveMismatch,
    DistributedError,
    RankCrash,
    RankError,
    RankLeak,
    WorldTimeout,
)
from harness.protocol.failures import (
    EXIT_MAIN_REIMPORTED,
    MAIN_GUARD_HINT,
    RankFailure,
    ranks_phrase,
)
from harness.protocol.messages import Done, Failed, RankMessage, Ready, Skipped
from harness.protocol.traces import RankTrace


@dataclass(frozen=True)
class Died:
    """A rank process ended without answering (what the supervisor saw, not a message).

    Attributes:
        exitcode: As :mod:`multiprocessing` reports it (negative: killed by that signal).
        at: When it died, on the monotonic clock, as well as the supervisor could tell.
        dump: Its readable crash dump ('' when Python wrote none).
    """

    exitcode: int | None
    at: float
    dump: str = ""


Reply = RankMessage | Died
"""What the supervisor saw of one rank."""


@dataclass
class Outcome:
    """Everything one call produced, before it is turned into a return value or an error.

    Attributes:
        values: The return values by rank, when the call succeeded.
        error: The error, when it did not.
        skip: The skip, when every rank skipped.
        outputs: Each rank's captured ``(stdout, stderr)``, when the call captured them.
        reusable: False when the world must be rebuilt before the next call although the
            call succeeded (it destroyed the default process group on some ranks only, left
            the ranks' process-group counters out of step, or a collective raised in a
            rank and the test handled the error: the group may be broken).
        notice: Why a successful call left the world unfit, when the caller should hear it
            ('' otherwise).
        regroup: True when the call destroyed the harness's default process group on every
            rank: the world makes a fresh one, on the same processes, before the next call.
        leaks: What a successful call left behind in each rank that no reset undoes, by
            rank, one line per finding (ranks that left nothing are absent); see
            :func:`leak_report` and :func:`leak_error`.
        suspect: The ranks' fingerprints of their collectives disagree: the caller fetches
            their traces and completes the desync check with :func:`desync`.
        returned: When the call failed, the pickled return values of the ranks that had
            returned before it did, by rank (a tool that judges ranks one by one, such as
            the ``--dist-mptc`` check, needs them).
    """

    values: list[Any] | None = None
    error: DistributedError | None = None
    skip: Skipped | None = None
    outputs: dict[int, tuple[str, str]] = field(default_factory=dict)
    reusable: bool = True
    notice: str = ""
    regroup: bool = False
    leaks: dict[int, tuple[str, ...]] = field(default_factory=dict)
    suspect: bool = False
    returned: dict[int, bytes] = field(default_factory=dict)

    def result(self) -> list[Any]:
        """The return values by rank; raises the error or the skip instead."""
        if self.error is not None:
            raise self.error
        if self.skip is not None:
            raise_skip(self.skip)
        return list(self.values or [])


def raise_skip(skip: Skipped) -> NoReturn:
    """Raise the same kind of skip the ranks raised, pointing at the caller, not at us."""
    if skip.kind == "pytest":
        compat.skip_at_test(skip.reason)
    raise unittest.SkipTest(skip.reason)


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
) -> Outcome:
    """Decide what a call (or the start of a world) amounts to.

    Args:
        replies: What was seen of each rank, by rank; a rank that is missing had not answered
            when the supervisor stopped waiting (the deadline passed, or it was torn down
            after a peer failed).
        world_size: The number of ranks.
        timeout: The bound the supervisor waited under, for the message (None: none).
        stacks: The readable stacks of the ranks that had not answered.
        starting: For the start of a world, how to name it (``"a world of 2 ranks
            (gloo)"``); None for a call.
        init: Whether the world has a harness default group. Without one, the groups a call
            leaves (and their counters) are all destroyed before the next call, so they
            never make it unfit.
        traces: The collective traces, taken on request, of the ranks that had not answered
            or that returned while others failed (a failure's own reply carries its trace);
            None for a rank that gave none.
        check_collectives: Whether a call that returned on every rank has its ranks'
            fingerprints of their collectives compared (the desync check's first half; see
            ``Outcome.suspect`` and :func:`desync`).

    Returns:
        For a call: the values when every rank returned; the skip when every rank skipped;
        otherwise the error. ``RankError`` / ``RankCrash`` (whichever the first failure in
        time was) list that failure first, then later failures, then skips, and name the
        ranks torn down; a skip on some ranks only is a ``RankError``; ranks that did not
        answer with no failure at all are a ``WorldTimeout`` with every rank's stacks. An
        error carries the ranks' collectives and the verdicts on them. A call that returned
        everywhere but whose ranks' fingerprints differ is marked ``suspect``.
        For a start: no error when every rank is ``Ready``, else a ``DistributedError``
        listing the ranks that did not come up, by rank.
    """
    stacks = stacks or {}
    if starting is not None:
        return _start(replies, world_size, timeout, stacks, starting)
    done = {r: m for r, m in replies.items() if isinstance(m, Done)}
    skipped = {r: m for r, m in replies.items() if isinstance(m, Skipped)}
    if len(done) == world_size:
        outcome = _values(done, init)
        prints = {rank: reply.collectives for rank, reply in done.items()}
        if check_collectives and outcome.error is None:
            outcome.suspect = not verdicts.agree(prints, world_size)
        return outcome
    if len(skipped) == world_size:
        return Outcome(skip=min(skipped.values(), key=lambda m: m.at))
    outcome = _failed(replies, world_size, timeout, stacks, skipped)
    if outcome.error is not None:
        _add_collectives(outcome.error, replies, traces or {}, world_size)
    return outcome


def _failed(
    replies: Mapping[int, Reply],
    world_size: int,
    timeout: float | None,
    stacks: Mapping[int, str],
    skipped: dict[int, Skipped],
) -> Outcome:
    silent = [rank for rank in range(world_size) if rank not in replies]
    events = sorted(
        ((m.at, rank) for rank, m in replies.items() if isinstance(m, (Failed, Died))),
    )
    if events:
        return Outcome(
            error=_failure_error(replies, events, skipped, silent),
            returned={r: m.value for r, m in replies.items() if isinstance(m, Done)},
        )
    if skipped:
        return Outcome(error=_partial_skip(skipped, world_size))
    bound = f" within {timeout:g} s" if timeout is not None else ""
    failures = {
        rank: RankFailure.still_running(
            rank,
            f"still running after {timeout:g} s" if timeout is not None else "still running",
            stacks.get(rank, ""),
        )
        for rank in silent
    }
    return Outcome(
        error=WorldTimeout(
            f"the run did not finish{bound}: {ranks_phrase(silent)} still running "
            "(their stacks at the deadline follow; the ranks were then killed)",
            failures,
            {rank: stacks.get(rank, "") for rank in range(world_size)},
        )
    )


def _add_collectives(
    error: DistributedError,
    replies: Mapping[int, Reply],
    fetched: Mapping[int, RankTrace | None],
    world_size: int,
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
        else:
            traces[rank], states[rank] = fetched.get(rank), verdicts.RUNNING
    if not any(trace is not None and trace.recent for trace in traces.values()):
        return  # the call issued no collective: nothing to show
    error.collectives = traces
    error.verdicts = _verdicts(traces, states, world_size)


def desync(outcome: Outcome, traces: Mapping[int, RankTrace | None], world_size: int) -> Outcome:
    """The second half of the desync check, for an outcome whose ranks' fingerprints
    disagreed (``Outcome.suspect``): compare their whole traces, taken after the call.

    Args:
        outcome: The successful outcome of a call that returned on every rank.
        traces: Each rank's trace of that call (None where it could not be read).
        world_size: The number of ranks.

    Returns:
        ``outcome`` when the traces agree after all (a checksum collision; differences
        that are right); otherwise a ``CollectiveMismatch`` outcome (the world is then
        rebuilt, as after any failed call).
    """
    states = dict.fromkeys(range(world_size), verdicts.DONE)
    # A collective that raised where the test handled the error is no desync, nor is what
    # followed it on its group: only what completed on every member is compared.
    found = _verdicts(traces, states, world_size, until_raised=True)
    if not found and all(trace is not None for trace in traces.values()):
        return outcome
    if not found:
        missing = [rank for rank, trace in traces.items() if trace is None]
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
    return Outcome(error=error, outputs=outcome.outputs, notice=outcome.notice, leaks=outcome.leaks)


def _verdicts(
    traces: Mapping[int, RankTrace | None],
    states: Mapping[int, str],
    world_size: int,
    *,
    until_raised: bool = False,
) -> list[str]:
    """``verdicts.find``, which must never turn the user's failure into one of ours: the
    traces come from the ranks, whatever state their code left them in."""
    try:
        return verdicts.find(traces, states, world_size, until_raised=until_raised)
    except Exception as exc:
        return [f"the ranks' collectives could not be compared ({type(exc).__name__}: {exc})"]


def _failure_of(rank: int, reply: Reply) -> RankFailure:
    """The failure a ``Failed`` or ``Died`` reply stands for."""
    if isinstance(reply, Failed):
        return reply.failure
    assert isinstance(reply, Died)
    return RankFailure.crash(rank, reply.exitcode, reply.dump)


def _failure_error(
    replies: Mapping[int, Reply],
    events: list[tuple[float, int]],
    skipped: dict[int, Skipped],
    silent: list[int],
) -> DistributedError:
    failures = {rank: _failure_of(rank, replies[rank]) for _, rank in events}
    exitcodes = {
        rank: reply.exitcode if reply.exitcode is not None else 0
        for rank, reply in replies.items()
        if isinstance(reply, Died)
    }
    for rank, skip in skipped.items():
        failures[rank] = RankFailure.skipped(rank, skip.reason)
    root = next(iter(failures.values()))
    summary = f"rank {root.rank} {root.what_happened()}"
    later = [rank for rank in failures if rank != root.rank]
    if later:
        summary += f"; then {ranks_phrase(later)} failed"
    if silent:
        summary += f"; {ranks_phrase(silent)} torn down"
    if isinstance(replies[root.rank], Died):
        return RankCrash(summary, failures, exitcodes)
    return RankError(summary, failures)


def _partial_skip(skipped: dict[int, Skipped], world_size: int) -> RankError:
    reasons = "; ".join(f"rank {r}: {m.reason}" for r, m in sorted(skipped.items()))
    others = [rank for rank in range(world_size) if rank not in skipped]
    failures = {
        rank: RankFailure.skipped(rank, skip.reason)
        for rank, skip in sorted(skipped.items(), key=lambda item: item[1].at)
    }
    return RankError(
        f"{ranks_phrase(list(skipped))} skipped but {ranks_phrase(others)} did not; a "
        f"distributed run must skip on every rank or on none ({reasons})",
        failures,
    )


def _values(done: dict[int, Done], init: bool) -> Outcome:
    values = []
    for rank in sorted(done):
        try:
            values.append(pickle.loads(done[rank].value))
        except Exception as exc:
            message = (
                f"could not unpickle the return value of rank {rank}: {type(exc).__name__}: {exc}"
            )
            failure = RankFailure(rank, type(exc).__name__, message, message + "\n")
            return Outcome(error=RankError(message, {rank: failure}))
    # A call that destroyed the default group on some ranks only, or made groups on some
    # ranks only, leaves its result valid but the world unfit for the next call.
    counts = {rank: reply.group_count for rank, reply in sorted(done.items())}
    gone = [rank for rank, reply in sorted(done.items()) if not reply.grouped]
    notice = ""
    # Without a harness group nothing of this matters: every group, the default one
    # included, is destroyed before the next call, which resets the counters too.
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
    return Outcome(values=values, reusable=reusable, notice=notice, regroup=regroup, leaks=leaks)


def leak_report(leaks: Mapping[int, tuple[str, ...]], call: str) -> str:
    """The warning for what a call left behind (``leaks="warn"``).

    Args:
        leaks: The findings by rank (``Outcome.leaks``), not empty.
        call: How to name the call (``"test test_x.py::test_a"``, ``"the call of fn"``).

    Returns:
        One line naming the call and, for each finding, the ranks it was found on (a body
        that runs alike on every rank leaks alike on every rank: said once).
    """
    items = "; ".join(f"{ranks}: {line}" for line, ranks in _grouped(leaks))
    return f"{call} left behind what the harness cannot undo in a reused rank: {items}"


def leak_error(outcome: Outcome, call: str) -> Outcome:
    """The failed outcome for a call that left something behind (``leaks="error"``).

    Args:
        outcome: A successful outcome with ``leaks``.
        call: How to name the call, as in :func:`leak_report`.

    Returns:
        A copy whose error is a ``RankLeak`` naming the call, the ranks and the first
        finding, with each rank's findings (one per line) as its failure; no values, and
        not reusable (stopping the ranks ends what they leaked).
    """
    leaks = outcome.leaks
    grouped = _grouped(leaks)
    line, ranks = grouped[0]
    also = f" (and {len(grouped) - 1} more, below)" if len(grouped) > 1 else ""
    summary = f"{call} left behind on {ranks}: {line}{also}; the ranks were stopped"
    failures = {
        rank: RankFailure(rank, "RankLeak", "; ".join(found), "".join(f"{f}\n" for f in found))
        for rank, found in sorted(leaks.items())
    }
    return Outcome(
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


def _start(
    replies: Mapping[int, Reply],
    world_size: int,
    timeout: float | None,
    stacks: Mapping[int, str],
    world: str,
) -> Outcome:
    if all(isinstance(replies.get(rank), Ready) for rank in range(world_size)):
        return Outcome(values=[])
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
    reimported = any(
        isinstance(reply, Died) and reply.exitcode == EXIT_MAIN_REIMPORTED
        for reply in replies.values()
    )
    return Outcome(
        error=DistributedError(
            f"{world} did not start: {names} did not come up",
            failures,
            hint=MAIN_GUARD_HINT if reimported else "",
        )
    )
