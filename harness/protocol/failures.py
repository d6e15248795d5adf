"""How a failure on a rank is described and rendered.

This is the one place both sides use for it.

A rank turns an exception into a :class:`RankFailure` (text only: the exception itself may not
pickle) with :meth:`RankFailure.from_exception`; the controller makes one for a rank that died
with :meth:`RankFailure.crash` or that did not finish with :meth:`RankFailure.still_running`.
:func:`sections` is how a set of failures reads, root cause first: both ``str()`` of a harness
error and the pytest report are built from it.
"""

from __future__ import annotations

import itertools
import os
import signal
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType

EXIT_MAIN_REIMPORTED = 86
"""The exit code of a rank that, while it started, re-imported the main module and found it
starting a world at import time (a script without ``if __name__ == "__main__":``)."""

MAIN_GUARD_HINT = (
    "Each rank imports the main module as it starts (as with multiprocessing's spawn and "
    "forkserver start methods), and the main module starts a world when it is imported: "
    'put the code that calls the harness under `if __name__ == "__main__":`.'
)
"""What to do about ``EXIT_MAIN_REIMPORTED``, shown last."""


PHASE_ATTR = "__harness_phase__"
"""Set on an exception that a fixture running in the ranks raised: ``"setup"`` or
``"teardown"``, the phase of the pytest test it belongs to. Without it, the test body raised."""

PHASES = ("setup", "call", "teardown")

TIMES_ATTR = "__harness_times__"
"""Set on an exception that ended a pytest test on a rank: how long the rank spent in the
test's setup, call and teardown (``RankFailure.times``)."""

EXIT_CODE_ATTR = "__harness_exit_code__"
"""Set on an exception that stands for a process exit: the exit code a native run's process
would have ended with (a ``MultiProcessTestCase`` test run on a reused rank, whose class judges
its processes by their exit codes)."""


@dataclass(frozen=True)
class RankFailure:
    """What went wrong on one rank.

    Attributes:
        rank: The global rank.
        exc_type: The exception's class name (``"ValueError"``), or ``"RankCrash"`` /
            ``"WorldTimeout"`` / ``"WorldHang"`` for a rank that died or did not finish.
        message: The exception's message (``str(exc)``), or what happened to the process.
        traceback: The rank's formatted traceback, with source lines and without harness
            frames; for a crash, the fatal-error dump if Python wrote one; for a timeout,
            the rank's stacks at the deadline.
        phase: For a pytest test, ``"setup"`` or ``"teardown"`` when a fixture that runs in
            the ranks raised; ``"call"`` otherwise.
        exitcode: The exit code the exception stands for (a test that called ``os._exit``),
            or None.
        times: For a pytest test, the seconds this rank spent in its setup, call and
            teardown, or None.
    """

    rank: int
    exc_type: str
    message: str
    traceback: str
    phase: str = "call"
    exitcode: int | None = None
    times: tuple[float, float, float] | None = None

    @classmethod
    def from_exception(
        cls,
        exc: BaseException,
        rank: int,
        *,
        hidden_dir: str,
        context: str | None = None,
    ) -> RankFailure:
        """Describe an exception raised on ``rank`` as text.

        This works whatever the exception does when printed.

        Args:
            exc: The exception.
            rank: The rank it was raised on.
            hidden_dir: Traceback frames from files under this directory (the rank loop, the
                test-body runner) are left out: the reader's code comes first.
            context: A sentence that says what was being done (``"could not unpickle the
                call sent to rank 1"``); it prefixes the message and ends the traceback.
        """
        tb: TracebackType | None = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename.startswith(hidden_dir):
            tb = tb.tb_next
        try:
            message = str(exc)
        except Exception:
            message = f"<unprintable {type(exc).__qualname__} object>"
        try:
            text = _without_frames(
                "".join(traceback.format_exception(type(exc), exc, tb)), hidden_dir
            )
        except Exception:
            text = f"{type(exc).__qualname__}: {message}\n"
        if context:
            message = f"{context}: {type(exc).__qualname__}: {message}"
            text = f"{text}\n{context}\n"
        phase = getattr(exc, PHASE_ATTR, "call")
        phase = phase if phase in PHASES else "call"
        exitcode = getattr(exc, EXIT_CODE_ATTR, None)
        exitcode = exitcode if isinstance(exitcode, int) else None
        times = getattr(exc, TIMES_ATTR, None)
        times = times if isinstance(times, tuple) else None
        return cls(rank, type(exc).__qualname__, message, text, phase, exitcode, times)

    @classmethod
    def crash(cls, rank: int, exitcode: int | None, dump: str) -> RankFailure:
        """A rank whose process ended without answering.

        ``dump`` is its readable crash dump ('' when Python wrote none).
        """
        return cls(rank, "RankCrash", f"the process {describe_exitcode(exitcode)}", dump)

    @classmethod
    def still_running(
        cls, rank: int, what: str, stacks: str, error: str = "WorldTimeout"
    ) -> RankFailure:
        """A rank that had not answered when waiting stopped: at the deadline, or, where
        ``error`` is ``"WorldHang"``, when its collectives proved it never would."""
        return cls(rank, error, what, stacks)

    @classmethod
    def skipped(cls, rank: int, reason: str, site: tuple[str, int] | None = None) -> RankFailure:
        """A rank that skipped while others did not.

        ``site`` is the file and line of the skip, as ``Skipped.site``.
        """
        where = f"{site[0]}:{site[1]}: " if site is not None else ""
        return cls(rank, "Skipped", reason, f"{where}Skipped: {reason}\n")

    def render(self) -> str:
        """The traceback, or ``exc_type: message`` when there is none."""
        text = self.traceback.rstrip("\n")
        return text if text else f"{self.exc_type}: {self.message}"

    def what_happened(self) -> str:
        """One phrase for a summary line.

        It reads ``raised ValueError: boom`` or ``was killed by SIGKILL (exit code -9)``.
        Only the message's first line: the rest (pytest's ``+ where`` explanation of an
        assert, say) is in the traceback below it.
        """
        if self.exc_type == "RankCrash":
            return self.message.replace("the process ", "", 1)
        first = self.message.splitlines()[0] if self.message.strip() else ""
        return f"raised {self.exc_type}" + (f": {first}" if first else "")


