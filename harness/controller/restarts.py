"""Runs with restarts, as torchrun's agent restarts its worker group: when a rank dies or
fails, the whole world ends, a fresh one starts (new processes, new rendezvous) and the
body runs again, up to the number of restarts.

Each attempt's ranks see its number as ``TORCHELASTIC_RESTART_COUNT`` (``restart_count``),
so that a body resumes from its checkpoint; a fault acts in the attempt it names
(``faults.kill(..., attempt=0)``, the default), so the attempts after it run clean; and a
schedule of sizes (``restarts=[2]``) gives each attempt after the first its own world size,
so that "save at 4, resume at 2" is one run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from harness.errors import DistributedError, RankCrash, RankError, WorldTimeout
from harness.faults import FaultFired
from harness.protocol.messages import CallOptions

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome


@dataclass(frozen=True)
class Attempt:
    """How one attempt of a run with restarts ended.

    Attributes:
        number: From 0 (the first).
        world_size: Its world's size.
        ended: ``"passed"``, ``"skipped"``, or what ended it: the failure's summary, or what
            the faults that ended ranks did (``"rank 1 killed (SIGKILL) before collective #3
            (all_reduce at train.py:34) on the default group (injected)"``).
    """

    number: int
    world_size: int
    ended: str

    def __str__(self) -> str:
        ranks = "rank" if self.world_size == 1 else "ranks"
        return f"attempt {self.number} ({self.world_size} {ranks}): {self.ended}"


def why_restart(outcome: Outcome) -> str:
    """What makes a run start again after ``outcome``, as torchrun's agent would restart its
    workers: a rank that failed, crashed or hung, or that its fault ended ('' when nothing
    did). Not the harness's own verdicts on a run whose ranks all finished (a collective
    mismatch, a fault that never fired, a leak): the run is over, with that error."""
    error = outcome.error
    if isinstance(error, (RankError, RankCrash, WorldTimeout)) or type(error) is DistributedError:
        return error.summary
    # A rank whose fault ended its part (killed, exited, hung, or the fault's error escaped
    # the body): under torchrun its worker failed, and the agent restarts the group.
    fired = [value for value in outcome.values or () if isinstance(value, FaultFired)]
    return "; ".join(f"{value} (injected)" for value in fired)


def run_attempts(
    attempt: Callable[[int, CallOptions], Outcome],
    options: CallOptions,
    sizes: Sequence[int],
) -> tuple[Outcome, list[Attempt]]:
    """Run attempts until one ends with no rank dead or failed, or none is left.

    Args:
        attempt: Runs one attempt on a fresh world of ``world_size`` ranks, with the call's
            options for it (its ``attempt`` number, its faults): ``attempt(world_size,
            options)``.
        options: The call's options, with every attempt's faults.
        sizes: The world size of each attempt (:func:`harness.faults.checks.plan`).

    Returns:
        The last attempt's outcome, and every attempt, in order. An outcome that failed
        carries the attempts before it in its error's ``attempts``; the outcome's ``fired``
        holds every attempt's faults that acted.
    """
    attempts: list[Attempt] = []
    fired: list[FaultFired] = []
    for number, size in enumerate(sizes):
        this = options  # without restarts every fault is the first attempt's: as they are
        if len(sizes) > 1:
            faults = tuple(fault for fault in options.faults if fault.attempt == number)
            this = replace(options, faults=faults, attempt=number, restarts=len(sizes) - 1)
        outcome = attempt(size, this)
        fired += outcome.fired
        restart = why_restart(outcome)
        if restart:
            ended = restart
        elif outcome.error is not None:
            ended = outcome.error.summary
        else:
            ended = "skipped" if outcome.skip is not None else "passed"
        attempts.append(Attempt(number, size, ended))
        if number + 1 == len(sizes) or not restart:
            outcome.fired = tuple(fired)
            if outcome.error is not None:
                outcome.error.attempts = [str(earlier) for earlier in attempts[:-1]]
            return outcome, attempts
    raise AssertionError("no attempt ran")  # sizes is never empty
