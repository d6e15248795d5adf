"""The plugin's settings: one record for the session, one for each test, one precedence order.

Where several places can give a setting, the first of these that gives it wins:

1. the test's marker (``@pytest.mark.distributed(timeout=30, backend="gloo")``);
2. the command line (``--dist-timeout``; ``--dist-backend`` for a marker's ``"auto"``;
   ``--dist-schedule-seed`` for any test that runs schedules, unless its marker says
   ``schedules=0``);
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from harness import validate
from harness.faults import Fault
from harness.faults.checks import plan
from harness.plugin import gpu_needs
from harness.plugin.gpu_needs import GpuNeed
from harness.plugin.marker import (
    BACKEND_PARAM,
    FAULT_PARAM,
    WORLD_SIZE_PARAM,
    CleanRun,
    MarkSpec,
    Unresolved,
    check_verify,
    drawn_world_size,
    parse_mark,
    run_mark,
)
from harness.protocol.messages import OUTPUT_CAPTURE, OUTPUT_PREFIX, CallOptions
from harness.protocol.schedules import DEFAULT_DELAY_S

DEFAULT_TIMEOUT_S = validate.DEFAULT_TIMEOUT_S
DEFAULT_BISECT_RUNS = 8

_SETTINGS = pytest.StashKey["Settings"]()


@dataclass(frozen=True)
class Settings:
    """The session's settings: each field is the option named after it (``--dist-<name>``,
    ini ``dist_<name>``), except ``check_collectives`` (``--dist-no-collective-check``, ini
    ``dist_no_collective_check``), ``confirm`` (ini ``dist_confirm = fresh``), ``output``
    (captured, or under ``-s`` to the terminal) and ``randomly_seed`` (pytest-randomly's,
    when it is active). Sizes (``memory_growth``, ``max_rank_memory``) are in bytes."""

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
    schedules: int = 0
    schedule_seed: int | None = None
    schedule_delay: float = DEFAULT_DELAY_S
    memory_growth: int = validate.DEFAULT_MEMORY_GROWTH
    max_rank_memory: int | None = None


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
            backend=backend_option(config),
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
            preload=preload_option(config),
            trace_dir=_trace_dir(config),
            trace_all=bool(config.getoption("dist_trace_all", False)),
            memory_growth=validate.size(
                str(config.getini("dist_memory_growth") or validate.DEFAULT_MEMORY_GROWTH),
                "ini option dist_memory_growth",
            ),
            max_rank_memory=_max_rank_memory(config),
            **_schedule_options(config),
        )
    except (TypeError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None
    return found


def _schedule_options(config: pytest.Config) -> dict[str, Any]:
    """The session's schedules (their number, the one seed to run, the longest hold)."""
    count, where = config.getoption("dist_schedules", None), "--dist-schedules"
    if count is None:
        count, where = str(config.getini("dist_schedules") or "0").strip(), "ini dist_schedules"
    seed = config.getoption("dist_schedule_seed", None)
    delay, said = config.getoption("dist_schedule_delay", None), "--dist-schedule-delay"
    if delay is None:
        delay, said = config.getini("dist_schedule_delay"), "ini dist_schedule_delay"
    return {
        "schedules": validate.whole(count, where, text=True),
        "schedule_seed": (
            None if seed is None else validate.seed(seed, "--dist-schedule-seed", text=True)
        ),
        "schedule_delay": validate.seconds(delay or DEFAULT_DELAY_S, said, text=True),
    }


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


def _max_rank_memory(config: pytest.Config) -> int | None:
    """The limit on a rank's resident memory given, in bytes (None: none)."""
    given, where = config.getoption("dist_max_rank_memory", None), "--dist-max-rank-memory"
    if given is None:
        given = str(config.getini("dist_max_rank_memory") or "").strip() or None
        where = "ini option dist_max_rank_memory"
    return None if given is None else validate.size(given, where)


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
    # Only here: a session that traces nothing loads nothing of the timeline at start.
    from harness.timeline.folder import check_writable

    if where == "--dist-trace-dir":
        base = config.invocation_params.dir
    else:
        base = config.inipath.parent if config.inipath is not None else config.rootpath
    return str(check_writable(os.path.join(base, os.path.expanduser(str(given))), where))


# The options read before the session's record, or per test: here too, with the others.


def backend_option(config: pytest.Config) -> str:
    """``--dist-backend`` as given (``"auto"`` where not)."""
    return str(config.getoption("dist_backend", None) or "auto")


def preload_option(config: pytest.Config) -> tuple[str, ...]:
    """Ini ``dist_preload``'s entries (see :func:`preload_entries`).

    Raises:
        ValueError: An entry is not valid, naming it.
    """
    return preload_entries(config.getini("dist_preload"))


