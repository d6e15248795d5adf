"""The plugin's controller: runs each distributed test on its world and owns the worlds.

``DistSession`` keeps one ``World`` per (world size, backend, init) for the session (a World
rebuilds itself after any failure). A test is one call to its ranks, by reference (the body
runs in :mod:`harness.rank.pytest_body`), at the end of pytest's setup phase: the ranks set
up their own fixtures, run the body and tear those fixtures down in that call. Its outcome
is then raised in the phase it belongs to, so a rank-side fixture's error is the test's setup
or teardown error, as it would be in-process. Under an external launcher the test runs in
:mod:`harness.plugin.launcher` instead.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NoReturn

import pytest

from harness import compat, validate
from harness.controller import forkserver
from harness.controller.backends import resolve_backend, unavailable_reason
from harness.controller.gpus import LeaseError
from harness.controller.memory import LimitBelowStart
from harness.controller.world import World
from harness.errors import DistributedError
from harness.plugin import (
    after_run,
    interrupts,
    item_settings,
    item_state,
    memory_report,
    properties,
    rank_fixtures,
    refs,
    replay,
    report,
    schedules,
    settings,
    sweep_cases,
    sweep_recount,
    trace_folders,
)
from harness.plugin.item_settings import TestSettings, WorldShape
from harness.plugin.leases import Holder, Leases
from harness.plugin.marker import launched
from harness.plugin.runner import Held, Runner
from harness.protocol.messages import OUTPUT_CAPTURE, CallOptions
from harness.protocol.pytest_calls import FixturePlan, LogSettings, TestRef
from harness.rank.entry import end_scopes, run_test

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome
    from harness.plugin.launcher import LauncherRank


class DistSession:
    """Per-session state of the plugin: its settings, the pool of worlds, launcher mode."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.settings = settings.read(config)
        self.trace_folders = trace_folders.TraceFolders(self.settings)
        self._logs = _log_settings(config)
        launcher = launched(config)
        self.launcher: LauncherRank | None = None
        if launcher is not None:
            # Only under a launcher: it brings the rank side into this process.
            from harness.plugin.launcher import LauncherRank

            self.launcher = LauncherRank(launcher[1], self.settings.timeout)
        self._worlds: dict[WorldShape, World] = {}
        self.runner = Runner(self.settings, self._world, self.fresh_world)
        self.leases = Leases(self.settings)
        # The project's warm-up (ini dist_preload) is the forkserver's to run: given here
        # too, in case the server starts with the first world rather than earlier.
        forkserver.preload_also(self.settings.preload)
        self._preload_failed: str | None = None if self.settings.preload else ""
        # Answers that cannot change during a session, asked for every test otherwise.
        self._resolve = functools.cache(resolve_backend)
        self._unavailable = functools.cache(unavailable_reason)
        # Scopes (node ids) whose wider-scoped rank fixtures live in these worlds.
        self._scopes: dict[str, set[World]] = {}
        # Why worlds of a shape cannot start under --dist-max-rank-memory: found once, it
        # fails each later test of that shape without starting its world again.
        self._below_start: dict[WorldShape, str] = {}

    def world(self, world_size: int, backend: str = "auto", init: bool = True) -> World:
        """The session's World of this size, backend and ``init`` (started on first use)."""
        size, init = validate.positive_int(world_size, "world_size"), validate.flag(init, "init")
        return self._world(WorldShape(size, self.resolve_backend(backend), init), Holder())

    def _world(self, shape: WorldShape, holder: Holder) -> World:
        world = self._worlds.get(shape)
        if world is None or world.closed:
            world = self._worlds[shape] = self.fresh_world(shape, holder)
        return world

    def fresh_world(self, shape: WorldShape, holder: Holder) -> World:
        """A new world of ``shape``, its GPUs leased for ``holder``.

        Raises:
            pytest.fail.Exception: ``--dist-max-rank-memory`` is below what its ranks hold
                as they start.
        """
        if shape in self._below_start:
            raise pytest.fail.Exception(self._below_start[shape], pytrace=False)
        lease = None
        if shape.gpus:
            lease = self.leases.take(shape.gpus.count(shape.size), holder, self.give_back_gpus)
        try:
            world = World(
                shape.size,
                backend=shape.backend,
                init=shape.init,
                leaks=self.settings.leaks,
                gpus=lease,
                memory_growth=self.settings.memory_growth,
                max_rank_memory=self.settings.max_rank_memory,
            )
        except LimitBelowStart as exc:
            problem = self._below_start[shape] = (
                f"usage error: --dist-max-rank-memory (or ini dist_max_rank_memory): {exc}"
            )
            raise pytest.fail.Exception(problem, pytrace=False) from None
        memory_report.of(self.config).add(world)
        if self._preload_failed is None:
            # The server has run the warm-up by now: it did before it forked these ranks.
            problems = forkserver.preload_problems()
            failed = "ini dist_preload failed in the forkserver, which ranks are forked from: "
            self._preload_failed = failed + "; ".join(problems) if problems else ""
        return world

    def give_back_gpus(self) -> None:
        """End the idle worlds that hold GPUs, their wider-scoped rank fixtures first."""
        for shape, world in list(self._worlds.items()):
            if not shape.gpus or world.closed:
                continue
            del self._worlds[shape]
            scoped = [key for key, worlds in self._scopes.items() if world in worlds]
            if scoped and not world.broken:
                options = CallOptions(self.settings.timeout, OUTPUT_CAPTURE)
                world.call(end_scopes, (scoped,), options=options)
            for key in scoped:
                self._scopes[key].discard(world)
            world.close()

    def _preload_failure(self) -> str:
        # A method, not the attribute: the first world of a test may set it.
        return self._preload_failed or ""

    def holds_gpus(self) -> bool:
        return any(shape.gpus and not world.closed for shape, world in self._worlds.items())

    def resolve_backend(self, backend: object) -> str:
        """``"auto"`` means ``--dist-backend`` when that was given; then as ``World`` does."""
        if isinstance(backend, str) and backend.lower() == "auto":
            backend = self.settings.backend
        if not isinstance(backend, str):
            return resolve_backend(backend)  # raises, naming the value
        return self._resolve(backend)

    def close(self) -> None:
        """Close every World and the trace writer, and the launcher's process group."""
        worlds, self._worlds = list(self._worlds.values()), {}
        for world in worlds:
            world.close()
        memory_report.of(self.config).close(self.config)
        self.trace_folders.close()
        if self.launcher is not None:
            self.launcher.close()

    def run_item(self, item: pytest.Function) -> None:
        """Run a marked test on its ranks, its controller fixtures set up: prepare, run,
        the steps after a run (:mod:`harness.plugin.after_run`), settle."""
        if self.config.option.setuponly or self.config.option.setupplan:
            return
        state = item_state.of(item)
        try:
            test, ref, plan = self._prepare(item)
            if properties.is_property(item):  # its examples run in its call phase
                state.call_phase = properties.prepare(item, test, ref, plan, self).run
                return
            ran, deadline = self._run(item, test, ref, plan)
            ran = after_run.after_run(self, ran)
        except pytest.fail.Exception as exc:
            # The test's own mistake (its marker, a value that does not pickle), or GPUs
            # waited for in vain, fails the test rather than erroring its setup.
            state.call = exc
            return
        _settle(ran, deadline)

    def _prepare(self, item: pytest.Function) -> tuple[TestSettings, TestRef, FixturePlan]:
        """A test's settings and what its ranks need to run it, its world's GPUs checked.

        Raises:
            pytest.fail.Exception: The test cannot run as it is (see ``run_item``).
            pytest.skip.Exception: It needs what this run lacks (GPUs, a backend).
        """
        if properties.is_property(item):
            # Before anything can fail: Hypothesis's health checks run before the call phase.
            compat.relax_settings(item.obj)
        if self._preload_failure():
            raise pytest.fail.Exception(self._preload_failure(), pytrace=False)
        test = item_settings.for_test(self.settings, item, self.resolve_backend)
        world = test.world
        self.leases.check(item, world.size, world.gpus)
        devices = world.gpus.count(world.size) or None
        if unavailable := self._unavailable(world.backend, world.size, devices):
            compat.skip_at_test(unavailable)
        ref = refs.reference(item, item.originalname, state=True)
        return test, ref, rank_fixtures.plan(item, self._logs)

    def runnable(
        self, item: pytest.Function, plan: FixturePlan, step: replay.Step, timeout: float
    ) -> _MarkedTest:
        """``step`` of a marked test as the runner runs it (``timeout``: the test's own)."""
        return _MarkedTest(step, self, item, plan, timeout)

    @contextlib.contextmanager
    def worlds_of_one_test(self, keep: WorldShape) -> Iterator[None]:
        """Close, as the block ends, the worlds it started, but the one of ``keep``: those
        of a ``@given`` test's drawn sizes."""
        before = set(self._worlds)
        try:
            yield
        finally:
            for shape in set(self._worlds) - before - {keep}:
                self._worlds.pop(shape).close()

    def _run(
        self, item: pytest.Function, test: TestSettings, ref: TestRef, plan: FixturePlan
    ) -> tuple[after_run.Ran, interrupts.Deadline]:
        """Run a test on its world (with its restarts, on fresh worlds), under its deadline.

        Raises:
            pytest.fail.Exception: Its GPUs were waited for in vain, or the project's
                warm-up failed as its first world started.
        """
        option = f"--dist-backend={test.world.backend}"
        with interrupts.taken_over(item, test.timeout) as deadline:
            seconds = deadline.seconds
            holder = Holder(item.nodeid)

            def marked(options: CallOptions) -> _MarkedTest:
                body, args = sweep_cases.body(item, test, run_test, (ref, plan))
                step = replay.Step(item.nodeid, body, args, options)
                return self.runnable(item, plan, step, test.timeout)

            started = time.monotonic()
            try:
                # A sweep's case whose count a case before it found stale need not run.
                known = sweep_recount.before_case(item, test)
                if test.world.gpus and known is None:
                    # Its GPUs first: waiting for them counts against the test's deadline.
                    end = time.monotonic() + seconds
                    holder = Holder(item.nodeid, end)
                    if not test.isolate:
                        self._world(test.world, holder)
                    seconds = math.ceil(max(end - time.monotonic(), 0.1) * 10) / 10
                options = replace(test.call, timeout=seconds)
                explored: schedules.Explored[Outcome] | None = None
                if known is not None:
                    held = Held(known)
                elif len(test.attempts) > 1:
                    held = self.runner.run_attempts(
                        item, marked, options, test.world, holder, test.attempts
                    )
                elif test.schedules:
                    exploration = schedules.Exploration(
                        self.runner, item, marked, replay.verdict_of, _outcome, test.world,
                        holder, test.isolate, option,
                    )  # fmt: skip
                    explored = exploration.explore(options, test.schedules, test.schedule_delay)
                    held = explored.held
                else:
                    held = self.runner.run(
                        item, marked(options), test.world, holder, test.isolate, option
                    )
            except LeaseError as exc:  # waited in vain for GPUs, or no lease directory
                raise pytest.fail.Exception(str(exc), pytrace=False) from None
            if self._preload_failure():  # found as its first world started
                raise pytest.fail.Exception(self._preload_failure(), pytrace=False)
        note = held.note
        if explored is not None and explored.option:
            option, note = f"{option} {explored.option}", explored.lines + note
        ran = after_run.Ran(
            item, held.result, test.world, options, holder, option, note,
            held.failure, test, seconds=time.monotonic() - started, call=(ref, plan),
        )  # fmt: skip
        return ran, deadline

    def finish_call(self, item: pytest.Function) -> None:
        """Raise what :meth:`run_item` kept for a test (under a launcher: run it here); run
        a ``@given`` test's examples."""
        state = item_state.of(item)
        if state.call_phase is not None:
            run, state.call_phase = state.call_phase, None
            run()
            return
        if self.launcher is not None:
            self.launcher.run_item(
                item,
                functools.partial(
                    item_settings.for_test, self.settings, item, self.resolve_backend
                ),
            )
        elif state.call is not None:
            kept, state.call = state.call, None
            if isinstance(kept, str):
                compat.skip_at_test(kept)
            _fail(item, kept)

    def keep_scopes(
        self, item: pytest.Function, plan: FixturePlan, world: World, timeout: float
    ) -> None:
        """Make the wider-scoped rank fixtures this test set up end with their pytest scope."""
        for fixture in plan.fixtures:
            if fixture.scope == "function":
                continue
            worlds = self._scopes.get(fixture.scope_key)
            if worlds is None:
                worlds = self._scopes[fixture.scope_key] = set()
                _, node = rank_fixtures.scope_node(item, fixture.scope)
                finalizer = functools.partial(self._end_scope, item, fixture.scope_key, timeout)
                (node or item.session).addfinalizer(finalizer)
            worlds.add(world)

    def _end_scope(self, item: pytest.Function, scope_key: str, timeout: float) -> None:
        # Run in the teardown of whichever test runs then, under its pytest-timeout timer.
        errors = []
        with interrupts.taken_over(item, timeout, teardown=True) as deadline:
            options = CallOptions(deadline.seconds, OUTPUT_CAPTURE)
            for world in self._scopes.pop(scope_key, set()):
                if world.closed or world.broken:
                    continue  # its processes, and the fixtures in them, are gone already
                with report.warnings_at(item):
                    outcome = world.call(end_scopes, ([scope_key],), options=options)
                report.add_output_sections(item, outcome.outputs)
                if outcome.error is not None:
                    errors.append(outcome.error)
        if errors:
            deadline.explain(errors[0])
            raise errors[0]


