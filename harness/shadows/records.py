"""What a shadow world's simulated ranks report, as plain data both sides use.

A simulated rank (:mod:`harness.shadows.simulate`) reports a :class:`SimulatedRank`: the
trace of its collectives as a real rank records them, the groups it made
(:class:`Creation`) and how it ended. The host (:mod:`harness.shadows.host`) gathers them into
a :class:`ShadowRun`, which the controller's side checks (:mod:`harness.shadows.check`).

Standard library and the protocol only, like the protocol itself.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from harness.protocol.failures import RankFailure, ranks_phrase
from harness.protocol.pytest_calls import FixturePlan, TestRef
from harness.protocol.traces import Fingerprint, RankTrace

SHADOW_VARIABLE = "HARNESS_SHADOW_WORLD"
"""Set in a simulated rank's environment to the shadow world's size (``harness.shadow()``
reads it; so does any process the body starts)."""


@dataclass(frozen=True)
class ShadowJob:
    """One shadow world to run: what the controller asks of the host.

    Attributes:
        ref: The test.
        plan: Its fixtures that run in the ranks.
        size: The shadow world's size.
        node_size: Ranks per node (``LOCAL_WORLD_SIZE``): the real world's size, so that
            rank ``r`` has ``LOCAL_RANK`` ``r % node_size``.
        init: Whether the harness makes the default group, as in the real world.
        seed: The seed of every rank's random generators (the real run's).
        rank_timeout: Seconds a simulated rank may take before it is stopped.
        stop_at_difference: Stop at the first rank whose collectives or groups disagree
            with those of a rank run before it (a search needs only to know whether a size
            shows a difference); a failure stops a run either way.
    """

    ref: TestRef
    plan: FixturePlan
    size: int
    node_size: int
    init: bool = True
    seed: int | None = None
    rank_timeout: float = 120.0
    stop_at_difference: bool = False


@dataclass(frozen=True)
class Creation:
    """One process group a simulated rank made (``new_group``, and what calls it: a
    ``DeviceMesh``, ``new_subgroups``).

    Attributes:
        ranks: Its members, sorted (None: every rank of the world).
        site: Where the user's code made it (``test_x.py:12``).
        local: Made with ``use_local_synchronization=True``: only its members make it, so
            the other ranks' creations are not compared with it.
    """

    ranks: tuple[int, ...] | None
    site: str
    local: bool = False

    @property
    def text(self) -> str:
        """``new_group(ranks 0-7) at test_x.py:12``."""
        members = "every rank" if self.ranks is None else ranks_phrase(self.ranks)
        return f"new_group({members}) at {self.site}"


@dataclass(frozen=True)
class SimulatedRank:
    """What one simulated rank did.

    Attributes:
        rank: Its rank in the shadow world.
        trace: Its collectives, recorded as on a real rank; on torch without process-group
            hooks, those torch issued below its Python functions (DDP's) too, which the
            shadow's own process groups record.
        fingerprint: Its trace's :data:`~harness.protocol.traces.Fingerprint`.
        creations: The groups it made, in order.
        below: Per group id, the numbers of the collectives that only the shadow's process
            groups saw (torch issued them below its Python functions where torch has no
            hooks): a real run on this torch does not record them.
        failure: How it failed (raised, died, did not finish); None when it returned.
        skip: Why it skipped ('' when it did not).
        imported: The first rank run: the modules of installed packages it imported, which
            the host imports before it forks the others.
    """

    rank: int
    trace: RankTrace = field(default_factory=RankTrace)
    fingerprint: Fingerprint = ()
    creations: tuple[Creation, ...] = ()
    below: dict[str, tuple[int, ...]] = field(default_factory=dict)
    failure: RankFailure | None = None
    skip: str = ""
    imported: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShadowRun:
    """One shadow world's run, as its host gathered it.

    Attributes:
        size: The shadow world's size.
        ranks: What each rank run did, by rank: every rank, unless the run stopped early (a
            rank failed, or, where asked, the ranks disagreed).
    """

    size: int
    ranks: dict[int, SimulatedRank]

    @property
    def failed(self) -> SimulatedRank | None:
        """The lowest rank that failed or skipped (None: none did)."""
        return next(
            (
                self.ranks[r]
                for r in sorted(self.ranks)
                if self.ranks[r].failure or self.ranks[r].skip
            ),
            None,
        )


def spread(size: int) -> list[int]:
    """Every rank of a world of ``size``, in the order a shadow runs them: the first and the
    last, then the middle of each gap in turn, so that ranks far apart (those that play
    other roles) run early and a run that stops at the first difference stops soon."""
    if size <= 2:
        return list(range(size))
    order = [0, size - 1]
    gaps = deque([(0, size - 1)])
    while gaps:
        low, high = gaps.popleft()
        if high - low < 2:
            continue
        middle = (low + high) // 2
        order.append(middle)
        gaps += [(low, middle), (middle, high)]
    return order
