"""Same verdict as fresh processes: a reused world's failure is confirmed before it is reported.

A distributed test on a reused world runs on processes that earlier tests ran on. Whatever
they left behind that no reset covers can make it fail where fresh processes would pass it
(or pass where they would fail it). So, on the controller side:

* :class:`History` keeps, per world, the tests its current processes ran (a :class:`Step`
  each: what runs the test again).
* A test that failed on a reused world runs once more on fresh ranks (ini ``dist_confirm =
  fresh``, the default): same seed, world size, backend and fixture values. Failing again,
  it is reported as it was; otherwise the fresh run's verdict stands and the order
  dependence is reported (ini ``dist_order_dependent = warn | fail``). With
  ``--dist-verify`` every test runs both ways, so a test that passes only after another is
  found too.
* :func:`bisect` then looks for the earlier test that reproduces the reused outcome on
  fresh ranks, running a shrinking tail of the history before the test, within
  ``dist_bisect_runs`` fresh worlds.

The plugin's session (:mod:`harness.plugin.session`) and ``--dist-mptc``
(:mod:`harness.plugin.mptc`) decide when; this module says what a run on fresh ranks found
and how it reads.
"""

from __future__ import annotations

import os
import shlex
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from harness.errors import OrderDependenceWarning
from harness.protocol.messages import OUTPUT_CAPTURE

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome
    from harness.controller.world import World

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"

CONFIRM_CHOICES = ("fresh", "off")
ORDER_CHOICES = ("warn", "fail")
DEFAULT_BISECT_RUNS = 8

HISTORY_CAP = 1000
"""Tests kept per world: a world that runs more keeps the latest (the search then starts
from those, and says so when it cannot reproduce the failure with them)."""

_REPRO = pytest.StashKey[str]()


@dataclass(frozen=True)
class Settings:
    """How the session checks verdicts against fresh processes.

    Attributes:
        confirm: Whether a failure on a reused world is run again on fresh ranks.
        order_dependent: ``"warn"`` (the fresh verdict stands, a warning names the order
            dependence) or ``"fail"`` (the test fails with that message).
        bisect_runs: How many fresh worlds the search for the culprit may use.
        verify: ``--dist-verify``: every test also runs on fresh ranks, pass or fail.
    """

    confirm: bool = True
    order_dependent: str = "warn"
    bisect_runs: int = DEFAULT_BISECT_RUNS
    verify: bool = False


def settings(config: pytest.Config) -> Settings:
    """The session's settings from ``--dist-verify`` and ini ``dist_confirm``,
    ``dist_order_dependent`` and ``dist_bisect_runs``.

    Raises:
        pytest.UsageError: A value that is not valid, named with what would be.
    """
    confirm = _choice(config, "dist_confirm", CONFIRM_CHOICES)
    order = _choice(config, "dist_order_dependent", ORDER_CHOICES)
    raw = str(config.getini("dist_bisect_runs") or DEFAULT_BISECT_RUNS).strip()
    if not raw.isdecimal():
        raise pytest.UsageError(
            f"ini option dist_bisect_runs must be a whole number >= 0 (fresh worlds the "
            f"search for an order dependence may start), got {raw!r}"
        )
    return Settings(
        confirm=confirm == "fresh",
        order_dependent=order,
        bisect_runs=int(raw),
        verify=bool(config.getoption("dist_verify", False)),
    )


