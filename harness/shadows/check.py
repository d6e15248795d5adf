"""What a shadow world's run shows, on the controller's side: pure logic on plain data.

* :func:`differences`: whether every rank made the same groups in the same order, then, per
  process group, whether its members issued the same collectives, in the words of the
  desync verdicts (:func:`harness.controller.verdicts.findings`);
* :func:`unfaithful`: whether the shadow of the real world's size issued what the real run
  did, rank by rank and group by group (where not, the body depends on what its collectives
  returned, or on something else a shadow does not simulate);
* :func:`sequences`: every group's sequences, compact, for the trace folder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import groupby

from harness.controller import verdicts
from harness.protocol.failures import ranks_phrase
from harness.protocol.traces import DEFAULT_GROUP, GroupHistory, Op, RankTrace, group_names
from harness.shadows.records import Creation, ShadowRun, SimulatedRank

SHOWN_FINDINGS = 3
"""How many groups' findings a report lists; the others are counted."""


def differences(run: ShadowRun) -> list[str]:
    """The verdict lines of a shadow run, empty when its ranks agree: the groups they made
    (every rank makes a group in the same order, except one made with
    ``use_local_synchronization``), then each process group's collectives."""
    lines = []
    made = _creations_differ(run.ranks)
    if made:
        lines.append(made)
    traces: dict[int, RankTrace | None] = {rank: ran.trace for rank, ran in run.ranks.items()}
    states = dict.fromkeys(traces, verdicts.DONE)
    members = {g: h.ranks for ran in run.ranks.values() for g, h in ran.trace.groups.items()}
    # By their lowest rank (the default group first), not by their ids' text.
    found = [
        finding.text
        for finding in sorted(
            verdicts.findings(traces, states, run.size),
            key=lambda finding: min(members.get(finding.group) or (-1,)),
        )
    ]
    lines += found[:SHOWN_FINDINGS]
    if len(found) > SHOWN_FINDINGS:
        more = len(found) - SHOWN_FINDINGS
        lines.append(f"and {more} more group{'s' if more > 1 else ''} like these")
    return lines


def first_outlier(run: ShadowRun) -> int | None:
    """The lowest rank whose groups made, or collectives on a group it shares with rank 0,
    differ from rank 0's (None: none does): what the search for the smallest size that shows
    a difference tries first."""
    first = run.ranks.get(0)
    if first is None:
        return None
    made = first.creations
    theirs = {
        group: (members, count, checksum) for group, members, count, checksum in first.fingerprint
    }
    for rank in sorted(run.ranks)[1:]:
        ran = run.ranks[rank]
        if ran.creations != made:
            return rank
        mine = {
            group: (members, count, checksum) for group, members, count, checksum in ran.fingerprint
        }
        for group in set(mine) | set(theirs):
            members = (mine.get(group) or theirs[group])[0]
            shared = members is None or (rank in members and 0 in members)
            if shared and mine.get(group) != theirs.get(group):
                return rank
    return None


def _creations_differ(ranks: Mapping[int, SimulatedRank]) -> str:
    """How the ranks' group creations first differ ('' when they agree)."""
    made = {rank: [c for c in ran.creations if not c.local] for rank, ran in ranks.items()}
    if len({tuple(m) for m in made.values()}) <= 1:
        return ""
    longest = max(len(m) for m in made.values())
    for index in range(longest):
        by_made: dict[Creation | None, list[int]] = {}
        for rank in sorted(made):
            found = made[rank][index] if index < len(made[rank]) else None
            by_made.setdefault(found, []).append(rank)
        if len(by_made) == 1:
            continue
        parts = [
            f"{ranks_phrase(members)} "
            + (creation.text if creation is not None else f"made no group #{index + 1}")
            for creation, members in sorted(by_made.items(), key=lambda item: item[1][0])
        ]
        shown = "; ".join(parts[:2])
        others = len(parts) - 2
        if others > 0:
            shown += f"; and {others} other group{'s' if others > 1 else ''} there"
        return (
            f"group creation #{index + 1} differs (every rank makes every group, in the same "
            f"order): {shown}"
        )
    return ""


def unfaithful(real: Mapping[int, RankTrace | None], run: ShadowRun, below_recorded: bool) -> str:
    """How the shadow of the real world's size first differs from the real run ('' where it
    issued the same collectives, rank by rank and group by group).

    Args:
        real: The real run's traces, by rank (None: unknown).
        run: The shadow run of the same size.
        below_recorded: Whether the real run recorded what torch issues below its Python
            functions (torch's process-group hooks): where not, the shadow's records of
            them are left out.
    """
    for rank in sorted(real):
        theirs, ours = real[rank], run.ranks.get(rank)
        if theirs is None or ours is None:
            continue
        real_groups, shadow_groups = _aligned(theirs.groups), _aligned(ours.trace.groups)
        for key in sorted(set(real_groups) | set(shadow_groups), key=repr):
            mine, other = real_groups.get(key), shadow_groups.get(key)
            left_out: tuple[int, ...] = ()
            if not below_recorded and other is not None:
                left_out = ours.below.get(other.group, ())
            differs = _first_difference(_numbered(mine, ()), _numbered(other, left_out))
            if differs is None:
                continue
            members = key[0]
            on = "" if members is None else f" on the group of {ranks_phrase(members)}"
            index, said_real, said_shadow = differs
            return (
                f"rank {rank}'s collective #{index + 1}{on} was {said_real} in the real run, "
                f"{said_shadow} in the shadow of the same size"
            )
    return ""


