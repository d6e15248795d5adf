"""Order dependence: the earlier test it comes from, and how it reads.

A test whose verdict on a reused world differs from its verdict on fresh processes depends
on what an earlier test left in the ranks. :func:`bisect` looks for that test among those
the world ran (:class:`harness.plugin.replay.History`), on fresh worlds; :func:`message`
says what was found, ending with the command that shows it, and :func:`report` reports it
as ini ``dist_order_dependent`` says. :func:`command` is also the repro line that ends
every failure report of a distributed test (:func:`set_repro`, :func:`repro`).
"""

from __future__ import annotations

import os
import shlex
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from harness.errors import OrderDependenceWarning
from harness.plugin.replay import FAILED, PASSED, SKIPPED, Replayed, Step, on_fresh

if TYPE_CHECKING:
    from harness.controller.world import World

_REPRO = pytest.StashKey[str]()


@dataclass(frozen=True)
class Finding:
    """What the search for an order dependence found.

    Attributes:
        tests: The earlier tests that, run before the test on fresh ranks, reproduce what
            the reused world did: one test when the culprit was found, else the earlier
            tests the cause is among.
        found: Whether ``tests`` is one culprit shown to reproduce it alone.
        runs: The fresh worlds used.
        why: Why the search stopped short of a culprit ('' when found).
    """

    tests: tuple[str, ...]
    found: bool
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
    left (the whole history is taken to reproduce it, the test alone not to: that is what
    the reused and fresh runs showed), and that test alone is then run before the test.

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
            return Finding(ids[low:high], False, runs, spent)
        if shown_alone:
            return Finding((ids[low],), True, runs)
        if runs >= budget:
            return Finding(ids[low:], False, runs, spent)
        if reproduces(history[low : low + 1]):
            return Finding((ids[low],), True, runs)
        return Finding(
            ids[low:], False, runs, f"{_name(ids[low])} alone before it does not reproduce it"
        )
    except Replayed as replayed:
        return Finding(
            ids[low:],
            False,
            runs,
            f"{_name(replayed.nodeid)} failed when it was run again on fresh processes",
        )
    except Exception as exc:  # a fresh world that does not start
        return Finding(ids[low:], False, runs, f"a fresh world did not start ({exc})")


_REUSED = {PASSED: "passed", FAILED: "failed", SKIPPED: "was skipped"}
_FRESH = {PASSED: "passes", FAILED: "fails", SKIPPED: "is skipped"}


def message(
    config: pytest.Config,
    nodeid: str,
    earlier: Sequence[str],
    reused: str,
    fresh: str,
    finding: Finding | None,
    extra: Sequence[str] = (),
) -> str:
    """How an order dependence reads, ending with the command that shows it.

    Args:
        config: The session's config (for the command).
        nodeid: The test.
        earlier: The tests that ran before it on the reused world.
        reused, fresh: How it ended there and on fresh ranks.
        finding: What the search found (None: no search was made).
        extra: Options the command needs besides the tests (``--dist-mptc``).
    """
    test = _name(nodeid)
    plural = "" if finding is not None and finding.runs == 1 else "s"
    runs = "" if finding is None else f" (found in {finding.runs} run{plural})"
    if finding is not None and finding.found:
        culprit = finding.tests[0]
        return (
            f"{test} {_REUSED[reused]} after {_name(culprit)} on a reused world and "
            f"{_FRESH[fresh]} on fresh processes{runs}; run: "
            f"{command(config, [culprit, nodeid], extra)}"
        )
    count = f"{len(earlier)} earlier test" + ("s" if len(earlier) != 1 else "")
    if finding is None:
        among, where = list(earlier), f" ({_names(earlier)})"
        why = ""
    else:
        among, where = list(finding.tests), ""
        why = (
            f"; no single earlier test found ({finding.why}): the cause is among "
            f"{_names(finding.tests)}"
        )
    return (
        f"{test} {_REUSED[reused]} on a reused world after {count}{where} and "
        f"{_FRESH[fresh]} on fresh processes{why}; run: "
        f"{command(config, [*among, nodeid], extra)}"
    )


def report(item: pytest.Item, text: str, fresh: str, *, fail: bool) -> None:
    """Report an order dependence of ``item``: a warning located at the test (pytest lists
    it in its warnings summary), or, with ``fail`` (ini ``dist_order_dependent = fail``),
    the test's failure where the fresh run did not fail it already.

    Raises:
        pytest.fail.Exception: ``fail``, and the fresh run passed or skipped; or the
            warning filters turn the warning into an error (``-W error``): the test's
            failure then, not an error of its setup inside the plugin.
    """
    if fail and fresh != FAILED:
        pytest.fail(text, pytrace=False)
    path, lineno, _ = item.location
    try:
        warnings.warn_explicit(
            OrderDependenceWarning(text),
            OrderDependenceWarning,
            str(item.config.rootpath / path),
            (lineno or 0) + 1,
        )
    except OrderDependenceWarning:
        pass
    else:
        return
    pytest.fail(f"OrderDependenceWarning: {text}", pytrace=False)


def command(config: pytest.Config, nodeids: Sequence[str], extra: Sequence[str] = ()) -> str:
    """The pytest command line that runs these tests, in this order, as this run did.

    Node ids are relative to the root directory; the command is for the directory pytest
    was started from. Under pytest-randomly its seed is kept (the harness seeds each test
    from it) and, for several tests, its shuffling is turned off: the order is the point.
    """
    start = str(config.invocation_params.dir)
    root = str(config.rootpath)
    args = []
    for nodeid in nodeids:
        path, sep, rest = nodeid.partition("::")
        if start != root:
            path = os.path.relpath(os.path.join(root, path), start)
        args.append(shlex.quote(path + sep + rest))
    args += extra
    seed = config.getoption("randomly_seed", None)
    if config.pluginmanager.hasplugin("randomly") and isinstance(seed, int):
        args.append(f"--randomly-seed={seed}")
        if len(nodeids) > 1:
            args.append("--randomly-dont-reorganize")
    return "pytest " + " ".join(args)


def set_repro(item: pytest.Item, line: str) -> None:
    """Note the line a failure report of ``item`` ends with (see :func:`repro`)."""
    item.stash[_REPRO] = line


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
