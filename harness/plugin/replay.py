"""Running tests again on other processes: what a world ran, and a fresh world to run it on.

:class:`History` keeps, per world, the tests its current processes ran, as a :class:`Step`
each; :func:`on_fresh` runs some of them, then the test under scrutiny, on a fresh world
(for :mod:`harness.plugin.runner` and :mod:`harness.plugin.order`).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from harness.protocol.messages import OUTPUT_CAPTURE, CallOptions

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome
    from harness.controller.world import World

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"

# Tests kept per world (the latest): each step holds its fixtures' values, so the bound is
# memory's; the search for a culprit halves the history with each fresh world (its default
# 8 runs narrow 128 tests to one).
HISTORY_CAP = 256


def verdict_of(outcome: Outcome) -> str:
    """How a call ended: ``FAILED``, ``SKIPPED`` or ``PASSED``."""
    if outcome.error is not None:
        return FAILED
    return SKIPPED if outcome.skip is not None else PASSED


@dataclass(frozen=True)
class Step:
    """One test as a world ran it (its rank-side ``fn`` and ``args``): what runs it again.

    ``prepare`` runs in the controller before each call, where given: it puts back what the
    test's own setup left for its ranks and an earlier run changed (a store file).
    """

    nodeid: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    options: CallOptions
    prepare: Callable[[], None] | None = None

    def call(self, world: World, output: str | None = None) -> Outcome:
        """Run the test on ``world``; ``output``, where given, in place of the record's (a
        replay of an earlier test captures what it prints)."""
        if self.prepare is not None:
            self.prepare()
        options = self.options if output is None else replace(self.options, output=output)
        return world.call(self.fn, self.args, options=options)


class History:
    """The tests each world's current processes ran, oldest first."""

    def __init__(self) -> None:
        self._runs: weakref.WeakKeyDictionary[World, tuple[int, list[Step]]] = (
            weakref.WeakKeyDictionary()
        )

    def before(self, world: World) -> list[Step]:
        """What ran on the processes the next call on ``world`` will use: empty when that
        call starts fresh ones (a new world, or one that a failure broke)."""
        generation, steps = self._runs.get(world, (0, []))
        return list(steps) if generation == world.generation and not world.broken else []

    def record(self, world: World, step: Step) -> None:
        """Note that ``step`` ran on ``world`` (forgotten when the world is rebuilt)."""
        steps = [*self.before(world), step][-HISTORY_CAP:]
        self._runs[world] = (world.generation, steps)


_T = TypeVar("_T")


class Replayed(Exception):
    """An earlier test (its node id the one argument) failed when run again."""


def on_fresh(
    new_world: Callable[[], World], before: Sequence[Step], attempt: Callable[[World], _T]
) -> _T:
    """Run ``before``, then the attempt, on a fresh world (stopped afterwards).

    Raises:
        Replayed: A test of ``before`` failed this time.
        DistributedError, RuntimeError: The fresh world could not start.
    """
    with new_world() as world, warnings.catch_warnings():
        # What the earlier tests leak was reported when they ran.
        warnings.simplefilter("ignore")
        for step in before:
            step.call(world, OUTPUT_CAPTURE)
            if world.broken:
                raise Replayed(step.nodeid)
        return attempt(world)
