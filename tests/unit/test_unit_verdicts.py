"""Which collective went wrong, on plain trace data: the verdict lines of ``verdicts.findings``,
and how a rank's trace reads (``traces.render``, group names, the lookups a verdict uses)."""

from __future__ import annotations

import pytest
from verdict_testutil import history as _history
from verdict_testutil import verdict_lines

from harness import faults
from harness.controller import classify, verdicts
from harness.controller.outcome import Died, Evidence, Faulted, Reply
from harness.controller.verdicts import DIED, DONE, FAILED, RUNNING
from harness.protocol.failures import RankFailure
from harness.protocol.messages import Failed, Fired
from harness.protocol.traces import (
    COMPLETED,
    DEFAULT_GROUP,
    IN_FLIGHT,
    ISSUED,
    RAISED,
    SHOWN,
    Collective,
    GroupHistory,
    Op,
    RankTrace,
    group_names,
    render,
)

SUM = Op("all_reduce", "all_reduce(SUM, float32[4])", "all_reduce(SUM, float32[4])", "SUM")
MAX = Op("all_reduce", "all_reduce(MAX, float32[4])", "all_reduce(MAX, float32[4])", "MAX")
BARRIER = Op("barrier", "barrier()", "barrier")
BCAST = Op(
    "broadcast", "broadcast(src=0, float32[4])", "broadcast(src=0, float32[4])", root="src=0"
)
SEND = Op("send", "send(dst=1, float32[4])", "send", p2p=True)
PAIR = "0,1/3"  # the group of ranks 0 and 1, named "3"


def _trace(*histories: GroupHistory, last: str = COMPLETED, blocked_at: str = "") -> RankTrace:
    """A trace whose recent records are every collective of ``histories`` in order; the
    last one of each group in state ``last``."""
    recent = []
    for history in histories:
        for seq in range(1, history.count + 1):
            found = history.at(seq)
            assert found is not None
            state = last if seq == history.count else COMPLETED
            line = int(found[1].rsplit(":", 1)[1])
            recent.append(Collective(history.group, seq, found[0], "/src/test_x.py", line, state))
    return RankTrace(tuple(recent), {h.group: h for h in histories}, blocked_at)


def _running(*traces: RankTrace) -> dict[int, RankTrace | None]:
    return dict(enumerate(traces))


# ---------------------------------------------------------------- differences


def test_ranks_that_agree_give_no_verdict() -> None:
    traces = _running(_trace(_history([SUM, MAX])), _trace(_history([SUM, MAX])))
    assert verdict_lines(traces, dict.fromkeys(traces, DONE), 2) == []


def test_fewer_than_two_known_traces_give_no_verdict() -> None:
    one = {0: _trace(_history([SUM])), 1: None}
    assert verdict_lines(one, {0: DONE, 1: DIED}, 2) == []
    assert verdict_lines({}, {}, 2) == []


def test_the_first_differing_collective_is_named_with_each_sides_call_site() -> None:
    traces = _running(
        _trace(_history([SUM, SUM, SUM])),
        _trace(_history([SUM, BCAST, MAX], lines=[10, 20, 21])),
    )
    assert verdict_lines(traces, dict.fromkeys(traces, DONE), 2) == [
        "collective #2 on the default group differs: rank 0 all_reduce(SUM, float32[4]) at "
        "test_x.py:11; rank 1 broadcast(src=0, float32[4]) at test_x.py:20"
    ]


def test_a_difference_on_a_subgroup_is_said_on_that_group() -> None:
    traces = _running(
        _trace(_history([SUM], PAIR, (0, 1))),
        _trace(_history([MAX], PAIR, (0, 1))),
        _trace(),
    )
    assert verdict_lines(traces, dict.fromkeys(traces, DONE), 3) == [
        "collective #1 on the group of ranks 0, 1 differs: rank 0 all_reduce(SUM, float32[4]) "
        "at test_x.py:10; rank 1 all_reduce(MAX, float32[4]) at test_x.py:10"
    ]


def test_each_group_gives_at_most_one_verdict() -> None:
    traces = _running(
        _trace(_history([SUM, SUM]), _history([SUM], PAIR, (0, 1))),
        _trace(_history([MAX, MAX]), _history([BARRIER], PAIR, (0, 1))),
    )
    found = verdict_lines(traces, dict.fromkeys(traces, DONE), 2)
    assert [line.split(" differs")[0] for line in found] == [
        "collective #1 on the default group",
        "collective #1 on the group of ranks 0, 1",
    ]


def test_a_group_with_one_known_member_is_not_compared() -> None:
    traces = {0: _trace(_history([SUM], PAIR, (0, 1))), 1: None, 2: _trace()}
    assert verdict_lines(traces, {0: DONE, 1: DIED, 2: DONE}, 3) == []


