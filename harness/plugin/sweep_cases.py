"""Sweeps over every rank and collective, ``verify=``, and what each case notes for the summary.

``faults.sweep("kill", ranks="all", at="all")`` is resolved at collection
(:func:`resolve`): ``"all"`` ranks are those of the test's world; ``"all"`` collectives are
those a clean run of the test makes on each rank, on the fault's group, counted by a pytest
subprocess (:mod:`harness.plugin.sweep_count`). A sweep that cannot be resolved (its clean
run failed, say) makes one case, :class:`~harness.plugin.marker.Unresolved`, which fails
saying why when it runs: the test's own failure, never a collection error that would stop
every other test.

After each case that passed (its survivors coped, or its restarts resumed), the marker's
``verify=`` runs on every rank of a fresh world (:func:`after_case`); its failure is the
case's, naming the kill point. Each case of a sweep notes itself for the terminal summary
(:func:`note`, :mod:`harness.plugin.sweep_summary`).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from harness import validate
from harness.faults import ALL, Collective, Fault, OpenSweep, Sweep
from harness.plugin import item_state, report
from harness.plugin.marker import CleanRun, MarkSpec, Unresolved, check_verify
from harness.plugin.sweep_count import COUNT_DIR, COUNT_TEST, count, counted_before
from harness.plugin.sweep_summary import CASE, MAX_CASES, Case, fault_label, too_many, verdict
from harness.protocol.messages import OUTPUT_CAPTURE, CallOptions
from harness.protocol.traces import call_text
from harness.rank.sweep_body import RANK_ARGS, counted, verified

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome
    from harness.controller.world import World
    from harness.plugin.item_settings import TestSettings


def resolve(metafunc: pytest.Metafunc, spec: MarkSpec, sweep: OpenSweep) -> list[Any]:
    """The cases of a sweep over ``"all"`` ranks or collectives, for the marker to
    parametrize: its faults; in the counting subprocess, the clean runs; or, where the sweep
    cannot be resolved (a list of world sizes, a bad argument of its faults or of
    ``verify=``, a clean run that failed or differs from the other, more than
    ``MAX_CASES`` cases), one :class:`Unresolved` case that fails saying why.
    """
    nodeid = metafunc.definition.nodeid
    counting = os.environ.get(COUNT_TEST)
    if counting is not None:  # the counting subprocess: no sweep, two clean runs
        return [CleanRun(1), CleanRun(2)] if counting == nodeid else [CleanRun(0)]
    try:
        faults = _faults(metafunc.config, nodeid, spec, sweep)
    except (TypeError, ValueError) as exc:
        return [Unresolved(sweep.kind, f"{nodeid}: {sweep}: {exc}")]
    if len(faults) > MAX_CASES:
        per_rank: dict[int, int] = {}
        for fault in faults:
            per_rank[fault.rank] = per_rank.get(fault.rank, 0) + 1
        return [Unresolved(sweep.kind, too_many(nodeid, len(faults), per_rank))]
    if not faults:
        group = "the default group" if sweep.group is None else f"group {sweep.group}"
        reason = f"{nodeid}: {sweep} makes no case: a clean run issued no collective on {group}"
        return [Unresolved(sweep.kind, reason)]
    return list(faults)


def _faults(config: pytest.Config, nodeid: str, spec: MarkSpec, sweep: OpenSweep) -> Sweep:
    """A sweep's faults, counting a clean run for ``at="all"``.

    Raises:
        TypeError, ValueError: The sweep cannot be resolved, saying why.
    """
    if isinstance(spec.world_size, (list, tuple)):
        raise ValueError(
            f"a sweep over {ALL!r} needs one world_size, not {list(spec.world_size)}: "
            "give ranks and at explicitly, or one test per size"
        )
    size = validate.positive_int(spec.world_size, "world_size")
    sizes = validate.attempt_sizes(spec.restarts, size)
    attempt = sweep.options.get("attempt", 0)
    if sweep.at == ALL and attempt:
        raise ValueError(
            f"at={ALL!r} counts a clean run's collectives, and a clean run never "
            f"reaches attempt {attempt}: give at=range(...)"
        )
    if not isinstance(attempt, int) or not 0 <= attempt < len(sizes):
        raise ValueError(f"the sweep's attempt={attempt!r} is not an attempt of the run")
    if sweep.at != ALL:  # each case's fault is checked as it runs, as any fault
        return sweep.faults(sizes[attempt])
    # Before a clean run is counted for them: a bad argument fails without one.
    check_verify(spec.verify)
    for fault in sweep.faults(sizes[attempt], lambda rank: 1):
        fault.check(sizes[attempt])
    issued = count(config, nodeid, size)
    key = "" if sweep.group is None else ",".join(map(str, sweep.group))
    return sweep.faults(sizes[attempt], lambda rank: len(issued.get(rank, {}).get(key, [])))


def body(
    item: pytest.Item, test: TestSettings, fn: Callable[..., Any], args: tuple[Any, ...]
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The rank-side call of a test: ``fn(*args)``, or, for a clean run that counts a
    sweep, that call wrapped to write what the ranks issued."""
    directory = os.environ.get(COUNT_DIR)
    if not isinstance(test.case, CleanRun) or not directory:
        return fn, args
    case = item.name.replace(os.sep, "_")  # test_x[clean1]: how a difference names it
    return counted, (os.path.join(directory, case), fn, *args)


