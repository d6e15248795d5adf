"""Faults to place at a rank's collective #N: what a test of fault-tolerant code injects.

A fault acts on one rank at collective ``#at`` of a process group, numbered from 1 per group
exactly as a report's collectives section numbers them: ``kill`` (before, during or after the
collective), ``exit``, ``error`` (the collective raises), ``delay`` (a straggler), ``hang``
(the rank never enters) and ``corrupt`` (the rank's input tensor is changed first). Faults
go to the marker (``@pytest.mark.distributed(faults=[...])``), ``World.run(fn, faults=[...])``
and ``harness.run(..., faults=[...])``; :func:`sweep` makes one fault per (rank, collective)
pair, and the marker turns a sweep into one test case per fault.

A rank's death or error caused by a fault is not a failure by itself: the call's verdict is
what the other ranks did. A fault that never fires is an error (``strict=False`` allows it).

Every spec is checked when it is made (and against the world's size when it is used), so a
bad one fails before any process starts. This module imports neither torch nor pytest.
"""

from __future__ import annotations

import math
import signal as _signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALL",
    "KINDS",
    "WHEN",
    "Fault",
    "FaultFired",
    "OpenSweep",
    "Sweep",
    "corrupt",
    "delay",
    "error",
    "exit",
    "hang",
    "kill",
    "sweep",
]

KINDS = ("kill", "exit", "error", "delay", "hang", "corrupt")
"""The kinds of fault, each made by the function of the same name."""

WHEN = ("before", "during", "after")
"""When a ``kill`` strikes: instead of entering the collective, inside it (the rank has
started it and its peers may be waiting on its data), or once it returned."""


@dataclass(frozen=True)
class Fault:
    """One fault: a kind, the rank it acts on, and the collective it acts at.

    Made by :func:`kill`, :func:`exit`, :func:`error`, :func:`delay`, :func:`hang` or
    :func:`corrupt`; the fields that do not apply to a kind keep their defaults.

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
        if (
            not isinstance(self.code, int)
            or isinstance(self.code, bool)
            or not 0 <= self.code < 256
        ):
            raise ValueError(f"code must be an exit status from 0 to 255, not {self.code!r}")
        if self.kind == "error" and not _is_exception(self.exc):
            raise TypeError(
                f"exc must be an exception or an exception class (e.g. RuntimeError('peer "
                f"lost')), not {self.exc!r}"
            )
        seconds = self.seconds
        if (
            not isinstance(seconds, (int, float))
            or isinstance(seconds, bool)
            or not math.isfinite(seconds)
            or seconds < 0
        ):
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


class Sweep(tuple):  # type: ignore[type-arg]
    """Faults meant one at a time: the marker makes one test case per fault, id'd by
    :attr:`Fault.id`. Made by :func:`sweep`."""

    __slots__ = ()


ALL = "all"
"""``ranks``/``at`` of :func:`sweep`: every rank of the world, every collective of a clean run."""


@dataclass(frozen=True)
class OpenSweep:
    """A sweep over ``"all"`` ranks or collectives, until the marker knows them: it resolves
    it (:meth:`faults`) with the test's world size and a clean run's collective counts.

    Attributes:
        kind: The kind of fault.
        ranks: ``"all"`` or the ranks.
        at: ``"all"`` or the collectives.
        kwargs: The kind's other arguments, as sorted ``(name, value)`` pairs.
    """

    kind: str
    ranks: tuple[int, ...] | str
    at: tuple[int, ...] | str
    kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def options(self) -> dict[str, Any]:
        """The kind's other arguments, by name."""
        return dict(self.kwargs)

    @property
    def group(self) -> tuple[int, ...] | None:
        """The group whose collectives ``at`` counts (None: the default group)."""
        group = self.options.get("group")
        return None if group is None else tuple(sorted(group))

    def faults(self, world_size: int, counts: Callable[[int], int] | None = None) -> Sweep:
        """The sweep's faults, rank by rank, then collective by collective.

        Args:
            world_size: The world the faults act in (``"all"`` ranks: every rank of it).
            counts: With ``at="all"``: how many collectives a clean run makes on a rank
                (on the fault's group).

        Raises:
            ValueError: ``at="all"`` and no counts are given.
        """
        ranks: Iterable[int] = self.ranks  # type: ignore[assignment]
        if self.ranks == ALL:  # every rank of the world, of the fault's group
            ranks = [r for r in range(world_size) if self.group is None or r in self.group]
        faults = []
        for rank in ranks:
            if self.at == ALL:
                if counts is None:
                    raise ValueError("at='all' needs a clean run's collective counts")
                at: Iterable[int] = range(1, counts(rank) + 1)
            else:
                at = self.at  # type: ignore[assignment]
            faults += [_MAKERS[self.kind](rank, n, **self.options) for n in at]
        return Sweep(faults)

    def __str__(self) -> str:
        extra = "".join(f", {name}={value!r}" for name, value in self.kwargs)
        return f"sweep({self.kind!r}, ranks={self.ranks!r}, at={self.at!r}{extra})"


