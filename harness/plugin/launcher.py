"""Distributed tests under an external launcher: pytest itself runs on every rank.

When pytest was started by ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set), nothing is
spawned: each pytest process is one rank, the test body runs in-process inside the
launcher's process group, and the ranks exchange their outcomes so that every rank reports
the same result for each test. What a harness world gives a test is given alike here: one
``tmp_path`` shared by the ranks of a test (:class:`SharedTmpPath`), the test's seed, the
``collectives`` fixture, and a ``@given`` test's examples drawn alike and judged together on
every rank, so that Hypothesis takes the same steps on each. A test that needs ranks the
harness starts (faults, restarts, a sweep's clean run, drawn world sizes) is skipped, saying
why.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from harness import compat
from harness.errors import RankError
from harness.faults import OpenSweep
from harness.plugin import properties, property_checks
from harness.plugin.item_settings import TestSettings
from harness.plugin.marker import find_mark, parse_mark
from harness.protocol.failures import RankFailure, ranks_phrase
from harness.rank.identity import rank_value

_LAUNCHER = "run it without the launcher"
# The harness's own frames, left out of a failure's traceback: the user's code comes first.
_HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def configure(config: pytest.Config, rank: Callable[[], LauncherRank | None]) -> None:
    """Set a session under a launcher up, as it starts (``rank``: the session's
    :class:`LauncherRank`, made on first use): the recording of collectives in this process,
    before any test module takes torch.distributed's functions by name; the shared
    ``tmp_path``."""
    from harness.rank import recording

    recording.install()
    config.pluginmanager.register(SharedTmpPath(rank), "harness-launcher-tmp-path")


class SharedTmpPath:
    """``tmp_path`` under a launcher (a plugin that overrides pytest's fixture): for a
    distributed test, one directory that every rank of the launcher's world gets, as the
    ranks of a harness world share the controller's; for any other test, this process's
    own, as pytest makes it.

    Each rank names a distributed test's directory alike, without asking the others: after
    the test's name, numbered by how often this process has used that name, under one
    directory that rank 0 made and told every rank once. The ranks run the same tests in
    the same order, so their numbers agree.
    """

    def __init__(self, rank: Callable[[], LauncherRank | None]) -> None:
        self._rank = rank
        self._root: Path | None = None
        self._used: dict[str, int] = {}

    @pytest.fixture
    def tmp_path(self, request: pytest.FixtureRequest) -> Path:
        """A temporary directory for the test: shared by the ranks of a distributed test."""
        if find_mark(request.node) is None:
            path: Path = request.getfixturevalue("tmp_path")  # pytest's own, overridden here
            return path
        if self._root is None:
            launcher = self._rank()
            assert launcher is not None
            self._root = launcher.shared_dir(request.getfixturevalue("tmp_path_factory"))
        name = re.sub(r"\W", "_", request.node.name)[:30]  # as pytest names its own
        number = self._used.get(name, 0)
        self._used[name] = number + 1
        path = self._root / f"{name}{number}"
        path.mkdir(mode=0o700, parents=True, exist_ok=True)  # parents: on another node
        return path


class LauncherRank:
    """This pytest process's rank of the launcher's world.

    Args:
        world_size: The launcher's world size.
        timeout: The process-group timeout, in seconds, if the plugin creates the group.
    """

    def __init__(self, world_size: int, timeout: float) -> None:
        self.world_size = world_size
        self._timeout = timeout
        self._outcome_group: Any = None
        self._own_group = False

    def ensure_group(self) -> None:
        """Make sure the default process group is up (the plugin's own, if it was not)."""
        import torch.distributed as dist

        import fhelium.distributed

        if not dist.is_initialized():
            # The launcher set up the network; only the timeout is ours.
            fhelium.distributed.init(timeout=timedelta(seconds=self._timeout))
            self._own_group = True

    def _outcomes(self) -> Any:
        """The group the ranks tell each other over: Gloo whatever the default backend is
        (object collectives on NCCL would need a device), and apart from the tests'
        collectives, so that it works after any failure."""
        import torch.distributed as dist

        self.ensure_group()
        if self._outcome_group is None:
            self._outcome_group = dist.new_group(backend="gloo")
        return self._outcome_group

    def fixture(self, name: str) -> Any:
        """The value of a rank-side fixture in this process."""
        self.ensure_group()
        return rank_value(name)

    def shared_dir(self, factory: pytest.TempPathFactory) -> Path:
        """A directory rank 0 makes with its ``tmp_path_factory``, named to every rank."""
        import torch.distributed as dist

        group = self._outcomes()
        made = [str(factory.mktemp("shared")) if dist.get_rank() == 0 else ""]
        dist.broadcast_object_list(made, src=0, group=group)
        return Path(made[0])

    def close(self) -> None:
        """Destroy the default process group if the plugin created it."""
        if self._own_group:
            import fhelium.distributed

            self._own_group = False
            self._outcome_group = None
            fhelium.distributed.shutdown()

    def prepare(self, item: pytest.Function) -> None:
        """Before pytest sets a test up: a ``@given`` test's Hypothesis settings, which
        Hypothesis's own hooks read before the call phase."""
        if properties.is_property(item):
            compat.relax_settings(item.obj, alike=True)

    def run_item(self, item: pytest.Function, settings: Callable[[], TestSettings]) -> None:
        """Run the test body here, with ``settings()``, its settings; raise what every rank
        agrees the outcome is (every rank skips alike a test that this world cannot run)."""
        import torch.distributed as dist

        from harness.rank import reset

        _skip_sweep_over_all(item)
        test = settings()
        _skip_unlaunchable(item, test, self.world_size)
        self.ensure_group()
        live = str(dist.get_backend())
        backend = test.world.backend
        if test.named_backend and backend != live:
            compat.skip_at_test(f"needs backend {backend!r}; the launcher's world uses {live!r}")
        group = self._outcomes()
        if test.call.seed is not None:
            reset.seed_all(test.call.seed)  # as a harness rank seeds each test
        funcargs = {name: item.funcargs[name] for name in compat.test_argnames(item)}
        if properties.is_property(item):
            local = _attempt(functools.partial(self._examples, item, funcargs))
        else:
            local = _attempt(functools.partial(_recorded, item.obj, (), funcargs))
        status = _status(local)
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, status, group=group)
        if local is not None and status[0] != "skipped":
            raise local
        failed = {r: s for r, s in enumerate(everyone) if s[0] == "failed"}
        skipped = {r: s for r, s in enumerate(everyone) if s[0] == "skipped"}
        if failed:
            details = "; ".join(f"rank {r}: {s[1]}" for r, s in failed.items())
            pytest.fail(f"failed on other ranks: {details}", pytrace=False)
        if skipped and len(skipped) < self.world_size:
            ranks = ", ".join(map(str, skipped))
            pytest.fail(
                f"skipped on ranks {ranks} only: {everyone[min(skipped)][1]}", pytrace=False
            )
        if skipped:
            assert local is not None
            raise local

    def _examples(self, item: pytest.Function, funcargs: dict[str, Any]) -> None:
        """Run a ``@given`` test here: each example on every rank, judged by all of them.

        Every rank draws the same examples (:meth:`prepare`); for Hypothesis to go on alike
        (shrink the same failure, stop at the same example), each example's outcome must be
        the same on every rank: where any rank failed, every rank raises the same error
        from the same line (Hypothesis tells failures apart by type and line).
        """
        import torch.distributed as dist

        handle = item.obj.hypothesis
        original = handle.inner_test
        group = self._outcomes()

        # functools.wraps: Hypothesis keys its derandomized seed by the inner test's name
        # and source, which must stay the user's.
        @functools.wraps(original)
        def example(*args: Any, **kwargs: Any) -> None:
            local = _attempt(functools.partial(_recorded, original, args, kwargs))
            mine = None
            if local is not None:
                mine = RankFailure.from_exception(local, dist.get_rank(), hidden_dir=_HARNESS_DIR)
            everyone: list[Any] = [None] * self.world_size
            dist.all_gather_object(everyone, (_control(local), mine), group=group)
            failures = {r: failure for r, (_, failure) in enumerate(everyone) if failure}
            if not failures:
                return
            controls = {control for control, _ in everyone}
            if local is not None and len(controls) == 1 and "" not in controls:
                raise local  # the same skip or assume() everywhere: Hypothesis's to handle
            raise _agreed(failures)

        handle.inner_test = example
        try:
            item.obj(**funcargs)
        except RankError as error:
            # Hypothesis names the minimal example in notes, which the report would not show.
            error.hint = "\n".join(getattr(error, "__notes__", ())) or error.hint
            raise
        finally:
            handle.inner_test = original


def _agreed(failures: dict[int, RankFailure]) -> RankError:
    """The error every rank raises for an example that failed on ``failures``' ranks."""
    root = next(iter(failures.values()))
    later = [rank for rank in failures if rank != root.rank]
    also = f"; {ranks_phrase(later)} failed too" if later else ""
    error = RankError(f"rank {root.rank} {root.what_happened()}{also}", failures)
    error.root_cause_first = False  # the ranks' failures are listed by rank, not in time
    return error


def _recorded(body: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Call ``body``, its collectives recorded for the ``collectives`` fixture."""
    from harness.rank.recording import recorder

    with recorder.recording():
        body(*args, **kwargs)


def _attempt(body: Callable[[], None]) -> BaseException | None:
    """What ``body()`` raised (None: nothing); Ctrl-C is raised on."""
    try:
        body()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return exc
    return None


def _skip_sweep_over_all(item: pytest.Function) -> None:
    """Skip a test whose marker sweeps faults over ``"all"`` (left unresolved here)."""
    mark = find_mark(item)
    assert mark is not None
    try:
        faults = parse_mark(mark).faults
    except ValueError:
        return  # the test's settings fail it, naming the bad argument
    if isinstance(faults, OpenSweep):
        compat.skip_at_test(
            f"needs a clean run on ranks the harness starts, to count {faults}'s cases, and "
            f"faults, which end and start the test's ranks: {_LAUNCHER}"
        )


def _skip_unlaunchable(item: pytest.Function, test: TestSettings, world_size: int) -> None:
    """Skip a test that needs what the launcher's world cannot give, saying what."""
    if not test.init:  # it makes its own default group; here pytest runs in the launcher's
        compat.skip_at_test(
            "needs ranks without a process group (init=False); under the launcher the "
            f"test would run inside the launcher's group: {_LAUNCHER}"
        )
    if test.call.faults or len(test.attempts) > 1:
        # A fault ends or stalls a rank and a restart starts new ones: here a rank is
        # this pytest process, which the harness neither owns nor may end.
        what = "restarts" if len(test.attempts) > 1 else "faults"
        compat.skip_at_test(
            f"needs {what}, which end and start the test's ranks; under the launcher "
            f"each rank is a pytest process: {_LAUNCHER}"
        )
    drawn = compat.given_strategies(item.obj) if properties.is_property(item) else {}
    if "world_size" in drawn:
        compat.skip_at_test(
            "draws its world size (@given(world_size=...)); the launcher's world has one "
            f"size, {world_size}: {_LAUNCHER}"
        )
    if property_checks.FAULT_ARG in drawn:
        compat.skip_at_test(
            f"draws faults (@given({property_checks.FAULT_ARG}=...)), which end and start "
            f"the test's ranks; under the launcher each rank is a pytest process: {_LAUNCHER}"
        )
    if test.world_size != world_size:
        compat.skip_at_test(
            f"needs world size {test.world_size}; the launcher's world has {world_size}"
        )


def _control(exc: BaseException | None) -> str:
    """The type of ``exc`` where it is not a failure but tells pytest or Hypothesis what to
    do (a skip, ``assume()``); '' otherwise."""
    if exc is None:
        return ""
    kind = type(exc)
    controls = issubclass(kind, pytest.skip.Exception) or kind.__module__.startswith("hypothesis")
    return f"{kind.__module__}.{kind.__qualname__}" if controls else ""


def _status(exc: BaseException | None) -> tuple[str, str]:
    if exc is None:
        return ("passed", "")
    if isinstance(exc, pytest.skip.Exception):
        return ("skipped", str(exc.msg))
    return ("failed", f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
