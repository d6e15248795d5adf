"""Shadow worlds on plain data: what a run of simulated ranks shows (its verdicts, whether it
is faithful to the real run, its sequences), the order ranks run in, the agreement told rank
by rank, the search for the smallest size, and the sizes a marker or ``--dist-shadow`` asks
for."""

from __future__ import annotations

import re
import zlib

import pytest
from verdict_testutil import history

from harness import validate
from harness.controller import verdicts
from harness.protocol.failures import RankFailure
from harness.protocol.traces import DEFAULT_GROUP, Agreement, Op, RankTrace
from harness.shadows import check
from harness.shadows.records import Creation, ShadowRun, SimulatedRank, spread
from harness.shadows.search import AGREES, DIFFERS, UNUSABLE, Search

SUM = Op("all_reduce", "all_reduce(SUM, float32[4])", "all_reduce(SUM, float32[4])", "SUM")
BCAST = Op(
    "broadcast", "broadcast(src=0, float32[4])", "broadcast(src=0, float32[4])", root="src=0"
)
HOOKED = Op("all_reduce", "all_reduce(float32[4]) in backward (DDP)", "all_reduce(float32[4])")


def _rank(
    rank: int,
    groups: dict[str, tuple[tuple[int, ...] | None, list[Op]]],
    creations: tuple[Creation, ...] = (),
    below: dict[str, tuple[int, ...]] | None = None,
) -> SimulatedRank:
    """A simulated rank that issued ``groups`` (id -> members, ops)."""
    histories = {
        g: history(ops, g, members, lines=[10] * len(ops)) for g, (members, ops) in groups.items()
    }
    prints = tuple(
        (g, members, len(ops), zlib.crc32("\0".join(op.key for op in ops).encode()))
        for g, (members, ops) in groups.items()
        if ops
    )
    return SimulatedRank(rank, RankTrace((), histories), prints, creations, below or {})


def _run(ranks: list[SimulatedRank]) -> ShadowRun:
    return ShadowRun(len(ranks), {r.rank: r for r in ranks})


def test_ranks_run_first_last_then_the_middles():
    assert spread(1) == [0]
    assert spread(2) == [0, 1]
    assert spread(9)[:4] == [0, 8, 4, 2]
    assert sorted(spread(1000)) == list(range(1000))


def test_agreement_told_rank_by_rank():
    everyone = (DEFAULT_GROUP, None, 2, 7)
    agreement = Agreement()
    assert agreement.add(0, (everyone,))
    assert agreement.add(1, (everyone,))
    assert not agreement.add(2, ((DEFAULT_GROUP, None, 1, 3),))
    # A member without an entry for a group issued nothing there, whenever it comes.
    pair = ("0,1/1", (0, 1), 1, 5)
    assert not _added(Agreement(), [(1, ()), (0, (pair,))])
    assert not _added(Agreement(), [(0, (pair,)), (1, ())])
    assert _added(Agreement(), [(0, (pair,)), (1, (pair,)), (2, ())])


def _added(agreement: Agreement, prints: list[tuple[int, tuple]]) -> bool:
    return all(agreement.add(rank, found) for rank, found in prints)


def test_agree_is_the_agreement_of_every_rank():
    pair = ("0,1/1", (0, 1), 1, 5)
    assert verdicts.agree({0: (pair,), 1: (pair,), 2: ()}, 3)
    assert not verdicts.agree({0: (pair,), 1: (), 2: ()}, 3)


def test_a_rank_that_skips_a_collective_reads_as_the_desync_verdicts_do():
    ranks = [_rank(r, {DEFAULT_GROUP: (None, [SUM, SUM] if r < 2 else [SUM])}) for r in range(4)]
    assert check.differences(_run(ranks)) == [
        "ranks 2, 3 finished the call after #1; ranks 0, 1 went on to #2 "
        "(all_reduce(SUM, float32[4]) at test_x.py:10)"
    ]
    assert check.first_outlier(_run(ranks)) == 2


