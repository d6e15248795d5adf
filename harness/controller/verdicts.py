"""Which collective went wrong, from the ranks' traces: one verdict line per finding.

Pure logic on plain data, for every failed call and, as the desync check, every call that
returned on all ranks; while a call runs, :func:`can_never_finish` says whether the traces
already prove it can never finish. Per process group, only its members are compared:

* the first collective whose op, reduce op, root, shapes or dtypes differ between members
  (``collective #2 on the default group differs: rank 0 all_reduce(SUM, float32[4]) at
  test_x.py:14; rank 1 broadcast(src=0, float32[4]) at test_x.py:16``), each compared
  only where both members know it (:func:`same_op`: a collective recorded through torch's
  process-group hooks has no reduce op);
* otherwise, members that issued fewer collectives than others, said by what became of
  them: still running (``rank 2 never reached collective #2 (barrier) that ranks 0, 1 wait
  in; rank 2 is in time.sleep at test_x.py:30``), returned (``rank 3 finished the call
  after #4; ranks 0-2 wait in #5 (all_gather)``), failed or died.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from harness.protocol.failures import ranks_phrase
from harness.protocol.traces import (
    DEFAULT_GROUP,
    IN_FLIGHT,
    RAISED,
    Agreement,
    Collective,
    Fingerprint,
    GroupHistory,
    Op,
    RankTrace,
    group_names,
)

RUNNING = "running"
"""The rank had not answered when the controller stopped waiting (blocked, or busy)."""
DONE = "done"
"""The rank returned from the call."""
FAILED = "failed"
"""The rank raised (or skipped)."""
DIED = "died"
"""The rank's process ended without answering."""

MISMATCH, HANG = "mismatch", "hang"
"""The kinds of :attr:`Finding.kind`: kept on the error as ``DistributedError.marks``, where
the timeline (:mod:`harness.timeline`) finds the collective to mark."""

_ENDED = {DONE: "finished the call", FAILED: "failed", DIED: "died"}

_EVERY_MEMBER_JOINS = frozenset(
    {
        *("all_reduce", "all_reduce_coalesced", "barrier", "all_gather_object"),
        *("all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_coalesced"),
        *("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single"),
        *("all_to_all", "all_to_all_single"),
    }
)
"""Collectives no member finishes before every member joined: each receives from all (a
broadcast's root, or a gather's sender, may finish alone; ``monitored_barrier`` ends by its
own timeout, naming the missing rank)."""


@dataclass(frozen=True)
class Finding:
    """One verdict line on a group's collectives, and the collective it points at: the first
    that differs (``MISMATCH``), or the one members behind never issued (``HANG``)."""

    group: str
    seq: int
    kind: str
    text: str


def findings(
    traces: Mapping[int, RankTrace | None],
    states: Mapping[int, str],
    world_size: int,
    *,
    until_raised: bool = False,
) -> list[Finding]:
    """Compare the ranks' traces of one call.

    Args:
        traces: Per rank, the collectives it issued (None or missing: unknown).
        states: Per rank, what became of it: ``RUNNING``, ``DONE``, ``FAILED`` or ``DIED``.
        world_size: The number of ranks (the members of the default group).
        until_raised: Compare each group only before its first collective that raised on
            any member: the desync check of a call whose test handled that error.

    Returns:
        The findings, at most one per process group; empty when the ranks agree.
    """
    known = {rank: trace for rank, trace in traces.items() if trace is not None}
    if len(known) < 2:
        return []
    members = _members(known)
    names = group_names(sorted(members), members)
    verdicts: list[Finding] = []
    for group in sorted(members):
        ranks = members[group]
        compared = [r for r in (ranks if ranks is not None else range(world_size)) if r in known]
        if len(compared) < 2:
            continue
        histories = {rank: known[rank].groups.get(group) for rank in compared}
        if until_raised:
            histories = _before_raised(histories)
        verdict = _difference(group, names[group], histories) or _missing(
            group, names[group], histories, known, states
        )
        if verdict:
            verdicts.append(verdict)
    return verdicts


