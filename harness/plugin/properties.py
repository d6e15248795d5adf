"""Distributed property tests: Hypothesis draws each example here, real ranks run it.

A distributed test decorated with Hypothesis's ``@given`` is run in its call phase, inside
Hypothesis's own pytest integration: the wrapper ``@given`` made draws every example in the
pytest process, and the function it calls for each example (``.hypothesis.inner_test``,
which Hypothesis lets other libraries replace) is, for the duration of the test, one that
sends the drawn arguments to every rank of a reused world and runs the body there
(:mod:`harness.rank.property_body`). A failure on any rank is raised back into Hypothesis:
a failing example, which it shrinks as any other; the last one it runs is the minimal one,
and the report names it (world size and arguments) with an ``@example(...)`` to paste.

A drawn ``world_size`` (``@given(world_size=st.integers(1, 4))``) is the size of the world
the example runs on; what the strategy can draw is checked against ini
``dist_max_world_size`` before any example runs. The worlds of drawn sizes are kept warm
across the examples and closed after the test (the marker's own size is the session's world,
kept as for any test).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pytest

from harness import compat, validate
from harness.controller.pickling import pickle_problem
from harness.errors import DistributedError, OrderDependenceWarning
from harness.faults import Fault
from harness.plugin import interrupts, property_checks, report, settings, sweep_cases
from harness.plugin.replay import Step
from harness.protocol.pytest_calls import ARG_VALUE, Arg, FixturePlan, TestRef
from harness.rank.property_body import run_example

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome
    from harness.controller.world import World
    from harness.plugin.settings import WorldShape

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


def prepare(
    item: pytest.Function,
    test: settings.TestSettings,
    ref: TestRef,
    plan: FixturePlan,
    session: settings.Settings,
    worlds: Mapping[WorldShape, World],
    world: Callable[[WorldShape], World],
    new_world: Callable[[WorldShape], World],
    call: Callable[[World, Step, bool], Outcome],
) -> PropertyTest:
    """A ``@given`` test as its call phase runs it, checked before any example runs.

    Args:
        item: The test.
        test: Its settings (its marker's, else the session's), its world among them.
        ref: Where the ranks find the test.
        plan: Its fixture plan.
        session: The session's settings (``dist_confirm``, ``dist_order_dependent``).
        worlds: The session's worlds, by shape (read only: a warm one is used).
        world: The session's world of a shape, started on first use.
        new_world: A fresh world of a shape.
        call: Runs one step on a world (``True``: a fresh one), under the harness's
            warnings and its wider-scoped fixtures' bookkeeping.

    Returns:
        The test, for :meth:`PropertyTest.run`.

    Raises:
        pytest.fail.Exception: Its ``world_size`` strategy can draw outside 1 to ini
            ``dist_max_world_size``, or ini ``dist_max_world_size`` is not an int >= 1.
    """
    bound = property_checks.max_world_size(item.config)
    property_checks.check_bounds(item, bound)

    def warm(wanted: WorldShape) -> World | None:
        found = worlds.get(wanted)
        return found if found is not None and not found.closed else None

    return PropertyTest(
        item=item,
        test=test,
        ref=ref,
        plan=plan,
        option=f"--dist-backend={test.world.backend}",
        bound=bound,
        session_world=world,
        warm=warm,
        new_world=new_world,
        call=call,
        confirm=session.confirm,
        order_dependent=session.order_dependent,
    )


@dataclass
class _Failed:
    """The last failing example: its world size, drawn arguments and what the ranks did."""

    size: int
    drawn: dict[str, Any]
    outcome: Outcome


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
        option: What the repro command needs besides the test's id (``--dist-backend=gloo``).
        bound: The largest drawn world size (ini ``dist_max_world_size``).
        session_world: The session's world of the marker's shape, started on first use.
        warm: The session's started world of a shape, if it has one.
        new_world: A fresh world of a shape.
        call: Runs one example's step on a world (``True``: a fresh one), under the
            harness's warnings and its wider-scoped fixtures' bookkeeping.
        confirm: Whether the minimal example runs again on fresh processes (ini
            ``dist_confirm``).
        order_dependent: What a minimal example that passes there gets (ini
            ``dist_order_dependent``): ``"warn"`` or ``"fail"``.
    """

    item: pytest.Function
    test: settings.TestSettings
    ref: TestRef
    plan: FixturePlan
    option: str
    bound: int
    session_world: Callable[[WorldShape], World]
    warm: Callable[[WorldShape], World | None]
    new_world: Callable[[WorldShape], World]
    call: Callable[[World, Step, bool], Outcome]
    confirm: bool = True
    order_dependent: str = "warn"
    examples: int = 0
    _own: dict[WorldShape, World] = field(default_factory=dict)
    _failed: _Failed | None = None

    def run(self) -> None:
        """Run Hypothesis's wrapper here, each example on the ranks; close the worlds it
        started. A failure is the minimal example's, confirmed on fresh processes, its
        report naming it."""
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
        except DistributedError as error:
            confirmed = self._confirmed(error)
            if confirmed is not None:
                raise confirmed from None
        finally:
            handle.inner_test = original
            self.close()

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
        for name, value in drawn.items():
            problem = pickle_problem(value)
            if problem is not None:
                raise TypeError(
                    f"drawn argument {name!r} cannot be sent to the ranks: its value "
                    f"{validate.short_repr(value)} does not pickle ({problem})"
                )
        outcome = self._outcome(drawn, size, placed, self.test.isolate)
        self.examples += 1
        if outcome.skip is not None:  # Hypothesis lets pytest's skip through: the test's
            compat.skip_at_test(outcome.skip.reason)
        if outcome.error is not None:
            self._failed = _Failed(size, dict(drawn), outcome)
            raise outcome.error

    def _outcome(
        self, drawn: dict[str, Any], size: int, placed: tuple[Any, ...], fresh: bool
    ) -> Outcome:
        """One example's run on its world (``fresh``: a world of its own), then ``verify=``."""
        plan = replace(
            self.plan,
            args=(*self.plan.args, *((name, Arg(ARG_VALUE, _DRAWN + name)) for name in drawn)),
            values={**self.plan.values, **{_DRAWN + n: v for n, v in drawn.items()}},
        )
        shape = self.test.world.sized(size)
        timeout = self.test.call.timeout or validate.DEFAULT_TIMEOUT_S
        with interrupts.taken_over(self.item, timeout) as deadline:
            options = replace(self.test.call, timeout=deadline.seconds, faults=placed)
            step = Step(self.item.nodeid, run_example, (self.ref, plan), options)
            if fresh:
                with self.new_world(shape) as world:
                    outcome = self.call(world, step, True)
            else:
                outcome = self.call(self._world(shape), step, False)
            fault = drawn.get(property_checks.FAULT_ARG)
            outcome = sweep_cases.after_case(
                self.item,
                self.test,
                outcome,
                lambda n: self.new_world(self.test.world.sized(n)),
                options,
                fault=fault if isinstance(fault, Fault) else None,
                values=drawn,
            )
            deadline.explain(outcome.error)
        return outcome

    def close(self) -> None:
        """Close the worlds this test started for drawn sizes."""
        worlds, self._own = list(self._own.values()), {}
        for world in worlds:
            world.close()

    def _world(self, shape: WorldShape) -> World:
        """The marker's size: the session's world; another: the session's where it has
        one started, else this test's own, kept until the test ends."""
        if shape == self.test.world:
            return self.session_world(shape)
        world = self.warm(shape) or self._own.get(shape)
        if world is None or world.closed:
            world = self._own[shape] = self.new_world(shape)
        return world

    def _confirmed(self, error: DistributedError) -> BaseException | None:
        """The test's failure: the minimal example's, run once more on fresh processes
        (ini ``dist_confirm = fresh``), its report naming it; None where it passed there
        and the order dependence is a warning.

        Shrinking runs many examples, so only the minimal one is confirmed: one world start
        per failing test, as for any test.
        """
        failed = self._failed
        if failed is None or failed.outcome.error is not error:
            return error
        note = ""
        if self.confirm and not self.test.isolate:
            drawn, size = failed.drawn, failed.size
            try:
                placed = property_checks.drawn_faults(drawn, self.test.call.faults, size)
                fresh = self._outcome(drawn, size, placed, True)
            except Exception as exc:  # the fresh world did not start
                note = f"not confirmed on fresh processes ({exc}); "
            else:
                if fresh.error is None and fresh.skip is None:
                    return self._order_dependent(failed)
                if fresh.error is not None:
                    # The fresh run's account: what the example shows on ranks of its own.
                    failed.outcome, error = fresh, fresh.error
                    note = "confirmed on fresh processes; "
        self._report(failed, note)
        return error

    def _order_dependent(self, failed: _Failed) -> BaseException | None:
        """The minimal example failed after earlier examples on the same ranks and passed
        on fresh ones: a warning at the test, or its failure (ini ``dist_order_dependent``)."""
        text = (
            f"{self.item.nodeid}: the minimal example {self._call_text(failed)} failed on "
            f"ranks that ran earlier examples ({self.examples} examples run) and passed on "
            "fresh processes: an example leaves state in its ranks that a later one "
            "depends on"
        )
        if self.order_dependent == "fail":
            return pytest.fail.Exception(text, pytrace=False)
        path, lineno, _ = self.item.location
        try:  # a warning located at the test
            warnings.warn_explicit(
                OrderDependenceWarning(text),
                OrderDependenceWarning,
                str(self.item.config.rootpath / path),
                (lineno or 0) + 1,
            )
        except OrderDependenceWarning:  # -W error: the test's failure, not a plugin error
            return pytest.fail.Exception(f"OrderDependenceWarning: {text}", pytrace=False)
        return None

    def _call_text(self, failed: _Failed) -> str:
        args = ", ".join(f"{name}={value!r}" for name, value in failed.drawn.items())
        return f"{self.item.originalname}({args})"

    def _report(self, failed: _Failed, note: str) -> None:
        """End the failure's report with the minimal example and how to replay it."""
        args = ", ".join(f"{name}={value!r}" for name, value in failed.drawn.items())
        ranks = f"{failed.size} rank" + ("" if failed.size == 1 else "s")
        lines = (
            f"minimal example ({ranks}, {self.examples} examples run): "
            f"{self._call_text(failed)}\n"
            f"to replay it first, add above @given: @example({args})\n"
        )
        report.set_repro(
            self.item, lines + note, f"{ranks}, {self.test.world.backend}", self.option
        )
        report.add_output_sections(self.item, failed.outcome.outputs)
