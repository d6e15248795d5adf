"""A run's faults checked together: against its world, each other and its restarts.

:mod:`harness.faults` makes each fault without checking it, so that a bad one made at the
import of a test module fails that test alone; a run (``World.run``, ``harness.run``, a
marked test) hands its whole list here before any rank starts, and this is where each
fault's arguments are checked.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence

from harness.faults import Fault, OpenSweep, Sweep


def checked(faults: object, world_size: int, where: str = "faults") -> tuple[Fault, ...]:
    """Check the faults given to a run or a test case (``where`` names them in messages).

    Returns:
        The faults as a tuple.

    Raises:
        TypeError: ``faults`` is not a list or tuple of faults, is a :class:`Sweep` (meant
            one fault at a time), or a fault does not pickle (to travel to the ranks).
        ValueError: A fault's own argument is not valid (``at=0``: collectives are counted
            from 1), a fault does not fit the world, or two act at the same collective of
            the same rank; the message names the fault.
    """
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
    seen: dict[tuple[int, int, tuple[int, ...] | None, int], Fault] = {}
    for fault in faults:
        fault.check(world_size)
        key = (fault.rank, fault.at, fault.group, fault.attempt)
        if key in seen:
            raise ValueError(
                f"{where}: {seen[key]} and {fault} both act at collective #{fault.at} of "
                f"rank {fault.rank} on {fault.group_name}; give one"
            )
        seen[key] = fault
        try:
            pickle.dumps(fault)
        except Exception as exc:
            raise TypeError(
                f"fault {fault} does not pickle ({type(exc).__name__}: {exc}); its function "
                "or exception must be defined at module level"
            ) from None
    return tuple(faults)


def check_attempts(faults: Sequence[Fault], sizes: Sequence[int]) -> None:
    """Check that each fault acts in an attempt the run has, and fits that attempt's world.

    Raises:
        ValueError: A fault's ``attempt`` is beyond the restarts, or its rank is not in that
            attempt's world.
    """
    for fault in faults:
        if fault.attempt >= len(sizes):
            restarts = len(sizes) - 1
            raise ValueError(
                f"fault {fault} acts in attempt {fault.attempt}, but the run has "
                f"{restarts} restart{'' if restarts == 1 else 's'} (attempts 0 to {restarts})"
            )
        fault.check(sizes[fault.attempt])
