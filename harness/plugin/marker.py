"""The ``distributed`` marker: which one is the plugin's, and its arguments (without torch).

Which marker is the plugin's is decided once per session (:func:`claim_marker`): ini
``dist_marker`` (default ``distributed``). A project that declares a ``distributed`` marker of
its own (ini ``markers``, or a conftest's ``pytest_configure``) keeps it: the plugin then runs
no test by that marker, and says so in the report header. The settings a marker's arguments
resolve to are :mod:`harness.plugin.settings`'s.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
import pickle
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from harness import compat
from harness.faults import OpenSweep, Sweep
from harness.plugin import item_state

MARKER = "distributed"  # the marker's default name

WORLD_SIZE_PARAM = "_harness_world_size"
BACKEND_PARAM = "_harness_backend"
FAULT_PARAM = "_harness_fault"


@dataclasses.dataclass(frozen=True)
class MarkSpec:
    """The arguments of a ``distributed`` marker, not yet validated."""

    world_size: Any = 2
    backend: Any = "auto"
    timeout: Any = None
    isolate: Any = False
    init: Any = True
    check_collectives: Any = True
    faults: Any = ()
    gpus_per_rank: Any = None
    ranks_per_gpu: Any = None
    restarts: Any = 0
    verify: Any = None
    shadow: Any = ()
    schedules: Any = None
    schedule_seed: Any = None
    schedule_delay: Any = None


@dataclasses.dataclass(frozen=True)
class CleanRun:
    """The fault parameter of a clean run that counts a sweep's collectives
    (:mod:`harness.plugin.sweep_cases`): no fault; ``number`` 1 and 2 are the two runs compared,
    0 a test that is not being counted (never run)."""

    number: int

    @property
    def id(self) -> str:
        return f"clean{self.number}" if self.number else "uncounted"


@dataclasses.dataclass(frozen=True)
class Unresolved:
    """The fault parameter of the one case of a sweep over ``"all"`` that could not be
    resolved into faults (:func:`harness.plugin.sweep_cases.resolve`): it fails, with
    ``reason``, when it runs.

    Attributes:
        kind: The sweep's kind of fault (its case's id is ``kill-unresolved``).
        reason: Why, naming the test and the sweep.
    """

    kind: str
    reason: str

    @property
    def id(self) -> str:
        return f"{self.kind}-unresolved"


def check_verify(value: object) -> Callable[..., Any] | None:
    """A marker's ``verify=``, checked: None, or a module-level function.

    Raises:
        TypeError: It is neither, naming it.
    """
    if value is None:
        return None
    name = getattr(value, "__qualname__", repr(value))
    if not inspect.isfunction(value) or "<" in name:
        raise TypeError(
            f"verify must be a module-level function (it runs in the ranks of a fresh "
            f"world, by reference), not {value!r}"
        )
    try:
        pickle.dumps(value)
    except Exception as exc:
        raise TypeError(f"verify {name} does not pickle by reference ({exc})") from None
    return value


_CLAIMED = pytest.StashKey["str | None"]()
# The session's launcher world (see launched), in a tuple: None is a valid answer.
_LAUNCHED = pytest.StashKey["tuple[tuple[int, int] | None]"]()


def marker_option(config: pytest.Config) -> str:
    """Ini ``dist_marker``: the marker the project names for the plugin ('' where none).

    Read here, not in :mod:`harness.plugin.settings`, which reads the marker through this
    module.
    """
    return str(config.getini("dist_marker") or "").strip()


def claim_marker(config: pytest.Config) -> str | None:
    """Decide which marker runs tests on ranks this session, once every conftest's markers
    are declared, and return its name (see :func:`choose_marker`).

    Raises:
        pytest.UsageError: ``dist_marker`` is not a valid marker name.
    """
    chosen = marker_option(config)
    if chosen and not chosen.isidentifier():
        raise pytest.UsageError(
            f"ini option dist_marker must be a marker name (an identifier), got {chosen!r}"
        )
    name = choose_marker(chosen, config.getini("markers"))
    config.stash[_CLAIMED] = name
    return name


def choose_marker(dist_marker: str, markers: Iterable[str]) -> str | None:
    """The plugin's marker name: ``dist_marker`` if set, else ``distributed`` unless one of
    the declared ``markers`` lines (ini ``markers`` format) is a ``distributed`` marker
    (None then: the project's own)."""
    declared = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in markers}
    return dist_marker or (None if MARKER in declared else MARKER)


