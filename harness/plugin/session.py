"""The plugin's controller: runs each distributed test on its world and owns the worlds.

``DistSession`` keeps one ``World`` per (world size, backend, init) for the whole session (a
World rebuilds itself after any failure), sends each marked test to its ranks by reference
(the body runs in :mod:`harness.rank.pytest_body`), and turns the outcome into pytest's
terms. Under an external launcher it hands the test to :mod:`harness.plugin.launcher`.
"""

from __future__ import annotations

import builtins
import functools
import zlib
from typing import TYPE_CHECKING, Any

import pytest

from harness import compat, validate
from harness.controller.backends import resolve_backend, unavailable_reason
from harness.controller.pickling import picklable
from harness.controller.world import World
from harness.errors import DistributedError
from harness.plugin import confirm, interrupts, order, rank_fixtures, replay, report, settings
from harness.plugin.marker import find_mark, launcher_world
from harness.protocol.messages import (
    OUTPUT_CAPTURE,
    OUTPUT_PREFIX,
    FixturePlan,
    RequestInfo,
    TestRef,
)
from harness.rank.entry import end_scopes, run_test

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome
    from harness.plugin.launcher import LauncherRank

_RANK_SIDE = pytest.StashKey[rank_fixtures.RankSide]()
_CALL_ERROR = pytest.StashKey[BaseException]()
_CALL_SKIP = pytest.StashKey[str]()