def test_the_desync_check_stops_at_the_first_collective_that_raised() -> None:
    # Ranks differ at #2, after #1 raised on rank 0 (the test handled it): compared up to
    # #1 only, they agree. Differing at #1, they do not.
    after = _running(_trace(_history([SUM, SUM], raised=1)), _trace(_history([SUM, MAX])))
    states = dict.fromkeys(after, DONE)
    assert verdict_lines(after, states, 2, until_raised=True) == []
    assert verdict_lines(after, states, 2)[0].startswith("collective #2 on the default group")
    later = _running(_trace(_history([SUM, SUM, SUM], raised=3)), _trace(_history([SUM, MAX, MAX])))
    assert verdict_lines(later, states, 2, until_raised=True)[0].startswith("collective #2 ")
    # Nor does the collective that raised itself count (a peer may have left it).
    at = _running(_trace(_history([SUM, SUM], raised=2)), _trace(_history([SUM, MAX])))
    assert verdict_lines(at, states, 2, until_raised=True) == []


# ---------------------------------------------------------------- ranks that are behind


def test_a_running_rank_behind_others_that_wait_is_named_where_it_is() -> None:
    waiting = _trace(_history([SUM, BARRIER]), last=IN_FLIGHT)
    behind = _trace(_history([SUM]), blocked_at="time.sleep at test_x.py:30")
    traces = _running(waiting, waiting, behind)
    assert verdict_lines(traces, dict.fromkeys(traces, RUNNING), 3) == [
        "rank 2 never reached collective #2 (barrier) that ranks 0, 1 wait in; "
        "rank 2 is in time.sleep at test_x.py:30"
    ]


def test_one_rank_waiting_is_said_in_the_singular() -> None:
    traces = _running(
        _trace(_history([SUM, BARRIER]), last=IN_FLIGHT),
        _trace(_history([SUM]), blocked_at="at test_x.py:31"),
    )
    assert verdict_lines(traces, dict.fromkeys(traces, RUNNING), 2) == [
        "rank 1 never reached collective #2 (barrier) that rank 0 waits in; "
        "rank 1 is at test_x.py:31"
    ]


def _joined(*traces: RankTrace) -> RankTrace:
    """One rank's trace of several groups, their records in the order given."""
    recent = tuple(record for trace in traces for record in trace.recent)
    groups = {group: h for trace in traces for group, h in trace.groups.items()}
    return RankTrace(recent, groups)


def test_a_rank_behind_inside_another_groups_collective_is_named_there() -> None:
    pair = _history([BCAST], PAIR, (0, 1))
    waiting = _trace(_history([SUM, BARRIER]), last=IN_FLIGHT)
    traces = _running(
        _joined(_trace(pair), waiting),
        _joined(_trace(_history([SUM])), _trace(pair, last=IN_FLIGHT)),
        waiting,
    )
    # The pair agrees (one broadcast each); on the default group rank 1 is behind.
    assert verdict_lines(traces, dict.fromkeys(traces, RUNNING), 3) == [
        "rank 1 never reached collective #2 (barrier) that ranks 0, 2 wait in; rank 1 is "
        "in broadcast(src=0, float32[4]) at test_x.py:10"
    ]


@pytest.mark.parametrize("state", [COMPLETED, IN_FLIGHT])
def test_a_running_rank_behind_others_that_went_on_is_named_without_a_place(state: str) -> None:
    # In flight on the group itself, it is where the verdict says: nothing to add.
    traces = _running(_trace(_history([SUM, SUM, SUM, SUM])), _trace(_history([SUM]), last=state))
    assert verdict_lines(traces, dict.fromkeys(traces, RUNNING), 2) == [
        "rank 1 never reached collective #2 (all_reduce); rank 0 went on to #4"
    ]


@pytest.mark.parametrize(
    ("state", "said"),
    [(DONE, "finished the call"), (FAILED, "failed"), (DIED, "died")],
)
def test_a_rank_that_ended_early_is_said_by_what_became_of_it(state: str, said: str) -> None:
    traces = _running(_trace(_history([SUM, BARRIER]), last=IN_FLIGHT), _trace(_history([SUM])))
    assert verdict_lines(traces, {0: RUNNING, 1: state}, 2) == [
        f"rank 1 {said} after #1; rank 0 waits in #2 (barrier)"
    ]


def test_peers_that_raised_where_a_rank_left_were_in_it() -> None:
    raised = _trace(_history([SUM, BARRIER]), last=RAISED)
    traces = _running(raised, raised, _trace(_history([SUM])))
    assert verdict_lines(traces, {0: FAILED, 1: FAILED, 2: DIED}, 3) == [
        "rank 2 died after #1; ranks 0, 1 were in #2 (barrier)"
    ]


