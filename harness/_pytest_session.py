"""The plugin's controller: runs each distributed test on its world and owns the worlds.

``DistSession`` keeps one ``World`` per (world size, backend) for the whole session (a
World rebuilds itself after any failure), sends each marked test to its ranks by reference,
and turns the outcome into pytest's terms. Under an external launcher (pytest started by
torchrun) it runs bodies in-process instead and makes every rank agree on the outcome.
"""

from __future__ import annotations

import builtins
import pickle
import sys
from datetime import timedelta
from typing import Any

import pytest

from harness import _pytest_report, _world
from harness._checks import check_timeout, check_world_size
from harness._errors import DistributedError
from harness._pytest_marker import (
    BACKEND_PARAM,
    MARKER,
    WORLD_SIZE_PARAM,
    launcher_world,
    parse_mark,
    timeout_setting,
)
from harness._pytest_rank import RANK_FIXTURES, RankValue, TestRef, run_test
from harness._world import World


class DistSession:
    """Per-session state of the plugin: options, the pool of worlds, launcher mode."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.backend_option: str = config.getoption("dist_backend") or "auto"
        self.isolate_all: bool = bool(config.getoption("dist_isolate"))
        self.default_timeout = timeout_setting(config)
        self.launcher = launcher_world()
        self._worlds: dict[tuple[int, str], World] = {}
        self._outcome_group: Any = None
        self._own_group = False

    # -- worlds -------------------------------------------------------------------------

    def world(self, world_size: int, backend: str = "auto") -> World:
        """The session's World of this size and backend (started on first use)."""
        resolved = self.resolve_backend(backend)
        key = (check_world_size(world_size), resolved)
        world = self._worlds.get(key)
        if world is None or world.closed:
            world = self._worlds[key] = World(world_size, backend=resolved)
        return world

    def resolve_backend(self, backend: object) -> str:
        """``"auto"`` means ``--dist-backend`` when that was given; then as ``World`` does."""
        if isinstance(backend, str) and backend.lower() == "auto":
            backend = self.backend_option
        return _world.resolve_backend(backend)

    def close(self) -> None:
        """Close every World (before pytest-cov saves its data: their coverage is merged),
        and destroy the launcher's process group if the plugin created it."""
        worlds, self._worlds = list(self._worlds.values()), {}
        for world in worlds:
            world.close()
        if self._own_group:
            import fhelium.distributed

            self._own_group = False
            self._outcome_group = None
            fhelium.distributed.shutdown()

    def launcher_group(self) -> None:
        """Under an external launcher: make sure the default process group is up."""
        import torch.distributed as dist

        import fhelium.distributed

        if not dist.is_initialized():
            # The launcher set up the network; only the timeout is ours.
            fhelium.distributed.init(timeout=timedelta(seconds=self.default_timeout))
            self._own_group = True

    # -- running a test -----------------------------------------------------------------

    def run_item(self, item: pytest.Function) -> None:
        """Run a marked test's body on its ranks; raise what pytest should report."""
        mark = item.get_closest_marker(MARKER)
        assert mark is not None
        world_size, backend, timeout, isolate = self._resolve(item, mark)
        if self.launcher is not None:
            self._run_in_launcher(item, world_size, backend)
            return
        reason = _world.unavailable_reason(backend, world_size)
        if reason:
            raise pytest.skip.Exception(reason, _use_item_location=True)
        ref, kwargs = _describe(item)
        capture = self.config.getoption("capture", "fd") != "no"
        if isolate:
            with World(world_size, backend=backend) as world:
                outcome = world._call(run_test, (ref, kwargs), timeout=timeout, capture=capture)
        else:
            outcome = self.world(world_size, backend)._call(
                run_test, (ref, kwargs), timeout=timeout, capture=capture
            )
        _pytest_report.add_output_sections(item, outcome.outputs)
        if outcome.error is not None:
            _raise_xfail_if_all_xfailed(outcome.error)
            _raise_xfail_if_raises_matches(item, outcome.error)
            raise outcome.error
        if outcome.skip is not None:
            # Any skip (pytest.skip or unittest.SkipTest) is pytest's skip here, located at the
            # test: pytest would place a unittest.SkipTest at its own _pytest/unittest.py.
            raise pytest.skip.Exception(outcome.skip.reason, _use_item_location=True)
        outcome.result()

    def _resolve(self, item: pytest.Function, mark: pytest.Mark) -> tuple[int, str, float, bool]:
        problem = None
        try:
            spec = parse_mark(mark)
            params = getattr(item, "callspec", None)
            params = params.params if params is not None else {}
            world_size = check_world_size(params.get(WORLD_SIZE_PARAM, spec.world_size))
            backend = self.resolve_backend(params.get(BACKEND_PARAM, spec.backend))
            timeout = check_timeout(spec.timeout)
        except (TypeError, ValueError) as exc:
            problem = str(exc)
        if problem is not None:  # raised here, not in the except: no chained traceback
            pytest.fail(f"invalid @pytest.mark.{MARKER}: {problem}", pytrace=False)
        return (
            world_size,
            backend,
            timeout if timeout is not None else self.default_timeout,
            bool(spec.isolate) or self.isolate_all,
        )

    # -- external launcher --------------------------------------------------------------

    def _run_in_launcher(self, item: pytest.Function, world_size: int, backend: str) -> None:
        import torch.distributed as dist

        assert self.launcher is not None
        launched_size = self.launcher[1]
        if world_size != launched_size:
            raise pytest.skip.Exception(
                f"needs world size {world_size}; the launcher's world has {launched_size}",
                _use_item_location=True,
            )
        self.launcher_group()
        live = str(dist.get_backend())
        asked = item.get_closest_marker(MARKER)
        explicit = asked is not None and parse_mark(asked).backend not in ("auto", None)
        if explicit and backend != live:
            raise pytest.skip.Exception(
                f"needs backend {backend!r}; the launcher's world uses {live!r}",
                _use_item_location=True,
            )
        if self._outcome_group is None:
            # Outcomes are exchanged over Gloo whatever the default backend is: object
            # collectives on NCCL would need a device, and this must work after any failure.
            self._outcome_group = dist.new_group(backend="gloo")
        funcargs = {name: item.funcargs[name] for name in item._fixtureinfo.argnames}
        local: BaseException | None = None
        try:
            item.obj(**funcargs)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            local = exc
        status = _status(local)
        everyone: list[Any] = [None] * launched_size
        dist.all_gather_object(everyone, status, group=self._outcome_group)
        if local is not None and status[0] != "skipped":
            raise local
        failed = {r: s for r, s in enumerate(everyone) if s[0] == "failed"}
        skipped = {r: s for r, s in enumerate(everyone) if s[0] == "skipped"}
        if failed:
            details = "; ".join(f"rank {r}: {s[1]}" for r, s in failed.items())
            pytest.fail(f"failed on other ranks: {details}", pytrace=False)
        if skipped and len(skipped) < launched_size:
            ranks = ", ".join(map(str, skipped))
            pytest.fail(
                f"skipped on ranks {ranks} only: {everyone[min(skipped)][1]}", pytrace=False
            )
        if skipped:
            assert local is not None
            raise local


