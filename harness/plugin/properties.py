"""Distributed property tests: Hypothesis draws each example here, real ranks run it.

A distributed test decorated with Hypothesis's ``@given`` is run in its call phase, inside
Hypothesis's own pytest integration: the wrapper ``@given`` made draws every example in the
pytest process, and the function it calls for each example (``.hypothesis.inner_test``,
which Hypothesis lets other libraries replace) is, for the duration of the test, one that
sends the drawn arguments to every rank of a reused world and runs the body there
(:mod:`harness.rank.property_body`). A failure on any rank is raised back into Hypothesis:
a failing example, which it shrinks as any other; the last one it runs is the minimal one.

What differs from a marked test is only what runs on the ranks (an example, its drawn
arguments added to the test's plan, then the marker's ``verify=``) and when: each example
runs through the session's runner (:mod:`harness.plugin.runner`) on its world, and the last
one, the minimal example where the test failed, is held against fresh processes and goes
through the steps after a run (:mod:`harness.plugin.after_run`) as any test does: its
confirmation, ``--dist-verify``, the bisection of an order dependence, its trace folder and
its repro, which names it (world size and arguments) with an ``@example(...)`` to paste.

A drawn ``world_size`` (``@given(world_size=st.integers(1, 4))``) is the size of the world
the example runs on; what the strategy can draw is checked against ini
``dist_max_world_size`` before any example runs. The worlds of drawn sizes are the session's,
kept warm across the examples; those the test started are closed after it (the marker's own
size is kept as for any test).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from harness import compat, validate
from harness.controller.pickling import pickle_problem
from harness.errors import DistributedError
from harness.faults import Fault
from harness.plugin import (
    after_run,
    interrupts,
    property_checks,
    schedules,
    settings,
    sweep_cases,
)
from harness.plugin.leases import Holder
from harness.plugin.replay import Step, verdict_of
from harness.plugin.runner import Held, Reused, Runnable, Runner
from harness.protocol.pytest_calls import ARG_VALUE, Arg, FixturePlan, TestRef
from harness.rank.property_body import run_example

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome
    from harness.controller.world import World
    from harness.plugin.item_settings import TestSettings, WorldShape
    from harness.protocol.messages import CallOptions

_DRAWN = "\x1fdrawn "  # a drawn argument's key among the plan's values: never a fixture's


class _RankSide:
    """What the pytest process hands Hypothesis's wrapper for an argument that only the
    ranks have (``rank``, a ``@harness.fixture``): never sent, since each rank makes its own."""

    def __repr__(self) -> str:
        return "<made in each rank>"


RANK_SIDE = _RankSide()


def is_property(item: pytest.Function) -> bool:
    """Whether a test is a Hypothesis ``@given`` test."""
    return bool(getattr(item.obj, "is_hypothesis_test", False))


class Session(after_run.Session, Protocol):
    """What a property test needs of the plugin's session."""

    runner: Runner

    def runnable(
        self, item: pytest.Function, plan: FixturePlan, step: Step, timeout: float
    ) -> Runnable[Outcome]:
        """``step`` as the runner runs a marked test: under the harness's warnings, its
        wider-scoped fixtures kept with the world (``timeout``: the test's own)."""

    def worlds_of_one_test(self, keep: WorldShape) -> contextlib.AbstractContextManager[None]:
        """Close, as the block ends, the worlds it started, but the one of ``keep``."""


def prepare(
    item: pytest.Function, test: TestSettings, ref: TestRef, plan: FixturePlan, session: Session
) -> PropertyTest:
    """A ``@given`` test as its call phase runs it, checked before any example runs.

    Args:
        item: The test.
        test: Its settings (its marker's, else the session's), its world among them.
        ref: Where the ranks find the test.
        plan: Its fixture plan.
        session: The plugin's session: its runner, worlds and the steps' needs.

    Returns:
        The test, for :meth:`PropertyTest.run`.

    Raises:
        pytest.fail.Exception: Its ``world_size`` strategy can draw outside 1 to ini
            ``dist_max_world_size``, ini ``dist_max_world_size`` is not an int >= 1, or
            its marker asks for schedules (an example's is drawn).
    """
    bound = settings.max_world_size(item.config)
    property_checks.check_bounds(item, bound)
    property_checks.check_schedules(item)
    return PropertyTest(item, test, ref, plan, session, bound)


