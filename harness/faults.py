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

A spec is checked when a run uses it (``World.run``, ``harness.run``, or the test it marks),
against the world's size too, before any process starts: a bad one (``kill(rank=1, at=0)``)
fails that run or test alone, never the import of the module that makes it. The record of a
fault, :class:`Fault`, and of what it did, :class:`FaultFired`, are defined in
:mod:`harness.fault_values` and public here; this module makes them, one at a time or
swept. It imports neither torch nor pytest.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from harness.fault_values import KINDS, WHEN, Fault, FaultFired

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
    maker.__name__: maker for maker in (kill, exit, error, delay, hang, corrupt)
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
        TypeError: An argument the kind's function does not take. The values of the
            faults' arguments are checked when the test runs, as any fault's.
    """
    maker = _MAKERS.get(kind) if isinstance(kind, str) else kind
    if maker is None or maker not in _MAKERS.values():
        raise ValueError(f"unknown fault kind {kind!r}; valid: {', '.join(KINDS)}")
    if ranks == ALL or at == ALL:
        for name, value in (("ranks", ranks), ("at", at)):
            if isinstance(value, str) and value != ALL:
                raise ValueError(f"{name} must be {ALL!r} or ints, not {value!r}")
        maker(0, 1, **kwargs)  # an argument the kind has no parameter for is named now
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
