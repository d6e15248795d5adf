"""A distributed test run under seeded schedules (``schedules=N``, ``--dist-schedules``).

A race between ranks (rank 1 reads the checkpoint rank 0 writes after a collective, with no
barrier between) shows only when one rank happens to be behind. After a test's first run
passed, :func:`explore` runs it again under the schedule of each seed, on the same world:
each holds a few ranks back at collective boundaries until their peers are blocked
(:mod:`harness.protocol.schedules`, acted out by :mod:`harness.rank.holds`). The first run
counts the boundaries each rank crosses, which :func:`~harness.protocol.schedules.draw`
needs: a seed names the same holds for the same test every time.

The first schedule that fails twice in a row is the test's failure. It is shrunk to the
fewest of its holds that still fail twice, held against fresh processes as any failure
(:meth:`harness.plugin.runner.Runner.held`), and reported with its seed, what each hold did
(rank, boundary, collective, call site, how long) and the command that replays it
(``--dist-schedule-seed``). A schedule that failed once and then passed (the race shows
without it too) is the failure reported only where no schedule failed twice. A test that
passes them all notes how many ran and the bound that gives (:func:`passed_line`, for the
terminal summary).

Each run of a test under schedules starts from its ``tmp_path`` as its fixtures left it:
what an earlier run wrote there is removed first, so that a file one rank writes for
another is missing again, as in a first run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

import pytest

from harness.plugin import report
from harness.plugin.replay import FAILED, PASSED, Step
from harness.plugin.runner import Held, Reused, Runnable, Runner
from harness.protocol.schedules import Schedule, draw, escape_probability

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome
    from harness.controller.world import World
    from harness.plugin.item_settings import WorldShape
    from harness.plugin.leases import Holder
    from harness.protocol.messages import CallOptions
    from harness.protocol.traces import RankTrace

REPLAYS = 2
"""How many runs in a row a schedule must fail to count as failing (a race it does not make
certain fails some runs of any schedule). Shrinking keeps fewer holds only where they fail
one run more: a wrong shrink would be confirmed on fresh processes, and fail there."""

_T = TypeVar("_T")


@dataclass(frozen=True)
class Explored(Generic[_T]):
    """A test's runs under schedules: the verdict that stands, and how the report tells it.

    Attributes:
        held: The run whose verdict stands (the failing schedule's, held against fresh
            processes), as the runner holds any run.
        lines: What the report says of the failing schedule before its repro line.
        option: What the repro command adds to replay it (``--dist-schedule-seed=7``).
    """

    held: Held[_T]
    lines: str = ""
    option: str = ""


@dataclass
class Exploration(Generic[_T]):
    """One test as its schedules run it.

    Attributes:
        runner: The session's runner: its worlds, its hold against fresh processes.
        item: The test.
        make: The test as the runner runs it, with these call options.
        verdict: A run's verdict (``PASSED``...), from the runner's result.
        outcome_of: What a run produced, from the runner's result.
        shape: Its world's shape.
        holder: Whose GPUs its worlds lease.
        isolate: Whether each run has fresh processes of its own.
        option: What a command that runs it needs besides its id (``--dist-backend=gloo``).
        fresh_state: What puts the test's state back before each of its runs (None: its
            ``tmp_path``, :func:`fresh_tmp_path`).
    """

    runner: Runner
    item: pytest.Item
    make: Callable[[CallOptions], Runnable[_T]]
    verdict: Callable[[_T], str]
    outcome_of: Callable[[_T], Outcome]
    shape: WorldShape
    holder: Holder
    isolate: bool
    option: str
    fresh_state: Callable[[], None] | None = None
    _options: CallOptions = field(init=False)
    _restore: Callable[[], None] = field(init=False)

    def explore(self, options: CallOptions, seeds: tuple[int, ...], delay: float) -> Explored[_T]:
        """Run the test without holds, then, where it passed, under the schedule of each
        of ``seeds`` (each hold at most ``delay`` seconds) until one fails, as the module's
        docstring says; ``options``: how each run is called."""
        self._options, self._restore = options, self.fresh_state or fresh_tmp_path(self.item)
        held, earlier = self._first()
        if self.verdict(held.result) != PASSED or held.failure is not None:
            return Explored(held)
        traces = self.outcome_of(held.result).traces
        counts = {rank: trace.boundaries for rank, trace in traces.items() if trace is not None}
        total = sum(counts.values())
        if self.shape.size < 2 or not total:
            why = "1 rank" if self.shape.size < 2 else "it crossed no collective boundary"
            self._note(f"{self.item.nodeid}: no schedule ran ({why})")
            return Explored(held)
        once: tuple[int, int, Schedule, _T] | None = None
        for number, seed in enumerate(seeds, 1):
            schedule = draw(seed, counts, delay)
            failures, failed = self._fails(schedule)
            if failed is None:
                continue
            head = _head(number, len(seeds), seed, counts, failures)
            if failures == REPLAYS:
                return self._found(seed, schedule, failed, earlier, head)
            once = once or (number, seed, schedule, failed)
        if once is not None:  # none fails every run: the first that failed once
            number, seed, schedule, failed = once
            head = _head(number, len(seeds), seed, counts, 1)
            lines = head + holds_lines(schedule, self.outcome_of(failed))
            return Explored(Held(failed), lines, f"--dist-schedule-seed={seed}")
        self._note(passed_line(self.item.nodeid, seeds, self.shape.size, total))
        return Explored(held)

    def _first(self) -> tuple[Held[_T], list[Step]]:
        """The run without holds, which counts each rank's boundaries, held against fresh
        processes as any run; and the tests its world ran before it."""
        counting = replace(self._options, schedule=Schedule(), keep_traces=True)
        first = _Restoring(self.make(counting), self._restore)
        if self.isolate:
            return Held(self._alone(first)[1]), []
        reused = self.runner.reused(first, self.shape, self.holder)
        # A failure there that fresh processes do not confirm is an order dependence,
        # reported as such: the schedules go on from the fresh run.
        return self.runner.held(self.item, first, reused, self.option), reused.earlier

    def _found(
        self, seed: int, schedule: Schedule, failed: _T, earlier: list[Step], head: str
    ) -> Explored[_T]:
        """A schedule that failed every run: shrunk, held against fresh processes as any
        failure, told."""
        lines = head + holds_lines(schedule, self.outcome_of(failed))
        shrunk, last = self._shrink(schedule, failed)
        if shrunk != schedule:
            lines += _shrunk(shrunk, self.outcome_of(last))
        option = f"--dist-schedule-seed={seed}"
        if self.isolate:  # it failed on fresh processes already
            return Explored(Held(last), lines, option)
        reused = Reused(self.shape, self.holder, earlier, FAILED, last)
        test = self._scheduled(shrunk)
        # always: the world's last runs were the test's own, not earlier tests'.
        held = self.runner.held(self.item, test, reused, f"{self.option} {option}", always=True)
        return Explored(held, lines, option)

    def _scheduled(self, schedule: Schedule) -> Runnable[_T]:
        """The test under ``schedule``: its deadline longer by the most its holds add."""
        options = self._options
        timeout = options.timeout
        if timeout is not None:
            timeout += schedule.longest
        made = self.make(replace(options, schedule=schedule, timeout=timeout))
        return _Restoring(made, self._restore)

    def _alone(self, test: Runnable[_T]) -> tuple[str, _T]:
        with self.runner.new_world(self.shape, self.holder) as world:
            return test.attempt(world, True)

    def _fails(self, schedule: Schedule, runs: int = REPLAYS) -> tuple[int, _T | None]:
        """How many of up to ``runs`` runs under ``schedule`` failed (stopping at the
        first that passed), and the first failing run's result (None: none failed)."""
        test = self._scheduled(schedule)
        first: _T | None = None
        for failures in range(runs):
            if self.isolate:
                verdict, result = self._alone(test)
            else:
                world: World = self.runner.world(self.shape, self.holder)
                verdict, result = test.attempt(world, False)
            if verdict != FAILED:
                return failures, first
            first = result if first is None else first
        return runs, first

    def _shrink(self, schedule: Schedule, failed: _T) -> tuple[Schedule, _T]:
        """The fewest of ``schedule``'s holds that still fail every run, one hold left out
        at a time, and a run that failed under them."""
        for hold in schedule.holds:
            fewer = schedule.without(hold)
            failures, result = self._fails(fewer, REPLAYS + 1)
            if failures == REPLAYS + 1 and result is not None:
                schedule, failed = fewer, result
        return schedule, failed

    def _note(self, line: str) -> None:
        """Note ``line`` for the terminal summary's ``harness: schedules``."""
        self.item.user_properties.append((report.SCHEDULES, line))