def test_a_rank_that_ended_before_any_collective_while_others_went_on() -> None:
    traces = _running(_trace(_history([SUM, MAX, MAX])), _trace())
    assert verdict_lines(traces, {0: DONE, 1: DONE}, 2) == [
        "rank 1 finished the call before #1; rank 0 went on to #1 "
        "(all_reduce(SUM, float32[4]) at test_x.py:10) and 2 more"
    ]


def test_ranks_behind_that_ended_differently_stopped() -> None:
    traces = _running(
        _trace(_history([SUM, SUM])), _trace(_history([SUM])), _trace(_history([SUM]))
    )
    assert verdict_lines(traces, {0: DONE, 1: FAILED, 2: DIED}, 3) == [
        "ranks 1, 2 stopped after #1; rank 0 went on to #2 "
        "(all_reduce(SUM, float32[4]) at test_x.py:11)"
    ]


def test_a_rank_behind_on_a_subgroup_is_said_on_that_group() -> None:
    traces = _running(
        _trace(_history([SUM, SUM], PAIR, (0, 1))),
        _trace(_history([SUM], PAIR, (0, 1))),
    )
    assert verdict_lines(traces, {0: DONE, 1: DONE}, 2) == [
        "rank 1 finished the call after #1 on the group of ranks 0, 1; rank 0 went on to #2 "
        "(all_reduce(SUM, float32[4]) at test_x.py:11)"
    ]


# ---------------------------------------------------------------- fingerprints


def test_fingerprints_of_equal_calls_agree_and_a_missing_one_is_not_judged() -> None:
    everyone = (DEFAULT_GROUP, None, 2, 7)
    assert verdicts.agree({0: (everyone,), 1: (everyone,)}, 2)
    assert not verdicts.agree({0: (everyone,), 1: ((DEFAULT_GROUP, None, 2, 8),)}, 2)
    assert not verdicts.agree({0: (everyone,), 1: ((DEFAULT_GROUP, None, 3, 7),)}, 2)
    assert verdicts.agree({0: (everyone,), 1: None}, 2)


def test_fingerprints_of_a_group_are_compared_among_its_members_only() -> None:
    pair = (PAIR, (0, 1), 1, 5)
    # Rank 2 issued nothing on the pair: not a member, not a difference.
    assert verdicts.agree({0: (pair,), 1: (pair,), 2: ()}, 3)
    # A member that issued nothing on it is.
    assert not verdicts.agree({0: (pair,), 1: (), 2: ()}, 3)


# ---------------------------------------------------------------- trace lookups


def test_a_group_history_looks_up_each_collective_by_number() -> None:
    history = _history([SUM, MAX, SUM], lines=[4, 4, 9])
    assert history.keys() == [SUM.key, MAX.key, SUM.key]
    assert history.at(1) == (SUM, "test_x.py:4")
    assert history.at(3) == (SUM, "test_x.py:9")
    assert history.at(0) is None
    assert history.at(4) is None
    assert len(history.ops) == 2  # distinct ops are stored once


def test_a_traces_last_collective_skips_point_to_point_ops_and_other_groups() -> None:
    recent = (
        Collective(DEFAULT_GROUP, 1, SUM, "/a/t.py", 1, COMPLETED),
        Collective(PAIR, 1, MAX, "/a/t.py", 2, IN_FLIGHT),
        Collective(DEFAULT_GROUP, 0, SEND, "/a/t.py", 3, ISSUED),
    )
    trace = RankTrace(recent, {DEFAULT_GROUP: _history([SUM])})
    assert trace.last(DEFAULT_GROUP) == recent[0]
    assert trace.last(PAIR) == recent[1]
    assert trace.last("elsewhere") is None
    assert trace.in_flight == recent[1]
    assert trace.count(DEFAULT_GROUP) == 1
    assert trace.count(PAIR) == 0  # no history of it


def test_a_call_site_reads_as_the_files_name_and_line() -> None:
    assert Collective(DEFAULT_GROUP, 1, SUM, "/deep/dir/test_y.py", 8, COMPLETED).where == (
        "test_y.py:8"
    )
    assert Collective(DEFAULT_GROUP, 1, SUM, "C:\\w\\test_z.py", 2, COMPLETED).where == (
        "test_z.py:2"
    )


def test_group_names_tell_groups_of_the_same_ranks_apart() -> None:
    ranks = {DEFAULT_GROUP: None, "0,1/3": (0, 1), "0,1/4": (0, 1), "2,3/5": (2, 3), "1,2": (1, 2)}
    assert group_names(list(ranks), ranks) == {
        DEFAULT_GROUP: "the default group",
        "0,1/3": "the group of ranks 0, 1 (group 3)",
        "0,1/4": "the group of ranks 0, 1 (group 4)",
        "2,3/5": "the group of ranks 2, 3",
        "1,2": "the group of ranks 1, 2",
    }
    shared = {"0,1": (0, 1), "0,1/x": (0, 1)}
    assert group_names(shared, shared)["0,1"] == "the group of ranks 0, 1 (group ?)"