MAX_WORLD_SIZE_INI = "dist_max_world_size"
DEFAULT_MAX_WORLD_SIZE = 8
"""The largest world a drawn ``world_size`` may ask for, where ini ``dist_max_world_size``
does not say: Gloo ranks share the machine's cores, and a world larger than this is more
likely a strategy's mistake than a test's intent."""


def max_world_size(config: pytest.Config) -> int:
    """The largest world a drawn ``world_size`` may ask for (ini ``dist_max_world_size``).

    Raises:
        pytest.fail.Exception: The ini value is not an int >= 1 (the test's failure).
    """
    value = config.getini(MAX_WORLD_SIZE_INI) or DEFAULT_MAX_WORLD_SIZE
    try:
        return validate.positive_int(value, f"ini option {MAX_WORLD_SIZE_INI}", text=True)
    except (TypeError, ValueError) as exc:
        raise pytest.fail.Exception(str(exc), pytrace=False) from None


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
class WorldShape:
    """What a world is kept for: tests of one shape share it.

    Attributes:
        size: Its ranks.
        backend: Its resolved backend (``"gloo"``, ``"nccl"``, ...).
        init: Whether its ranks have a default process group.
        gpus: The GPUs it leases (none by default).
    """

    size: int
    backend: str
    init: bool = True
    gpus: GpuNeed = field(default_factory=GpuNeed)

    def sized(self, size: int) -> WorldShape:
        """The same shape with ``size`` ranks."""
        return replace(self, size=size)


@dataclass(frozen=True)
class TestSettings:
    """One distributed test's settings: its marker's, else the session's; the marker is
    read once, here.

    Attributes:
        world: The world it runs on: its size, resolved backend, ``init`` and GPUs.
        backend: The backend asked for, ``"auto"`` as ``--dist-backend`` says.
        named_backend: Whether the marker names a backend (not ``"auto"``).
        isolate: Whether it runs on fresh processes of its own.
        gpus_per_rank: None: the backend's default, applied once the backend is resolved.
        ranks_per_gpu: Ranks that share a GPU: the marker's, else ini
            ``dist_ranks_per_gpu`` where it can apply (:func:`gpu_needs.ranks_per_gpu`).
        call: How its ranks run it (one of a sweep's faults per case).
        attempts: With ``restarts``, the world size of each attempt, the first included.
        case: The sweep case it is: its fault, or the clean run that counts the sweep;
            None where it is no sweep's case.
        verify: The marker's ``verify=``, checked (None: none).
        schedules: The seeds of the schedules it runs after a first run without holds
            (:mod:`harness.plugin.schedules`); none: it runs none.
        schedule_delay: The longest a hold of those schedules lasts, in seconds.
    """

    __test__ = False  # not a test class, for pytest's collection of this module's users

    world: WorldShape
    backend: str
    isolate: bool
    gpus_per_rank: int | None
    call: CallOptions
    ranks_per_gpu: int = 1
    attempts: tuple[int, ...] = ()
    named_backend: bool = False
    case: Fault | CleanRun | None = None
    verify: Callable[..., Any] | None = None
    schedules: tuple[int, ...] = ()
    schedule_delay: float = DEFAULT_DELAY_S

    @property
    def world_size(self) -> int:
        return self.world.size

    @property
    def init(self) -> bool:
        return self.world.init

    @property
    def timeout(self) -> float:
        assert self.call.timeout is not None
        return self.call.timeout


def for_test(
    session: Settings, item: pytest.Item, resolve: Callable[[str], str] = str
) -> TestSettings:
    """Resolve a distributed test's settings from its marker and the session's.

    Args:
        session: The session's settings.
        item: The test.
        resolve: The backend a world of the test's backend uses (``"auto"`` resolved as
            ``World`` does); by default the name as given.

    Raises:
        pytest.fail.Exception: The marker is invalid (the test fails, naming the value), or
            the test is a sweep's case that could not be resolved (saying why).
    """
    mark = run_mark(item)
    assert mark is not None
    callspec = getattr(item, "callspec", None)
    params: dict[str, Any] = getattr(callspec, "params", {})
    case = params.get(FAULT_PARAM)
    if isinstance(case, Unresolved):
        raise pytest.fail.Exception(case.reason, pytrace=False)
    try:
        return _settings(session, item, parse_mark(mark), params, resolve)
    except (TypeError, ValueError) as exc:
        problem = f"invalid @pytest.mark.{mark.name}: {exc}"
        raise pytest.fail.Exception(problem, pytrace=False) from None