@dataclass
class _Example:
    """One example as the runner runs it: the test's step with the drawn arguments, then
    the marker's ``verify=`` on a fresh world where it passed."""

    test: PropertyTest
    marked: Runnable[Outcome]
    drawn: dict[str, Any]
    size: int

    @property
    def step(self) -> Step:
        return self.marked.step

    def attempt(self, world: World, fresh: bool) -> tuple[str, Outcome]:
        self.test.restore()
        outcome = self.marked.attempt(world, fresh)[1]
        prop, fault = self.test, self.drawn.get(property_checks.FAULT_ARG)
        outcome = sweep_cases.after_case(
            prop.item,
            prop.test,
            outcome,
            lambda n: prop.session.fresh_world(prop.test.world.sized(n), prop.holder),
            self.step.options,
            fault=fault if isinstance(fault, Fault) else None,
            values=self.drawn,
        )
        return verdict_of(outcome), outcome


@dataclass
class _Ran:
    """An example's run: what ran, and on which world (``reused``: None where fresh)."""

    example: _Example
    outcome: Outcome
    reused: Reused[Outcome] | None


@dataclass
class PropertyTest:
    """A ``@given`` distributed test, ready to run in its call phase.

    Attributes:
        item: The test.
        test: Its settings: the marker's world (its size is used where ``world_size`` is
            not drawn), how its ranks run each example (its timeout: each example's; the
            marker's faults, to which each example adds its drawn ``fault``), whether each
            example runs on fresh ranks.
        ref: Where the ranks find the test.
        plan: Its fixture plan, to which each example adds its drawn arguments.
        session: The plugin's session.
        bound: The largest drawn world size (ini ``dist_max_world_size``).
        holder: Whose GPUs its worlds lease.
        examples: How many examples ran.
        restore: Puts its ``tmp_path`` back before each example that draws a schedule.
    """

    item: pytest.Function
    test: TestSettings
    ref: TestRef
    plan: FixturePlan
    session: Session
    bound: int
    holder: Holder = field(init=False)
    examples: int = 0
    restore: Callable[[], None] = field(init=False)
    _last: _Ran | None = None

    def __post_init__(self) -> None:
        self.holder = Holder(self.item.nodeid)
        # A drawn schedule's race (a file one rank writes for another) shows only where the
        # file is not there already: each example starts from tmp_path as its fixtures left
        # it, as each schedule of a marked test does.
        drawn = property_checks.SCHEDULE_ARG in compat.given_strategies(self.item.obj)
        self.restore = schedules.fresh_tmp_path(self.item) if drawn else lambda: None

    @property
    def option(self) -> str:
        """What the repro command needs besides the test's id (``--dist-backend=gloo``)."""
        return f"--dist-backend={self.test.world.backend}"

    def run(self) -> None:
        """Run Hypothesis's wrapper here, each example on the ranks; close the worlds it
        started; take its last example through the steps after a run.

        Raises:
            BaseException: The test's failure: the minimal example's, held against fresh
                processes, or an order dependence where one fails the test.
        """
        with self.session.worlds_of_one_test(self.test.world):
            try:
                self._examples()
            except DistributedError as error:
                if self._last is None or self._last.outcome.error is not error:
                    raise
                failed = True
            else:
                failed = False
            last = self._last
            if last is not None:
                self._settle(last, self._minimal(last) if failed else "")

    def _examples(self) -> None:
        """Hypothesis's wrapper, each example it draws sent to :meth:`example`."""
        function = self.item.obj
        handle = function.hypothesis
        original = handle.inner_test
        # Not drawn: what the pytest process passes the wrapper, and a method's self (which
        # Hypothesis passes on by name).
        passed = set(inspect.signature(function).parameters)
        if self.item.cls is not None:
            passed.add(next(iter(inspect.signature(original).parameters), "self"))

        # functools.wraps: Hypothesis keys its example database and its derandomized seed
        # by the inner test's name and source, which must stay the user's.
        @functools.wraps(original)
        def example(*args: Any, **kwargs: Any) -> None:
            del args  # a method's self: each rank makes its own instance
            self.example({k: v for k, v in kwargs.items() if k not in passed})

        handle.inner_test = example
        try:
            params = inspect.signature(function).parameters
            function(**{name: self.item.funcargs.get(name, RANK_SIDE) for name in params})
        finally:
            handle.inner_test = original

    def example(self, drawn: dict[str, Any]) -> None:
        """Run one example on every rank of the world of its size, with its faults, then
        the marker's ``verify=`` where it passed.

        Raises:
            DistributedError: A rank failed, hung or crashed, the ranks' collectives
                differ, or ``verify=`` failed: a failing example for Hypothesis.
            TypeError: A drawn argument does not pickle (naming it), or a drawn ``fault``
                is not a fault.
            ValueError: A drawn world size outside 1 to the bound, or a drawn fault's
                argument is not valid.
        """
        size = property_checks.drawn_size(drawn, self.test.world_size, self.bound)
        placed = property_checks.drawn_faults(drawn, self.test.call.faults, size)
        schedule = property_checks.drawn_schedule(drawn, self.test.schedule_delay)
        for name, value in drawn.items():
            problem = pickle_problem(value)
            if problem is not None:
                raise TypeError(
                    f"drawn argument {name!r} cannot be sent to the ranks: its value "
                    f"{validate.short_repr(value)} does not pickle ({problem})"
                )
        timeout = self.test.call.timeout or validate.DEFAULT_TIMEOUT_S
        with interrupts.taken_over(self.item, timeout) as deadline:
            # A schedule's holds are counted outside the test's deadline.
            seconds = deadline.seconds + (schedule.longest if schedule is not None else 0)
            options = replace(self.test.call, timeout=seconds, faults=placed, schedule=schedule)
            example = self._example(dict(drawn), size, options)
            shape = self.test.world.sized(size)
            runner = self.session.runner
            if self.test.isolate:
                self._last = _Ran(example, runner.alone(example, shape, self.holder), None)
            else:
                reused = runner.reused(example, shape, self.holder)
                # Its earlier examples are the test itself, not an earlier test to search.
                earlier = [step for step in reused.earlier if step.nodeid != self.item.nodeid]
                self._last = _Ran(example, reused.result, replace(reused, earlier=earlier))
            outcome = self._last.outcome
            deadline.explain(outcome.error)
        self.examples += 1
        if outcome.skip is not None:  # Hypothesis lets pytest's skip through: the test's
            compat.skip_at_test(outcome.skip.reason)
        if outcome.error is not None:
            raise outcome.error

    def _example(self, drawn: dict[str, Any], size: int, options: CallOptions) -> _Example:
        """An example's run on the ranks: the test's plan with the drawn arguments."""
        plan = replace(
            self.plan,
            args=(*self.plan.args, *((name, Arg(ARG_VALUE, _DRAWN + name)) for name in drawn)),
            values={**self.plan.values, **{_DRAWN + n: v for n, v in drawn.items()}},
        )
        step = Step(self.item.nodeid, run_example, (self.ref, plan), options)
        marked = self.session.runnable(self.item, plan, step, self.test.timeout)
        return _Example(self, marked, drawn, size)

    def _minimal(self, last: _Ran) -> str:
        """The report's lines on the minimal example, before the repro command."""
        drawn, size = last.example.drawn, last.example.size
        args = ", ".join(f"{name}={value!r}" for name, value in drawn.items())
        ranks = f"{size} rank" + ("" if size == 1 else "s")
        schedule = last.example.step.options.schedule
        holds = "" if schedule is None else schedules.holds_lines(schedule, last.outcome)
        return (
            f"minimal example ({ranks}, {self.examples} examples run): "
            f"{self.item.originalname}({args})\n{holds}"
            f"to replay it first, add above @given: @example({args})\n"
        )

    def _settle(self, last: _Ran, lines: str) -> None:
        """Hold the last example against fresh processes and take it through the steps
        after a run (:mod:`harness.plugin.after_run`); raise the test's failure.

        Shrinking runs many examples, so only the last one (the minimal one, where the test
        failed) is held: one world start per failing test, as for any test.
        """
        example = last.example
        timeout = self.test.call.timeout or validate.DEFAULT_TIMEOUT_S
        with interrupts.taken_over(self.item, timeout) as deadline:
            held: Held[Outcome] = Held(last.outcome)
            if last.reused is not None:
                held = self.session.runner.held(
                    self.item, example, last.reused, self.option, always=True
                )
            ran = after_run.Ran(
                self.item, held.result, self.test.world.sized(example.size),
                example.step.options, self.holder, self.option, lines + held.note,
                held.failure, self.test, call_phase=True,
            )  # fmt: skip
            ran = after_run.after_run(self.session, ran)
            deadline.explain(ran.outcome.error)
        if ran.failure is not None:
            raise ran.failure
        if ran.outcome.error is not None:
            raise ran.outcome.error
