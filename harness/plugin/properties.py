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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pytest

from harness import compat, validate
from harness.controller.pickling import pickle_problem
from harness.errors import DistributedError
from harness.plugin import interrupts, report
from harness.plugin.marker import parse_mark, run_mark
from harness.plugin.replay import Step
from harness.protocol.pytest_calls import ARG_VALUE, Arg, FixturePlan, TestRef
from harness.rank.property_body import run_example

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome
    from harness.controller.world import World
    from harness.plugin.runner import Shape
    from harness.protocol.messages import CallOptions

MAX_WORLD_SIZE_INI = "dist_max_world_size"
DEFAULT_MAX_WORLD_SIZE = 8
"""The largest world a drawn ``world_size`` may ask for, where ini ``dist_max_world_size``
does not say: Gloo ranks share the machine's cores, and a world larger than this is more
likely a strategy's mistake than a test's intent."""

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


def check_marker(item: pytest.Function) -> None:
    """Fail a test whose marker's ``world_size`` is a Hypothesis strategy, saying where the
    strategy goes instead.

    Raises:
        pytest.fail.Exception: The marker's ``world_size`` is a strategy.
    """
    mark = run_mark(item)
    if mark is None:
        return
    try:
        size = parse_mark(mark).world_size
    except ValueError:
        return  # the marker's other mistakes are reported by its settings
    if type(size).__module__.startswith("hypothesis."):
        raise pytest.fail.Exception(
            f"invalid @pytest.mark.{mark.name}: world_size={size!r} is a Hypothesis strategy; "
            f"draw it with the test's arguments instead: @given(world_size={size!r}, ...), "
            "and leave world_size out of the marker",
            pytrace=False,
        )


def max_world_size(config: pytest.Config) -> int:
    """The largest world a drawn ``world_size`` may ask for (ini ``dist_max_world_size``).

    Raises:
        pytest.fail.Exception: The ini value is not an int >= 1.
    """
    value = config.getini(MAX_WORLD_SIZE_INI) or DEFAULT_MAX_WORLD_SIZE
    try:
        return validate.positive_int(value, f"ini option {MAX_WORLD_SIZE_INI}", text=True)
    except (TypeError, ValueError) as exc:
        raise pytest.fail.Exception(str(exc), pytrace=False) from None


