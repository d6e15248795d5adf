"""The plugin's controller: runs each distributed test on its world and owns the worlds.

``DistSession`` keeps one ``World`` per (world size, backend) for the whole session (a
World rebuilds itself after any failure), sends each marked test to its ranks by reference
(the body runs in :mod:`harness.rank.pytest_body`), and turns the outcome into pytest's
terms. Under an external launcher it hands the test to :mod:`harness.plugin.launcher`.
"""

from __future__ import annotations

import builtins
import pickle
import sys
import zlib
from typing import Any

import pytest

from harness import compat, validate
from harness.controller.backends import resolve_backend, unavailable_reason
from harness.controller.pickling import short_repr
from harness.controller.world import World
from harness.errors import DistributedError
from harness.plugin import report
from harness.plugin.launcher import LauncherRank, launcher_world
from harness.plugin.marker import (
    BACKEND_PARAM,
    WORLD_SIZE_PARAM,
    find_mark,
    leaks_setting,
    parse_mark,
    timeout_setting,
)
from harness.protocol.messages import (
    OUTPUT_CAPTURE,
    OUTPUT_PREFIX,
    RankValue,
    TestRef,
)
from harness.rank.pytest_body import run_test


class DistSession:
    """Per-session state of the plugin: options, the pool of worlds, launcher mode."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.backend_option: str = config.getoption("dist_backend") or "auto"
        self.isolate_all: bool = bool(config.getoption("dist_isolate"))
        self.default_timeout = timeout_setting(config)
        self.leaks = leaks_setting(config)
        launched = launcher_world()
        self.launcher = (
            LauncherRank(launched[1], self.default_timeout) if launched is not None else None
        )
        self._worlds: dict[tuple[int, str], World] = {}
        # Answers that cannot change during a session, asked for every test otherwise.
        self._resolved: dict[object, str] = {}
        self._unavailable: dict[tuple[int, str], str | None] = {}

    # -- worlds -------------------------------------------------------------------------

    def world(self, world_size: int, backend: str = "auto") -> World:
        """The session's World of this size and backend (started on first use)."""
        resolved = self.resolve_backend(backend)
        key = (validate.positive_int(world_size, "world_size"), resolved)
        world = self._worlds.get(key)
        if world is None or world.closed:
            world = self._worlds[key] = World(world_size, backend=resolved, leaks=self.leaks)
        return world

    def resolve_backend(self, backend: object) -> str:
        """``"auto"`` means ``--dist-backend`` when that was given; then as ``World`` does."""
        if isinstance(backend, str) and backend.lower() == "auto":
            backend = self.backend_option
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

    def run_item(self, item: pytest.Function) -> None:
        """Run a marked test's body on its ranks; raise what pytest should report."""
        mark = find_mark(item)
        assert mark is not None
        world_size, backend, timeout, isolate = self._resolve(item, mark)
        if self.launcher is not None:
            self.launcher.run_item(item, world_size, backend)
            return
        key = (world_size, backend)
        if key not in self._unavailable:
            self._unavailable[key] = unavailable_reason(backend, world_size)
        reason = self._unavailable[key]
        if reason:
            compat.skip_at_test(reason)
        ref, kwargs = _describe(item)
        # Under -s the ranks share the terminal: each line says which rank wrote it.
        captured = self.config.getoption("capture", "fd") != "no"
        output = OUTPUT_CAPTURE if captured else OUTPUT_PREFIX
        seed = self._seed(item)
        name = f"test {item.nodeid}"
        if isolate:
            with World(world_size, backend=backend, leaks=self.leaks) as world:
                outcome = world.call(
                    run_test, (ref, kwargs), timeout=timeout, output=output, seed=seed, name=name
                )
        else:
            outcome = self.world(world_size, backend).call(
                run_test, (ref, kwargs), timeout=timeout, output=output, seed=seed, name=name
            )
        report.add_output_sections(item, outcome.outputs)
        if outcome.error is not None:
            _raise_xfail_if_all_xfailed(outcome.error)
            _raise_xfail_if_raises_matches(item, outcome.error)
            raise outcome.error
        if outcome.skip is not None:
            # Any skip (pytest.skip or unittest.SkipTest) is pytest's skip here, located at the
            # test: pytest would place a unittest.SkipTest at its own _pytest/unittest.py.
            compat.skip_at_test(outcome.skip.reason)

    def _seed(self, item: pytest.Function) -> int:
        """The seed of a test's random generators on every rank: pytest-randomly's seed when
        that plugin is active (it reseeds every test alike), else one from the node id, so a
        test draws the same numbers alone, first, or after any others."""
        randomly = self.config.getoption("randomly_seed", None)
        if isinstance(randomly, int) and self.config.pluginmanager.hasplugin("randomly"):
            return randomly
        return zlib.crc32(item.nodeid.encode())

    def _resolve(self, item: pytest.Function, mark: pytest.Mark) -> tuple[int, str, float, bool]:
        problem = None
        try:
            spec = parse_mark(mark)
            params = getattr(item, "callspec", None)
            params = params.params if params is not None else {}
            world_size = validate.positive_int(
                params.get(WORLD_SIZE_PARAM, spec.world_size), "world_size"
            )
            backend = self.resolve_backend(params.get(BACKEND_PARAM, spec.backend))
            timeout = (
                None
                if spec.timeout is None
                else validate.seconds(spec.timeout, "timeout", optional=True)
            )
        except (TypeError, ValueError) as exc:
            problem = str(exc)
        if problem is not None:  # raised here, not in the except: no chained traceback
            pytest.fail(f"invalid @pytest.mark.{mark.name}: {problem}", pytrace=False)
        return (
            world_size,
            backend,
            timeout if timeout is not None else self.default_timeout,
            bool(spec.isolate) or self.isolate_all,
        )


def _describe(item: pytest.Function) -> tuple[TestRef, dict[str, Any]]:
    """The reference to the test function and the fixture values to send to the ranks."""
    module = item.module
    assert module is not None
    assert module.__file__ is not None
    cls = item.cls
    state = None
    if cls is not None and item.instance is not None and vars(item.instance):
        state = dict(vars(item.instance))
        for name, value in state.items():
            _check_picklable(value, f"attribute {name!r} of the test class instance")
    ref = TestRef(
        module=module.__name__,
        path=module.__file__,
        cls=cls.__qualname__ if cls is not None else None,
        function=item.originalname,
        sys_path=tuple(sys.path),
        rewrite=compat.asserts_rewritten(module),
        instance_state=state,
    )
    kwargs: dict[str, Any] = {}
    for name in compat.test_argnames(item):
        value = item.funcargs[name]
        if isinstance(value, RankValue):
            # The plugin's own fixture: each rank fills it in. A user's parametrize or fixture
            # of the same name gave a real value instead, and that value is what is sent.
            kwargs[name] = value
        else:
            _check_picklable(value, f"fixture {name!r}")
            kwargs[name] = value
    return ref, kwargs


def _check_picklable(value: Any, what: str) -> None:
    try:
        pickle.dumps(value)
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}"
    else:
        return
    # Raised outside the except: pytest would show the pickling error as a chained traceback.
    pytest.fail(
        f"{what} cannot be sent to the ranks: its value {short_repr(value)} does not pickle "
        f"({problem})",
        pytrace=False,
    )


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
