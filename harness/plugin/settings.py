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

from dataclasses import dataclass
from typing import Any

import pytest

from harness import validate
from harness.faults import Fault, checked
from harness.plugin.marker import (
    BACKEND_PARAM,
    FAULT_PARAM,
    WORLD_SIZE_PARAM,
    parse_mark,
    run_mark,
)

DEFAULT_TIMEOUT_S = validate.DEFAULT_TIMEOUT_S
DEFAULT_BISECT_RUNS = 8
CONFIRM_CHOICES = ("fresh", "off")
ORDER_CHOICES = ("warn", "fail")

_SETTINGS = pytest.StashKey["Settings"]()


@dataclass(frozen=True)
class Settings:
    """The session's settings (command line, then ini, then default).

    Attributes:
        backend: ``--dist-backend``: what a marker's ``"auto"`` means (``"auto"`` itself:
            NCCL with CUDA, else Gloo).
        timeout: A test's deadline when its marker gives none: ``--dist-timeout``, ini
            ``dist_timeout``, 120 s.
        isolate: ``--dist-isolate``: every test on fresh processes.
        check_collectives: False under ``--dist-no-collective-check``.
        leaks: ini ``dist_leaks``: ``"warn"``, ``"error"`` or ``"off"``.
        mptc: ``--dist-mptc`` or ini ``dist_mptc``.
        confirm: ini ``dist_confirm = fresh``: a failure on a reused world is run again on
            fresh ranks.
        order_dependent: ini ``dist_order_dependent``: ``"warn"`` (the fresh verdict
            stands, a warning names the order dependence) or ``"fail"`` (the test fails).
        bisect_runs: ini ``dist_bisect_runs``: fresh worlds the search for the earlier test
            behind an order dependence may start.
        verify: ``--dist-verify``: every test also runs on fresh ranks, pass or fail.
    """

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
            check_collectives=not config.getoption("dist_no_collective_check", False),
            leaks=_ini_choice(config, "dist_leaks", validate.LEAK_CHOICES),
            mptc=bool(config.getoption("dist_mptc", False) or config.getini("dist_mptc")),
            confirm=_ini_choice(config, "dist_confirm", CONFIRM_CHOICES) == "fresh",
            order_dependent=_ini_choice(config, "dist_order_dependent", ORDER_CHOICES),
            bisect_runs=int(bisect_runs),
            verify=bool(config.getoption("dist_verify", False)),
        )
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    return found


def _ini_choice(config: pytest.Config, name: str, choices: tuple[str, ...]) -> str:
    value = str(config.getini(name) or choices[0]).strip()
    return validate.one_of(value, f"ini option {name}", choices)


@dataclass(frozen=True)
class TestSettings:
    """One distributed test's settings: its marker's, else the session's.

    Attributes:
        world_size: The number of ranks (the marker's, or its parameter of a list).
        backend: The backend asked for, ``"auto"`` as ``--dist-backend`` says (the session
            resolves what remains ``"auto"``, with torch).
        timeout: The test's deadline in seconds.
        isolate: Whether it runs on fresh processes.
        init: Whether its ranks start in a default process group.
        check_collectives: Whether its collectives are compared when it passes.
        faults: The faults injected at its ranks' collectives (one of a sweep's per case).
    """

    __test__ = False  # not a test class, for pytest's collection of this module's users

    world_size: int
    backend: str
    timeout: float
    isolate: bool
    init: bool
    check_collectives: bool
    faults: tuple[Fault, ...] = ()


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
        backend = params.get(BACKEND_PARAM, spec.backend)
        if isinstance(backend, str) and backend.lower() == "auto":
            backend = session.backend
        size = params.get(WORLD_SIZE_PARAM, spec.world_size)
        if isinstance(size, (list, tuple)) and not size:
            raise ValueError("world_size must be an int >= 1 or a non-empty list of them, not []")
        world_size = validate.positive_int(size, "world_size")
        faults = [params[FAULT_PARAM]] if FAULT_PARAM in params else spec.faults
        return TestSettings(
            world_size=world_size,
            backend=validate.backend(backend),
            timeout=(
                session.timeout
                if spec.timeout is None
                else validate.seconds(spec.timeout, "timeout", optional=True)
            ),
            isolate=bool(spec.isolate) or session.isolate,
            init=validate.flag(spec.init, "init"),
            check_collectives=(
                validate.flag(spec.check_collectives, "check_collectives")
                and session.check_collectives
            ),
            faults=checked(faults, world_size),
        )
    except (TypeError, ValueError) as exc:
        problem = f"invalid @pytest.mark.{mark.name}: {exc}"
        raise pytest.fail.Exception(problem, pytrace=False) from None
