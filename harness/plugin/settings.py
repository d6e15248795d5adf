"""The plugin's settings: one record for the session, one precedence order (each test's own
record, its marker read against these, is :mod:`harness.plugin.item_settings`).

Where several places can give a setting, the first of these that gives it wins:

1. the test's marker (``@pytest.mark.distributed(timeout=30, backend="gloo")``);
2. the command line (``--dist-timeout``; ``--dist-backend`` for a marker's ``"auto"``;
   ``--dist-schedule-seed`` for any test that runs schedules, unless its marker says
   ``schedules=0``);
3. the ini file (``dist_timeout``, ...);
4. the default.

Three flags only ever add to what a marker says, for every test: ``--dist-isolate``,
``--dist-no-collective-check`` and ``--dist-shadow`` (a shadow size for every test that can
have one; ``shadow=False`` in a marker opts a test out). pytest-timeout's limit, where one
applies to a test, bounds its deadline too (:mod:`harness.plugin.interrupts`). The session's
settings are read, without torch, at configure: a bad value is a usage error at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

from harness import validate
from harness.protocol.messages import OUTPUT_CAPTURE, OUTPUT_PREFIX
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
    shadow: tuple[int, ...] = ()


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
            shadow=tuple(
                validate.positive_int(size, "--dist-shadow", text=True)
                for size in config.getoption("dist_shadow", None) or ()
            ),
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
