"""Where a pytest test body runs in a rank: :func:`run_pytest_test`.

The plugin sends a :class:`~harness.protocol.pytest_calls.TestRef` (never the function
object) and a :class:`~harness.protocol.pytest_calls.FixturePlan`. Here the module is
imported the way pytest imported it in the controller (:mod:`harness.rank.importer`), the
class (if any) is instantiated, the rank-side fixtures are set up, the body is called, and
they are torn down: after a failure, only once the controller heard of it
(:meth:`~harness.rank.context.RankContext.report_failing`). What outlives the test (the
imported modules, wider-scoped fixtures, the log handler) is kept on the rank's context.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from typing import TYPE_CHECKING, Any

from harness.protocol.failures import TIMES_ATTR
from harness.protocol.pytest_calls import FixturePlan, TestRef
from harness.rank import current, fixtures

if TYPE_CHECKING:
    from harness.rank.context import RankContext


def run_pytest_test(ref: TestRef, plan: FixturePlan) -> tuple[float, float, float]:
    """Run a pytest test with its rank-side fixtures, its log records captured.

    Raises what the test raised, or what a fixture raised marked with its phase.

    Returns:
        The seconds spent in the test's setup, call and teardown, as pytest reports its
        phases' durations; they are set on what it raises too (``TIMES_ATTR``).
    """
    ctx = current.context()
    marks = [time.perf_counter()]  # when setup, call and teardown started
    with ctx.logs.captured(plan.logs):
        try:
            _run(ctx, ref, plan, marks)
        except BaseException as exc:
            # An exception type with __slots__ takes no attribute: its phases are not told apart.
            with contextlib.suppress(AttributeError, TypeError):
                setattr(exc, TIMES_ATTR, _times(marks))
            raise
    return _times(marks)


def _run(ctx: RankContext, ref: TestRef, plan: FixturePlan, marks: list[float]) -> None:
    module = ctx.importer.test_module(ref)
    cls: Any = None
    instance: Any = None
    if ref.cls is not None:
        cls = functools.reduce(getattr, ref.cls.split("."), module)
        instance = cls()
        if ref.instance_state:
            instance.__dict__.update(ref.instance_state)
    function = getattr(module if instance is None else instance, ref.function)
    if not plan.args and not plan.fixtures:
        _enter(ctx, "call", marks)
        function()  # nothing to set up or tear down
        return
    test = {"module": module, "cls": cls, "instance": instance, "function": function}
    running = ctx.running
    setup = fixtures.Setup(
        plan,
        test,
        ctx.importer.fixture_function,
        failing=ctx.report_failing,
        scopes=ctx.fixtures,
        watch=running.watch if running is not None else None,
    )
    kwargs = setup.arguments()
    _enter(ctx, "call", marks)
    try:
        function(**kwargs)
    except BaseException as exc:
        # The controller hears of the failure before the teardown, which may take long or
        # be cut short: this rank's failure is the root cause when it came first.
        ctx.report_failing(exc)
        _enter(ctx, "teardown", marks)
        setup.teardown(quiet=True)
        raise
    _enter(ctx, "teardown", marks)
    setup.teardown()


def _enter(ctx: RankContext, phase: str, marks: list[float]) -> None:
    marks.append(time.perf_counter())
    ctx.logs.enter(phase)


def _times(marks: list[float]) -> tuple[float, float, float]:
    """The seconds from each mark to the next (the last: until now); 0 for a phase not reached."""
    points = [*marks, time.perf_counter()]
    spans = [end - start for start, end in itertools.pairwise(points)]
    setup, call, teardown = [*spans, 0.0, 0.0][:3]
    return (setup, call, teardown)
