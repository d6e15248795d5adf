"""Validators for every value a user hands the harness.

Each value is named by where it came from.

``World(...)``, ``harness.run(...)``, the ``distributed`` marker, ``--dist-timeout``, ini
``dist_timeout`` and ``python -m harness check`` all check their values here, so they accept
the same things and say the same thing about a bad one: where it came from (``where``), the
value, and what would be valid. Callers turn the ``TypeError``/``ValueError`` into their own
kind of error (``pytest.UsageError``, an argparse error, a failed test) without rewording it.
No torch, no pytest: the plugin checks its settings before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from harness.protocol.schedules import Schedule

BACKEND_CHOICES = ("auto", "gloo", "nccl", "ucc", "mpi", "xccl")
"""Every backend name the harness accepts, wherever it is named (``World``, the marker,
``--dist-backend``, ``python -m harness check --backend``): ``"auto"`` and the backends
torch.distributed knows. Whether one can run here is a separate question, answered by
:func:`harness.controller.backends.unavailable_reason` (a backend torch was built without is
a skip in pytest, not a usage error)."""

LEAK_CHOICES = ("warn", "error", "off")
"""What to do about what a call leaves behind in a reused rank (``World(leaks=...)``, ini
``dist_leaks``): warn naming the call and the ranks, fail the call (and stop the ranks), or
not look."""

DEFAULT_TIMEOUT_S = 120.0
"""The bound in seconds on one run where none is given: ``World(...)``, ``harness.run`` and a
distributed test (``--dist-timeout``, ini ``dist_timeout``) alike."""

DEFAULT_MEMORY_GROWTH = 64 * 2**20
"""How much a rank's resident memory may grow and stay, over its last 100 calls, before the
growth is a leak finding (``World(memory_growth=...)``, ini ``dist_memory_growth``), in bytes;
see :mod:`harness.rank.memory`."""

# No one-letter units: "2g" is 2 GiB to some tools and 2 GB to others.
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*")

_T = TypeVar("_T")


def positive_int(value: object, where: str, *, text: bool = False) -> int:
    """Check and return an integer of at least 1.

    For example a world size or a repeat count.

    Args:
        value: The value; parsed first if ``text`` (a command-line argument) and a string.
        where: What it is, for the message (``"world_size"``, ``"--world-size"``).
        text: Whether ``value`` may be text to parse.

    Raises:
        TypeError: It is not an int (``True`` and ``2.0`` are not).
        ValueError: It is smaller than 1, or is text that is not an integer.
    """
    if text and isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{where} must be an int >= 1, not {value!r}") from None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{where} must be an int >= 1, not {value!r}")
    if value < 1:
        raise ValueError(f"{where} must be >= 1, got {value}")
    return value


def whole(value: object, where: str, *, text: bool = False, what: str = "") -> int:
    """Check and return an integer of at least 0.

    For example a number of GPUs per rank, or a seed.

    Args:
        value: The value; parsed first if ``text`` (a command-line argument) and a string.
        where: What it is, for the message (``"gpus_per_rank"``, ``"--dist-schedules"``).
        text: Whether ``value`` may be text to parse.
        what: What the number is, for the message (``" (a seed)"``).

    Raises:
        TypeError: It is not an int (``True`` and ``1.0`` are not).
        ValueError: It is negative, or text that is not an integer.
    """
    if text and isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{where} must be an int >= 0{what}, not {value!r}") from None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{where} must be an int >= 0{what}, not {value!r}")
    if value < 0:
        raise ValueError(f"{where} must be {'an int ' if what else ''}>= 0{what}, got {value}")
    return value


def attempt_sizes(restarts: object, world_size: int) -> tuple[int, ...]:
    """The world size of every attempt, the first included.

    ``restarts=N`` is N more of ``world_size``; a list of sizes is one more attempt per size.

    Raises:
        TypeError: ``restarts`` is neither an int nor a list of them.
        ValueError: A negative count, or a size below 1.
    """
    if isinstance(restarts, int) and not isinstance(restarts, bool):
        if restarts < 0:
            raise ValueError(f"restarts must be >= 0, got {restarts}")
        return (world_size,) * (restarts + 1)
    valid = isinstance(restarts, (list, tuple)) and all(
        isinstance(size, int) and not isinstance(size, bool) for size in restarts
    )
    if not valid:
        raise TypeError(
            "restarts must be a number of restarts (an int >= 0) or the world size of each "
            f"restart (a list of ints >= 1, e.g. [2]), not {restarts!r}"
        )
    assert isinstance(restarts, (list, tuple))
    for size in restarts:
        if size < 1:
            raise ValueError(f"restarts has world size {size}; each must be >= 1")
    return (world_size, *restarts)


def shadow_sizes(
    marked: object, flagged: tuple[int, ...], world_size: int, alone: str = ""
) -> tuple[int, ...]:
    """A test's shadow sizes: its marker's ``shadow=`` (a list of sizes, one size, or False
    to opt out of ``--dist-shadow``), then ``flagged`` (``--dist-shadow``'s), in order.

    Args:
        marked: The marker's ``shadow=``.
        flagged: ``--dist-shadow``'s sizes.
        world_size: The test's real world size: no shadow is smaller.
        alone: Why the test cannot have shadow worlds ('' where it can): ``"faults"``,
            ``"restarts"``. ``--dist-shadow`` then leaves it alone; a marker that asks is
            an error.

    Raises:
        TypeError, ValueError: A size that is not an int, or is smaller than the test's
            world; ``shadow=`` on a test with faults or restarts.
    """
    if marked is False:
        return ()
    if isinstance(marked, int) and not isinstance(marked, bool):
        marked = [marked]
    if not isinstance(marked, (list, tuple)):
        raise TypeError(
            f"shadow must be a list of world sizes (shadow=[64, 1024]), one size, or False "
            f"(no shadow worlds, whatever --dist-shadow says), not {marked!r}"
        )
    if marked and alone:
        raise ValueError(
            f"shadow={list(marked)!r} on a test with {alone}: a shadow world runs the body "
            f"without them, so it would not be this test; give shadow= to a test without {alone}"
        )
    sizes = [(positive_int(size, "each shadow size"), "shadow") for size in marked]
    if not alone:
        sizes += [(size, f"--dist-shadow={size}") for size in flagged]
    for size, where in sizes:
        if size < world_size:
            named = f"shadow size {size}" if where == "shadow" else where
            raise ValueError(
                f"{named} is smaller than the test's world ({world_size} ranks); a shadow "
                f"world is at least as large as the real one"
            )
    return tuple(sorted({size for size, _ in sizes}))


def seconds(value: object, where: str, *, optional: bool = False, text: bool = False) -> float:
    """Check a positive, finite duration in seconds.

    It is returned as a float.

    Args:
        value: The value; parsed first if ``text`` (an ini value, a command-line argument).
        where: What it is, for the message (``"timeout"``, ``"ini option dist_timeout"``).
        optional: Whether None is allowed; the caller handles it before calling, this only
            changes the message (``"... or None"``).
        text: Whether ``value`` may be text to parse.

    Raises:
        ValueError: It is not a number, or not positive and finite.
    """
    number = value
    if text and isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if (
        not isinstance(number, (int, float))
        or isinstance(number, bool)
        or not math.isfinite(number)
        or number <= 0
    ):
        also = " or None" if optional else ""
        raise ValueError(f"{where} must be a positive number of seconds{also}, got {value!r}")
    return float(number)


def seed(value: object, where: str, *, text: bool = False) -> int:
    """Check and return a seed: an int >= 0 (a schedule's, ``--dist-schedule-seed``).

    Raises:
        TypeError: It is not an int (``True`` and ``7.0`` are not).
        ValueError: It is negative, or text that is not an integer.
    """
    return whole(value, where, text=text, what=" (a seed)")


def schedule(value: object, where: str) -> Schedule:
    """Check a :class:`~harness.protocol.schedules.Schedule` a user made or drew: its holds
    ``(rank >= 0, boundary >= 1)`` pairs of ints, its delay None or positive seconds.

    Raises:
        TypeError: It is not a schedule, or its holds are not pairs of ints, naming it.
        ValueError: A hold's rank or boundary, or its delay, is out of range, naming it.
    """
    if not isinstance(value, Schedule):
        raise TypeError(
            f"{where} must be a harness.Schedule (draw it with harness.strategies.schedules), "
            f"not {short_repr(value)}"
        )
    holds = value.holds
    pairs = isinstance(holds, tuple) and all(
        isinstance(hold, tuple)
        and len(hold) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) for n in hold)
        for hold in holds
    )
    if not pairs:
        raise TypeError(
            f"{where} must hold (rank, boundary) pairs of ints, e.g. holds=((0, 3),), "
            f"not holds={short_repr(holds)}"
        )
    for rank, at in holds:
        if rank < 0 or at < 1:
            raise ValueError(
                f"{where} has the hold ({rank}, {at}): a rank is >= 0 and a boundary >= 1 "
                "(counted from 1)"
            )
    if value.delay is not None:
        seconds(value.delay, f"{where}'s delay")
    return value


def size(value: object, where: str) -> int:
    """Check an amount of memory; return it in bytes.

    Args:
        value: A whole number of bytes (an int, or text), or text with a unit: ``2GiB``,
            ``512MiB``, ``64KiB`` (powers of 1024), ``2GB``, ``500MB`` (powers of 1000),
            in any case, a space allowed before the unit.
        where: What it is, for the message (``"max_rank_memory"``,
            ``"--dist-max-rank-memory"``).

    Raises:
        TypeError: It is neither an int nor text (``True`` is not an int here).
        ValueError: It is negative, or text that is not a size.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{where} must be a size >= 0, got {value}")
        return value
    what = "a size: bytes (an int), or a number and a unit such as 2GiB, 512MiB, 2GB"
    if not isinstance(value, str):
        raise TypeError(f"{where} must be {what}, not {value!r}")
    found = _SIZE.fullmatch(value.lower())
    if found is None or found.group(2) not in _UNITS:
        raise ValueError(f"{where} must be {what}, got {value!r}")
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def flag(value: object, where: str) -> bool:
    """Check and return a yes/no setting such as ``init``.

    Only a real bool is accepted (else ``TypeError``), since a value such as ``"no"`` is true
    in Python, the opposite of what it says.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{where} must be True or False, not {value!r}")
    return value


def one_of(value: object, where: str, choices: tuple[str, ...]) -> str:
    """Check a name (any case) against ``choices``.

    It is returned in lower case; else raise ``ValueError`` listing them.
    """
    if not isinstance(value, str) or value.lower() not in choices:
        raise ValueError(f"unknown {where} {value!r}; valid: {', '.join(map(repr, choices))}")
    return value.lower()


def backend(value: object, where: str = "backend") -> str:
    """Check a backend name (any case) against :data:`BACKEND_CHOICES`; see :func:`one_of`."""
    return one_of(value, where, BACKEND_CHOICES)


def call_args(value: object, where: str = "args") -> tuple[Any, ...]:
    """Check a call's positional arguments; return them as a tuple.

    The arguments are as in ``World.run(fn, args=...)``.

    Any iterable of them is accepted (a tuple, a list, a generator), except a ``str``,
    ``bytes`` or mapping: each would be taken apart into several arguments (``args="ab"``
    would be ``fn("a", "b")``; a dict, its keys), which is never what was meant.

    Raises:
        TypeError: It is not such an iterable; the message names the value and its type.
    """
    if not isinstance(value, (str, bytes, bytearray, Mapping)):
        try:
            items = iter(value)  # type: ignore[call-overload]
        except TypeError:
            pass
        else:
            return tuple(items)
    shown = short_repr(value)
    fix = (
        f"; keyword arguments go in kwargs={shown}"
        if isinstance(value, Mapping)
        else f"; for a single argument write {where}=({shown},)"
    )
    raise TypeError(
        f"{where} must be a tuple (or list) of positional arguments for fn, not {shown} "
        f"({type(value).__name__}){fix}"
    )


def call_kwargs(value: object, where: str = "kwargs") -> dict[str, Any]:
    """Check a call's keyword arguments; return a new dict.

    The arguments are as in ``World.run(fn, kwargs=...)``: a mapping from names (``str``) to
    values, or None for none.

    Raises:
        TypeError: It is not a mapping, or has a key that is not a ``str``; the message names
            the value and its type.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{where} must be a mapping (a dict) of keyword arguments for fn, not "
            f"{short_repr(value)} ({type(value).__name__})"
        )
    for key in value:
        if not isinstance(key, str):
            raise TypeError(
                f"{where} must map the names (str) of fn's keyword arguments to their values; "
                f"it has the key {short_repr(key)} ({type(key).__name__})"
            )
    return dict(value)


def short_repr(obj: object) -> str:
    """``repr(obj)`` cut to 80 characters, never raising.

    This is how a message shows a value the user gave, whatever it is.
    """
    try:
        text = repr(obj)
    except Exception:
        text = f"<{type(obj).__qualname__} object>"
    return text if len(text) <= 80 else text[:77] + "..."


def argparse_type(check: Callable[..., _T], where: str) -> Callable[[str], _T]:
    """Turn a validator into an argparse ``type=``.

    The argparse error is the validator's message.
    """

    def parse(text: str) -> _T:
        try:
            return check(text, where, text=True)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = where
    return parse