def can_never_finish(
    traces: Mapping[int, RankTrace | None],
    states: Mapping[int, str],
    world_size: int,
    *,
    desync_check: bool = True,
    deadline: float | None = None,
) -> bool:
    """Whether the traces prove a running call can never finish, or never pass.

    They prove it when, on some group,

    * a member that returned or died (``DONE``, ``DIED``) issued fewer collectives than
      another member is inside (one that saw none of its own raise): it never issues that
      one;
    * or every member is inside collective #N and their ops (op, root, shapes, dtypes;
      not the reduce op alone, which the backend completes) differ: the call cannot pass,
      and is reported as that mismatch (:mod:`~harness.controller.classify`);

    unless the waiting collectives raise by themselves first: a ``monitored_barrier``, or
    any collective of a group whose own timeout is shorter than the call's ``deadline``
    (seconds; None: none), an error the test may expect.

    Args:
        traces, states, world_size: As :func:`findings`; a rank without a trace proves nothing.
        desync_check: Whether the call's desync check is on. Without it a mismatch may
            pass (Gloo completes SUM against MAX; a rooted collective may finish on one
            side), so only the first kind counts, for a collective every member must join.
    """
    known = {rank: trace for rank, trace in traces.items() if trace is not None}
    members = _members(known)
    for group, ranks in members.items():
        group_ranks = list(ranks if ranks is not None else range(world_size))
        inside = {}
        for rank in group_ranks:
            last = known[rank].last(group) if rank in known else None
            if states.get(rank) == RUNNING and last is not None and last.state == IN_FLIGHT:
                inside[rank] = last
        if not inside or _ends_itself(group, inside, known, deadline):
            continue
        ended = [r for r in group_ranks if r in known and states.get(r) in (DONE, DIED)]
        fewest = min((known[rank].count(group) for rank in ended), default=None)
        for rank, last in inside.items():
            joined = desync_check or last.op.name in _EVERY_MEMBER_JOINS
            # A collective this rank saw raise may never have reached the backend (torch
            # rejected its arguments), so its numbers may run ahead of its peers': no proof.
            counted = not known[rank].groups[group].raised
            if fewest is not None and fewest < last.seq and joined and counted:
                return True
        if not desync_check or len(inside) < len(group_ranks):
            continue
        if any(known[rank].groups[group].raised for rank in group_ranks):
            continue  # a collective raised: the test may handle such errors on purpose
        seqs = {last.seq for last in inside.values()}
        ops = [last.op for last in inside.values()]
        # Ops that differ in their reduce op alone complete (SUM against MAX): the desync
        # check finds them once every rank returned, however slow the backend is.
        if len(seqs) == 1 and not _alike(ops) and len({_without_reduce_op(op) for op in ops}) > 1:
            return True
    return False


def _members(known: Mapping[int, RankTrace]) -> dict[str, tuple[int, ...] | None]:
    """Each group's members (None: every rank), as the first trace that has the group says."""
    members: dict[str, tuple[int, ...] | None] = {}
    for trace in known.values():
        for group, history in trace.groups.items():
            members.setdefault(group, history.ranks)
    return members


def _ends_itself(
    group: str,
    inside: Mapping[int, Collective],
    known: Mapping[int, RankTrace],
    deadline: float | None,
) -> bool:
    """Whether the collectives ranks are ``inside`` on ``group`` raise before the deadline."""
    if any(last.op.name == "monitored_barrier" for last in inside.values()):
        return True
    bounds = [t for r in inside if (t := known[r].groups[group].timeout) is not None]
    return bool(bounds) and (deadline is None or min(bounds) < deadline)


def _before_raised(
    histories: Mapping[int, GroupHistory | None],
) -> dict[int, GroupHistory | None]:
    """The members' histories of a group, cut before its first collective that raised."""
    raised = [h.raised for h in histories.values() if h is not None and h.raised]
    if not raised:
        return dict(histories)
    keep = min(raised) - 1
    size = array("I").itemsize
    return {
        rank: None
        if h is None
        else replace(
            h,
            count=min(h.count, keep),
            op_ids=h.op_ids[: keep * size],
            place_ids=h.place_ids[: keep * size],
            raised=0,
        )
        for rank, h in histories.items()
    }


def agree(prints: Mapping[int, Fingerprint | None], world_size: int) -> bool:
    """The desync check's first half: whether the members of every group issued as many
    collectives on it, with equal checksums (True where a rank sent no fingerprint)."""
    if any(found is None for found in prints.values()):
        return True
    values = list(prints.values())
    if all(found == values[0] for found in values):
        return True  # the common case: one comparison per rank
    agreement = Agreement()
    return all(agreement.add(rank, found or ()) for rank, found in prints.items())


def same_op(first: Op, second: Op) -> bool:
    """Whether two members' ops are the same collective, comparing only what both know.

    Their keys are equal, or equal once the reduce op is left out where only one of them
    knows it: torch's process-group hooks do not give the reduce op of a collective issued
    below ``torch.distributed``'s functions (DDP's, a functional one), which the Python
    layer records (``all_reduce(SUM, float32[4])`` against ``all_reduce(float32[4])``).
    """
    if first.key == second.key:
        return True
    if first.name != second.name or bool(first.reduce_op) == bool(second.reduce_op):
        return False
    known, other = (first, second) if first.reduce_op else (second, first)
    return _without_reduce_op(known) == other.key


def _without_reduce_op(op: Op) -> str:
    """``op.key`` with its reduce op left out (``all_reduce(SUM, float32[4])`` reads
    ``all_reduce(float32[4])``): an item of the parenthesised list, which no tensor, root
    or count can be equal to."""
    head, _, rest = op.key.partition("(")
    items, reduce_op = rest.removesuffix(")"), op.reduce_op
    if items == reduce_op:
        items = ""
    elif items.startswith(f"{reduce_op}, "):
        items = items[len(reduce_op) + 2 :]
    else:
        items = re.sub(f", {re.escape(reduce_op)}(?=, |$)", "", items, count=1)
    return f"{head}({items})"


