"""The public errors a run can end with: ``harness.DistributedError`` and its subclasses.

They are raised in the controller, carry
every failing rank's :class:`RankFailure`, and read as :func:`harness.protocol.failures.sections`
lays failures out. Importing this module costs no torch import (the pytest plugin needs them in
every pytest run).

A run stopped by Ctrl-C ends with the ``KeyboardInterrupt`` itself, not an error of these: the
helpers at the end (:func:`note_interrupt` and its readers) carry the ranks' stacks on it,
from the controller that notes them to whoever shows them (the interpreter, the plugin).
"""

from __future__ import annotations

from typing import Any

from harness.protocol.failures import RankFailure, sections
from harness.protocol.traces import RankTrace, render

__all__ = [
    "CollectiveMismatch",
    "DistributedError",
    "FaultNotFired",
    "OrderDependenceWarning",
    "RankCrash",
    "RankError",
    "RankFailure",
    "RankLeak",
    "ShadowMismatch",
    "ShadowUnfaithful",
    "WorldHang",
    "WorldTimeout",
]


class DistributedError(Exception):
    """A run on a world's ranks did not succeed.

    Attributes:
        summary: The one-line account of what happened (``str()`` adds the tracebacks).
        failures: The failing ranks, root cause first (``dict`` order): the rank that failed
            first in time leads, ranks that failed after it follow.
        hint: What to do about it, when the harness knows ('' otherwise); shown last.
        collectives: Per rank, the collectives it issued during the call (see
            :class:`harness.protocol.traces.RankTrace`: the last few with their state, the
            one in flight, and the full sequence per process group); None for a rank whose
            trace is unknown (it died, or did not answer); empty when the call issued none.
        verdicts: Where the ranks' collectives disagree, one line per finding (``collective
            #2 on the default group differs: rank 0 all_reduce(SUM, float32[4]) at
            test_x.py:14; rank 1 broadcast(src=0, float32[4]) at test_x.py:16``).
        marks: For each verdict, the collective it points at: ``(group id, number on the
            group, kind)``, kind ``"mismatch"`` (the ops differ there) or ``"hang"``
            (members never issued it); what ``--dist-trace-dir``'s timeline marks.
        attempts: For a run with restarts, how each attempt before this one ended, one line
            each (``"attempt 0 (4 ranks): rank 1 killed (SIGKILL) before collective #3 ...
            (injected)"``); empty otherwise.
    """

    root_cause_first = False
    """Whether the first failure is the root cause (failures ordered in time), as opposed to
    failures simply listed by rank (a timeout, a world that did not start)."""

    def __init__(
        self, message: str, failures: dict[int, RankFailure] | None = None, hint: str = ""
    ) -> None:
        super().__init__(message)
        self.summary = message
        self.failures: dict[int, RankFailure] = dict(failures or {})
        self.hint = hint
        self.collectives: dict[int, RankTrace | None] = {}
        self.verdicts: list[str] = []
        self.marks: list[tuple[str, int, str]] = []
        self.attempts: list[str] = []

    def report(self) -> tuple[list[str], list[tuple[str, str]]]:
        """How the error reads after its summary.

        ``str()`` and the pytest report alike lay it out this way.

        Returns:
            The verdict lines not already in the summary, and the sections: each failing
            rank's traceback (``"rank 1 (root cause)"``, root cause first), then the
            ``"collectives"`` section (per rank, its last collectives) when any were issued,
            then the earlier ``"attempts"`` of a run with restarts.
        """
        lines = [verdict for verdict in self.verdicts if verdict not in self.summary]
        parts = sections(self.failures, root_cause_first=self.root_cause_first)
        collectives = render(self.collectives) if self.collectives else ""
        if collectives:
            parts.append(("collectives", collectives))
        if self.attempts:
            parts.append(("attempts", "".join(f"{line}\n" for line in self.attempts)))
        return lines, parts

    def __str__(self) -> str:
        lines, parts = self.report()
        out = [self.summary, *lines]
        for heading, text in parts:
            out += [f"\n---------- {heading} ----------", text]
        if self.hint:
            out += ["", self.hint]
        return "\n".join(out)

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses add attributes; the instance dict carries them across a pickle.
        return (type(self), (self.summary,), self.__dict__)


