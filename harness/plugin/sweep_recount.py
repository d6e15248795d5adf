"""A sweep's count held against each case's run: a case whose run contradicts it counts
again, once per test and session.

A sweep over ``at="all"`` makes its cases from a clean run's count
(:mod:`harness.plugin.sweep_count`), reused while the project's files it imported are
unchanged. What that key cannot see (a file the test reads, a library reinstalled into
``site-packages``, an environment variable) can still leave the count stale. A case's run
then contradicts it: its fault never fired (the run ended, hung or failed before it did), or
it fired at a collective other than the one counted at its number. That case counts again
(:func:`after_case`), once per test and session:

- the count stands: the case's outcome stands (its failure is its own);
- the clean run now fails: the case fails with that failure, and so does each later case of
  the test, at once, without running (:func:`before_case`): one count's failure, rather
  than a timeout per case where the code now hangs;
- the count changed: the case fails, unless its run agrees with the new count, and so does
  each later case whose collective the new count lacks; the next run makes its cases from
  the new count, and its summary names the new call sites.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.controller.outcome import Outcome
from harness.errors import DistributedError
from harness.faults import Fault
from harness.plugin.sweep_count import Count, counted_before, recount
from harness.protocol.traces import call_text

if TYPE_CHECKING:
    import pytest

    from harness.plugin.item_settings import TestSettings

_RUN_AGAIN = "this session's cases were made from the old count: run again for the new one"


def contradiction(fault: Fault, counted: list[list[str]], outcome: Outcome) -> str:
    """How a case's run contradicts its sweep's count ('' where it does not): its fault never
    fired (the run was not skipped), or it fired at a collective that is not the one counted
    at its number.

    Args:
        fault: The case's fault, placed by its number.
        counted: The count's collectives of the fault's rank on its group, each ``[op,
            call site, origin]``.
        outcome: The case's run.
    """
    if outcome.skip is not None:
        return ""
    fired = next((found for found in outcome.fired if found.fault == fault), None)
    if fired is None:
        error = outcome.error
        ended = "" if error is None else f" in {type(error).__name__}"
        return (
            f"its fault never fired: the run ended{ended} before it did, though the count has "
            f"{len(counted)} collective{'' if len(counted) == 1 else 's'} of rank "
            f"{fault.rank} on {fault.group_name}"
        )
    if 1 <= fired.number <= len(counted) and fired.op:
        op, site, origin = counted[fired.number - 1]
        if op != "?" and (op, site) != (fired.op, fired.site):
            return (
                f"collective #{fired.number} was {call_text(fired.op, fired.site, fired.origin)}, "
                f"counted as {call_text(op, site, origin)}"
            )
    return ""


def after_case(item: pytest.Item, test: TestSettings, outcome: Outcome) -> Outcome:
    """A case's outcome, held against its sweep's count: where its run contradicts the count,
    counted again (once per test and session; see the module's docstring)."""
    fault = test.case
    counted = _count_of(item, fault)
    if counted is None or counted.recounted or not isinstance(fault, Fault):
        return outcome
    found = contradiction(fault, counted.of(fault), outcome)
    if not found:
        return outcome
    before = counted.issued
    counted = recount(item.config, _definition(item))
    if counted.failure:
        return _failed(outcome, f"{found}; counted again, and {counted.failure}")
    if counted.issued == before or not contradiction(fault, counted.of(fault), outcome):
        return outcome
    return _failed(outcome, f"{found}; counted again: {_now(counted, fault)}; {_RUN_AGAIN}")


def before_case(item: pytest.Item, test: TestSettings) -> Outcome | None:
    """The outcome of a case that need not run: its test counted again this session and its
    clean run failed, or the new count lacks the case's collective (None: it runs)."""
    fault = test.case
    counted = _count_of(item, fault)
    if counted is None or not counted.recounted or not isinstance(fault, Fault):
        return None
    earlier = "an earlier case of the test contradicted its count"
    if counted.failure:
        return _failed(None, f"{earlier}; counted again, and {counted.failure}")
    assert isinstance(fault.at, int)
    if fault.at <= len(counted.of(fault)):
        return None
    return _failed(None, f"{earlier}; counted again: {_now(counted, fault)}; {_RUN_AGAIN}")


def _count_of(item: pytest.Item, fault: object) -> Count | None:
    """The count of the sweep whose case ``item`` is (None: no counted sweep's case)."""
    if not isinstance(fault, Fault) or not isinstance(fault.at, int):
        return None
    return counted_before(item.config, _definition(item))


def _definition(item: pytest.Item) -> str:
    return item.nodeid.partition("[")[0]


def _now(counted: Count, fault: Fault) -> str:
    made = len(counted.of(fault))
    return (
        f"rank {fault.rank} now makes {made} collective{'' if made == 1 else 's'} on "
        f"{fault.group_name}"
    )


def _failed(outcome: Outcome | None, why: str) -> Outcome:
    """A case failed because its sweep's count is stale (``why``)."""
    error = DistributedError(f"the sweep's count of a clean run no longer holds: {why}")
    return Outcome(error=error, outputs=outcome.outputs if outcome is not None else {})