# ---------------------------------------------------------------- the collectives section


def test_no_section_when_no_rank_issued_anything() -> None:
    assert render({0: RankTrace(), 1: None}) == ""
    assert render({}) == ""


def test_the_section_lists_every_rank_unknown_ones_included() -> None:
    traces = {0: _trace(_history([SUM, MAX])), 2: None}
    assert render(traces, world_size=4).splitlines() == [
        "rank 0: (2 on the default group)",
        "  #1 all_reduce(SUM, float32[4]) at test_x.py:10",
        "  #2 all_reduce(MAX, float32[4]) at test_x.py:11",
        "rank 1: unknown (the rank died or did not answer)",
        "rank 2: unknown (the rank died or did not answer)",
        "rank 3: unknown (the rank died or did not answer)",
    ]


def test_the_section_says_states_groups_and_point_to_point_ops() -> None:
    recent = (
        Collective(PAIR, 1, BCAST, "/a/test_x.py", 5, COMPLETED),
        Collective(DEFAULT_GROUP, 0, SEND, "/a/test_x.py", 6, ISSUED),
        Collective(DEFAULT_GROUP, 1, BARRIER, "/a/test_x.py", 7, IN_FLIGHT),
    )
    groups = {PAIR: _history([BCAST], PAIR, (0, 1)), DEFAULT_GROUP: _history([BARRIER])}
    text = render({0: RankTrace(recent, groups), 1: RankTrace()})
    assert text.splitlines() == [
        "rank 0: (1 on the default group, 1 on the group of ranks 0, 1)",
        "  #1 broadcast(src=0, float32[4]) on the group of ranks 0, 1 at test_x.py:5",
        "  send(dst=1, float32[4]) at test_x.py:6  [issued]",
        "  #1 barrier() at test_x.py:7  [in flight]",
        "rank 1: none",
    ]


def test_the_one_in_flight_is_shown_even_when_older_than_the_last_few() -> None:
    pair = _history([BCAST], PAIR, (0, 1))
    flight = Collective(PAIR, 1, BCAST, "/a/test_x.py", 3, IN_FLIGHT)
    # An async all-reduce loop issued after the broadcast it is still inside.
    later = tuple(
        Collective(DEFAULT_GROUP, seq, SUM, "/a/test_x.py", 4, ISSUED) for seq in range(1, 8)
    )
    trace = RankTrace((flight, *later), {PAIR: pair, DEFAULT_GROUP: _history([SUM] * 7)})
    lines = render({0: trace}).splitlines()
    assert len(lines) == 1 + SHOWN
    assert lines[1].startswith("  #4 all_reduce")  # the oldest shown dropped for it
    assert lines[-1] == (
        "  #1 broadcast(src=0, float32[4]) on the group of ranks 0, 1 at test_x.py:3  [in flight]"
    )


def test_torchs_flight_recorder_lines_come_after_the_ranks_own() -> None:
    recorded = tuple(f"all_reduce float32[20] on pg 0, #{n} (scheduled)" for n in range(1, 8))
    text = render({0: RankTrace(recorded=recorded), 1: _trace(_history([SUM]))})
    lines = text.splitlines()
    assert lines[0] == "rank 0: none"
    assert lines[1:6] == [f"  torch's flight recorder: {line}" for line in recorded[-5:]]
    assert lines[6] == "rank 1: (1 on the default group)"


def _raised_here() -> RankFailure:
    try:
        raise RuntimeError("Connection closed by peer")
    except RuntimeError as exc:
        return RankFailure.from_exception(exc, 0, hidden_dir="/nonexistent")


@pytest.mark.parametrize("seen", [True, False], ids=["death-seen", "death-not-seen-yet"])
def test_a_killed_rank_is_said_dead_whether_or_not_its_death_was_seen(seen: bool) -> None:
    # A peer's failure can end the wait before the controller sees the killed rank's death.
    survivor = _trace(_history([SUM, BARRIER]), last=RAISED)
    lost = _trace(_history([SUM]))
    fired = Fired(0, "killed (SIGKILL) before collective #2 (barrier)", 1.0, True, lost)
    replies: dict[int, Reply] = {
        0: Failed(_raised_here(), 2.0, survivor),
        1: Faulted(fired, Died(-9, 3.0) if seen else None),
    }
    outcome = classify.classify(Evidence(replies, 2, timeout=None, faults=[faults.kill(1, 2)]))
    assert outcome.error is not None
    assert outcome.error.verdicts == ["rank 1 died after #1; rank 0 was in #2 (barrier)"]
