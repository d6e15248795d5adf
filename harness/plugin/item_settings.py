"""One distributed test's settings (:class:`TestSettings`): its marker's, else the session's
(:mod:`harness.plugin.settings`, which gives the precedence order), read once per test."""

from __future__ import annotations

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
from harness.plugin.settings import Settings
from harness.protocol.messages import CallOptions
from harness.protocol.schedules import DEFAULT_DELAY_S


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
        shadow: The sizes of the shadow worlds its body runs on after its real run, in
            order (the marker's ``shadow=`` and ``--dist-shadow``'s); empty: none.
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
    shadow: tuple[int, ...] = ()
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
    alone = _shadowless(item, bool(faults) or FAULT_PARAM in params, len(planned.sizes) > 1)
    shadow = validate.shadow_sizes(spec.shadow, session.shadow, world_size, alone)
    # A test's shadow of its real size is compared with its real run's traces.
    call = replace(planned.options, keep_traces=True) if shadow else planned.options
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
        call=call,
        ranks_per_gpu=shared,
        attempts=planned.sizes,
        named_backend=spec.backend not in ("auto", None),
        case=case if isinstance(case, (Fault, CleanRun)) else None,
        verify=check_verify(spec.verify),
        shadow=shadow,
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


def _shadowless(item: pytest.Item, faults: bool, restarts: bool) -> str:
    """Why a test cannot have shadow worlds, which run its body once per rank without faults
    or restarts ('' where it can)."""
    if faults:  # a sweep's clean run too: it counts the collectives of a run with faults
        return "faults"
    if restarts:
        return "restarts"
    # Its examples are drawn in the pytest process, each one call of the ranks.
    if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
        return "@given examples"
    return ""


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