def check_bounds(item: pytest.Function, bound: int) -> None:
    """Fail the test before any example runs where its ``world_size`` strategy can draw a
    size outside 1 to ``bound``, naming the bound and a size it drew.

    Hypothesis cannot tell what a strategy may draw without drawing: each side is searched
    for with ``hypothesis.find``, derandomized, so the verdict is the same at every run.

    Raises:
        pytest.fail.Exception: The strategy can draw 0 or fewer ranks, or more than ``bound``.
    """
    strategy = compat.given_strategies(item.obj).get("world_size")
    if strategy is None:
        return
    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample

    search = settings(
        database=None, derandomize=True, max_examples=200, suppress_health_check=list(HealthCheck)
    )
    sides: list[tuple[str, Callable[[Any], bool]]] = [
        ("not a world size", lambda v: not isinstance(v, int) or isinstance(v, bool) or v < 1),
        (f"more ranks than {bound}", lambda v: isinstance(v, int) and v > bound),
    ]
    for what, outside in sides:
        try:
            found = find(strategy, outside, settings=search)
        except NoSuchExample:
            continue
        raise pytest.fail.Exception(
            f"@given(world_size={strategy!r}) can draw {found!r}, {what}: a drawn world has "
            f"1 to {bound} ranks (ini {MAX_WORLD_SIZE_INI} = {bound}); bound the strategy, "
            f"e.g. st.integers(1, {bound}), or raise the ini option",
            pytrace=False,
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
        shape: The marker's world (its size is used where ``world_size`` is not drawn).
        ref: Where the ranks find the test.
        plan: Its fixture plan, to which each example adds its drawn arguments.
        options: How its ranks run each example (its timeout: each example's).
        isolate: Whether each example runs on fresh ranks.
        option: What the repro command needs besides the test's id (``--dist-backend=gloo``).
        bound: The largest drawn world size (ini ``dist_max_world_size``).
        session_world: The session's world of the marker's shape, started on first use.
        warm: The session's started world of a shape, if it has one.
        new_world: A fresh world of a shape.
        call: Runs one example's step on a world (``True``: a fresh one), under the
            harness's warnings and its wider-scoped fixtures' bookkeeping.
    """

    item: pytest.Function
    shape: Shape
    ref: TestRef
    plan: FixturePlan
    options: CallOptions
    isolate: bool
    option: str
    bound: int
    session_world: Callable[[Shape], World]
    warm: Callable[[Shape], World | None]
    new_world: Callable[[Shape], World]
    call: Callable[[World, Step, bool], Outcome]
    examples: int = 0
    _own: dict[Shape, World] = field(default_factory=dict)
    _failed: _Failed | None = None

    def run(self) -> None:
        """Run Hypothesis's wrapper here, each example on the ranks; close the worlds it
        started. A failure is the minimal example's, its report naming it."""
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
            self._report(error)
            raise
        finally:
            handle.inner_test = original
            self.close()

    def example(self, drawn: dict[str, Any]) -> None:
        """Run one example on every rank of the world of its size.

        Raises:
            DistributedError: A rank failed, hung or crashed, or the ranks' collectives
                differ: a failing example for Hypothesis.
            TypeError: A drawn argument does not pickle (naming it).
            ValueError: A drawn world size outside 1 to the bound.
        """
        size = drawn.get("world_size", self.shape[0])
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= self.bound:
            raise ValueError(
                f"drawn world_size {size!r}: a drawn world has 1 to {self.bound} ranks "
                f"(ini {MAX_WORLD_SIZE_INI})"
            )
        for name, value in drawn.items():
            problem = pickle_problem(value)
            if problem is not None:
                raise TypeError(
                    f"drawn argument {name!r} cannot be sent to the ranks: its value "
                    f"{validate.short_repr(value)} does not pickle ({problem})"
                )
        plan = replace(
            self.plan,
            args=(*self.plan.args, *((name, Arg(ARG_VALUE, _DRAWN + name)) for name in drawn)),
            values={**self.plan.values, **{_DRAWN + n: v for n, v in drawn.items()}},
        )
        shape: Shape = (size, *self.shape[1:])
        timeout = self.options.timeout or validate.DEFAULT_TIMEOUT_S
        with interrupts.taken_over(self.item, timeout) as deadline:
            options = replace(self.options, timeout=deadline.seconds)
            step = Step(self.item.nodeid, run_example, (self.ref, plan), options)
            if self.isolate:
                with self.new_world(shape) as world:
                    outcome = self.call(world, step, True)
            else:
                outcome = self.call(self._world(shape), step, False)
            deadline.explain(outcome.error)
        self.examples += 1
        if outcome.skip is not None:  # Hypothesis lets pytest's skip through: the test's
            compat.skip_at_test(outcome.skip.reason)
        if outcome.error is not None:
            self._failed = _Failed(size, dict(drawn), outcome)
            raise outcome.error

    def close(self) -> None:
        """Close the worlds this test started for drawn sizes."""
        worlds, self._own = list(self._own.values()), {}
        for world in worlds:
            world.close()

    def _world(self, shape: Shape) -> World:
        """The marker's size: the session's world; another: the session's where it has
        one started, else this test's own, kept until the test ends."""
        if shape == self.shape:
            return self.session_world(shape)
        world = self.warm(shape) or self._own.get(shape)
        if world is None or world.closed:
            world = self._own[shape] = self.new_world(shape)
        return world

    def _report(self, error: DistributedError) -> None:
        """End the failure's report with the minimal example and how to replay it."""
        failed = self._failed
        if failed is None or failed.outcome.error is not error:
            return
        args = ", ".join(f"{name}={value!r}" for name, value in failed.drawn.items())
        ranks = f"{failed.size} rank" + ("" if failed.size == 1 else "s")
        note = (
            f"minimal example ({ranks}, {self.examples} examples run): "
            f"{self.item.originalname}({args})\n"
            f"to replay it first, add above @given: @example({args})\n"
        )
        report.set_repro(self.item, note, f"{ranks}, {self.shape[1]}", self.option)
        report.add_output_sections(self.item, failed.outcome.outputs)
