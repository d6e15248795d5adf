"""What a fault is: the :class:`Fault` record, checked when a run uses it, and
:class:`FaultFired`.

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
        # Normalised where the value allows; every field is checked when a run uses the fault
        # (:meth:`check`), so that a bad one fails that run, not the import of its module.
        if isinstance(self.group, tuple) and all(_is_int(member) for member in self.group):
            object.__setattr__(self, "group", tuple(sorted(self.group)))
        if _is_int(self.signal) and self.signal in _SIGNALS:
            # A plain int: Signals members travel as the number they stand for.
            object.__setattr__(self, "signal", int(self.signal))

    def problem(self) -> str:
        """What is wrong with the fault's own arguments ('' when nothing), naming the bad
        value and what would be valid."""
        if self.kind not in KINDS:
            return f"unknown fault kind {self.kind!r}; valid: {', '.join(KINDS)}"
        found = (
            _index(self.rank, "rank", minimum=0)
            or _index(self.at, "at", minimum=1, why=" (collectives are counted from 1)")
            or _index(self.attempt, "attempt", minimum=0)
        )
        if found:
            return found
        if self.group is not None:
            members = self.group
            if not isinstance(members, tuple) or not members:
                return (
                    f"group must be a non-empty tuple of global ranks (e.g. (0, 1)) or None "
                    f"for the default group, not {members!r}"
                )
            for member in members:
                found = _index(member, "a rank of group", minimum=0)
                if found:
                    return found
            if len(set(members)) != len(members):
                return f"group {members!r} names a rank twice"
            if self.rank not in members:
                return f"rank {self.rank} is not a member of group {members!r}"
        if self.when not in WHEN:
            return f"unknown when {self.when!r}; valid: {', '.join(map(repr, WHEN))}"
        # Signals() would take 9.0 or True as a signal.
        if not _is_int(self.signal) or self.signal not in _SIGNALS:
            return f"signal must be a signal number such as signal.SIGKILL, not {self.signal!r}"
        if not _is_int(self.code) or not 0 <= self.code < 256:
            return f"code must be an exit status from 0 to 255, not {self.code!r}"
        exc_type = self.exc if isinstance(self.exc, type) else type(self.exc)
        if self.kind == "error" and not issubclass(exc_type, BaseException):
            return (
                f"exc must be an exception or an exception class (e.g. RuntimeError('peer "
                f"lost')), not {self.exc!r}"
            )
        seconds = self.seconds
        number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        if not number or not math.isfinite(seconds) or seconds < 0:
            return f"seconds must be a finite number >= 0, not {seconds!r}"
        if self.kind == "corrupt" and not callable(self.fn):
            return f"fn must be callable (it gets the rank's tensor), not {self.fn!r}"
        strict: object = self.strict  # typed bool, given anything
        if not isinstance(strict, bool):
            return f"strict must be True or False, not {strict!r}"
        return ""

    @property
    def id(self) -> str:
        """The test id of this fault in a sweep, such as ``kill-r1-at3``."""
        kind = f"kill-{self.when}" if self.kind == "kill" and self.when != "before" else self.kind
        # Any value reads (a bad one is reported when the case runs, by this id).
        members = self.group if isinstance(self.group, tuple) else (self.group,)
        group = "" if self.group is None else "-g" + "_".join(map(str, members))
        attempt = f"-attempt{self.attempt}" if self.attempt else ""
        return f"{kind}-r{self.rank}-at{self.at}{group}{attempt}"

    def __repr__(self) -> str:
        return f"faults.{self}"

    def __str__(self) -> str:
        details = [f"rank={self.rank}", f"at={self.at}"]
        if self.kind == "kill" and self.when != "before":
            details.append(f"when={self.when!r}")
        if self.kind == "kill" and self.signal != _signal.SIGKILL:
            valid = _is_int(self.signal) and self.signal in _SIGNALS
            name = _signal.Signals(self.signal).name if valid else repr(self.signal)
            details.append(f"signal={name}")
        if self.kind == "exit":
            details.append(f"code={self.code}")
        if self.kind == "error":
            details.append(f"exc={self.exc!r}")
        if self.kind == "delay":
            number = isinstance(self.seconds, (int, float)) and not isinstance(self.seconds, bool)
            details.append(f"seconds={self.seconds:g}" if number else f"seconds={self.seconds!r}")
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
        """Check the fault's arguments, then the fault against the size of the world it is
        used in.

        Raises:
            ValueError: An argument is not valid (see :meth:`problem`), or its rank, or a
                rank of its group, is not in the world; the message names the fault.
        """
        problem = self.problem()
        if problem:
            raise ValueError(f"fault {self}: {problem}")
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


_SIGNALS = frozenset(int(number) for number in _signal.Signals)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _index(value: object, what: str, *, minimum: int, why: str = "") -> str:
    """What is wrong with ``value`` as an int >= ``minimum`` ('' when nothing)."""
    if not _is_int(value) or value < minimum:  # type: ignore[operator]
        return f"{what} must be an int >= {minimum}{why}, not {value!r}"
    return ""