class RankError(DistributedError):
    """Code raised on one or more ranks.

    The first rank to fail is the root cause; peers that failed because of it (a closed
    connection in a collective) are listed after it. The other ranks were torn down at once.
    """

    root_cause_first = True


class WorldTimeout(DistributedError):
    """The run did not finish within its timeout.

    Or, as :class:`WorldHang`, it can never finish. The ranks were killed afterwards.

    Attributes:
        stacks: Every rank's Python stack (all threads) when the wait ended, formatted like a
            traceback with source lines.
        timeout: The bound in seconds that passed; None for a :class:`WorldHang`, which
            ends before any bound.
    """

    def __init__(
        self,
        message: str,
        failures: dict[int, RankFailure] | None = None,
        stacks: dict[int, str] | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(message, failures)
        self.stacks: dict[int, str] = dict(stacks or {})
        self.timeout = timeout


class WorldHang(WorldTimeout):
    """The run can never finish, so it was ended early.

    The ranks' collectives prove it, before the timeout: nothing timed out, and waiting
    longer would not help. Ranks wait in a collective that a peer never joins (it returned
    from the call, or died, after fewer collectives on that group). The ranks were then
    killed. Ranks that called different collectives are a :class:`CollectiveMismatch`
    instead, whether they hang in them or not.

    A subclass of :class:`WorldTimeout`, so that ``except WorldTimeout`` catches both ways
    a run can hang; ``timeout`` is None. ``verdicts`` say which collective cannot complete,
    ``stacks`` hold every rank's stack where it waits, ``collectives`` each rank's trace.
    """


class RankCrash(DistributedError):
    """A rank process died while running.

    It was killed by a signal, or exited.

    Attributes:
        exitcodes: The exit code of each rank that died, as :mod:`multiprocessing` reports
            it: a negative signal number for a signal (``-11`` for SIGSEGV).
    """

    root_cause_first = True

    def __init__(
        self,
        message: str,
        failures: dict[int, RankFailure] | None = None,
        exitcodes: dict[int, int] | None = None,
    ) -> None:
        super().__init__(message, failures)
        self.exitcodes: dict[int, int] = dict(exitcodes or {})


class RankLeak(DistributedError):
    """The call left behind what a reused rank cannot undo.

    It returned on every rank but left, on some: threads it started that are still alive,
    child processes, open files (raised under ``leaks="error"``, ini ``dist_leaks = error``).
    The ranks were then stopped, and what they leaked with them; the next call gets fresh
    ones.

    Each failing rank's section lists its findings, one per line.
    """


class CollectiveMismatch(DistributedError):
    """The ranks' collectives did not match.

    This is the desync check, on by default; ``check_collectives=False`` turns it off. When
    the call returned on every rank, it finds a collective with another op, reduce op, root,
    shape or dtype on some ranks, or more collectives on some ranks than on others: nothing
    hung, but the results may be wrong (Gloo completes ``all_reduce(SUM)`` on one rank against
    ``all_reduce(MAX)`` on another). When ranks were still running as the call was ended (at
    the deadline, or early once their collectives proved it could not pass) and no rank
    raised, a collective that differs is the error too: it is the root cause, whether the
    backend completed it or hangs in it. Those ranks were then killed; ``failures`` holds
    their stacks.

    ``summary`` names the first finding, ``verdicts`` holds them all, ``collectives`` each
    rank's trace; there is no traceback (no rank raised).
    """


class ShadowMismatch(CollectiveMismatch):
    """The ranks of a shadow world did not make the same groups or issue the same collectives.

    A test that asked for shadow worlds (``shadow=[...]``, ``--dist-shadow``) passed on its
    real world, and its body, run on every rank of a larger simulated one, made its groups in
    another order on some ranks, or issued collectives that the other members of a group did
    not (a real world of that size would hang or compute wrong results). ``verdicts`` say
    where; ``size`` is the shadow world's size, ``smallest`` the smallest size found that
    shows it.
    """

    def __init__(self, message: str, size: int = 0, smallest: int = 0) -> None:
        super().__init__(message)
        self.size, self.smallest = size, smallest


class ShadowUnfaithful(DistributedError):
    """A shadow world of the real world's size did not issue what the real run did.

    The body depends on what its collectives returned (a shadow's collectives return what
    they would if every rank held this rank's data), or on something else a shadow does not
    simulate (a peer's files, the store): its larger shadows would say nothing true, so none
    ran. The summary says where the two first differ; ``harness.shadow()`` tells the body
    it runs in a shadow.
    """


class FaultNotFired(DistributedError):
    """A fault given to the call never acted.

    The fault (``harness.faults``) did not act: its rank made fewer collectives on its group
    than the fault's ``at``. A sweep cannot pass vacuously; ``strict=False`` on the fault
    allows it. ``summary`` has one line per fault.
    """


class OrderDependenceWarning(UserWarning):
    """A test's outcome differs between reused and fresh ranks.

    The distributed test depends on what an earlier test left in the ranks. The message names
    the test, the earlier test that causes it where one was found, and the command that shows
    it.
    """


_INTERRUPT_ATTR = "__harness_interrupt__"


def note_interrupt(
    interrupt: BaseException, summary: str, stacks: dict[int, str], collectives: str = ""
) -> None:
    """Attach the ranks' collectives and stacks to a ``KeyboardInterrupt`` that stopped a run.

    They go on it as a note the interpreter prints after the traceback (Python 3.11+) and as
    data for :func:`interrupt_stacks`: the interrupt itself is re-raised unchanged, so that
    ``except KeyboardInterrupt`` and pytest's handling of Ctrl-C keep working.

    Args:
        interrupt: The exception being raised.
        summary: One line: what was interrupted and what became of the ranks.
        stacks: Each rank's readable stacks at the interrupt ('' for a rank already gone).
        collectives: The ranks' last collectives and the one in flight, as a report's
            ``collectives`` section shows them ('' when none was issued).
    """
    setattr(interrupt, _INTERRUPT_ATTR, (summary, dict(stacks), collectives))
    parts = [summary]
    for heading, text in _sections(stacks, collectives):
        parts += [f"---------- {heading} ----------", text]
    note = "\n".join(parts)
    notes = getattr(interrupt, "__notes__", None)
    if isinstance(notes, list):
        notes.append(note)
    else:
        # What BaseException.add_note does on 3.11+; on 3.10 the attribute is only data.
        interrupt.__notes__ = [note]  # type: ignore[attr-defined]


def interrupt_stacks(exc: BaseException) -> tuple[str, dict[int, str]] | None:
    """``(summary, {rank: stacks})`` a ``KeyboardInterrupt`` carries from the run it stopped
    (see :func:`note_interrupt`); None when it stopped none."""
    found = getattr(exc, _INTERRUPT_ATTR, None)
    return (str(found[0]), dict(found[1])) if isinstance(found, tuple) else None


def interrupt_sections(exc: BaseException) -> list[tuple[str, str]]:
    """The sections a ``KeyboardInterrupt`` carries from a run it stopped.

    As its note shows them after the summary (see :func:`note_interrupt`): ``("collectives",
    text)`` when any was issued, then ``("rank N", its stacks)`` for each rank; empty when it
    stopped none.
    """
    found = getattr(exc, _INTERRUPT_ATTR, None)
    return _sections(found[1], found[2]) if isinstance(found, tuple) else []


def forget_interrupt_note(exc: BaseException) -> None:
    """Drop the note :func:`note_interrupt` added, once the stacks were shown otherwise.

    pytest folds an exception's notes into its one-line KeyboardInterrupt summary.
    """
    found = interrupt_stacks(exc)
    notes = getattr(exc, "__notes__", None)
    if found is None or not isinstance(notes, list):
        return
    notes[:] = [note for note in notes if not (isinstance(note, str) and note.startswith(found[0]))]
    if not notes:
        del exc.__notes__  # type: ignore[attr-defined]


def _sections(stacks: dict[int, str], collectives: str) -> list[tuple[str, str]]:
    parts = [("collectives", collectives)] if collectives else []
    for rank, text in sorted(stacks.items()):
        gone = "(no stack: the process had already ended)"
        parts.append((f"rank {rank}", text.rstrip("\n") if text.strip() else gone))
    return parts
