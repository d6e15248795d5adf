"""A run's faults checked together, before any rank starts: each fault's arguments, and
against its world, each other and its restarts.

The makers record a fault without checking it, so that a bad one made at the import of a
test module fails that test alone. Every entry point hands the list it was given (the
marker, ``harness.run``, ``World.run``, ``World.call``'s options, a drawn example) to
:func:`checked` where it makes the call's record (``CallOptions``) of them: the one place a
fault list is checked. :func:`plan` does it for a call that may restart: its attempts'
sizes, then its faults checked against them.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeAlias

from harness import validate
from harness.faults.places import Collective
from harness.faults.sweeps import InvalidSweep, OpenSweep, Sweep
from harness.faults.values import Fault
from harness.protocol.messages import CallOptions

_Place: TypeAlias = tuple[int, int | Collective, tuple[int, ...] | None, int]
"""Where a fault acts: its rank, collective, group and attempt."""


def checked(faults: object, sizes: int | Sequence[int], where: str = "faults") -> tuple[Fault, ...]:
    """Check the faults given to a call or a run (``where`` names them in messages).

    Args:
        faults: The list as given.
        sizes: The size of the call's world; or, for a run that may restart, each
            attempt's (the first included: :func:`harness.validate.attempt_sizes`), where
            each fault must act in an attempt the run has, and fit that attempt's world.
        where: How messages name the list: where it came from.

    Returns:
        The faults as a tuple.

    Raises:
        TypeError: ``faults`` is not a list or tuple of faults, is a sweep (meant one fault
            at a time), or a fault does not pickle (to travel to the ranks); or an invalid
            sweep says so.
        ValueError: A fault's own argument is not valid (``at=0``: collectives are counted
            from 1), a fault does not fit the world, two act at the same collective of the
            same rank, or a fault acts in an attempt the run does not have; the message
            names the fault. Or an invalid sweep (:class:`InvalidSweep`) says why.
    """
    placed = _faults(faults, where)
    largest = sizes if isinstance(sizes, int) else max(sizes)
    seen: dict[_Place, Fault] = {}
    for fault in placed:
        fault.check(largest)
        _check_alone(fault, seen, where)
        _check_pickles(fault)
    if not isinstance(sizes, int):
        for fault in placed:
            _check_attempt(fault, sizes)
    return placed


def _faults(faults: object, where: str) -> tuple[Fault, ...]:
    """``faults`` as a tuple, where it is a list or tuple of faults."""
    if isinstance(faults, InvalidSweep):
        faults.fail()
    if isinstance(faults, (Sweep, OpenSweep)):
        raise TypeError(
            f"{where}: a sweep of faults is meant one fault at a time: run each "
            "(for fault in sweep: world.run(fn, faults=[fault]))"
        )
    if not isinstance(faults, (list, tuple)) or not all(isinstance(f, Fault) for f in faults):
        raise TypeError(
            f"{where} must be a list of faults made by harness.faults (kill, exit, error, "
            f"delay, hang, corrupt), not {faults!r}"
        )
    return tuple(faults)


def _check_alone(fault: Fault, seen: dict[_Place, Fault], where: str) -> None:
    """Check that no fault before it (``seen``, which it joins) acts at its collective."""
    place = (fault.rank, fault.at, fault.group, fault.attempt)
    if place in seen:
        raise ValueError(
            f"{where}: {seen[place]} and {fault} both act at {fault.point} of "
            f"rank {fault.rank} on {fault.group_name}; give one"
        )
    seen[place] = fault


def _check_pickles(fault: Fault) -> None:
    try:
        pickle.dumps(fault)
    except Exception as exc:
        raise TypeError(
            f"fault {fault} does not pickle ({type(exc).__name__}: {exc}); its function "
            "or exception must be defined at module level"
        ) from None


def _check_attempt(fault: Fault, sizes: Sequence[int]) -> None:
    """Check that ``fault`` acts in an attempt the run has, and fits that attempt's world."""
    if fault.attempt >= len(sizes):
        restarts = len(sizes) - 1
        raise ValueError(
            f"fault {fault} acts in attempt {fault.attempt}, but the run has "
            f"{restarts} restart{'' if restarts == 1 else 's'} (attempts 0 to {restarts})"
        )
    fault.check(sizes[fault.attempt])


@dataclass(frozen=True)
class Planned:
    """A call's attempts, planned before the first starts.

    Attributes:
        options: The call's options, with every attempt's faults, checked against them.
        sizes: The world size of each attempt, the first included.
    """

    options: CallOptions
    sizes: tuple[int, ...]


def plan(options: CallOptions, faults: object, restarts: object, world_size: int) -> Planned:
    """Plan a call's attempts: their world sizes (``restarts`` on a world of
    ``world_size``: :func:`harness.validate.attempt_sizes`), and ``faults``, as given,
    checked against them (:func:`checked`) into ``options``.

    Raises:
        TypeError, ValueError: ``restarts`` or ``faults`` is not valid, naming it.
    """
    sizes = validate.attempt_sizes(restarts, world_size)
    # Checked before the record is made of them: a bad value is named as it was given.
    return Planned(replace(options, faults=checked(faults, sizes)), sizes)