def marker_name(config: pytest.Config) -> str | None:
    """The plugin's marker this session (see :func:`claim_marker`), or None."""
    return config.stash.get(_CLAIMED, None)


def launcher_world() -> tuple[int, int] | None:
    """``(rank, world_size)`` when pytest itself was started by a launcher such as torchrun."""
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None


def launched(config: pytest.Config) -> tuple[int, int] | None:
    """:func:`launcher_world` as it was when the session started, asked once per session: a
    test that leaves ``RANK`` and ``WORLD_SIZE`` in pytest's environment (torch's own tests
    do) must not put the tests after it under a launcher, nor one that removes them take
    them out."""
    found = config.stash.get(_LAUNCHED, None)
    if found is None:
        found = config.stash[_LAUNCHED] = (launcher_world(),)
    return found[0]


def find_mark(node: pytest.Item) -> pytest.Mark | None:
    """The plugin's marker on a test (closest first), or None."""
    name = marker_name(node.config)
    return node.get_closest_marker(name) if name else None


def run_mark(item: pytest.Item) -> pytest.Mark | None:
    """:func:`find_mark` of a test being run, looked up once: from its setup on, its markers
    are final (its setup decides where it runs), and the hooks of its run ask again."""
    state = item_state.of(item)
    if state.mark is None:
        state.mark = (find_mark(item),)
    return state.mark[0]


def parse_mark(mark: pytest.Mark) -> MarkSpec:
    """Read a marker's arguments: ``world_size`` (the only positional one) and
    :class:`MarkSpec`'s others by name.

    Raises:
        ValueError: For unknown or surplus arguments.
    """
    if len(mark.args) > 1:
        raise ValueError(
            f"world_size is the only positional argument, got {len(mark.args)}: {mark.args!r}"
        )
    kwargs = dict(mark.kwargs)
    if mark.args:
        if "world_size" in kwargs:
            raise ValueError("world_size given twice (positionally and by name)")
        kwargs["world_size"] = mark.args[0]
    valid = [field.name for field in dataclasses.fields(MarkSpec)]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        guesses = [difflib.get_close_matches(name, valid, n=1) for name in unknown]
        hint = "".join(f" (did you mean {close[0]!r}?)" for close in guesses if close)
        raise ValueError(
            f"unknown argument(s) {', '.join(map(repr, unknown))}{hint}; valid: {', '.join(valid)}"
        )
    return MarkSpec(**kwargs)


def drawn_world_size(function: Any) -> Any | None:
    """The Hypothesis strategy a ``@given`` test draws its ``world_size`` from (None: it
    draws none, or is no ``@given`` test)."""
    if not getattr(function, "is_hypothesis_test", False):
        return None
    return compat.given_strategies(function).get("world_size")


def parametrize(
    metafunc: pytest.Metafunc,
    resolve: Callable[[pytest.Metafunc, MarkSpec, OpenSweep], list[Any]] | None = None,
) -> None:
    """Turn list-valued ``world_size`` / ``backend`` and a sweep of ``faults`` into parameters
    (ids ``ws2``, ``gloo``, ``kill-r1-at3``); a sweep over ``"all"`` is resolved first, by
    ``resolve`` (:func:`harness.plugin.sweep_cases.resolve`).

    Raises:
        pytest.fail.Exception: A sweep over ``"all"`` that cannot be resolved (a collection
            error of the module, naming why).
    """
    mark = find_mark(metafunc.definition)
    if mark is None:
        return
    try:
        spec = parse_mark(mark)
    except ValueError:
        return  # reported when the test runs, so the module's other tests still run
    sweep: Any = spec.faults if isinstance(spec.faults, Sweep) else ()
    if isinstance(spec.faults, OpenSweep) and resolve is not None:
        sweep = resolve(metafunc, spec, spec.faults)
    # A test that draws its world size too is one test, which fails naming both.
    sizes = () if drawn_world_size(metafunc.function) is not None else spec.world_size
    for name, values, make_id in (
        (WORLD_SIZE_PARAM, sizes, lambda v: f"ws{v}"),
        (BACKEND_PARAM, spec.backend, str),
        (FAULT_PARAM, sweep, lambda v: v.id),
    ):
        if isinstance(values, (list, tuple)) and values:
            # parametrize() only accepts names the test requests; this one it requests
            # implicitly, and no fixture of that name exists.
            if name not in metafunc.fixturenames:
                metafunc.fixturenames.append(name)
            metafunc.parametrize(name, list(values), ids=[make_id(v) for v in values])