@dataclass
class _MarkedTest:
    """A marked test as the runner runs it; its wider-scoped fixtures end with a fresh world."""

    step: replay.Step
    session: DistSession
    item: pytest.Function
    plan: FixturePlan
    timeout: float  # the test's own: its fixtures' scopes end under it

    def attempt(self, world: World, fresh: bool) -> tuple[str, Outcome]:
        with report.warnings_at(self.item):
            outcome = self.step.call(world)
            scoped = any(f.scope != "function" for f in self.plan.fixtures)
            if outcome.error is None and not fresh:
                self.session.keep_scopes(self.item, self.plan, world, self.timeout)
            elif outcome.error is None and scoped:  # the world ends: so do those fixtures
                options = CallOptions(self.step.options.timeout, self.step.options.output)
                ending = world.call(end_scopes, (None,), options=options)
                outcome = ending if ending.error is not None else outcome
        return replay.verdict_of(outcome), outcome


def _outcome(outcome: Outcome) -> Outcome:
    """A marked test's run is its outcome."""
    return outcome


def _log_settings(config: pytest.Config) -> LogSettings | None:
    """pytest's log settings for the ranks; None where its logging plugin is off."""
    try:
        level, fmt, datefmt = (
            config.getoption(name) or config.getini(name)
            for name in ("log_level", "log_format", "log_date_format")
        )
    except ValueError:
        return None
    try:  # a level's name or number, as pytest reads it (it rejected any other at start)
        number = int(getattr(logging, str(level).upper(), level)) if level else None
    except ValueError:
        number = None
    return LogSettings(number, fmt, datefmt or None)