def _without_frames(text: str, hidden_dir: str) -> str:
    """A formatted traceback without the frames under ``hidden_dir``.

    Those are the frames of files under ``hidden_dir`` that sit between the user's and the
    library's (the rank's collective-recording wrapper): each is a ``  File "..."`` line and
    the indented lines (source, carets) below it.
    """
    marker = f'  File "{hidden_dir}'
    if marker not in text:
        return text
    kept: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        if line.startswith("  File "):
            skipping = line.startswith(marker)
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(line)
    return "".join(kept)


def sections(
    failures: Mapping[int, RankFailure], *, root_cause_first: bool
) -> list[tuple[str, str]]:
    """How a set of failures reads, in the order given.

    It reads ``[("rank 1 (root cause)", traceback), ("rank 0", traceback), ...]``; the first
    is headed root cause when ``root_cause_first`` (failures ordered in time, not listed by
    rank) and there are more.
    """
    marked = root_cause_first and len(failures) > 1
    return [
        (
            f"rank {failure.rank}" + (" (root cause)" if index == 0 and marked else ""),
            failure.render(),
        )
        for index, failure in enumerate(failures.values())
    ]


def skip_line(rank: int, reason: str, site: tuple[str, int] | None) -> str:
    """A rank's skip in a summary line.

    It reads ``"rank 1 (test_x.py:12): reason"``, or ``"rank 1: reason"`` where the skip's
    place (``Skipped.site``) is unknown.
    """
    where = f" ({os.path.basename(site[0])}:{site[1]})" if site is not None else ""
    return f"rank {rank}{where}: {reason}"


def describe_exitcode(code: int | None) -> str:
    """Say how a process ended, from its :mod:`multiprocessing` exit code."""
    if code is None:
        return "closed its connection without exiting"
    if code == EXIT_MAIN_REIMPORTED:
        return (
            f"exited with code {code}: it re-imported the main module, which starts a world "
            "at import time"
        )
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


def ranks_phrase(ranks: Iterable[int]) -> str:
    """A set of ranks as a short phrase.

    For example ``"rank 2"``, ``"ranks 0, 1"``, ``"ranks 0-3, 6"``: sorted, runs of three or
    more shortened.
    """
    ordered = sorted(set(ranks))
    parts: list[str] = []
    # Consecutive ranks share their difference to their position in the sorted list.
    for _, group in itertools.groupby(enumerate(ordered), lambda pair: pair[1] - pair[0]):
        run = [rank for _, rank in group]
        parts += [f"{run[0]}-{run[-1]}"] if len(run) >= 3 else [str(rank) for rank in run]
    return ("ranks " if len(ordered) > 1 else "rank ") + ", ".join(parts)