class DistSession:
    """Per-session state of the plugin: options, the pool of worlds, launcher mode."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.settings = settings.read(config)
        self.history = replay.History()
        launched = launcher_world()
        self.launcher: LauncherRank | None = None
        if launched is not None:
            # Only under a launcher: it brings the rank side into this process.
            from harness.plugin.launcher import LauncherRank

            self.launcher = LauncherRank(launched[1], self.settings.timeout)
        self._worlds: dict[tuple[int, str, bool], World] = {}
        # Answers that cannot change during a session, asked for every test otherwise.
        self._resolved: dict[object, str] = {}
        self._unavailable: dict[tuple[int, str], str | None] = {}
        # Scopes (node ids) whose wider-scoped rank fixtures live in these worlds.
        self._scopes: dict[str, set[World]] = {}
        self._config_view: tuple[dict[str, Any], dict[str, Any]] | None = None

    # -- worlds -------------------------------------------------------------------------

    def world(self, world_size: int, backend: str = "auto", init: bool = True) -> World:
        """The session's World of this size, backend and ``init`` (started on first use)."""
        resolved = self.resolve_backend(backend)
        key = (
            validate.positive_int(world_size, "world_size"),
            resolved,
            validate.flag(init, "init"),
        )
        world = self._worlds.get(key)
        if world is None or world.closed:
            world = self._worlds[key] = World(
                world_size, backend=resolved, init=init, leaks=self.settings.leaks
            )
        return world

    def resolve_backend(self, backend: object) -> str:
        """``"auto"`` means ``--dist-backend`` when that was given; then as ``World`` does."""
        if isinstance(backend, str) and backend.lower() == "auto":
            backend = self.settings.backend
        if not isinstance(backend, str):
            return resolve_backend(backend)  # raises, naming the value
        if backend not in self._resolved:
            self._resolved[backend] = resolve_backend(backend)
        return self._resolved[backend]

    def close(self) -> None:
        """Close every World (before pytest-cov saves its data: their coverage is merged),
        and destroy the launcher's process group if the plugin created it."""
        worlds, self._worlds = list(self._worlds.values()), {}
        for world in worlds:
            world.close()
        if self.launcher is not None:
            self.launcher.close()

    # -- running a test -----------------------------------------------------------------
    #
    # A distributed test is one call to its ranks, made at the end of pytest's setup phase,
    # once the controller's fixtures are up: the ranks set up their own fixtures, run the
    # body and tear those fixtures down in that call. Its outcome is then raised in the
    # phase it belongs to, so a rank-side fixture's error is the test's setup or teardown
    # error, as it would be in-process.

    def prepare(self, item: pytest.Function) -> None:
        """Before pytest sets up the test's fixtures: take those that run in the ranks out of
        pytest's hands (see :mod:`harness.plugin.rank_fixtures`)."""
        if _RANK_SIDE not in item.stash:  # once: a rerun finds pytest's part already trimmed
            item.stash[_RANK_SIDE] = rank_fixtures.split(item)

    def run_item(self, item: pytest.Function) -> None:
        """Run a marked test on its ranks (pytest's setup phase, fixtures set up); raise what
        belongs to the setup phase and keep the rest for :meth:`finish_call` and teardown."""
        mark = find_mark(item)
        assert mark is not None
        try:
            test = settings.for_test(self.settings, item, mark)
            backend = self.resolve_backend(test.backend)
            key = (test.world_size, backend)
            if key not in self._unavailable:
                self._unavailable[key] = unavailable_reason(backend, test.world_size)
            reason = self._unavailable[key]
            if reason:
                compat.skip_at_test(reason)
            ref = _describe(item)
            plan = rank_fixtures.plan(
                item, item.stash[_RANK_SIDE], lambda: self._request_info(item)
            )
        except pytest.fail.Exception as exc:
            # The test's own mistake (its marker, a value that does not pickle) fails the
            # test, rather than erroring its setup: nothing ran on the ranks.
            item.stash[_CALL_ERROR] = exc
            return
        # pytest-timeout's limit, if any, is this test's deadline (see plugin.interrupts).
        limit = interrupts.PytestTimeout.of(item)
        with interrupts.taken_over(limit, test.timeout) as deadline:
            step = replay.Step(
                item.nodeid,
                run_test,
                (ref, plan),
                deadline,
                self._seed(item),
                test.check_collectives,
            )
            outcome, note = self._run(item, test, backend, step, plan)
        if outcome.error is not None:
            options = (f"--dist-backend={backend}",)
            command = order.command(self.config, [item.nodeid], options)
            order.set_repro(item, f"{note}run ({test.world_size} ranks, {backend}): {command}")
            if limit is not None:
                limit.explain(outcome.error, deadline, test.timeout)
        self._deliver(item, outcome)

    def _run(
        self,
        item: pytest.Function,
        test: settings.TestSettings,
        backend: str,
        step: replay.Step,
        plan: FixturePlan,
    ) -> tuple[Outcome, str]:
        """Run the test on its world (reused, unless it asks for fresh processes), hold the
        verdict against fresh processes where the settings say so, and return the outcome
        with what the failure report says of that check."""
        # Under -s the ranks share the terminal: each line says which rank wrote it.
        captured = self.config.getoption("capture", "fd") != "no"
        output = OUTPUT_CAPTURE if captured else OUTPUT_PREFIX
        scoped = any(f.scope != "function" for f in plan.fixtures)
        new_world = functools.partial(
            World, test.world_size, backend=backend, init=test.init, leaks=self.settings.leaks
        )
        if test.isolate:
            with new_world() as world:
                return _fresh_call(world, step, output, scoped), ""
        world = self.world(test.world_size, backend, test.init)
        earlier = self.history.before(world)
        outcome = step.call(world, output)
        self.history.record(world, step)
        if outcome.error is None:
            self._keep_scopes(item, plan, world, test.timeout)
        checked = confirm.check(
            item,
            self.settings,
            earlier,
            replay.kind(outcome),
            lambda world: _judged(_fresh_call(world, step, output, scoped)),
            new_world,
            (f"--dist-backend={backend}",),
        )
        if checked.failure is not None:
            item.stash[_CALL_ERROR] = checked.failure
        return (checked.fresh if checked.fresh is not None else outcome), checked.note

    def _deliver(self, item: pytest.Function, outcome: Outcome) -> None:
        """Raise what belongs to the setup phase; keep the rest for the call or teardown."""
        report.add_output_sections(item, outcome.outputs)
        phase = _phase(outcome.error)
        if outcome.error is not None and phase == "setup":
            raise outcome.error
        if outcome.skip is not None and outcome.skip.phase == "setup":
            compat.skip_at_test(outcome.skip.reason)
        if outcome.skip is not None:
            item.stash[_CALL_SKIP] = outcome.skip.reason
        elif outcome.error is not None and phase == "teardown":
            error = outcome.error

            def raise_teardown_error() -> None:
                raise error

            item.addfinalizer(raise_teardown_error)
        elif outcome.error is not None:
            item.stash[_CALL_ERROR] = outcome.error

    def finish_call(self, item: pytest.Function) -> None:
        """pytest's call phase of a marked test: raise the body's failure, if any."""
        if self.launcher is not None:
            mark = find_mark(item)
            assert mark is not None
            test = settings.for_test(self.settings, item, mark)
            backend = self.resolve_backend(test.backend)
            self.launcher.run_item(item, test.world_size, backend, init=test.init)
            return
        skip = item.stash.get(_CALL_SKIP, None)
        if skip is not None:
            # Any skip (pytest.skip or unittest.SkipTest) is pytest's skip here, located at the
            # test: pytest would place a unittest.SkipTest at its own _pytest/unittest.py.
            del item.stash[_CALL_SKIP]
            compat.skip_at_test(skip)
        error = item.stash.get(_CALL_ERROR, None)
        if error is None:
            return
        del item.stash[_CALL_ERROR]
        if isinstance(error, DistributedError):
            _raise_xfail_if_all_xfailed(error)
            _raise_xfail_if_raises_matches(item, error)
        raise error

    def _keep_scopes(
        self, item: pytest.Function, plan: FixturePlan, world: World, timeout: float
    ) -> None:
        """Arrange for the wider-scoped rank fixtures this test set up to end with their
        pytest scope (a module, a class, the session): a call of its own then."""
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
        errors = []
        # Run in some test's teardown, under its pytest-timeout timer, if any: as in run_item.
        limit = interrupts.PytestTimeout.in_teardown(self.config)
        with interrupts.taken_over(limit, timeout) as deadline:
            for world in self._scopes.pop(scope_key, set()):
                if world.closed or world.broken:
                    continue  # its processes, and the fixtures in them, are gone already
                outcome = world.call(
                    end_scopes, ([scope_key],), timeout=deadline, output=OUTPUT_CAPTURE
                )
                report.add_output_sections(item, outcome.outputs)
                if outcome.error is not None:
                    errors.append(outcome.error)
        if errors:
            if limit is not None:
                limit.explain(errors[0], deadline, timeout)
            raise errors[0]

    def _request_info(self, item: pytest.Function) -> RequestInfo:
        if self._config_view is None:
            config = self.config
            options = {k: v for k, v in vars(config.option).items() if picklable(v)}
            ini: dict[str, Any] = {}
            for name in compat.ini_names(config):
                try:
                    value = config.getini(name)
                except Exception:
                    continue
                if picklable(value):
                    ini[name] = value
            self._config_view = (options, ini)
        options, ini = self._config_view
        marks = tuple(mark for mark in item.iter_markers() if picklable(mark))
        return RequestInfo(item.name, item.nodeid, marks, options, ini)

    def _seed(self, item: pytest.Item) -> int:
        """The seed of a test's random generators on every rank: pytest-randomly's seed when
        that plugin is active (it reseeds every test alike), else one from the node id, so a
        test draws the same numbers alone, first, or after any others."""
        randomly = self.config.getoption("randomly_seed", None)
        if isinstance(randomly, int) and self.config.pluginmanager.hasplugin("randomly"):
            return randomly
        return zlib.crc32(item.nodeid.encode())


