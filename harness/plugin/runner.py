"""One distributed test's runs: on the reused world, then, where asked, on fresh processes.

A test on a reused world runs on processes that earlier tests ran on, and whatever they left
behind that no reset covers can change its verdict. :meth:`Runner.run` reads top to bottom,
for marked tests and ``--dist-mptc`` cases alike: run the test on fresh processes alone
where it is isolated; else on the session's world of its shape, noting it in that world's
history; a failure there (ini ``dist_confirm = fresh``, the default), or any verdict under
``--dist-verify``, runs again on a fresh world with the same seed and fixture values (not a
leak's failure, ``dist_leaks = error``: it is about the reused ranks themselves); where
the two verdicts differ, the fresh one stands, the earlier test behind the difference is
searched for (:func:`harness.plugin.order.bisect`) and the order dependence is reported as a
warning, or as the test's failure with ini ``dist_order_dependent = fail``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import pytest

from harness.controller import restarts
from harness.errors import OrderDependenceWarning, RankLeak
from harness.plugin import order, report
from harness.plugin.item_settings import WorldShape
from harness.plugin.replay import FAILED, History, Step, on_fresh
from harness.plugin.settings import Settings

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome
    from harness.controller.world import World
    from harness.plugin.leases import Holder
    from harness.protocol.messages import CallOptions

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


class Runnable(Protocol[_T_co]):
    """A test as the runner runs it: its ``step``, and one run on a world."""

    @property
    def step(self) -> Step:
        """What runs it again on another world (for the bisection)."""

    def attempt(self, world: World, fresh: bool) -> tuple[str, _T_co]:
        """Run the test on ``world`` (``fresh``: its own); return its verdict and result."""


@dataclass(frozen=True)
class Held(Generic[_T]):
    """A test's run, held against fresh processes where the settings ask for it.

    Attributes:
        result: The run's result whose verdict stands (the fresh one's, where they differ).
        note: What a failure report says of the fresh run before its repro command
            (``"confirmed on fresh processes; "``; '' when there was none).
        failure: The test's failure, where an order dependence is one.
    """

    result: _T
    note: str = ""
    failure: BaseException | None = None


@dataclass(frozen=True)
class Reused(Generic[_T]):
    """A test's run on the session's world of its shape, for :meth:`Runner.held`.

    Attributes:
        shape: The world's shape; a fresh world of it holds the verdict.
        holder: Whose GPUs the fresh worlds lease.
        earlier: The tests that world's processes ran before this one, oldest first.
        verdict: How the run ended (``FAILED``, ``SKIPPED``, ``PASSED``).
        result: What the run produced.
    """

    shape: WorldShape
    holder: Holder
    earlier: list[Step]
    verdict: str
    result: _T


@dataclass
class Runner:
    """Runs each distributed test on the session's ``world`` of its shape (started on first
    use) and holds its verdict against fresh processes (``new_world``) as ``settings`` say;
    the GPUs of either are leased for the test's ``Holder``."""

    settings: Settings
    world: Callable[[WorldShape, Holder], World]
    new_world: Callable[[WorldShape, Holder], World]
    _history: History = field(default_factory=History, init=False)

    def run_attempts(
        self,
        item: pytest.Item,
        test: Callable[[CallOptions], Runnable[Outcome]],
        options: CallOptions,
        shape: WorldShape,
        holder: Holder,
        sizes: tuple[int, ...],
    ) -> Held[Outcome]:
        """Run a test with restarts, each attempt on a fresh world of its size in ``sizes``
        (:mod:`harness.controller.restarts`), listing them in the report's ``attempts``."""

        def attempt(size: int, attempt_options: CallOptions) -> Outcome:
            with self.new_world(shape.sized(size), holder) as world:
                return test(attempt_options).attempt(world, True)[1]

        outcome, attempts = restarts.run_attempts(attempt, options, sizes)
        if len(attempts) > 1 and outcome.error is None:  # a failure lists them itself
            item.add_report_section("call", "attempts", "".join(f"{a}\n" for a in attempts))
        return Held(outcome)

    def run(
        self,
        item: pytest.Item,
        test: Runnable[_T],
        shape: WorldShape,
        holder: Holder,
        isolate: bool,
        option: str,
    ) -> Held[_T]:
        """Run ``test`` as the module's docstring says; ``option`` is what the commands in
        messages need besides the test ids (``--dist-backend=gloo``, ``--dist-mptc``)."""
        if isolate:
            return Held(self.alone(test, shape, holder))
        return self.held(item, test, self.reused(test, shape, holder), option)

    def alone(self, test: Runnable[_T], shape: WorldShape, holder: Holder) -> _T:
        """Run ``test`` on a fresh world of its own (an isolated test)."""
        with self.new_world(shape, holder) as world:
            return test.attempt(world, True)[1]

    def reused(self, test: Runnable[_T], shape: WorldShape, holder: Holder) -> Reused[_T]:
        """Run ``test`` on the session's world of ``shape``, noting it in its history."""
        world = self.world(shape, holder)
        earlier = self._history.before(world)
        generation = world.generation
        verdict, result = test.attempt(world, False)
        if world.generation == generation:  # else it ran on processes replaced since
            self._history.record(world, test.step)
        return Reused(shape, holder, earlier, verdict, result)

    def held(
        self,
        item: pytest.Item,
        test: Runnable[_T],
        run: Reused[_T],
        option: str,
        always: bool = False,
    ) -> Held[_T]:
        """A run on a reused world held against fresh processes, as the settings ask: the
        verdict that stands, and an order dependence reported (see the module's docstring).

        ``always``: also where the world's processes ran nothing before it (a ``@given``
        test's minimal example: the earlier examples' failures replaced those processes).
        """
        verdict, result, earlier = run.verdict, run.result, run.earlier
        fresh_world = functools.partial(self.new_world, run.shape, run.holder)
        settings = self.settings
        wanted = settings.verify or (settings.confirm and verdict == FAILED)
        if not wanted or not (earlier or always) or _leaked(result):
            return Held(result)
        try:
            fresh, found = on_fresh(fresh_world, (), lambda world: test.attempt(world, True))
        except Exception as exc:  # the fresh world did not start
            return Held(result, f"not confirmed on fresh processes ({exc}); ")
        if settings.verify:
            item.user_properties.append(
                (report.VERIFIED, "same" if fresh == verdict else "differs")
            )
        if fresh == verdict:
            # The fresh run's account: what a run of the test alone shows (a reused rank may
            # fail the same test another way, e.g. crash where fresh ones raise).
            return Held(found, "confirmed on fresh processes; ")
        finding = None
        if settings.bisect_runs and earlier:
            finding = order.bisect(
                fresh_world,
                earlier,
                lambda world: test.attempt(world, True)[0],
                verdict,
                settings.bisect_runs,
            )
        text = order.message(
            item, [step.nodeid for step in earlier], verdict, fresh, finding, option
        )
        if settings.order_dependent == "fail" and fresh != FAILED:
            return Held(found, failure=pytest.fail.Exception(text, pytrace=False))
        path, lineno, _ = item.location
        try:  # a warning located at the test
            warnings.warn_explicit(
                OrderDependenceWarning(text),
                OrderDependenceWarning,
                str(item.config.rootpath / path),
                (lineno or 0) + 1,
            )
        except OrderDependenceWarning:  # -W error: the test's failure, not a plugin error
            text = f"OrderDependenceWarning: {text}"
            return Held(found, failure=pytest.fail.Exception(text, pytrace=False))
        return Held(found)


def _leaked(result: object) -> bool:
    """Whether a run failed with a leak (``RankLeak``): what the reused ranks kept, which fresh
    processes that never ran the earlier tests can neither confirm (memory that grew over
    them) nor refute."""
    outcome = getattr(result, "outcome", result)  # a --dist-mptc case's ending holds it
    return isinstance(getattr(outcome, "error", None), RankLeak)
