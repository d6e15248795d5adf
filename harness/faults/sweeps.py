"""Sweeps of faults: :func:`sweep` makes one fault of a kind per (rank, collective) pair,
meant one at a time (the marker makes one test case per fault); over ``"all"`` ranks or
collectives, an :class:`OpenSweep` the marker resolves once it knows the world and a clean
run's collectives; of arguments that make no sweep, an :class:`InvalidSweep` that fails the
test or run given it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from harness.faults.makers import MAKERS, for_kind
from harness.faults.values import Fault


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
        make = MAKERS[self.kind]
        return Sweep(
            make(rank, n, **self.options)
            for rank in self._ranks(world_size)
            for n in self._at(rank, counts)
        )

    def _ranks(self, world_size: int) -> Iterable[int]:
        if isinstance(self.ranks, str):  # "all": every rank of the world, of the fault's group
            return [r for r in range(world_size) if self.group is None or r in self.group]
        return self.ranks

    def _at(self, rank: int, counts: Callable[[int], int] | None) -> Iterable[int]:
        if not isinstance(self.at, str):
            return self.at
        if counts is None:
            raise ValueError("at='all' needs a clean run's collective counts")
        return range(1, counts(rank) + 1)

    def __str__(self) -> str:
        extra = "".join(f", {name}={value!r}" for name, value in self.kwargs)
        return f"sweep({self.kind!r}, ranks={self.ranks!r}, at={self.at!r}{extra})"


@dataclass(frozen=True)
class InvalidSweep:
    """What :func:`sweep` makes of arguments that make no sweep: the run or test given it
    fails, saying why, where a valid sweep's faults would be checked (iterating over it
    raises too); the import of the module that makes it does not.

    Attributes:
        call: The call as written (``sweep('explode', ranks=[1], at=[1])``).
        error: Why it makes no sweep.
        kind: The exception that says so: ``ValueError`` or ``TypeError``.
    """

    call: str
    error: str
    kind: type[Exception] = ValueError

    def fail(self) -> NoReturn:
        """Raise what is wrong with the sweep.

        Raises:
            ValueError, TypeError: Always (:attr:`kind`), naming the call and the problem.
        """
        raise self.kind(f"{self.call}: {self.error}")

    def __iter__(self) -> Iterator[Fault]:
        self.fail()


def sweep(
    kind: str | Callable[..., Fault],
    *,
    ranks: Iterable[int] | str,
    at: Iterable[int] | str,
    **kwargs: Any,
) -> Sweep | OpenSweep | InvalidSweep:
    """One fault of ``kind`` for every (rank, collective) pair, meant one at a time.

    Args:
        kind: A kind's name (``"kill"``) or its function (``faults.kill``).
        ranks: The ranks to place it on, or ``"all"``: every rank of the test's world.
        at: The collectives to place it at (``range(1, 4)``), or ``"all"``: every
            collective a clean run of the test makes on each rank (on the fault's group),
            counted at collection (:mod:`harness.plugin.sweep_cases`).
        **kwargs: The kind's other arguments (``when="during"``, ``code=3``, ...).

    Returns:
        The faults, rank by rank, then collective by collective; with ``"all"``, an
        :class:`OpenSweep` that the marker resolves into them. Where ``kind`` is unknown,
        ``ranks`` or ``at`` is empty or a string other than ``"all"``, or the kind's
        function does not take an argument, an :class:`InvalidSweep`, which fails the test
        or run given it (not the import of its module), naming the problem. The values of
        the faults' arguments are checked when the test runs, as any fault's.
    """
    shown = ", ".join(
        [repr(getattr(kind, "__name__", kind)), f"ranks={ranks!r}", f"at={at!r}"]
        + [f"{name}={value!r}" for name, value in kwargs.items()]
    )
    try:
        return _sweep(kind, ranks, at, kwargs)
    except (TypeError, ValueError) as exc:
        return InvalidSweep(f"sweep({shown})", str(exc), type(exc))


def _sweep(
    kind: str | Callable[..., Fault],
    ranks: Iterable[int] | str,
    at: Iterable[int] | str,
    kwargs: dict[str, Any],
) -> Sweep | OpenSweep:
    """:func:`sweep`'s faults, or its open sweep.

    Raises:
        TypeError, ValueError: The arguments make no sweep (see :func:`sweep`).
    """
    maker = for_kind(kind)
    if ranks == ALL or at == ALL:
        return _open(maker, ranks, at, kwargs)
    pairs = [(rank, n) for rank in ranks for n in at]
    if not pairs:
        raise ValueError(f"sweep of {kind!r} has no (rank, at) pair: give ranks and at")
    return Sweep(maker(rank, n, **kwargs) for rank, n in pairs)


def _open(
    maker: Callable[..., Fault],
    ranks: Iterable[int] | str,
    at: Iterable[int] | str,
    kwargs: dict[str, Any],
) -> OpenSweep:
    """A sweep over ``"all"`` ranks or collectives, its arguments checked as far as they
    can be before the world and a clean run are known."""
    for name, value in (("ranks", ranks), ("at", at)):
        if isinstance(value, str) and value != ALL:
            raise ValueError(f"{name} must be {ALL!r} or ints, not {value!r}")
    maker(0, 1, **kwargs)  # an argument the kind has no parameter for is named now
    return OpenSweep(
        maker.__name__, _all_or_tuple(ranks), _all_or_tuple(at), tuple(sorted(kwargs.items()))
    )


def _all_or_tuple(value: Iterable[int] | str) -> tuple[int, ...] | str:
    return ALL if value == ALL else tuple(value)  # type: ignore[arg-type]
