"""The plugin's settings: one record for the session, one for each test, one precedence order.

Where several places can give a setting, the first of these that gives it wins:

1. the test's marker (``@pytest.mark.distributed(timeout=30, backend="gloo")``);
2. the command line (``--dist-timeout``; ``--dist-backend`` for a marker's ``"auto"``);
3. the ini file (``dist_timeout``, ...);
4. the default.

Two flags only ever add to what a marker says, for every test: ``--dist-isolate`` and
``--dist-no-collective-check``. pytest-timeout's limit, where one applies to a test, bounds
its deadline too (:mod:`harness.plugin.interrupts`). The session's settings are read, without
torch, at configure: a bad value is a usage error at once.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from harness import validate
from harness.faults.checks import checked
from harness.plugin import gpu_needs
from harness.plugin.marker import (
    BACKEND_PARAM,
    FAULT_PARAM,
    WORLD_SIZE_PARAM,
    CleanRun,
    parse_mark,
    run_mark,
)
from harness.protocol.messages import OUTPUT_CAPTURE, OUTPUT_PREFIX, CallOptions

DEFAULT_TIMEOUT_S = validate.DEFAULT_TIMEOUT_S
DEFAULT_BISECT_RUNS = 8

_SETTINGS = pytest.StashKey["Settings"]()


@dataclass(frozen=True)
class Settings:
    """The session's settings: each field is the option named after it (``--dist-<name>``,
    ini ``dist_<name>``), except ``check_collectives`` (``--dist-no-collective-check``, ini
    ``dist_no_collective_check``), ``confirm`` (ini ``dist_confirm = fresh``), ``output``
    (captured, or under ``-s`` to the terminal) and ``randomly_seed`` (pytest-randomly's,
    when it is active)."""

    backend: str = "auto"
    timeout: float = DEFAULT_TIMEOUT_S
    isolate: bool = False
    check_collectives: bool = True
    leaks: str = "warn"
    mptc: bool = False
    confirm: bool = True
    order_dependent: str = "warn"
    bisect_runs: int = DEFAULT_BISECT_RUNS
    verify: bool = False
    output: str = OUTPUT_CAPTURE
    randomly_seed: int | None = None
    gpus: str | None = None
    ranks_per_gpu: int = 1
    gpu_lease_dir: str = ""
    require_gpus: bool = False
    preload: tuple[str, ...] = ()
    trace_dir: str = ""
    trace_all: bool = False


def read(config: pytest.Config) -> Settings:
    """The session's settings, read once and kept on the config.

    Raises:
        pytest.UsageError: A value that is not valid, named with what would be.
    """
    if _SETTINGS in config.stash:
        return config.stash[_SETTINGS]
    timeout, where = config.getoption("dist_timeout"), "--dist-timeout"
    if timeout is None:
        timeout = config.getini("dist_timeout") or DEFAULT_TIMEOUT_S
        where = "ini option dist_timeout"
    bisect_runs = str(config.getini("dist_bisect_runs") or DEFAULT_BISECT_RUNS).strip()
    try:
        if not bisect_runs.isdecimal():
            raise ValueError(
                "ini option dist_bisect_runs must be a whole number >= 0 (fresh worlds the "
                f"search for an order dependence may start), got {bisect_runs!r}"
            )
        found = config.stash[_SETTINGS] = Settings(
            backend=config.getoption("dist_backend") or "auto",
            timeout=validate.seconds(timeout, where, text=True),
            isolate=bool(config.getoption("dist_isolate", False)),
            check_collectives=not (
                config.getoption("dist_no_collective_check", False)
                or config.getini("dist_no_collective_check")
            ),
            leaks=_ini_choice(config, "dist_leaks", validate.LEAK_CHOICES),
            mptc=bool(config.getoption("dist_mptc", False) or config.getini("dist_mptc")),
            confirm=_ini_choice(config, "dist_confirm", ("fresh", "off")) == "fresh",
            order_dependent=_ini_choice(config, "dist_order_dependent", ("warn", "fail")),
            bisect_runs=int(bisect_runs),
            verify=bool(config.getoption("dist_verify", False)),
            output=OUTPUT_CAPTURE if config.getoption("capture", "fd") != "no" else OUTPUT_PREFIX,
            randomly_seed=randomly_seed(config),
            gpus=_gpus(config),
            ranks_per_gpu=validate.positive_int(
                str(config.getini("dist_ranks_per_gpu") or "1").strip(),
                "ini option dist_ranks_per_gpu",
                text=True,
            ),
            gpu_lease_dir=str(config.getini("dist_gpu_lease_dir") or "").strip(),
            require_gpus=bool(
                config.getoption("dist_require_gpus", False) or config.getini("dist_require_gpus")
            ),
            preload=preload_entries(config.getini("dist_preload")),
            trace_dir=_trace_dir(config),
            trace_all=bool(config.getoption("dist_trace_all", False)),
        )
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    return found


def _gpus(config: pytest.Config) -> str | None:
    """The GPUs given (None: every GPU CUDA shows), checked as far as torch is not needed."""
    given: str | None = config.getoption("dist_gpus", None)
    where = "--dist-gpus"
    if given is None:
        given, where = str(config.getini("dist_gpus") or "").strip() or None, "ini dist_gpus"
    if given is not None:
        # Only here: a session that names no GPUs loads nothing of the controller at start.
        from harness.controller import gpus

        gpus.inventory(given, os.environ, lambda: 0, "", where)
    return given


def _trace_dir(config: pytest.Config) -> str:
    """The trace directory given, absolute, made and checked writable; '' when none is."""
    given, where = config.getoption("dist_trace_dir", None), "--dist-trace-dir"
    if not given:
        given, where = str(config.getini("dist_trace_dir") or "").strip(), "ini dist_trace_dir"
    if not given:
        if config.getoption("dist_trace_all", False):
            raise ValueError(
                "--dist-trace-all writes each test's trace folder into --dist-trace-dir "
                "(or ini dist_trace_dir): give one too"
            )
        return ""
    # Only here: a session that traces nothing loads nothing of the controller at start.
    from harness.controller.trace_dir import check_writable

    if where == "--dist-trace-dir":
        base = config.invocation_params.dir
    else:
        base = config.inipath.parent if config.inipath is not None else config.rootpath
    return str(check_writable(os.path.join(base, os.path.expanduser(str(given))), where))


def preload_entries(value: object) -> tuple[str, ...]:
    """The entries of ini ``dist_preload`` (separated by commas or white space).

    Raises:
        ValueError: An entry that is not ``module`` or ``module:function`` (dotted names).
    """
    entries = tuple(str(value or "").replace(",", " ").split())
    for entry in entries:
        module, colon, function = entry.partition(":")
        dotted = all(part.isidentifier() for part in module.split("."))
        if not dotted or (colon and not function.isidentifier()):
            raise ValueError(
                f"ini option dist_preload has {entry!r}; each entry must be a module "
                "(mylib.models) or a module and a function in it (mylib.testing:warm_up)"
            )
    return entries


def _ini_choice(config: pytest.Config, name: str, choices: tuple[str, ...]) -> str:
    value = str(config.getini(name) or choices[0]).strip()
    return validate.one_of(value, f"ini option {name}", choices)


def randomly_seed(config: pytest.Config) -> int | None:
    """pytest-randomly's seed, when that plugin is active (set by its pytest_configure)."""
    seed = config.getoption("randomly_seed", None)
    return seed if isinstance(seed, int) and config.pluginmanager.hasplugin("randomly") else None