def _settle(ran: after_run.Ran, deadline: interrupts.Deadline) -> None:
    """Keep a test's verdict for the pytest phase it belongs to: a skip or failure of its
    setup raises now, one of its call is kept for that phase, one of its teardown is
    raised by a finalizer.

    Raises:
        pytest.skip.Exception: The ranks skipped the test in its setup.
        DistributedError: The ranks failed the test in its setup.
    """
    item, state = ran.item, item_state.of(ran.item)
    if ran.failure is not None:
        state.call = ran.failure
    skip, error = ran.outcome.skip, ran.outcome.error
    if skip is not None:
        # Any skip (pytest.skip or unittest.SkipTest) is pytest's, located where the ranks
        # raised it (else at the test): pytest would place a unittest.SkipTest at its own
        # _pytest/unittest.py.
        report.keep_skip_site(item, skip.site)
        if skip.phase == "setup":
            compat.skip_at_test(skip.reason)
        state.call = skip.reason
    elif error is not None:
        deadline.explain(error)
        # The phase of the root cause (see RankFailure.phase).
        root = next(iter(error.failures.values()), None)
        phase = root.phase if root is not None else "call"
        if phase == "setup":
            raise error
        if phase == "teardown":
            item.addfinalizer(functools.partial(_fail, None, error))
        else:
            state.call = error


def _fail(item: pytest.Function | None, error: BaseException) -> NoReturn:
    """Raise a test's failure; in its call phase (``item``), pytest's xfail where every failing
    rank called ``pytest.xfail()`` or ``xfail(raises=...)`` names the first one's exception."""
    failures = list(error.failures.values()) if isinstance(error, DistributedError) else []
    if item is not None and failures:
        if all(f.exc_type == "XFailed" for f in failures):
            pytest.xfail(failures[0].message)
        root, xfail = failures[0], compat.xfail_raises(item)
        raises, reason = xfail if xfail is not None else ((), "")
        builtin = getattr(builtins, root.exc_type, None)
        for expected in raises:
            # A pytest.RaisesExc matcher (not a type) needs the exception object itself.
            if isinstance(expected, type) and (
                root.exc_type == expected.__qualname__
                or (isinstance(builtin, type) and issubclass(builtin, expected))
            ):
                pytest.xfail(reason or f"rank {root.rank} raised {root.exc_type}")
    raise error