def kill(
    rank: int,
    at: int,
    *,
    group: tuple[int, ...] | None = None,
    when: str = "before",
    signal: int = _signal.SIGKILL,
    strict: bool = True,
    attempt: int = 0,
) -> Fault:
    """Kill ``rank`` with ``signal`` before, during or after its collective ``#at``."""
    return Fault("kill", rank, at, group, when=when, signal=signal, strict=strict, attempt=attempt)


def exit(
    rank: int,
    at: int,
    code: int,
    *,
    group: tuple[int, ...] | None = None,
    strict: bool = True,
    attempt: int = 0,
) -> Fault:
    """Make ``rank`` exit with status ``code`` (``os._exit``) instead of entering ``#at``."""
    return Fault("exit", rank, at, group, code=code, strict=strict, attempt=attempt)


def error(
    rank: int,
    at: int,
    exc: BaseException | type[BaseException],
    *,
    group: tuple[int, ...] | None = None,
    strict: bool = True,
    attempt: int = 0,
) -> Fault:
    """Make collective ``#at`` raise ``exc`` on ``rank`` instead of running."""
    return Fault("error", rank, at, group, exc=exc, strict=strict, attempt=attempt)


def delay(
    rank: int,
    at: int,
    seconds: float,
    *,
    group: tuple[int, ...] | None = None,
    strict: bool = True,
    attempt: int = 0,
) -> Fault:
    """Make ``rank`` sleep ``seconds`` before entering collective ``#at`` (a straggler)."""
    return Fault("delay", rank, at, group, seconds=seconds, strict=strict, attempt=attempt)


def hang(
    rank: int,
    at: int,
    *,
    group: tuple[int, ...] | None = None,
    strict: bool = True,
    attempt: int = 0,
) -> Fault:
    """Make ``rank`` block, alive, instead of entering collective ``#at``."""
    return Fault("hang", rank, at, group, strict=strict, attempt=attempt)


def corrupt(
    rank: int,
    at: int,
    fn: Callable[[Any], object],
    *,
    group: tuple[int, ...] | None = None,
    strict: bool = True,
    attempt: int = 0,
) -> Fault:
    """Call ``fn(tensor)`` on ``rank``'s input tensor of collective ``#at`` before it runs
    (``fn`` changes it in place; it must pickle: a module-level function)."""
    return Fault("corrupt", rank, at, group, fn=fn, strict=strict, attempt=attempt)


_MAKERS: dict[str, Callable[..., Fault]] = {
    "kill": kill,
    "exit": exit,
    "error": error,
    "delay": delay,
    "hang": hang,
    "corrupt": corrupt,
}


def sweep(
    kind: str | Callable[..., Fault],
    *,
    ranks: Iterable[int] | str,
    at: Iterable[int] | str,
    **kwargs: Any,
) -> Sweep | OpenSweep:
    """One fault of ``kind`` for every (rank, collective) pair, meant one at a time.

    Args:
        kind: A kind's name (``"kill"``) or its function (``faults.kill``).
        ranks: The ranks to place it on, or ``"all"``: every rank of the test's world.
        at: The collectives to place it at (``range(1, 4)``), or ``"all"``: every
            collective a clean run of the test makes on each rank (on the fault's group),
            counted at collection (:mod:`harness.plugin.sweeps`).
        **kwargs: The kind's other arguments (``when="during"``, ``code=3``, ...).

    Returns:
        The faults, rank by rank, then collective by collective; with ``"all"``, an
        :class:`OpenSweep` that the marker resolves into them.

    Raises:
        ValueError: ``kind`` is unknown, ``ranks`` or ``at`` is empty, or a string other
            than ``"all"``.
        TypeError, ValueError: As the kind's function, for a bad argument.
    """
    maker = _MAKERS.get(kind) if isinstance(kind, str) else kind
    if maker is None or maker not in _MAKERS.values():
        raise ValueError(f"unknown fault kind {kind!r}; valid: {', '.join(KINDS)}")
    if ranks == ALL or at == ALL:
        for name, value in (("ranks", ranks), ("at", at)):
            if isinstance(value, str) and value != ALL:
                raise ValueError(f"{name} must be {ALL!r} or ints, not {value!r}")
        maker(0, 1, **kwargs)  # its arguments checked now, not once the cases are made
        return OpenSweep(
            maker.__name__,
            ALL if ranks == ALL else tuple(ranks),  # type: ignore[arg-type]
            ALL if at == ALL else tuple(at),  # type: ignore[arg-type]
            tuple(sorted(kwargs.items())),
        )
    pairs = [(rank, n) for rank in ranks for n in at]
    if not pairs:
        raise ValueError(f"sweep of {kind!r} has no (rank, at) pair: give ranks and at")
    return Sweep(maker(rank, n, **kwargs) for rank, n in pairs)


def _index(value: object, what: str, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int >= {minimum}, not {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")


def _is_exception(value: object) -> bool:
    if isinstance(value, BaseException):
        return True
    return isinstance(value, type) and issubclass(value, BaseException)