def test_agreeing_ranks_show_nothing():
    ranks = [_rank(r, {DEFAULT_GROUP: (None, [SUM, BCAST])}) for r in range(3)]
    assert check.differences(_run(ranks)) == []
    assert check.first_outlier(_run(ranks)) is None


def test_group_creations_in_another_order_on_some_ranks():
    low, high = Creation((0, 1), "test_x.py:5"), Creation((2, 3), "test_x.py:5")
    ranks = [
        _rank(r, {}, (low, high) if r < 2 else (high, low))  # each rank its own node first
        for r in range(4)
    ]
    assert check.differences(_run(ranks)) == [
        "group creation #1 differs (every rank makes every group, in the same order): "
        "ranks 0, 1 new_group(ranks 0, 1) at test_x.py:5; ranks 2, 3 new_group(ranks 2, 3) "
        "at test_x.py:5"
    ]
    # One made with use_local_synchronization is made by its members alone.
    local = [_rank(r, {}, (Creation((r,), "x.py:1", local=True),)) for r in range(2)]
    assert check.differences(_run(local)) == []


def test_many_groups_that_differ_alike_are_counted():
    groups = {f"{2 * g},{2 * g + 1}/{g}": ((2 * g, 2 * g + 1), [SUM]) for g in range(5)}
    ranks = []
    for r in range(10):
        mine = {k: (m, ops if r % 2 == 0 else []) for k, (m, ops) in groups.items() if r in m}
        ranks.append(_rank(r, mine))
    lines = check.differences(_run(ranks))
    assert len(lines) == check.SHOWN_FINDINGS + 1
    assert lines[-1] == "and 2 more groups like these"


def test_a_shadow_is_faithful_where_it_issued_what_the_real_run_did():
    real = {r: _rank(r, {DEFAULT_GROUP: (None, [SUM, BCAST])}).trace for r in range(2)}
    same = _run([_rank(r, {DEFAULT_GROUP: (None, [SUM, BCAST])}) for r in range(2)])
    assert check.unfaithful(real, same, below_recorded=True) == ""
    other = _run([_rank(r, {DEFAULT_GROUP: (None, [SUM])}) for r in range(2)])
    assert check.unfaithful(real, other, below_recorded=True) == (
        "rank 0's collective #2 was broadcast(src=0, float32[4]) at test_x.py:10 in the real "
        "run, none in the shadow of the same size"
    )


def test_what_only_the_shadow_saw_is_left_out_where_the_real_run_could_not_see_it():
    # Before torch 2.14 a real run does not record DDP's all_reduce; the shadow's groups do.
    real = {r: _rank(r, {DEFAULT_GROUP: (None, [SUM])}).trace for r in range(2)}
    seen = _run(
        [_rank(r, {DEFAULT_GROUP: (None, [HOOKED, SUM])}, below={"": (1,)}) for r in range(2)]
    )
    assert check.unfaithful(real, seen, below_recorded=False) == ""
    assert "in the real run" in check.unfaithful(real, seen, below_recorded=True)


def test_sequences_fold_members_groups_and_runs():
    tp = {f"{2 * g},{2 * g + 1}/{g + 1}": (2 * g, 2 * g + 1) for g in range(2)}
    made = tuple(Creation(m, "test_x.py:4") for m in tp.values())
    ranks = []
    for r in range(4):
        # Rank 3 issues nothing on its pair's group: said, as the others are.
        mine = {g: (m, [BCAST]) for g, m in tp.items() if r in m and r != 3}
        ranks.append(_rank(r, {DEFAULT_GROUP: (None, [SUM, SUM]), **mine}, made))
    text = check.sequences(_run(ranks))
    assert text.splitlines() == [
        "shadow world of 4 ranks (4 of them run)",
        "the default group:",
        "  ranks 0-3: 2 collectives",
        "    #1-#2 all_reduce(SUM, float32[4]) at test_x.py:10",
        "the group of ranks 0, 1:",
        "  ranks 0, 1: 1 collective",
        "    #1 broadcast(src=0, float32[4]) at test_x.py:10",
        "the group of ranks 2, 3:",
        "  rank 2: 1 collective",
        "    #1 broadcast(src=0, float32[4]) at test_x.py:10",
        "  rank 3: 0 collectives",
        "groups made:",
        "  ranks 0-3: 2 groups",
        "    #1-#2 2 groups of 2 ranks at test_x.py:4",
    ]