def after_case(
    item: pytest.Item,
    test: TestSettings,
    outcome: Outcome,
    new_world: Callable[[int], World],
    options: CallOptions,
    *,
    fault: Fault | None = None,
    values: Mapping[str, Any] | None = None,
) -> Outcome:
    """Run the marker's ``verify=`` on a fresh world after a case that passed; the outcome
    is the case's, or ``verify``'s failure, which names the case's fault.

    Args:
        item: The test.
        test: Its settings (its ``verify=`` and sweep case).
        outcome: The case's outcome.
        new_world: A fresh world of a size.
        options: The case's call options (its timeout and seed).
        fault: The case's fault where it is not a sweep's (a Hypothesis example's drawn
            ``fault``).
        values: More arguments ``verify`` may ask for by name (a Hypothesis example's
            drawn arguments).

    Returns:
        The case's outcome, or, where ``verify`` failed, its failure.

    Raises:
        pytest.fail.Exception: ``verify`` names an argument the test has no value for.
    """
    verify = test.verify
    if verify is None or outcome.error is not None or outcome.skip is not None:
        return outcome
    if isinstance(test.case, CleanRun):
        return outcome
    fault = test.case if isinstance(test.case, Fault) else fault
    kwargs = _verify_arguments(item, verify, fault, values or {})
    size = len(outcome.values or ()) or 1
    call = CallOptions(
        options.timeout,
        OUTPUT_CAPTURE,
        seed=options.seed,
        name=f"verify {verify.__qualname__} of test {item.nodeid}",
    )
    with new_world(size) as world:
        checked = world.call(verified, (verify, kwargs), options=call)
    error = checked.error
    if error is None:
        return outcome
    after = "a clean run" if fault is None else f"{fault} ({_point(item, fault, outcome)})"
    error.summary = f"verify {verify.__qualname__} failed after {after}: {error.summary}"
    item_state.of(item).verify_failed = verify.__qualname__
    return replace(outcome, values=None, error=error)


def _verify_arguments(
    item: pytest.Item, verify: Callable[..., Any], fault: Fault | None, values: Mapping[str, Any]
) -> dict[str, Any]:
    """What ``verify`` is called with, by the names of its parameters: the ranks' own
    (``rank``, ...), the case's ``fault``, the test's controller fixtures and ``values``.

    Raises:
        pytest.fail.Exception: ``verify`` names an argument the test has no value for.
    """
    kwargs: dict[str, Any] = {"_harness_rank_args": []}
    funcargs = {k: v for k, v in getattr(item, "funcargs", {}).items() if k != "request"}
    funcargs.update(values)
    for name in inspect.signature(verify).parameters:
        if name in RANK_ARGS:
            kwargs["_harness_rank_args"].append(name)
        elif name == "fault":
            kwargs[name] = fault
        elif name in funcargs:
            kwargs[name] = funcargs[name]
        else:
            valid = sorted({*RANK_ARGS, "fault", *funcargs})
            raise pytest.fail.Exception(
                f"verify {verify.__qualname__} asks for {name!r}, which the test has no "
                f"value for; valid: {', '.join(valid)} (the test's own fixtures that run in "
                "the pytest process)",
                pytrace=False,
            )
    return kwargs


def _point(item: pytest.Item, fault: Fault, outcome: Outcome) -> str:
    """Where a case's fault acts: ``collective #3: all_reduce at x.py:12`` where its call
    site is known (:func:`_collective`), else as the fault names it (``collective #3``)."""
    number, site = _collective(item, fault, outcome)
    return f"collective #{number}: {site}" if site else fault.point


def _collective(item: pytest.Item, fault: Fault, outcome: Outcome) -> tuple[int, str]:
    """The number of the collective a case's fault acts at, and how it reads (``all_reduce
    at x.py:12``): as the clean run that counted the sweep has it, else as the case's run
    found it where the fault fired; its number alone (0 where unknown) and '' otherwise."""
    counted = counted_before(item.config, item.nodeid.partition("[")[0])
    if isinstance(fault.at, int) and counted is not None:
        records = counted.of(fault)
        if 1 <= fault.at <= len(records):
            return fault.at, call_text(*records[fault.at - 1])
    fired = next((found for found in outcome.fired if found.fault == fault), None)
    if fired is not None and fired.op:
        return fired.number, call_text(fired.op, fired.site, fired.origin)
    return (fault.at if isinstance(fault.at, int) else 0), ""


def note(item: pytest.Item, test: TestSettings, outcome: Outcome, option: str) -> None:
    """Note a sweep's case in its reports' ``user_properties``, for the terminal summary."""
    fault = test.case
    if not isinstance(fault, Fault):
        return
    error = outcome.error
    message = ""
    if error is not None:  # the root cause alone: the headline names the case's fault
        root = next(iter(error.failures.values()), None)
        if root is not None:
            message = f"{root.exc_type}: {root.message}"
        else:  # no rank failed (a fault that never fired, a stale count): its summary
            message = f"{type(error).__name__}: {error.summary}"
        failed = item_state.of(item).verify_failed
        if failed:
            message = f"verify {failed}: {message}"
    number, site = _collective(item, fault, outcome)
    case = Case(
        test=item.nodeid.partition("[")[0],
        fault=fault_label(fault.kind, fault.when),
        rank=fault.rank,
        at=number,
        site=site,
        placed=fault.at.text if isinstance(fault.at, Collective) else "",
        verdict=verdict(error is not None, outcome.skip is not None, message),
        repro=report.command(item.config, [item.nodeid], option),
    )
    item.user_properties.append((CASE, case.dumps()))
