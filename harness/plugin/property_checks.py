"""What a ``@given`` distributed test is checked for: its ``world_size`` strategy before any
example runs, and each example's drawn world size and faults (a marker whose ``world_size``
is a strategy fails with the test's settings, :mod:`harness.plugin.settings`), and
the schedule each example runs under (:func:`drawn_schedule`).

The checks before any example fail the test with one line naming the bad value and what
would be valid (:func:`check_bounds`); those of an example (:func:`drawn_size`,
:func:`drawn_faults`) raise into Hypothesis, so that the example fails and shrinks, or, for
a fault on a rank the drawn world does not have, reject it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pytest

from harness import compat, validate
from harness.faults import Fault
from harness.faults.checks import checked
from harness.plugin.marker import parse_mark, run_mark
from harness.plugin.settings import MAX_WORLD_SIZE_INI
from harness.protocol.schedules import Schedule

FAULT_ARG = "fault"
"""The drawn argument whose value (a fault, a list of them, or None) each example injects."""

SCHEDULE_ARG = "schedule"
"""The drawn argument whose value (a ``harness.Schedule``, or None) each example runs under."""


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


def drawn_size(drawn: Mapping[str, Any], default: int, bound: int) -> int:
    """The world size an example runs on: its drawn ``world_size``, else ``default``.

    Raises:
        ValueError: A drawn world size outside 1 to ``bound``, naming it.
    """
    size = drawn.get("world_size", default)
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= bound:
        raise ValueError(
            f"drawn world_size {size!r}: a drawn world has 1 to {bound} ranks "
            f"(ini {MAX_WORLD_SIZE_INI})"
        )
    return size


def drawn_faults(
    drawn: Mapping[str, Any], marked: tuple[Fault, ...], size: int
) -> tuple[Fault, ...]:
    """The faults an example injects: the marker's, then its drawn ``fault`` (one fault, a
    list of them, or None), checked against the example's world.

    A drawn fault on a rank the drawn world does not have rejects the example, as
    ``hypothesis.assume`` would: a fault's rank and the world size are drawn apart.

    Raises:
        TypeError: The drawn ``fault`` is not a fault, a list of faults or None, naming it.
        ValueError: A fault's argument is not valid, or two act at the same collective.
    """
    value = drawn.get(FAULT_ARG)
    if FAULT_ARG not in drawn or value is None:
        return checked(marked, size, "the marker's faults") if marked else ()
    mine = [value] if isinstance(value, Fault) else value
    if not isinstance(mine, (list, tuple)) or not all(isinstance(f, Fault) for f in mine):
        raise TypeError(
            f"drawn argument {FAULT_ARG!r} must be a fault made by harness.faults, a list of "
            f"them, or None (draw it with harness.strategies.faults), not {value!r}"
        )
    if any(f.rank >= size or any(m >= size for m in f.group or ()) for f in mine):
        from hypothesis import reject

        reject()
    return checked([*marked, *mine], size, f"drawn argument {FAULT_ARG!r}")


def drawn_schedule(drawn: Mapping[str, Any], delay: float) -> Schedule | None:
    """The schedule an example runs under: its drawn ``schedule`` (None: none), each hold
    at most ``delay`` seconds where the schedule does not say.

    Raises:
        TypeError, ValueError: The drawn ``schedule`` is neither None nor a valid
            ``harness.Schedule``, naming it.
    """
    value = drawn.get(SCHEDULE_ARG)
    if value is None:
        return None
    schedule = validate.schedule(value, f"drawn argument {SCHEDULE_ARG!r}")
    return schedule if schedule.delay is not None else replace(schedule, delay=delay)


def check_schedules(item: pytest.Function) -> None:
    """Fail a ``@given`` test whose marker asks for schedules: Hypothesis draws an
    example's schedule, as another argument.

    Raises:
        pytest.fail.Exception: The marker has ``schedules`` (but 0) or ``schedule_seed``.
    """
    mark = run_mark(item)
    spec = parse_mark(mark) if mark is not None else None
    if spec is not None and (spec.schedules or spec.schedule_seed is not None):
        raise pytest.fail.Exception(
            f"{item.name} is a @given test: draw its schedule as another argument, "
            f"@given(..., {SCHEDULE_ARG}=harness.strategies.schedules(ranks=range(2))), "
            "instead of the marker's schedules= or schedule_seed=",
            pytrace=False,
        )
