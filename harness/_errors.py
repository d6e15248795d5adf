"""The errors a run can end with, and the per-rank failure record they carry."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DistributedError",
    "RankCrash",
    "RankError",
    "RankFailure",
    "WorldTimeout",
    "describe_exitcode",
]


@dataclass(frozen=True)
class RankFailure:
    """What went wrong on one rank.

    Attributes:
        rank: The global rank.
        exc_type: The exception's class name (``"ValueError"``), or ``"RankCrash"`` /
            ``"WorldTimeout"`` for a rank that died or did not finish.
        message: The exception's message (``str(exc)``), or what happened to the process.
        traceback: The rank's formatted traceback, with source lines and without harness
            frames; for a crash, the fatal-error dump if Python wrote one; for a timeout,
            the rank's stacks at the deadline.
    """

    rank: int
    exc_type: str
    message: str
    traceback: str

    def render(self) -> str:
        """The traceback, or ``exc_type: message`` when there is none."""
        text = self.traceback.rstrip("\n")
        return text if text else f"{self.exc_type}: {self.message}"


class DistributedError(Exception):
    """A run on the ranks of a world did not succeed.

    Attributes:
        failures: The failing ranks, root cause first (``dict`` order): the rank that failed
            first in time leads, ranks that failed after it follow.
    """

    # Whether the first failure is the root cause (failures ordered in time) or the failures
    # are simply listed by rank (a timeout, a world that did not start).
    _root_cause_first = False

    def __init__(self, message: str, failures: dict[int, RankFailure] | None = None) -> None:
        super().__init__(message)
        self.summary = message
        self.failures: dict[int, RankFailure] = dict(failures or {})

    def __str__(self) -> str:
        parts = [self.summary]
        for index, failure in enumerate(self.failures.values()):
            first = index == 0 and len(self.failures) > 1 and self._root_cause_first
            note = " (root cause)" if first else ""
            parts.append(f"\n---------- rank {failure.rank}{note} ----------")
            parts.append(failure.render())
        return "\n".join(parts)

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses add attributes; the instance dict carries them across a pickle.
        return (type(self), (self.summary,), self.__dict__)


class RankError(DistributedError):
    """Code raised on one or more ranks.

    The first rank to fail is the root cause; peers that failed because of it (a closed
    connection in a collective) are listed after it. The other ranks were torn down at once.
    """

    _root_cause_first = True


class WorldTimeout(DistributedError):
    """The run did not finish within its timeout; the ranks were killed afterwards.

    Attributes:
        stacks: Every rank's Python stack (all threads) at the deadline, formatted like a
            traceback with source lines.
    """

    def __init__(
        self,
        message: str,
        failures: dict[int, RankFailure] | None = None,
        stacks: dict[int, str] | None = None,
    ) -> None:
        super().__init__(message, failures)
        self.stacks: dict[int, str] = dict(stacks or {})


class RankCrash(DistributedError):
    """A rank process died (killed by a signal, or exited) while running.

    Attributes:
        exitcodes: The exit code of each rank that died, as :mod:`multiprocessing` reports
            it: a negative signal number for a signal (``-11`` for SIGSEGV).
    """

    _root_cause_first = True

    def __init__(
        self,
        message: str,
        failures: dict[int, RankFailure] | None = None,
        exitcodes: dict[int, int] | None = None,
    ) -> None:
        super().__init__(message, failures)
        self.exitcodes: dict[int, int] = dict(exitcodes or {})


def describe_exitcode(code: int | None) -> str:
    """Say how a process ended, from its :mod:`multiprocessing` exit code."""
    if code is None:
        return "closed its connection without exiting"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"