def _status(exc: BaseException | None) -> tuple[str, str]:
    if exc is None:
        return ("passed", "")
    if isinstance(exc, pytest.skip.Exception):
        return ("skipped", str(exc.msg))
    return ("failed", f"{type(exc).__name__}: {exc}".splitlines()[0][:300])


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
        rewrite=hasattr(module, "@py_builtins"),
        instance_state=state,
    )
    kwargs: dict[str, Any] = {}
    for name in item._fixtureinfo.argnames:
        if name in RANK_FIXTURES:
            kwargs[name] = RankValue(name)
        else:
            value = item.funcargs[name]
            _check_picklable(value, f"fixture {name!r}")
            kwargs[name] = value
    return ref, kwargs


def _check_picklable(value: Any, what: str) -> None:
    try:
        pickle.dumps(value)
    except Exception as exc:
        pytest.fail(
            f"{what} cannot be sent to the ranks: its value {_world._short_repr(value)} "
            f"does not pickle ({type(exc).__name__}: {exc})",
            pytrace=False,
        )


def _raise_xfail_if_raises_matches(item: pytest.Function, error: DistributedError) -> None:
    # pytest matches xfail(raises=...) against the exception the call raised, here a
    # RankError; what the user means is the exception of the rank that failed first.
    from _pytest.skipping import xfailed_key

    xfailed = item.stash.get(xfailed_key, None)
    root = next(iter(error.failures.values()), None)
    if xfailed is None or xfailed.raises is None or root is None:
        return
    raises = xfailed.raises if isinstance(xfailed.raises, tuple) else (xfailed.raises,)
    builtin = getattr(builtins, root.exc_type, None)
    for expected in raises:
        if not isinstance(expected, type):
            continue  # a pytest.RaisesExc matcher needs the exception object itself
        if root.exc_type == expected.__qualname__ or (
            isinstance(builtin, type) and issubclass(builtin, expected)
        ):
            pytest.xfail(xfailed.reason or f"rank {root.rank} raised {root.exc_type}")


def _raise_xfail_if_all_xfailed(error: DistributedError) -> None:
    # pytest.xfail() inside the body raises XFailed on the ranks; if every failing rank did
    # that, the test as a whole is an expected failure, as it would be in-process.
    failures = list(error.failures.values())
    if failures and all(f.exc_type == "XFailed" for f in failures):
        pytest.xfail(failures[0].message)