def _describe(item: pytest.Function) -> TestRef:
    """The reference to the test function that the ranks import (with the state of its
    class's instance, which xunit-style setup methods may have filled in)."""
    state = None
    if item.cls is not None and item.instance is not None and vars(item.instance):
        state = dict(vars(item.instance))
        for name, value in state.items():
            rank_fixtures.check_picklable(value, f"attribute {name!r} of the test class instance")
    return rank_fixtures.reference(item, item.originalname, state)


def _judged(outcome: Outcome) -> tuple[str, Outcome]:
    return replay.kind(outcome), outcome


def _fresh_call(world: World, step: replay.Step, output: str, scoped: bool) -> Outcome:
    """Run a test on a world that ends with it: its wider-scoped rank fixtures end too."""
    outcome = step.call(world, output)
    if outcome.error is None and scoped:
        ending = world.call(end_scopes, (None,), timeout=step.timeout, output=output)
        outcome = ending if ending.error is not None else outcome
    return outcome


def _phase(error: DistributedError | None) -> str:
    """The pytest phase a failure belongs to: the root cause's (see ``RankFailure.phase``)."""
    root = next(iter(error.failures.values()), None) if error is not None else None
    return root.phase if root is not None else "call"


def _raise_xfail_if_raises_matches(item: pytest.Function, error: DistributedError) -> None:
    # pytest matches xfail(raises=...) against the exception the call raised, here a
    # RankError; what the user means is the exception of the rank that failed first.
    xfail = compat.xfail_raises(item)
    root = next(iter(error.failures.values()), None)
    if xfail is None or root is None:
        return
    raises, reason = xfail
    builtin = getattr(builtins, root.exc_type, None)
    for expected in raises:
        if not isinstance(expected, type):
            continue  # a pytest.RaisesExc matcher needs the exception object itself
        if root.exc_type == expected.__qualname__ or (
            isinstance(builtin, type) and issubclass(builtin, expected)
        ):
            pytest.xfail(reason or f"rank {root.rank} raised {root.exc_type}")


def _raise_xfail_if_all_xfailed(error: DistributedError) -> None:
    # pytest.xfail() inside the body raises XFailed on the ranks; if every failing rank did
    # that, the test as a whole is an expected failure, as it would be in-process.
    failures = list(error.failures.values())
    if failures and all(f.exc_type == "XFailed" for f in failures):
        pytest.xfail(failures[0].message)