def _alike(ops: Sequence[Op]) -> bool:
    """Whether every pair of ``ops`` is the same collective (:func:`same_op`)."""
    first = ops[0]
    if all(op.key == first.key for op in ops):
        return True  # the common case
    return all(same_op(a, b) for a, b in combinations(ops, 2))


def _difference(
    group: str, name: str, histories: Mapping[int, GroupHistory | None]
) -> Finding | None:
    """The first collective that differs between the members, among those all issued."""
    sequences = [h.sequence() if h is not None else [] for h in histories.values()]
    common = min(len(ops) for ops in sequences)
    for index in range(common):
        if _alike([ops[index] for ops in sequences]):
            continue
        seq = index + 1
        by_op: dict[str, list[int]] = {}
        for rank, history in histories.items():
            assert history is not None  # it has collective #seq
            found = history.at(seq)
            assert found is not None
            op, where = found
            by_op.setdefault(f"{op.text} at {where}", []).append(rank)
        parts = [f"{ranks_phrase(ranks)} {text}" for text, ranks in by_op.items()]
        where_group = "on the default group" if group == DEFAULT_GROUP else f"on {name}"
        text = f"collective #{seq} {where_group} differs: " + "; ".join(parts)
        return Finding(group, seq, MISMATCH, text)
    return None


def _missing(
    group: str,
    name: str,
    histories: Mapping[int, GroupHistory | None],
    known: Mapping[int, RankTrace],
    states: Mapping[int, str],
) -> Finding | None:
    """Members behind on the group: what became of them, and where the others are."""
    counts = {rank: (h.count if h is not None else 0) for rank, h in histories.items()}
    if len(set(counts.values())) == 1:
        return None
    top = max(counts.values())
    ahead = [rank for rank, count in counts.items() if count == top]
    # The rank furthest behind decides the collective that is missing.
    low = min(counts.values())
    behind = [rank for rank, count in counts.items() if count == low]
    seq = low + 1
    sample = histories[ahead[0]]
    assert sample is not None
    found = sample.at(seq)
    op_name = found[0].name if found is not None else "?"
    on_group = "" if group == DEFAULT_GROUP else f" on {name}"
    label = f"collective #{seq}{on_group}"
    waiting = _waiting(ahead, group, top, known)
    state = {states.get(rank, RUNNING) for rank in behind}
    who = ranks_phrase(behind)
    others = ranks_phrase(ahead)
    if state == {RUNNING}:
        if waiting and top == seq:
            text = f"{who} never reached {label} ({op_name}) that {others} {waiting}"
        else:
            text = f"{who} never reached {label} ({op_name}); {others} went on to #{top}"
        places = [p for rank in behind if (p := _where(rank, known[rank], group))]
        if places:
            text += "; " + "; ".join(places)
        return Finding(group, seq, HANG, text)
    after = f"after #{low}" if low else "before #1"
    ended = _ENDED.get(state.pop(), "stopped") if len(state) == 1 else "stopped"
    what = f"{who} {ended} {after}{on_group}"
    if waiting:
        at_top = sample.at(top)
        text = f"{what}; {others} {waiting} #{top} ({at_top[0].name if at_top else '?'})"
    else:
        where = f" ({found[0].text} at {found[1]})" if found is not None else ""
        more = f" and {top - seq} more" if top > seq else ""
        text = f"{what}; {others} went on to #{seq}{where}{more}"
    return Finding(group, seq, HANG, text)


def _waiting(ranks: list[int], group: str, top: int, known: Mapping[int, RankTrace]) -> str:
    """How ``ranks`` wait in collective ``#top``: ``"wait in"``, ``"were in"`` when they
    raised there (a peer left), or '' when some are not inside it."""
    states = set()
    for rank in ranks:
        last = known[rank].last(group)
        if last is None or last.seq != top or last.state not in (IN_FLIGHT, RAISED):
            return ""
        states.add(last.state)
    many = len(ranks) > 1
    if states == {IN_FLIGHT}:
        return "wait in" if many else "waits in"
    return "were in" if many else "was in"


def _where(rank: int, trace: RankTrace, group: str) -> str:
    """Where a rank behind on ``group`` is: inside a collective of another group, or in the
    user's code (``rank 2 is in time.sleep at test_x.py:30``)."""
    flight = trace.in_flight
    if flight is not None and flight.group != group:
        return f"rank {rank} is in {flight.op.text} at {flight.where}"
    if trace.blocked_at:
        text = trace.blocked_at
        return f"rank {rank} is " + (text if text.startswith("at ") else f"in {text}")
    return ""