def _aligned(
    groups: Mapping[str, GroupHistory],
) -> dict[tuple[tuple[int, ...] | None, int], GroupHistory]:
    """A rank's groups by their members and, among groups of the same members, their order
    of creation: group names count the groups a process made, the real run's ranks' those
    of earlier tests too."""
    by_members: dict[tuple[int, ...] | None, list[GroupHistory]] = {}
    for history in groups.values():
        by_members.setdefault(history.ranks, []).append(history)
    aligned = {}
    for members, found in by_members.items():
        found.sort(key=lambda h: _name_order(h.group))
        for index, history in enumerate(found):
            aligned[(members, index)] = history
    return aligned


def _name_order(group: str) -> tuple[int, str]:
    """A group id's name, as an order of creation: a counter's, else its text."""
    name = group.partition("/")[2]
    return (int(name), "") if name.isdecimal() else (-1, name)


def _numbered(history: GroupHistory | None, left_out: Iterable[int]) -> list[tuple[Op, str]]:
    """A group's collectives, each with its call site, those numbered ``left_out`` left out."""
    if history is None:
        return []
    skipped = set(left_out)
    found = []
    for seq in range(1, history.count + 1):
        at = history.at(seq)
        if at is not None and seq not in skipped:
            found.append(at)
    return found


def _first_difference(
    real: list[tuple[Op, str]], shadow: list[tuple[Op, str]]
) -> tuple[int, str, str] | None:
    """Where two sequences first differ: the index, and what each had there."""
    for index in range(max(len(real), len(shadow))):
        mine = real[index] if index < len(real) else None
        other = shadow[index] if index < len(shadow) else None
        if mine is not None and other is not None and verdicts.same_op(mine[0], other[0]):
            continue
        return index, _said(mine), _said(other)
    return None


def _said(found: tuple[Op, str] | None) -> str:
    return "none" if found is None else f"{found[0].text} at {found[1]}"


def sequences(run: ShadowRun) -> str:
    """Every group's collectives in a shadow run, compact: per group, its members with the
    same sequence in ranges (those that issued none on it too), groups whose members issued
    alike folded into one entry, runs of one collective at one call site in one line; and the
    groups the ranks made."""
    lines = [f"shadow world of {run.size} ranks ({len(run.ranks)} of them run)"]
    by_group: dict[str, dict[tuple[object, ...], list[int]]] = {}
    histories: dict[tuple[object, ...], GroupHistory] = {}
    members: dict[str, tuple[int, ...] | None] = {}
    for rank in sorted(run.ranks):
        for group, history in run.ranks[rank].trace.groups.items():
            members.setdefault(group, history.ranks)
            shape = (history.ops, history.op_ids, history.places, history.place_ids)
            histories.setdefault(shape, history)
            by_group.setdefault(group, {}).setdefault(shape, []).append(rank)
    # Groups whose members issued alike, at the same places in each group (every
    # tensor-parallel group of a mesh), read once.
    alike: dict[tuple[object, ...], list[str]] = {}
    for group in sorted(by_group, key=lambda g: (g != DEFAULT_GROUP, len(members[g] or ()), g)):
        place = {r: i for i, r in enumerate(members[group] or sorted(run.ranks))}
        issued_at = tuple(
            (issued, tuple(place[r] for r in who)) for issued, who in by_group[group].items()
        )
        alike.setdefault((len(place), issued_at), []).append(group)
    names = group_names(by_group, members)
    for (size, _), groups in alike.items():
        first = names[groups[0]]
        head = first if len(groups) == 1 else f"{len(groups)} groups of {size} ranks like {first}"
        lines.append(f"{head}:")
        issuing: set[int] = set()
        for issued, ranks in by_group[groups[0]].items():
            issuing.update(ranks)
            count = histories[issued].count
            lines.append(f"  {ranks_phrase(ranks)}: {count} collective{'s' if count != 1 else ''}")
            lines += [f"    {text}" for text in _runs(histories[issued])]
        # A member that issued none on the group has no history of it: said, not left out.
        silent = [r for r in members[groups[0]] or sorted(run.ranks) if r not in issuing]
        if silent:
            lines.append(f"  {ranks_phrase(silent)}: 0 collectives")
    lines += _creations(run.ranks)
    return "\n".join(lines)


def _runs(history: GroupHistory) -> list[str]:
    """A group's collectives, consecutive ones alike (op and call site) in one line."""
    found = []
    numbered = [(seq, history.at(seq)) for seq in range(1, history.count + 1)]
    for at, run in groupby(numbered, key=lambda item: item[1]):
        seqs = [seq for seq, _ in run]
        where = f"#{seqs[0]}" + (f"-#{seqs[-1]}" if len(seqs) > 1 else "")
        found.append(f"{where} {_said(at)}")
    return found


def _creations(ranks: Mapping[int, SimulatedRank]) -> list[str]:
    """The groups the ranks made, ranks that made the same in ranges."""
    by_made: dict[tuple[Creation, ...], list[int]] = {}
    for rank in sorted(ranks):
        by_made.setdefault(ranks[rank].creations, []).append(rank)
    if not any(by_made):
        return []
    lines = ["groups made:"]
    for made, who in by_made.items():
        lines.append(f"  {ranks_phrase(who)}: {len(made)} groups")
        numbered = list(enumerate(made, 1))
        for (site, size), run in groupby(
            numbered, key=lambda item: (item[1].site, len(item[1].ranks or ()))
        ):
            seqs = [seq for seq, _ in run]
            where = f"#{seqs[0]}" + (f"-#{seqs[-1]}" if len(seqs) > 1 else "")
            count = len(seqs)
            lines.append(
                f"    {where} {count} group{'s' if count > 1 else ''} of "
                f"{size or 'every'} rank{'s' if size != 1 else ''} at {site}"
            )
    return lines