def _settings(
    session: Settings,
    item: pytest.Item,
    spec: MarkSpec,
    params: dict[str, Any],
    resolve: Callable[[str], str],
) -> TestSettings:
    """:func:`for_test`'s settings from the marker's arguments and the test's parameters.

    Raises:
        TypeError, ValueError: An argument is not valid, naming it.
    """
    case = params.get(FAULT_PARAM)
    named = params.get(BACKEND_PARAM, spec.backend)
    auto = isinstance(named, str) and named.lower() == "auto"
    backend: Any = session.backend if auto else named
    drawn = drawn_world_size(getattr(item, "obj", None))
    if drawn is not None and isinstance(spec.world_size, (list, tuple)):
        raise ValueError(
            f"world_size={spec.world_size!r} in the marker and @given(world_size={drawn!r}) "
            "both give the world size: keep one (a list in the marker runs the test once "
            "per size; a drawn world_size is each example's)"
        )
    world_size = _world_size(params.get(WORLD_SIZE_PARAM, spec.world_size))
    # A sweep's case has its one fault; a clean run that counts a sweep none.
    faults = [case] if FAULT_PARAM in params else spec.faults
    faults = [] if isinstance(case, CleanRun) else faults
    planned = plan(_call_options(session, item, spec, faults), faults, spec.restarts, world_size)
    per_rank = spec.gpus_per_rank
    if per_rank is not None:
        per_rank = validate.whole(per_rank, "gpus_per_rank")
    shared = gpu_needs.ranks_per_gpu(spec.ranks_per_gpu, session.ranks_per_gpu, named, per_rank)
    backend = validate.backend(backend)
    resolved = resolve(backend)
    return TestSettings(
        world=WorldShape(
            world_size,
            resolved,
            validate.flag(spec.init, "init"),
            gpu_needs.need(resolved, per_rank, shared),
        ),
        backend=backend,
        isolate=bool(spec.isolate) or session.isolate,
        gpus_per_rank=per_rank,
        call=planned.options,
        ranks_per_gpu=shared,
        attempts=planned.sizes,
        named_backend=spec.backend not in ("auto", None),
        case=case if isinstance(case, (Fault, CleanRun)) else None,
        verify=check_verify(spec.verify),
        schedules=() if isinstance(case, CleanRun) else schedule_seeds(session, spec),
        schedule_delay=(
            session.schedule_delay
            if spec.schedule_delay is None
            else validate.seconds(spec.schedule_delay, "schedule_delay")
        ),
    )


def schedule_seeds(session: Settings, spec: MarkSpec | None = None) -> tuple[int, ...]:
    """The seeds of a test's schedules: ``schedule_seed`` alone, else 1 to ``schedules``;
    none with ``schedules=0`` or restarts.

    Raises:
        TypeError, ValueError: A bad ``schedules`` or ``schedule_seed``, or either with
            ``restarts``.
    """
    spec = spec or MarkSpec()
    count, seed = session.schedules, session.schedule_seed
    if spec.schedules is not None:
        count = validate.whole(spec.schedules, "schedules")
    if spec.schedule_seed is not None:
        seed = validate.seed(spec.schedule_seed, "schedule_seed")
    seeds = (seed,) if seed is not None else tuple(range(1, count + 1))
    if spec.restarts and (spec.schedules or spec.schedule_seed is not None):
        raise ValueError("schedules and restarts do not combine: give the test one of them")
    return () if spec.schedules == 0 or spec.restarts else seeds


def _world_size(size: object) -> int:
    """A test's world size (a list's is a parameter by now).

    Raises:
        TypeError, ValueError: It is not an int >= 1, naming it; a Hypothesis strategy
            (a ``@given`` test draws it), saying where it goes instead.
    """
    if type(size).__module__.startswith("hypothesis."):
        raise ValueError(
            f"world_size={size!r} is a Hypothesis strategy; draw it with the test's "
            f"arguments instead: @given(world_size={size!r}, ...), and leave world_size out "
            "of the marker"
        )
    if isinstance(size, (list, tuple)) and not size:
        raise ValueError("world_size must be an int >= 1 or a non-empty list of them, not []")
    return validate.positive_int(size, "world_size")


def _call_options(
    session: Settings, item: pytest.Item, spec: MarkSpec, faults: Sequence[object]
) -> CallOptions:
    """How a test's ranks run it, from its marker's arguments and the session's settings
    (its ``faults``, as given, are placed by :func:`harness.faults.checks.plan`).

    Raises:
        TypeError, ValueError: The marker's ``timeout`` or ``check_collectives`` is not
            valid.
    """
    # pytest-randomly's seed where it is active (it reseeds every test alike), else one
    # from the node id: a test draws the same numbers alone, first, or after any others.
    seed = session.randomly_seed
    return CallOptions(
        timeout=(
            session.timeout
            if spec.timeout is None
            else validate.seconds(spec.timeout, "timeout", optional=True)
        ),
        output=session.output,
        seed=zlib.crc32(item.nodeid.encode()) if seed is None else seed,
        name=f"test {item.nodeid}",
        check_collectives=(
            validate.flag(spec.check_collectives, "check_collectives") and session.check_collectives
        ),
        keep_traces=keep_traces(session, faults),
    )


def keep_traces(session: Settings, faults: Sequence[object]) -> bool:
    """Whether a passing call brings back its ranks' traces: for a trace folder of it."""
    return bool(session.trace_dir) and (session.trace_all or bool(faults))