def test_the_lowest_failing_rank_is_the_one_reported():
    failure = RankFailure(5, "ValueError", "no", "")
    run = ShadowRun(8, {7: SimulatedRank(7, skip="why"), 5: SimulatedRank(5, failure=failure)})
    assert run.failed is not None
    assert run.failed.rank == 5
    assert ShadowRun(2, {0: SimulatedRank(0)}).failed is None


def _search(answer: int, agrees: int, differs: int, unusable=lambda size: False, **kwargs):
    """Run a search against a body whose ranks differ from ``answer`` ranks on."""
    search = Search(agrees, differs, 100_000, **kwargs)
    tried = []
    while (size := search.next()) is not None:
        tried.append(size)
        shown = UNUSABLE if unusable(size) else DIFFERS if size >= answer else AGREES
        search.tell(size, shown, size if shown == AGREES else 1)
    return search, tried


@pytest.mark.parametrize("answer", [3, 5, 101, 513, 1000, 1024])
def test_the_search_finds_the_smallest_size_that_differs(answer):
    search, _ = _search(answer, 2, 1024)
    assert (search.agrees, search.differs) == (answer - 1, answer)
    assert search.closed


def test_the_search_doubles_the_size_that_agrees_first():
    _, tried = _search(513, 2, 1024)
    assert tried[:8] == [4, 8, 16, 32, 64, 128, 256, 512]


def test_a_hint_closes_the_gap_in_two_tries():
    search, tried = _search(513, 2, 1024, hint=513)
    assert tried == [513, 512]
    assert search.differs == 513


def test_sizes_a_mesh_cannot_use_are_stepped_over():
    # tp = 8 above 64 ranks: a size above 64 that 8 does not divide cannot run.
    search, _ = _search(72, 4, 1024, unusable=lambda size: size > 64 and size % 8)
    assert (search.agrees, search.differs) == (64, 72)
    assert set(range(65, 72)) <= search.unusable
    assert search.closed


def test_the_search_stops_at_its_budget():
    search = Search(2, 1024, budget=600)
    while (size := search.next()) is not None:
        search.tell(size, AGREES if size < 1000 else DIFFERS, size)
    assert search.spent >= 600
    assert not search.closed


@pytest.mark.parametrize(
    ("marked", "flagged", "expected"),
    [
        ([64, 1024], (), (64, 1024)),
        (1024, (), (1024,)),
        ((), (8,), (8,)),
        ([1024, 8], (8,), (8, 1024)),
        (False, (8,), ()),
    ],
)
def test_shadow_sizes_from_the_marker_and_the_flag(marked, flagged, expected):
    assert validate.shadow_sizes(marked, flagged, 4) == expected


@pytest.mark.parametrize(
    ("marked", "flagged", "alone", "error", "message"),
    [
        ([2], (), "", ValueError, "shadow size 2 is smaller than the test's world (4 ranks)"),
        ((), (2,), "", ValueError, "--dist-shadow=2 is smaller than the test's world"),
        (["64"], (), "", TypeError, "each shadow size must be an int >= 1, not '64'"),
        ([0], (), "", ValueError, "each shadow size must be >= 1, got 0"),
        ([True], (), "", TypeError, "not True"),
        ("64", (), "", TypeError, "shadow must be a list of world sizes"),
        ([64], (), "faults", ValueError, "shadow=[64] on a test with faults"),
    ],
)
def test_bad_shadow_sizes_are_named(marked, flagged, alone, error, message):
    with pytest.raises(error, match=re.escape(message)):
        validate.shadow_sizes(marked, flagged, 4, alone)


def test_the_flag_leaves_a_test_that_cannot_have_shadows_alone():
    assert validate.shadow_sizes((), (64,), 4, "restarts") == ()