def _head(number: int, count: int, seed: int, counts: Mapping[int, int], failures: int) -> str:
    """The report's first line on a failing schedule."""
    which = f"schedule {number} of {count}" if count > 1 else "the schedule"
    how = (
        f"failed {failures} runs of {failures}"
        if failures == REPLAYS
        else "failed once, then passed (the race also shows without its holds, by chance)"
    )
    boundaries = sum(counts.values())
    return (
        f"{which} (seed {seed}; {len(counts)} ranks, {_boundaries(boundaries)}) {how}; its holds:\n"
    )


def _boundaries(count: int) -> str:
    return f"{count} boundary" if count == 1 else f"{count} boundaries"


def _shrunk(shrunk: Schedule, outcome: Outcome) -> str:
    """The report's lines on the shrunk schedule."""
    count = len(shrunk.holds)
    if not count:
        return "shrunk to no hold: the test fails again without one, as its first run did not\n"
    holds = "1 hold that still fails" if count == 1 else f"{count} holds that still fail"
    return f"shrunk to {holds} every run:\n" + holds_lines(shrunk, outcome)


def holds_lines(schedule: Schedule, outcome: Outcome) -> str:
    """One line per hold of ``schedule``: what the rank did there in ``outcome``'s run
    (its ranks' traces)."""
    traces: Mapping[int, RankTrace | None] = (
        outcome.error.collectives if outcome.error is not None else outcome.traces
    )
    lines = []
    for rank, at in schedule.holds:
        trace = traces.get(rank)
        found = [held for held in trace.held if held.at == at] if trace is not None else []
        if found:
            lines.append(f"  {found[0]}")
        else:
            lines.append(f"  rank {rank} at boundary {at}: not reached (the run ended first)")
    return "".join(f"{line}\n" for line in lines)


