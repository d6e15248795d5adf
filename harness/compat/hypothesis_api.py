"""Hypothesis's private names: a ``@given`` test's strategies and its settings, replaced.

A distributed property test runs each of Hypothesis's examples on real ranks
(:mod:`harness.plugin.properties`). Hypothesis has no public way to read back the strategies
a ``@given`` test was decorated with (the drawn ``world_size`` is checked against its bound
before any example runs), nor to change the settings of a test that ``@settings`` already
decorated (a second ``@settings`` is an error), which the harness must do: the deadline is
off for examples that start worlds, and function-scoped fixtures of the ranks are set up
anew for each example. Hypothesis's own pytest plugin writes the same attribute. Hypothesis
is imported inside the functions: it is an optional dependency.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["given_strategies", "relax_settings"]


def given_strategies(function: Any) -> Mapping[str, Any]:
    """The strategies a ``@given`` test draws its arguments from, by argument name.

    Positional strategies (``@given(st.integers())``) are named by the parameter they fill,
    as Hypothesis names them.
    """
    strategies: Mapping[str, Any] = function.hypothesis._given_kwargs
    return strategies


def relax_settings(function: Any, *, alike: bool = False) -> None:
    """Turn off ``function``'s Hypothesis deadline, its health checks of function-scoped
    fixtures and differing executors and its report of several distinct bugs, keeping its
    other settings.

    The harness bounds each example with the test's own timeout (a hang is a failing
    example with the ranks' stacks, not a ``DeadlineExceeded``), sets up the ranks'
    function-scoped fixtures for each example (each rank makes a test class's instance of
    its own, too), and reports one failure: the minimal one.

    Args:
        function: The ``@given`` test.
        alike: Every process that runs it must draw the same examples, in the same order
            (each rank of a launcher's world runs Hypothesis itself): derandomized, no
            example database (the ranks would read and write it at different moments), no
            health check that depends on timing, no explain phase (it traces which lines
            each rank ran, which differs by rank).
    """
    from hypothesis import HealthCheck, Phase, settings

    target = getattr(function, "__func__", function)  # a method: its function
    current = getattr(target, "_hypothesis_internal_use_settings", None) or settings()
    # Both, or Hypothesis's pytest plugin asks pytest for each fixture's value, and a
    # rank-side fixture has none in this process.
    quiet = {HealthCheck.function_scoped_fixture, HealthCheck.differing_executors}
    same: dict[str, Any] = {}
    if alike:
        quiet.add(HealthCheck.too_slow)
        phases = [phase for phase in current.phases if phase is not Phase.explain]
        same = {"derandomize": True, "database": None, "phases": phases}
    suppressed = {*current.suppress_health_check, *quiet}
    target._hypothesis_internal_use_settings = settings(
        parent=current,
        deadline=None,
        suppress_health_check=list(suppressed),
        report_multiple_bugs=False,
        **same,
    )


def _probe() -> object:
    """Both names on a ``@given`` test, where Hypothesis is installed."""
    if importlib.util.find_spec("hypothesis") is None:
        return None
    from hypothesis import given, strategies

    @given(value=strategies.integers())
    def test(value: int) -> None:
        del value

    relax_settings(test)
    assert dict(given_strategies(test)).keys() == {"value"}
    return test._hypothesis_internal_use_settings.deadline  # type: ignore[attr-defined]


PROBES: dict[str, Callable[[], object]] = {
    "hypothesis: a @given test's _given_kwargs and _hypothesis_internal_use_settings": _probe,
}