@dataclass(frozen=True)
class TestSettings:
    """One distributed test's settings: its marker's, else the session's.

    Attributes:
        backend: ``"auto"`` as ``--dist-backend`` says (the session resolves what remains).
        gpus_per_rank: None: the backend's default, applied once the backend is resolved.
        ranks_per_gpu: Ranks that share a GPU: the marker's, else ini
            ``dist_ranks_per_gpu`` where it can apply (:func:`gpu_needs.ranks_per_gpu`).
        call: How its ranks run it (one of a sweep's faults per case).
        attempts: With ``restarts``, the world size of each attempt, the first included.
    """

    __test__ = False  # not a test class, for pytest's collection of this module's users

    world_size: int
    backend: str
    isolate: bool
    init: bool
    gpus_per_rank: int | None
    call: CallOptions
    ranks_per_gpu: int = 1
    attempts: tuple[int, ...] = ()

    @property
    def timeout(self) -> float:
        assert self.call.timeout is not None
        return self.call.timeout


def for_test(session: Settings, item: pytest.Item) -> TestSettings:
    """Resolve a distributed test's settings from its marker and the session's.

    Raises:
        pytest.fail.Exception: The marker is invalid (the test fails, naming the value).
    """
    mark = run_mark(item)
    assert mark is not None
    try:
        spec = parse_mark(mark)
        callspec = getattr(item, "callspec", None)
        params: dict[str, Any] = callspec.params if callspec is not None else {}
        backend = named = params.get(BACKEND_PARAM, spec.backend)
        if isinstance(backend, str) and backend.lower() == "auto":
            backend = session.backend
        size = params.get(WORLD_SIZE_PARAM, spec.world_size)
        if isinstance(size, (list, tuple)) and not size:
            raise ValueError("world_size must be an int >= 1 or a non-empty list of them, not []")
        world_size = validate.positive_int(size, "world_size")
        faults = [params[FAULT_PARAM]] if FAULT_PARAM in params else spec.faults
        if isinstance(params.get(FAULT_PARAM), CleanRun):  # a sweep's counting run: none
            faults = []
        sizes = validate.attempt_sizes(spec.restarts, world_size)
        placed = checked(faults, sizes)
        # pytest-randomly's seed where it is active (it reseeds every test alike), else one
        # from the node id: a test draws the same numbers alone, first, or after any others.
        seed, per_rank = session.randomly_seed, spec.gpus_per_rank
        if per_rank is not None:
            per_rank = validate.whole(per_rank, "gpus_per_rank")
        shared = gpu_needs.ranks_per_gpu(spec.ranks_per_gpu, session.ranks_per_gpu, named, per_rank)
        call = CallOptions(
            timeout=(
                session.timeout
                if spec.timeout is None
                else validate.seconds(spec.timeout, "timeout", optional=True)
            ),
            output=session.output,
            seed=zlib.crc32(item.nodeid.encode()) if seed is None else seed,
            name=f"test {item.nodeid}",
            check_collectives=(
                validate.flag(spec.check_collectives, "check_collectives")
                and session.check_collectives
            ),
            faults=placed,
            keep_traces=keep_traces(session, placed),
        )
        return TestSettings(
            world_size=world_size,
            backend=validate.backend(backend),
            isolate=bool(spec.isolate) or session.isolate,
            init=validate.flag(spec.init, "init"),
            gpus_per_rank=per_rank,
            call=call,
            ranks_per_gpu=shared,
            attempts=sizes,
        )
    except (TypeError, ValueError) as exc:
        problem = f"invalid @pytest.mark.{mark.name}: {exc}"
        raise pytest.fail.Exception(problem, pytrace=False) from None


def keep_traces(session: Settings, faults: Sequence[object]) -> bool:
    """Whether a passing call brings back its ranks' traces: for a trace folder of it."""
    return bool(session.trace_dir) and (session.trace_all or bool(faults))
