"""What one call produced, from what each rank showed.

A call's product is an :class:`Outcome`; what was seen of a rank is a :data:`Reply`, and
everything its end is judged from, an :class:`Evidence`.
"""

from __future__ import annotations

import unittest
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from harness import compat
from harness.errors import DistributedError
from harness.faults import Fault, FaultFired
from harness.protocol.messages import Fired, RankMessage, Skipped
from harness.protocol.traces import RankTrace


@dataclass(frozen=True)
class Died:
    """A rank process ended without answering (what the supervisor saw, not a message).

    ``at`` is on the monotonic clock; ``exit_call``, where it called ``os._exit``
    (``"test_x.py:12"``) and its stack there, when it left that way.
    """

    exitcode: int | None
    at: float
    dump: str = ""
    exit_call: tuple[str, str] | None = None


@dataclass(frozen=True)
class Faulted:
    """A rank whose injected fault ended its part of the call: what it said as the fault
    acted, then its death, its ``Failed`` with the fault's error, or None (it hangs)."""

    fired: Fired
    then: RankMessage | Died | None = None


Reply = RankMessage | Died | Faulted
"""What the supervisor saw of one rank."""


@dataclass(frozen=True)
class Evidence:
    """Everything the end of a call (or of a world's start) is judged from.

    Attributes:
        replies: What was seen of each rank; a missing rank had not answered when the
            supervisor stopped waiting.
        world_size: How many ranks were waited for.
        timeout: The bound the supervisor waited under (None: none).
        stacks: The readable stacks of the ranks, when the wait stopped before every rank
            answered.
        starting: For a world's start, how to name it (``"a world of 2 ranks (gloo)"``);
            None for a call.
        init: Whether the world has a harness default group (without one, every group a
            call leaves is destroyed before the next call: none makes it unfit).
        traces: The traces of the ranks that had not answered or that returned while others
            failed (a failure's reply carries its own).
        check_collectives: Whether the desync check's first half runs
            (:func:`~harness.controller.classify.desync` is its second).
        faults: The call's faults.
        fired: What each rank said as its fault acted, by rank.
        stopped: ``time.monotonic()`` when the wait ended.
        certain: The ranks' traces proved the call can never finish, or never pass.
    """

    replies: Mapping[int, Reply]
    world_size: int
    _: KW_ONLY
    timeout: float | None
    stacks: Mapping[int, str] = field(default_factory=dict)
    starting: str | None = None
    init: bool = True
    traces: Mapping[int, RankTrace | None] = field(default_factory=dict)
    check_collectives: bool = True
    faults: Sequence[Fault] = ()
    fired: Mapping[int, Fired] = field(default_factory=dict)
    stopped: float = 0.0
    certain: bool = False


@dataclass
class Outcome:
    """Everything one call produced, before it becomes a return value or an error.

    Attributes:
        outputs: Each rank's captured ``(stdout, stderr)``, when the call captured them.
        returned: When the call failed, the pickled return values of the ranks that had
            returned, by rank (the ``--dist-mptc`` check judges ranks one by one).
        traces: When the call succeeded and ``CallOptions.keep_traces`` asked for them,
            each rank's trace of its collectives (None: unknown), by rank.
        fired: What each fault that acted did, earliest first, whether the call succeeded
            or not (of a run with restarts: in every attempt).
    """

    values: list[Any] | None = None
    error: DistributedError | None = None
    skip: Skipped | None = None
    outputs: dict[int, tuple[str, str]] = field(default_factory=dict)
    returned: dict[int, bytes] = field(default_factory=dict)
    traces: dict[int, RankTrace | None] = field(default_factory=dict)
    fired: tuple[FaultFired, ...] = ()

    def result(self) -> list[Any]:
        """The return values by rank; raises the error or the skip instead."""
        if self.error is not None:
            raise self.error
        if self.skip is not None:
            # The kind of skip the ranks raised, pointing at the caller, not at us.
            if self.skip.kind == "pytest":
                compat.skip_at_test(self.skip.reason)
            raise unittest.SkipTest(self.skip.reason)
        return list(self.values or [])


@dataclass
class Classified(Outcome):
    """A call's outcome as the controller classified it, with what it means for the world that
    ran it (the World's to act on; ``World.call`` returns the plain :class:`Outcome`).

    Attributes:
        reusable: False when the world must be rebuilt although the call succeeded.
        notice: Why a successful call left the world unfit, when the caller should hear it.
        regroup: The call destroyed the harness's default process group on every rank: the
            world makes a fresh one, on the same processes, before the next call.
        leaks: What a successful call left that no reset undoes: findings by rank.
        suspect: The ranks' fingerprints disagree: ``classify.desync`` completes the check.
    """

    reusable: bool = True
    notice: str = ""
    regroup: bool = False
    leaks: dict[int, tuple[str, ...]] = field(default_factory=dict)
    suspect: bool = False

    def outcome(self) -> Outcome:
        """The outcome alone, as the World's caller sees it."""
        return Outcome(
            self.values,
            self.error,
            self.skip,
            self.outputs,
            self.returned,
            self.traces,
            self.fired,
        )
