"""A distributed call's collectives on one time axis, across its ranks: the record every file
of a test's trace folder (``--dist-trace-dir``) is written from.

:mod:`harness.timeline.build` makes a :class:`Timeline` from the ranks' traces; each writer
turns it into one file: the picture (:mod:`harness.timeline.page`), Chrome trace events
(:mod:`harness.timeline.chrome_trace`) and Flight Recorder dumps
(:mod:`harness.timeline.flight_dumps`). A collective is identified across ranks by its group
and its number there (``(group, seq)``): the ranks that took part in one collective hold a
span each with the same pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.protocol.traces import COMPLETED, IN_FLIGHT, ISSUED, RAISED

NEVER_REACHED = "never reached"
"""The state of a span a rank did not issue although a peer in its group did: the rank
stopped (returned, raised, hung, died) before it got there."""

STATES = (COMPLETED, IN_FLIGHT, ISSUED, RAISED, NEVER_REACHED)
"""Every state a span can have."""


@dataclass(frozen=True)
class Group:
    """One process group the call's collectives ran on.

    Attributes:
        id: Its id in the traces (``""``: the default group; else ``"0,2/3"``, its member
            ranks and torch's name for it).
        name: How reports name it: ``"the default group"``, ``"the group of ranks 0, 2"``.
        ranks: Its member ranks (global), in order; every rank for the default group.
    """

    id: str
    name: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Span:
    """One collective on one rank.

    Attributes:
        rank: The global rank.
        group: The id of its group (:attr:`Group.id`).
        seq: Its number among the group's collectives in the call, from 1.
        op: The function's name (``"all_reduce"``).
        text: How it reads: ``"all_reduce(SUM, float32[4])"``.
        shapes: Each tensor's shape.
        dtype: The first tensor's dtype (``"float32"``), None where there is no tensor.
        reduce_op: ``"SUM"``, ``"MAX"``, ... (None where the op has none).
        site: Its call site, ``"test_x.py:14"`` ('' for a span never reached).
        start: When the rank entered it, in seconds since :attr:`Timeline.origin` (None:
            not known, or never reached).
        end: When it returned (None: it did not, or not known).
        state: One of :data:`STATES`.
    """

    rank: int
    group: str
    seq: int
    op: str
    text: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str | None
    reduce_op: str | None
    site: str
    start: float | None
    end: float | None
    state: str

    @property
    def key(self) -> tuple[str, int]:
        """``(group, seq)``: the same on every rank that took part in this collective."""
        return self.group, self.seq


@dataclass(frozen=True)
class Timeline:
    """A call's collectives across its ranks.

    Attributes:
        test: What ran (a pytest node id, or a function's name).
        failure: One line saying how the call ended (``"rank 1 raised ValueError: ..."``,
            ``"hang: rank 1 is in #3 all_reduce, rank 0 never reached it"``; '' for a pass).
        world_size: How many ranks the world had.
        backend: Its backend (``"gloo"``, ``"nccl"``).
        groups: The groups its collectives ran on, the default group first.
        spans: Every rank's collectives, by rank, then in the order the rank issued them;
            each on a group of ``groups``.
        ranks_unknown: Ranks whose trace is missing (the rank died, or did not answer).
        mark: ``(group, seq)`` of the collective to point at (the first mismatch, or where a
            rank hangs); None when there is none.
        mark_kind: Its kind, as the verdict that points at it says:
            :data:`~harness.controller.verdicts.MISMATCH` or
            :data:`~harness.controller.verdicts.HANG` ('' when ``mark`` is None).
        mark_text: What is wrong there, one line (``"rank 1 called all_gather, rank 0
            all_reduce"``).
        origin: The time zero of ``Span.start``/``end``, as ``time.monotonic()`` read it on
            this machine (one time base per world: every rank shares the clock).
        duration: Seconds from ``origin`` to when the traces were taken (where in-flight
            spans end in the picture).
    """

    test: str
    failure: str
    world_size: int
    backend: str
    groups: tuple[Group, ...]
    spans: tuple[Span, ...]
    ranks_unknown: tuple[int, ...] = ()
    mark: tuple[str, int] | None = None
    mark_kind: str = ""
    mark_text: str = ""
    origin: float = 0.0
    duration: float = 0.0

    def __post_init__(self) -> None:
        listed = {group.id for group in self.groups}
        unlisted = sorted({span.group for span in self.spans} - listed)
        if unlisted:
            raise ValueError(
                f"spans on groups {unlisted} that the timeline's groups {sorted(listed)} lack"
            )
