"""The time axis of the timeline picture (:class:`Axis`): seconds to pixels, one axis for
every rank, with long idle stretches shortened.

The scale (pixels per second) is chosen by :mod:`harness.timeline.layout`. A stretch
with no collective starting or ending in it that would be wider than :data:`GAP_PX` (the wait
before a hang, the start-up before the first collective) is drawn as a gap of fixed width,
labelled with its length, so the collectives stay readable however long a call waited; gaps
side by side, or with only a sliver of time between them, become one. The axis then stretches
or shrinks, within bounds, to a plot between :data:`MIN_PLOT` and :data:`MAX_PLOT` wide.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

# In pixels: the typical interval between a rank's starts; the widest idle stretch
# drawn to scale; a shortened one (wider inside a band, for its count); a piece of time too
# narrow to show between two gaps; the plot's bounds before a stretch or a shrink (the most
# stretch: a call of two collectives need not fill a screen); the least room between ticks.
PITCH_PX = 64
GAP_PX = 200
BREAK_PX = 56
ELIDED_PX = 170
SLIVER_PX = 24
MIN_PLOT, MAX_PLOT = 1150, 24000
MAX_STRETCH = 40.0
TICK_PX = 90
X0 = 12.0
"""Where the axis starts in the plot."""


@dataclass(frozen=True)
class Gap:
    """A stretch of the axis drawn shorter than its length: ``seconds`` long, ``elided``
    when it lies inside a summarised band."""

    x: float
    w: float
    seconds: float
    elided: bool


class Axis:
    """Seconds to pixels: linear pieces joined by fixed-width gaps (see the module)."""

    def __init__(self, times: list[float], s0: float, elided: list[tuple[float, float]]) -> None:
        """Lay out the axis over ``times`` (every start and end drawn, 0 and the end).

        Args:
            times: The instants the picture must place exactly.
            s0: The scale before stretching to the plot's bounds, pixels per second.
            elided: The stretches summarised by bands, as ``(start, end)``.
        """
        ts = sorted(set(times))
        pairs = list(itertools.pairwise(ts))
        # Per piece: 0 linear, else the fixed width of a gap (wider inside a band: its label).
        fixed = [
            (ELIDED_PX if any(lo <= a and b <= hi for lo, hi in elided) else BREAK_PX)
            if (b - a) * s0 > GAP_PX
            else 0
            for a, b in pairs
        ]
        # Gaps next to each other, or with only a sliver of time between, become one gap
        # (one label): an instant inside it is placed in proportion.
        merged: list[tuple[float, float, int]] = []
        for (a, b), f in zip(pairs, fixed, strict=True):
            if f and merged and merged[-1][2]:
                merged[-1] = (merged[-1][0], b, max(f, merged[-1][2]))
            elif f and len(merged) > 1 and merged[-2][2] and _sliver(merged[-1], s0):
                merged.pop()
                merged[-1] = (merged[-1][0], b, max(f, merged[-1][2]))
            else:
                merged.append((a, b, f))
        linear = sum(b - a for a, b, f in merged if not f) * s0
        gaps = sum(f for _, _, f in merged)
        factor = 1.0
        if linear > 0 and linear + gaps < MIN_PLOT:
            factor = min(MAX_STRETCH, (MIN_PLOT - gaps) / linear)
        elif linear > 0 and linear + gaps > MAX_PLOT:
            factor = max(0.02, (MAX_PLOT - gaps) / linear)
        self.scale = s0 * factor
        self.starts: list[float] = []
        self.pieces: list[tuple[float, float, float, float, int]] = []
        x = X0
        for a, b, f in merged:
            w = f or (b - a) * self.scale
            self.starts.append(a)
            self.pieces.append((a, b, x, x + w, f))
            x += w
        self.end = (ts[-1] if ts else 0.0, x)

    def x(self, t: float) -> float:
        """Where instant ``t`` is drawn."""
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0:
            return X0
        a, b, x0, x1, _ = self.pieces[i]
        if t >= b:
            return self.end[1] + (t - self.end[0]) * self.scale
        return x0 + (t - a) / (b - a) * (x1 - x0)

    def gaps(self) -> list[Gap]:
        """The shortened stretches."""
        return [Gap(x0, x1 - x0, b - a, f == ELIDED_PX) for a, b, x0, x1, f in self.pieces if f]

    def ticks(self) -> list[tuple[float, str]]:
        """Tick marks at round numbers of seconds on the linear pieces, with their labels."""
        step = _nice(TICK_PX / self.scale)
        decimals = max(0, -math.floor(math.log10(step)))
        ticks: list[tuple[float, str]] = []
        last = -math.inf
        gaps = [(x0, x1) for _, _, x0, x1, f in self.pieces if f]
        starts = [x0 for x0, _ in gaps]
        for a, b, _, _, f in self.pieces:
            if f:
                continue
            for k in range(math.ceil(a / step - 1e-9), math.floor(b / step + 1e-9) + 1):
                x = self.x(k * step)
                # A label running into the next gap would overlap that gap's own label.
                i = bisect.bisect_left(starts, x)
                clear = i == len(gaps) or x + TICK_PX * 0.6 <= gaps[i][0]
                if x - last >= TICK_PX * 0.7 and clear:
                    ticks.append((x, f"{k * step:.{decimals}f} s"))
                    last = x
        return ticks


def _sliver(piece: tuple[float, float, int], scale: float) -> bool:
    """Whether a linear piece is too narrow to show between two gaps."""
    return piece[2] == 0 and (piece[1] - piece[0]) * scale < SLIVER_PX


def _nice(raw: float) -> float:
    """The smallest of 1, 2 or 5 times a power of ten that is at least ``raw``."""
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
