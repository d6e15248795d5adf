"""A reused world's verdict held against fresh processes, and the order dependence it shows.

A distributed test on a reused world runs on processes that earlier tests ran on. Whatever
they left behind that no reset covers can make it fail where fresh processes would pass it
(or pass where they would fail it). So :func:`check` runs a test that failed on a reused
world once more on fresh ranks (ini ``dist_confirm = fresh``, the default), with the same
seed, world size, backend and fixture values; under ``--dist-verify``, every test. Failing
again, it is reported as it was. Otherwise the fresh verdict stands, :func:`bisect` looks
for the earlier test behind it among those the world ran, on fresh worlds, and
:func:`check` reports the order dependence. :func:`command` also makes the line that ends
every failure report of a distributed test (:func:`set_repro`).
"""

from __future__ import annotations

import os
import shlex
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import pytest

from harness.errors import OrderDependenceWarning
from harness.plugin.replay import FAILED, PASSED, SKIPPED, Replayed, Step, on_fresh
from harness.plugin.settings import Settings

if TYPE_CHECKING:
    from harness.controller.world import World

_T = TypeVar("_T")
_REPRO = pytest.StashKey[str]()


@dataclass(frozen=True)
class Checked(Generic[_T]):
    """A test's run on a reused world, held against fresh processes.

    Attributes:
        result: The run's result whose verdict stands (the fresh one's, where they differ).
        note: What a failure report says of the check before its repro command
            (``"confirmed on fresh processes; "``; '' when nothing was checked).
        failure: The test's failure, where an order dependence is one.
    """

    result: _T
    note: str = ""
    failure: BaseException | None = None


def check(
    item: pytest.Item,
    settings: Settings,
    earlier: Sequence[Step],
    reused: tuple[str, _T],
    attempt: Callable[[World], tuple[str, _T]],
    new_world: Callable[[], World],
    option: str,
) -> Checked[_T]:
    """Hold a test's verdict on a reused world against fresh processes where the settings
    ask for it, and report the order dependence that shows.

    Args:
        item: The test.
        settings: The session's settings.
        earlier: The tests that ran on the reused world before it (none: nothing to check).
        reused: How it ended there (``PASSED``, ``FAILED`` or ``SKIPPED``), and the result.
        attempt: Runs it on a fresh world; returns the same pair.
        new_world: Starts a fresh world like the reused one.
        option: What the commands in messages need besides the test ids.
    """
    verdict, result = reused
    if not earlier or not (settings.verify or (settings.confirm and verdict == FAILED)):
        return Checked(result)
    try:
        fresh, found = on_fresh(new_world, (), attempt)
    except Exception as exc:  # the fresh world did not start
        return Checked(result, f"not confirmed on fresh processes ({exc}); ")
    if fresh == verdict:
        # The fresh run's account: what a run of the test alone shows (a reused rank may
        # fail the same test another way, e.g. crash where fresh ones raise).
        return Checked(found, "confirmed on fresh processes; ")
    finding = None
    if settings.bisect_runs:
        finding = bisect(
            new_world, earlier, lambda world: attempt(world)[0], verdict, settings.bisect_runs
        )
    text = message(item, [step.nodeid for step in earlier], verdict, fresh, finding, option)
    if settings.order_dependent == "fail" and fresh != FAILED:
        return Checked(found, failure=pytest.fail.Exception(text, pytrace=False))
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
        return Checked(found, failure=pytest.fail.Exception(text, pytrace=False))
    return Checked(found)


@dataclass(frozen=True)
class Finding:
    """What the search for an order dependence found.

    Attributes:
        tests: The culprit; or, with ``why``, the earlier tests the cause is among.
        runs: The fresh worlds used.
        why: Why the search stopped short of a culprit ('' when it found one).
    """

    tests: tuple[str, ...]
    runs: int
    why: str = ""


def bisect(
    new_world: Callable[[], World],
    history: Sequence[Step],
    attempt: Callable[[World], str],
    reused: str,
    budget: int,
) -> Finding:
    """Find the earlier test after which the test ends as it did on the reused world.

    The tail of ``history`` that still reproduces ``reused`` is halved until one test is
    left (the whole history is taken to reproduce it, the test alone not to: so the reused
    and fresh runs showed), and that test alone is then run before the test.

    Args:
        new_world: Starts a fresh world like the reused one.
        history: The tests the reused world ran before this one, oldest first.
        attempt: Runs the test and says how it ended.
        reused: How it ended on the reused world.
        budget: The most fresh worlds to start.
    """
    ids = tuple(step.nodeid for step in history)
    low, high, runs = 0, len(history), 0
    shown_alone = False  # whether history[low] alone before the test was run
    worlds = f"{budget} fresh world" + ("s" if budget != 1 else "")
    spent = f"the search used its {worlds}, ini dist_bisect_runs"

    def reproduces(before: Sequence[Step]) -> bool:
        nonlocal runs
        runs += 1
        return on_fresh(new_world, before, attempt) == reused

    try:
        # Invariant: history[low:] reproduces it, history[high:] does not.
        while high - low > 1 and runs < budget:
            middle = (low + high) // 2
            if reproduces(history[middle:]):
                low, shown_alone = middle, middle == len(history) - 1
            else:
                high = middle
        if high - low > 1:
            return Finding(ids[low:high], runs, spent)
        if shown_alone:
            return Finding((ids[low],), runs)
        if runs >= budget:
            return Finding(ids[low:], runs, spent)
        if reproduces(history[low : low + 1]):
            return Finding((ids[low],), runs)
        return Finding(ids[low:], runs, f"{_name(ids[low])} alone before it does not reproduce it")
    except Replayed as replayed:
        why = f"{_name(replayed.nodeid)} failed when it was run again on fresh processes"
        return Finding(ids[low:], runs, why)
    except Exception as exc:  # a fresh world that does not start
        return Finding(ids[low:], runs, f"a fresh world did not start ({exc})")