def passed_line(nodeid: str, seeds: tuple[int, ...], ranks: int, boundaries: int) -> str:
    """The terminal summary's line on a test that passed the schedules of ``seeds``, its
    ``ranks`` crossing ``boundaries`` collective boundaries in all."""
    if len(seeds) == 1:
        return f"{nodeid}: the schedule of seed {seeds[0]} passed"
    escape = escape_probability(boundaries, len(seeds))
    return (
        f"{nodeid}: {len(seeds)} schedules passed ({ranks} ranks, {_boundaries(boundaries)}): "
        f"a race that holding one rank at one boundary shows escaped them all with "
        f"probability <= {escape:.2g}"
    )


@dataclass
class _Restoring(Generic[_T]):
    """A test whose each run first puts its state back (``Exploration.fresh_state``)."""

    test: Runnable[_T]
    restore: Callable[[], None]

    @property
    def step(self) -> Step:
        return self.test.step

    def attempt(self, world: World, fresh: bool) -> tuple[str, _T]:
        self.restore()
        return self.test.attempt(world, fresh)


def fresh_tmp_path(item: pytest.Item) -> Callable[[], None]:
    """What puts the test's ``tmp_path`` back as it is now (as its fixtures left it, before
    the first run): every entry made since removed (a no-op without ``tmp_path``)."""
    path = getattr(item, "funcargs", {}).get("tmp_path")
    if not isinstance(path, Path) or not path.is_dir():
        return _nothing
    kept = set(os.listdir(path))

    def restore() -> None:
        for name in set(os.listdir(path)) - kept:
            entry = path / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    return restore


def _nothing() -> None:
    return None
