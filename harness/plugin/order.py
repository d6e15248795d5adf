"""The order dependence a reused world shows: the earlier test behind it, and how it reads.

Where the runner (:mod:`harness.plugin.runner`) finds that a test ends otherwise on fresh
processes than on its reused world, :func:`bisect` looks for the earlier test behind it
among those the world ran, on fresh worlds, and :func:`message` says what was found,
ending with the command that shows it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from harness.plugin.replay import FAILED, PASSED, SKIPPED, Replayed, Step, on_fresh
from harness.plugin.report import command

if TYPE_CHECKING:
    from harness.controller.world import World


@dataclass(frozen=True)
class Culprit:
    """What the search found: the culprit in ``tests``, or with ``why`` (why the search
    stopped short) the earlier tests the cause is among; ``runs``: the fresh worlds used."""

    tests: tuple[str, ...]
    runs: int
    why: str = ""


def bisect(
    new_world: Callable[[], World],
    history: Sequence[Step],
    attempt: Callable[[World], str],
    reused: str,
    budget: int,
) -> Culprit:
    """Find the earlier test after which the test ends as it did on the reused world.

    The tail of ``history`` that still reproduces ``reused`` is halved until one test is
    left (the whole history is taken to reproduce it, the test alone not to: so the reused
    and fresh runs showed), and that test alone is then run before the test.

    Args:
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
            return Culprit(ids[low:high], runs, spent)
        if shown_alone:
            return Culprit((ids[low],), runs)
        if runs >= budget:
            return Culprit(ids[low:], runs, spent)
        if reproduces(history[low : low + 1]):
            return Culprit((ids[low],), runs)
        return Culprit(ids[low:], runs, f"{_name(ids[low])} alone before it does not reproduce it")
    except Replayed as replayed:
        why = f"{_name(replayed.args[0])} failed when it was run again on fresh processes"
        return Culprit(ids[low:], runs, why)
    except Exception as exc:  # a fresh world that does not start
        return Culprit(ids[low:], runs, f"a fresh world did not start ({exc})")


_REUSED = {PASSED: "passed", FAILED: "failed", SKIPPED: "was skipped"}
_FRESH = {PASSED: "passes", FAILED: "fails", SKIPPED: "is skipped"}


def message(
    item: pytest.Item,
    earlier: Sequence[str],
    reused: str,
    fresh: str,
    finding: Culprit | None,
    option: str,
) -> str:
    """How an order dependence reads, ending with the command that shows it.

    Args:
        earlier: The tests that ran before it on the reused world.
        reused, fresh: How it ended there and on fresh ranks.
        finding: What the search found (None: no search was made).
        option: What the command needs besides the tests (``--dist-mptc``).
    """
    test, nodeid = _name(item.nodeid), item.nodeid
    if finding is not None and not finding.why:
        culprit = finding.tests[0]
        runs = f"{finding.runs} run" + ("s" if finding.runs != 1 else "")
        # A @given test's earlier example is the test itself: run alone, it replays it.
        after = "an earlier example of it" if culprit == nodeid else _name(culprit)
        return (
            f"{test} {_REUSED[reused]} after {after} on a reused world and "
            f"{_FRESH[fresh]} on fresh processes (found in {runs}); run: "
            f"{command(item.config, list(dict.fromkeys([culprit, nodeid])), option)}"
        )
    count = f"{len(earlier)} earlier test" + ("s" if len(earlier) != 1 else "")
    if not earlier:  # a @given test's minimal example, after the test's other examples
        return (
            f"{test} {_REUSED[reused]} on a reused world after its earlier examples and "
            f"{_FRESH[fresh]} on fresh processes; run: {command(item.config, [nodeid], option)}"
        )
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
        f"{command(item.config, list(dict.fromkeys([*among, nodeid])), option)}"
    )


def _names(nodeids: Sequence[str]) -> str:
    """``test_a, test_b, ...``: the first five by name (a @given test's examples once)."""
    nodeids = list(dict.fromkeys(nodeids))
    shown = ", ".join(_name(nodeid) for nodeid in nodeids[:5])
    return shown + (", ..." if len(nodeids) > 5 else "")


def _name(nodeid: str) -> str:
    """``test_b[ws2]`` for ``tests/test_x.py::test_b[ws2]`` (a class keeps its name)."""
    return nodeid.split("::", 1)[-1]