_REUSED = {PASSED: "passed", FAILED: "failed", SKIPPED: "was skipped"}
_FRESH = {PASSED: "passes", FAILED: "fails", SKIPPED: "is skipped"}


def message(
    item: pytest.Item,
    earlier: Sequence[str],
    reused: str,
    fresh: str,
    finding: Finding | None,
    option: str,
) -> str:
    """How an order dependence reads, ending with the command that shows it.

    Args:
        item: The test.
        earlier: The tests that ran before it on the reused world.
        reused, fresh: How it ended there and on fresh ranks.
        finding: What the search found (None: no search was made).
        option: What the command needs besides the tests (``--dist-mptc``).
    """
    test, nodeid = _name(item.nodeid), item.nodeid
    if finding is not None and not finding.why:
        culprit = finding.tests[0]
        runs = f"{finding.runs} run" + ("s" if finding.runs != 1 else "")
        return (
            f"{test} {_REUSED[reused]} after {_name(culprit)} on a reused world and "
            f"{_FRESH[fresh]} on fresh processes (found in {runs}); run: "
            f"{command(item.config, [culprit, nodeid], option)}"
        )
    count = f"{len(earlier)} earlier test" + ("s" if len(earlier) != 1 else "")
    if finding is None:
        among, where, why = list(earlier), f" ({_names(earlier)})", ""
    else:
        among, where = list(finding.tests), ""
        why = (
            f"; no single earlier test found ({finding.why}): the cause is among "
            f"{_names(finding.tests)}"
        )
    return (
        f"{test} {_REUSED[reused]} on a reused world after {count}{where} and "
        f"{_FRESH[fresh]} on fresh processes{why}; run: "
        f"{command(item.config, [*among, nodeid], option)}"
    )


def command(config: pytest.Config, nodeids: Sequence[str], option: str) -> str:
    """The pytest command line, for the directory pytest was started from, that runs these
    tests in this order as this run did: with ``option``, and under pytest-randomly with its
    seed (the harness seeds each test from it) and, for several tests, without shuffling."""
    start = str(config.invocation_params.dir)
    root = str(config.rootpath)
    args = []
    for nodeid in nodeids:
        path, sep, rest = nodeid.partition("::")
        if start != root:
            path = os.path.relpath(os.path.join(root, path), start)
        args.append(shlex.quote(path + sep + rest))
    args.append(option)
    seed = randomly_seed(config)
    if seed is not None:
        args.append(f"--randomly-seed={seed}")
        if len(nodeids) > 1:
            args.append("--randomly-dont-reorganize")
    return "pytest " + " ".join(args)


def randomly_seed(config: pytest.Config) -> int | None:
    """pytest-randomly's seed, when that plugin is active."""
    seed = config.getoption("randomly_seed", None)
    return seed if isinstance(seed, int) and config.pluginmanager.hasplugin("randomly") else None


def set_repro(item: pytest.Item, note: str, world: str, option: str) -> None:
    """Note the line a failure report of ``item`` ends with (see :func:`repro`): ``note``
    (what :func:`check` found), then ``run (2 ranks, gloo): pytest ... --dist-backend=gloo``
    for ``world`` and ``option``."""
    item.stash[_REPRO] = f"{note}run ({world}): {command(item.config, [item.nodeid], option)}"


def repro(item: pytest.Item) -> str:
    """The line a failure report of ``item`` ends with: the command that reproduces it,
    and whether fresh processes confirmed it ('' when none was noted)."""
    return item.stash.get(_REPRO, "")


def _names(nodeids: Sequence[str]) -> str:
    """``test_a, test_b, ...``: the first five by name."""
    shown = ", ".join(_name(nodeid) for nodeid in nodeids[:5])
    return shown + (", ..." if len(nodeids) > 5 else "")


def _name(nodeid: str) -> str:
    """``test_b[ws2]`` for ``tests/test_x.py::test_b[ws2]`` (a class keeps its name)."""
    return nodeid.split("::", 1)[-1]