def _choice(config: pytest.Config, name: str, choices: tuple[str, ...]) -> str:
    value = str(config.getini(name) or choices[0]).strip()
    if value not in choices:
        raise pytest.UsageError(
            f"ini option {name} must be one of {', '.join(choices)}, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class Step:
    """One test as a world ran it: what runs it again on other processes.

    Attributes:
        nodeid: The test's pytest node id.
        fn, args: The call its ranks were sent.
        timeout: Its deadline in seconds (None: none).
        seed: The seed its ranks' generators were given.
        check_collectives: Whether its collectives were compared.
    """

    nodeid: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    timeout: float | None
    seed: int | None
    check_collectives: bool = True

    def call(
        self, world: World, output: str = OUTPUT_CAPTURE, next_seed: int | None = None
    ) -> Outcome:
        """Run the test on ``world`` (see ``World.call`` for ``output`` and ``next_seed``)."""
        return world.call(
            self.fn,
            self.args,
            timeout=self.timeout,
            output=output,
            seed=self.seed,
            name=f"test {self.nodeid}",
            check_collectives=self.check_collectives,
            next_seed=next_seed,
        )


class History:
    """The tests each world's current processes ran, oldest first."""

    def __init__(self) -> None:
        self._runs: weakref.WeakKeyDictionary[World, tuple[int, list[Step]]] = (
            weakref.WeakKeyDictionary()
        )

    def before(self, world: World) -> list[Step]:
        """What ran on the processes the next call on ``world`` will use: empty when that
        call starts fresh ones (a new world, or one that a failure broke)."""
        if world.broken:
            return []
        generation, steps = self._runs.get(world, (0, []))
        return list(steps) if generation == world.generation else []

    def record(self, world: World, step: Step) -> None:
        """Note that ``step`` ran on ``world`` (forgotten when the world is rebuilt)."""
        if world.broken:
            self._runs.pop(world, None)
            return
        generation, steps = self._runs.get(world, (world.generation, []))
        if generation != world.generation:
            steps = []
        steps.append(step)
        del steps[:-HISTORY_CAP]
        self._runs[world] = (world.generation, steps)


Attempt = Callable[["World"], str]
"""Runs the test under scrutiny on a world; returns ``PASSED``, ``FAILED`` or ``SKIPPED``."""
_T = TypeVar("_T")


class Replayed(Exception):
    """An earlier test failed when run again: the replay is not the sequence that ran."""

    def __init__(self, nodeid: str) -> None:
        super().__init__(nodeid)
        self.nodeid = nodeid


def on_fresh(
    new_world: Callable[[], World], before: Sequence[Step], attempt: Callable[[World], _T]
) -> _T:
    """Run ``before``, then the attempt, on a fresh world (stopped afterwards).

    Raises:
        Replayed: A test of ``before`` failed this time.
        DistributedError, RuntimeError: The fresh world could not start.
    """
    with new_world() as world, warnings.catch_warnings():
        # What the earlier tests leak was reported when they ran.
        warnings.simplefilter("ignore")
        for step in before:
            step.call(world)
            if world.broken:
                raise Replayed(step.nodeid)
        return attempt(world)


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
    attempt: Attempt,
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
    reproduced: dict[int, bool] = {}

    def reproduces(start: int, before: Sequence[Step]) -> bool:
        nonlocal runs
        runs += 1
        return on_fresh(new_world, before, attempt) == reused

    try:
        # Invariant: history[low:] reproduces it, history[high:] does not.
        while high - low > 1 and runs < budget:
            middle = (low + high) // 2
            reproduced[middle] = reproduces(middle, history[middle:])
            low, high = (middle, high) if reproduced[middle] else (low, middle)
        if high - low > 1:
            return Finding(
                ids[low:high],
                False,
                runs,
                f"the search used its {budget} fresh worlds (ini dist_bisect_runs)",
            )
        if reproduced.get(low) and low == len(history) - 1:
            return Finding((ids[low],), True, runs)
        if runs >= budget:
            return Finding(
                ids[low:],
                False,
                runs,
                f"the search used its {budget} fresh worlds (ini dist_bisect_runs)",
            )
        if reproduces(low, history[low : low + 1]):
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


def order_message(
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
    among = list(finding.tests) if finding is not None else list(earlier)
    shown = ", ".join(_name(test) for test in among[:5]) + (", ..." if len(among) > 5 else "")
    why = f"; no single earlier test found: {finding.why}" if finding is not None else ""
    count = f"{len(earlier)} earlier test" + ("s" if len(earlier) != 1 else "")
    return (
        f"{test} {_REUSED[reused]} on a reused world after {count} ({shown}) and "
        f"{_FRESH[fresh]} on fresh processes{why}; run: "
        f"{command(config, [*among, nodeid], extra)}"
    )


def report(item: pytest.Item, settings: Settings, message: str, fresh: str) -> None:
    """Report an order dependence of ``item`` as ``dist_order_dependent`` says: a warning
    located at the test (pytest lists it in its warnings summary), or, with ``fail``, the
    test's failure where the fresh run did not fail it already.

    Raises:
        pytest.fail.Exception: ``dist_order_dependent = fail`` and the fresh run did not
            fail.
    """
    if settings.order_dependent == "fail" and fresh != FAILED:
        pytest.fail(message, pytrace=False)
    path, lineno, _ = item.location
    warnings.warn_explicit(
        OrderDependenceWarning(message),
        OrderDependenceWarning,
        str(item.config.rootpath / path),
        (lineno or 0) + 1,
    )


def kind(outcome: Outcome) -> str:
    """How a call ended: ``FAILED``, ``SKIPPED`` or ``PASSED``."""
    if outcome.error is not None:
        return FAILED
    return SKIPPED if outcome.skip is not None else PASSED


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


def _name(nodeid: str) -> str:
    """``test_b[ws2]`` for ``tests/test_x.py::test_b[ws2]`` (a class keeps its name)."""
    return nodeid.split("::", 1)[-1]
