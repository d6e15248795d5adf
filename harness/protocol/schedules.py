"""Schedules: where a call's ranks fall behind at collective boundaries, as plain data.

A *boundary* is a point where a rank's code meets torch.distributed: entering a collective
or point-to-point op, returning from it, and, for one that returned a ``Work``
(``async_op=True``), starting to wait on it. A rank numbers the boundaries it crosses during
a call 1, 2, ... in the order it crosses them. A :class:`Schedule` lists *holds*, ``(rank,
boundary)`` pairs: there that rank falls behind its peers. It stays until each peer is
blocked (inside a collective or a wait that needs it, done with the call, or held by a hold
placed before it: PCT's order of change points, by boundary), so that whatever they do
before they next need it happens first, and never longer than the schedule's ``delay``
(:mod:`harness.rank.holds` acts it out).

:func:`draw` picks a schedule's holds from a seed, PCT-style (probabilistic concurrency
testing: a few change points at random among the steps a run takes): ``DEPTH`` holds at
random among the boundaries the ranks crossed in a run without holds, never two at the
same boundary number. The seed's holds depend on those counts alone, so a seed names the
same schedule for the same test on any machine (the generator is written out here, not
Python's ``random``, whose algorithms may change). What a rank did at each hold comes back
in its trace (``RankTrace.held``, :class:`Held`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEPTH = 2
"""How many holds a drawn schedule places (PCT's change points)."""

DEFAULT_DELAY_S = 1.0
"""The longest a hold lasts, in seconds, where no setting says (``--dist-schedule-delay``)."""

BEFORE = "before"
AFTER = "after"
WAIT = "wait"
"""Which boundary of a collective a hold is at (``Held.point``): entering it, returning from
it, waiting on its ``Work``."""

PEERS = "peers"
BOUND = "bound"
"""Why a hold ended (``Held.until``): its peers were blocked, or it lasted the schedule's
``delay``; '' while it lasts."""


@dataclass(frozen=True)
class Schedule:
    """Where ranks fall behind during one call: hold ``rank`` at its boundary ``at``.

    Attributes:
        holds: ``(rank, at)`` pairs, ``at`` counted from 1 per rank and call; a hold at a
            boundary its rank never crosses does nothing. ``()``: no hold, and each rank
            counts the boundaries it crosses (``RankTrace.boundaries``).
        delay: The longest each hold lasts, in seconds (None: the test's setting, else
            ``DEFAULT_DELAY_S``).
        seed: The seed :func:`draw` made it from (None: made otherwise).

    The values are checked where a user hands them over (:func:`harness.validate.schedule`).
    """

    holds: tuple[tuple[int, int], ...] = ()
    delay: float | None = None
    seed: int | None = None

    def __repr__(self) -> str:
        parts = [f"holds={self.holds!r}"]
        if self.delay is not None:
            parts.append(f"delay={self.delay!r}")
        if self.seed is not None:
            parts.append(f"seed={self.seed!r}")
        return f"Schedule({', '.join(parts)})"

    @property
    def longest(self) -> float:
        """The most its holds can add to a call, in seconds."""
        return len(self.holds) * (self.delay or DEFAULT_DELAY_S)

    def without(self, hold: tuple[int, int]) -> Schedule:
        """The same schedule less ``hold``."""
        return Schedule(tuple(h for h in self.holds if h != hold), self.delay, self.seed)


@dataclass(frozen=True)
class Held:
    """What a rank did at one of its holds.

    Attributes:
        rank: The rank held.
        at: Its boundary number.
        point: ``BEFORE``, ``AFTER`` or ``WAIT`` its collective.
        collective: How the collective reads: ``"collective #2 (all_reduce)"``, ``"... on
            the group of ranks 0, 1"``, ``"send"`` for a point-to-point op.
        site: Its call site, ``"test_x.py:14"``.
        seconds: How long the rank was held (so far, while it lasts).
        until: ``PEERS``, ``BOUND``, or '' while it lasts.
    """

    rank: int
    at: int
    point: str
    collective: str
    site: str
    seconds: float
    until: str = ""

    def __str__(self) -> str:
        where = {
            BEFORE: f"before {self.collective} at {self.site}",
            AFTER: f"after {self.collective} at {self.site} returned",
            WAIT: f"before waiting on {self.collective} at {self.site}",
        }.get(self.point, self.point)
        until = {
            PEERS: "until its peers were blocked",
            BOUND: "the longest a hold lasts (its peers were still busy)",
        }.get(self.until, "and was still held when the call ended")
        return (
            f"rank {self.rank} held at boundary {self.at}, {where}: {self.seconds:.3f} s, {until}"
        )


def draw(seed: int, counts: Mapping[int, int], delay: float | None = None) -> Schedule:
    """The schedule of ``seed`` for ranks that cross ``counts[rank]`` boundaries in a run
    without holds: ``DEPTH`` holds, each a ``(rank, boundary)`` pair drawn uniformly from
    those left, never two at the same boundary number (two ranks held at the same point of
    the same code would not fall behind each other)."""
    pairs = [(rank, at) for rank in sorted(counts) for at in range(1, counts[rank] + 1)]
    numbers = _SplitMix64(seed)
    holds: list[tuple[int, int]] = []
    while pairs and len(holds) < DEPTH:
        rank, at = pairs.pop(numbers.below(len(pairs)))
        if all(at != taken for _, taken in holds):
            holds.append((rank, at))
    return Schedule(tuple(sorted(holds, key=lambda hold: (hold[1], hold[0]))), delay, seed)


def escape_probability(boundaries: int, schedules: int) -> float:
    """The most likely a race escapes ``schedules`` drawn schedules, where it shows once
    one given rank is held at one given boundary (of ``boundaries``, every rank's): the
    first hold of a schedule is that one with probability ``1 / boundaries``."""
    if boundaries < 1:
        return 1.0
    return (1.0 - 1.0 / boundaries) ** schedules


class _SplitMix64:
    """SplitMix64 (Steele, Lea and Flood, 2014): a seed's numbers, the same everywhere."""

    _MASK = (1 << 64) - 1

    def __init__(self, seed: int) -> None:
        self._state = seed & self._MASK

    def below(self, bound: int) -> int:
        """The next number, in ``range(bound)`` (the bias of ``%`` is negligible: a bound
        here, a number of boundaries, is far below 2**64)."""
        self._state = (self._state + 0x9E3779B97F4A7C15) & self._MASK
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self._MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self._MASK
        return (z ^ (z >> 31)) % bound
