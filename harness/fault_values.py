"""What a fault is: the :class:`Fault` record, checked when made, and :class:`FaultFired`.

Both are public as ``harness.faults.Fault`` and ``harness.faults.FaultFired``, where
:mod:`harness.faults` makes them. This module imports neither torch nor pytest.
"""

from __future__ import annotations

import math
import signal as _signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("kill", "exit", "error", "delay", "hang", "corrupt")
"""The kinds of fault, each made by the function of the same name."""

WHEN = ("before", "during", "after")
"""When a ``kill`` strikes: instead of entering the collective, inside it (the rank has
started it and its peers may be waiting on its data), or once it returned."""


@dataclass(frozen=True)
class Fault:
    """One fault: a kind, the rank it acts on, and the collective it acts at.

    Made by :func:`~harness.faults.kill`, :func:`~harness.faults.exit`,
    :func:`~harness.faults.error`, :func:`~harness.faults.delay`, :func:`~harness.faults.hang`
    or :func:`~harness.faults.corrupt`; the fields that do not apply to a kind keep their defaults.

    Attributes:
        kind: One of :data:`KINDS`.
        rank: The global rank it acts on.
        at: The collective it acts at, from 1, numbered per process group.
        group: The global ranks of the process group whose collectives are counted, sorted;
            None for the default group.
        when: ``kill`` only: one of :data:`WHEN`.
        signal: ``kill`` only: the signal number.
        code: ``exit`` only: the exit status.
        exc: ``error`` only: what the collective raises (an exception or exception class).
        seconds: ``delay`` only: how long the rank sleeps before entering.
        fn: ``corrupt`` only: called with the rank's input tensor, changes it in place.
        strict: Whether a fault that never fires is an error.
        attempt: The attempt of a run with restarts it acts in (0: the first), so that the
            attempts after it run clean.
    """

    kind: str
    rank: int
    at: int
    group: tuple[int, ...] | None = None
    when: str = "before"
    signal: int = int(_signal.SIGKILL)
    code: int = 0
    exc: BaseException | type[BaseException] | None = None
    seconds: float = 0.0
    fn: Callable[[Any], object] | None = None
    strict: bool = True
    attempt: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; valid: {', '.join(KINDS)}")
        _index(self.rank, "rank", minimum=0)
        _index(self.at, "at", minimum=1)
        _index(self.attempt, "attempt", minimum=0)
        if self.group is not None:
            members = self.group
            if not isinstance(members, tuple) or not members:
                raise TypeError(
                    f"group must be a non-empty tuple of global ranks (e.g. (0, 1)) or None "
                    f"for the default group, not {members!r}"
                )
            for member in members:
                _index(member, "a rank of group", minimum=0)
            if len(set(members)) != len(members):
                raise ValueError(f"group {members!r} names a rank twice")
            if self.rank not in members:
                raise ValueError(f"rank {self.rank} is not a member of group {members!r}")
            object.__setattr__(self, "group", tuple(sorted(members)))
        if self.when not in WHEN:
            raise ValueError(f"unknown when {self.when!r}; valid: {', '.join(map(repr, WHEN))}")
        try:
            if not isinstance(self.signal, int) or isinstance(self.signal, bool):
                raise TypeError  # Signals() would take 9.0 or True as a signal
            # A plain int: Signals members travel as the number they stand for.
            object.__setattr__(self, "signal", int(_signal.Signals(self.signal)))
        except (ValueError, TypeError):
            raise ValueError(
                f"signal must be a signal number such as signal.SIGKILL, not {self.signal!r}"
            ) from None
        code = self.code
        if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code < 256:
            raise ValueError(f"code must be an exit status from 0 to 255, not {code!r}")
        exc_type = self.exc if isinstance(self.exc, type) else type(self.exc)
        if self.kind == "error" and not issubclass(exc_type, BaseException):
            raise TypeError(
                f"exc must be an exception or an exception class (e.g. RuntimeError('peer "
                f"lost')), not {self.exc!r}"
            )
        seconds = self.seconds
        number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        if not number or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"seconds must be a finite number >= 0, not {seconds!r}")
        if self.kind == "corrupt" and not callable(self.fn):
            raise TypeError(f"fn must be callable (it gets the rank's tensor), not {self.fn!r}")
        if not isinstance(self.strict, bool):
            raise TypeError(f"strict must be True or False, not {self.strict!r}")

    @property
    def id(self) -> str:
        """The test id of this fault in a sweep, such as ``kill-r1-at3``."""
        kind = f"kill-{self.when}" if self.kind == "kill" and self.when != "before" else self.kind
        group = "" if self.group is None else "-g" + "_".join(map(str, self.group))
        attempt = f"-attempt{self.attempt}" if self.attempt else ""
        return f"{kind}-r{self.rank}-at{self.at}{group}{attempt}"

    def __repr__(self) -> str:
        return f"faults.{self}"

    def __str__(self) -> str:
        details = [f"rank={self.rank}", f"at={self.at}"]
        if self.kind == "kill" and self.when != "before":
            details.append(f"when={self.when!r}")
        if self.kind == "kill" and self.signal != _signal.SIGKILL:
            details.append(f"signal={_signal.Signals(self.signal).name}")
        if self.kind == "exit":
            details.append(f"code={self.code}")
        if self.kind == "error":
            details.append(f"exc={self.exc!r}")
        if self.kind == "delay":
            details.append(f"seconds={self.seconds:g}")
        if self.kind == "corrupt":
            details.append(f"fn={getattr(self.fn, '__qualname__', self.fn)!s}")
        if self.group is not None:
            details.append(f"group={self.group}")
        if self.attempt:
            details.append(f"attempt={self.attempt}")
        return f"{self.kind}({', '.join(details)})"

    @property
    def enters(self) -> bool:
        """Whether the rank enters the collective (not when it exits, hangs or is killed
        before it)."""
        return self.kind not in ("exit", "hang") and (self.kind, self.when) != ("kill", "before")

    @property
    def group_name(self) -> str:
        """How a report names the group: ``the default group`` or ``group (0, 1)``."""
        return "the default group" if self.group is None else f"group {self.group}"

    def check(self, world_size: int) -> None:
        """Check the fault against the size of the world it is used in.

        Raises:
            ValueError: Its rank, or a rank of its group, is not in the world.
        """
        for member in (self.rank, *(self.group or ())):
            if member >= world_size:
                raise ValueError(
                    f"fault {self}: rank {member} is not in a world of {world_size} "
                    f"(valid ranks: 0 to {world_size - 1})"
                )


@dataclass(frozen=True)
class FaultFired:
    """What a fault did to its rank: the value in that rank's slot of ``World.run``'s result.

    Attributes:
        fault: The fault.
        what: What happened, e.g. ``killed (SIGKILL) before collective #3 (all_reduce) on
            the default group``.
        time: When, as ``time.monotonic()`` on the controller's clock (same machine).
    """

    fault: Fault
    what: str
    time: float

    def __str__(self) -> str:
        return f"rank {self.fault.rank} {self.what}"

    def __repr__(self) -> str:
        return f"FaultFired({self})"


def _index(value: object, what: str, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int >= {minimum}, not {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
