"""Hangs the ranks' collectives prove can never end fail early, with the deadline's report
(a ``WorldHang``; a ``CollectiveMismatch`` where the ranks' collectives differ, however the
call ended).

Each real run has a 600 s bound: that such a test passes at all shows the call ended early
(no time is measured). A rank merely slow in Python code is never failed early: the test
lets it go on only after the supervisor has judged it, blocked peer and all.
"""

from __future__ import annotations

import os
import pickle
import threading
from array import array
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import hangs_rankfns as fns
import pytest

import harness
from harness.controller import verdicts
from harness.controller.certain import HangWatch
from harness.controller.classify import classify, desync
from harness.controller.outcome import Evidence
from harness.protocol.messages import Done
from harness.protocol.traces import (
    COMPLETED,
    DEFAULT_GROUP,
    IN_FLIGHT,
    Collective,
    GroupHistory,
    Op,
    RankTrace,
)

LONG_S = 600.0
"""A bound no test here should come near: these calls end once their hang is certain."""


@pytest.fixture(scope="module")
def world3() -> Iterator[harness.World]:
    with harness.World(3, backend="gloo", timeout=LONG_S) as world:
        yield world


def _early(world: harness.World, fn: Any, **kwargs: Any) -> harness.WorldHang:
    with pytest.raises(harness.WorldHang) as info:
        world.run(fn, **kwargs)
    error = info.value
    assert isinstance(error, harness.WorldTimeout)  # what `except WorldTimeout` still catches
    assert error.summary.startswith("the run can never finish: "), error.summary
    assert error.timeout is None
    assert not error.hint  # no bound to change: waiting longer would not help
    return error


def _stopped_mismatch(world: harness.World, fn: Any) -> harness.CollectiveMismatch:
    with pytest.raises(harness.CollectiveMismatch) as info:
        world.run(fn)
    error = info.value
    assert "; the run was stopped with " in error.summary, error.summary  # not the deadline
    assert not error.hint  # no bound to change: waiting longer would not help
    return error


def test_every_member_in_a_collective_with_another_op_fails_early_as_a_mismatch() -> None:
    with harness.World(2, backend="gloo", timeout=LONG_S) as world:
        error = _stopped_mismatch(world, fns.all_reduce_against_broadcast)
    verdict = (
        "collective #2 on the default group differs: "
        f"rank 0 all_reduce(SUM, float32[4]) at {fns.line_of('op-rank0')}; "
        f"rank 1 broadcast(src=0, float32[4]) at {fns.line_of('op-rank1')}"
    )
    assert error.summary == (
        f"the ranks' collectives do not match: {verdict}; the run was stopped with ranks 0, 1 "
        "still running (their stacks follow; the ranks were then killed)"
    )
    assert error.verdicts == [verdict]
    # As at a deadline: each rank's stack where it blocks, then the collectives.
    text = str(error)
    for rank, tag in ((0, "op-rank0"), (1, "op-rank1")):
        line = fns.line_of(tag).split(":")[1]
        assert f'hangs_rankfns.py", line {line}, in all_reduce_against_broadcast' in (
            error.failures[rank].traceback
        )
    assert "---------- rank 1 ----------" in text
    assert "#2 broadcast(src=0, float32[4]) at" in text
    assert "[in flight]" in text


def test_members_of_a_subgroup_with_other_roots_fail_early_as_a_mismatch(
    world3: harness.World,
) -> None:
    error = _stopped_mismatch(world3, fns.roots_differ_in_a_subgroup)
    where = fns.line_of("root")
    assert error.verdicts == [
        "collective #1 on the group of ranks 0, 1 differs: "
        f"rank 0 broadcast(src=0, float32[4]) at {where}; "
        f"rank 1 broadcast(src=1, float32[4]) at {where}"
    ]
    assert set(error.failures) == {0, 1}  # rank 2 returned: not part of the hang


def test_a_rank_that_returned_while_peers_wait_fails_early(world3: harness.World) -> None:
    error = _early(world3, fns.rank2_returns_early)
    assert error.verdicts == [
        "rank 2 finished the call after #1; ranks 0, 1 wait in #2 (all_gather)"
    ]
    assert f"#2 all_gather(float32[4]) at {fns.line_of('gather')}  [in flight]" in str(error)
    # The world recovers for the next call.
    assert world3.run(fns.rank1_waits_for_a_file, args=(os.devnull,)) == [None] * 3


def test_one_rank_left_waiting_is_named_in_the_singular() -> None:
    with harness.World(2, backend="gloo", timeout=LONG_S) as world:
        error = _early(world, fns.rank1_returns_before_the_barrier)
    assert error.summary == (
        "the run can never finish: rank 0 waits in a collective that cannot complete "
        "(their stacks follow; the ranks were then killed)"
    )
    assert error.verdicts == ["rank 1 finished the call before #1; rank 0 waits in #1 (barrier)"]


def test_a_returned_rank_is_certain_without_the_desync_check_too(world3: harness.World) -> None:
    # Every member must join an all_gather: it cannot finish without rank 2, check or not.
    error = _early(world3, fns.rank2_returns_early, check_collectives=False)
    assert error.verdicts == [
        "rank 2 finished the call after #1; ranks 0, 1 wait in #2 (all_gather)"
    ]


def test_a_mismatch_without_the_desync_check_waits_for_the_deadline() -> None:
    # Gloo completes some mismatches (SUM against MAX): without the desync check such a
    # call may pass, so a mismatch alone proves nothing and the deadline decides.
    with (
        harness.World(2, backend="gloo", timeout=3) as world,
        pytest.raises(harness.WorldTimeout) as info,
    ):
        world.run(fns.all_reduce_against_broadcast, check_collectives=False)
    assert type(info.value) is harness.WorldTimeout  # a timeout, not a proven hang
    assert info.value.summary.startswith("the run did not finish within 3 s")
    assert info.value.verdicts[0].startswith("collective #2 on the default group differs")


def test_a_rank_slow_in_python_code_is_not_failed_early(
    world3: harness.World, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rank 1 loops in Python until a file exists, while ranks 0 and 2 wait in a barrier.
    # The file is made only once the supervisor has judged that state, twice: the call must
    # then pass.
    judged: list[bool] = []
    blocked: list[None] = []  # the rounds that saw ranks 0 and 2 waiting, rank 1 running
    seen = threading.Event()
    real = verdicts.can_never_finish

    def can_never_finish(traces: Any, states: Any, world_size: int, **kwargs: Any) -> bool:
        found = real(traces, states, world_size, **kwargs)
        judged.append(found)
        waiting = [traces.get(rank) for rank in (0, 2)]
        if states.get(1) == verdicts.RUNNING and all(
            t is not None and t.in_flight is not None for t in waiting
        ):
            blocked.append(None)
            if len(blocked) >= 2:
                seen.set()
        return found

    monkeypatch.setattr(verdicts, "can_never_finish", can_never_finish)
    path = str(tmp_path / "go")
    result: list[Any] = []
    runner = threading.Thread(
        target=lambda: result.append(world3.run(fns.rank1_waits_for_a_file, args=(path,)))
    )
    runner.start()
    try:
        assert seen.wait(LONG_S)
    finally:
        open(path, "w").close()
        runner.join(LONG_S)
    assert result == [[None, None, None]]
    assert judged
    assert not any(judged)


# ---------------------------------------------------------------- verdicts.can_never_finish on data

_AR = Op("all_reduce", "all_reduce(SUM, float32[4])", "all_reduce SUM float32[4]", "SUM")
_BC = Op("broadcast", "broadcast(src=0, float32[4])", "broadcast src=0 float32[4]", root="src=0")


def _trace(
    ops: list[Op], state: str = IN_FLIGHT, raised: int = 0, timeout: float | None = None
) -> RankTrace:
    """A rank's trace on the default group: ``ops`` in order, the last one in ``state``
    (``timeout``: the group's own)."""
    distinct = list(dict.fromkeys(ops))
    ids = array("I", [distinct.index(op) for op in ops]).tobytes()
    history = GroupHistory(
        DEFAULT_GROUP, None, len(ops), tuple(distinct), ids, (("/x/t.py", 3),), bytes(4 * len(ops))
    )
    history = replace(history, raised=raised, timeout=timeout)
    recent = tuple(
        Collective(DEFAULT_GROUP, seq, op, "/x/t.py", 3, COMPLETED if seq < len(ops) else state)
        for seq, op in enumerate(ops, start=1)
    )
    return RankTrace(recent, {DEFAULT_GROUP: history})


RUN, DONE = verdicts.RUNNING, verdicts.DONE


@pytest.mark.parametrize(
    ("traces", "states", "desync_check", "expected"),
    [
        pytest.param([[_AR, _AR], [_AR, _BC]], [RUN, RUN], True, True, id="ops-differ"),
        pytest.param([[_AR, _AR], [_AR, _BC]], [RUN, RUN], False, False, id="no-desync-check"),
        pytest.param([[_AR, _AR], [_AR, _AR]], [RUN, RUN], True, False, id="same-op"),
        pytest.param([[_AR, _AR], [_BC]], [RUN, RUN], True, False, id="other-numbers"),
        pytest.param([[_AR, _AR], [_AR]], [RUN, DONE], True, True, id="peer-returned"),
        pytest.param([[_AR, _AR], [_AR]], [RUN, DONE], False, True, id="returned-no-check"),
        pytest.param([[_AR, _BC], [_AR]], [RUN, DONE], False, False, id="rooted-no-check"),
        pytest.param([[_AR, _BC], [_AR]], [RUN, DONE], True, True, id="rooted-checked"),
        pytest.param([[_AR, _AR], [_AR, _AR]], [RUN, DONE], True, False, id="returned-after"),
        pytest.param([[_AR, _AR], [_AR]], [RUN, RUN], True, False, id="peer-still-running"),
    ],
)
def test_certain_on_plain_data(
    traces: list[list[Op]], states: list[str], desync_check: bool, expected: bool
) -> None:
    found = {
        rank: _trace(ops, IN_FLIGHT if state == RUN else COMPLETED)
        for rank, (ops, state) in enumerate(zip(traces, states, strict=True))
    }
    by_rank = dict(enumerate(states))
    assert verdicts.can_never_finish(found, by_rank, 2, desync_check=desync_check) is expected


def test_certain_needs_every_member_inside_and_no_raised_collective() -> None:
    inside = {0: _trace([_AR]), 1: _trace([_BC])}
    running = {0: RUN, 1: RUN}
    assert verdicts.can_never_finish(inside, running, 2)
    # A rank whose trace is unknown proves nothing; nor does a third member not inside.
    assert not verdicts.can_never_finish({0: inside[0], 1: None}, running, 2)
    assert not verdicts.can_never_finish(
        {**inside, 2: _trace([], COMPLETED)}, {**running, 2: RUN}, 3
    )
    # A collective that raised on the group: the test may handle such errors.
    raised = {0: _trace([_AR], raised=1), 1: inside[1]}
    assert not verdicts.can_never_finish(raised, running, 2)


def test_certain_not_where_only_the_reduce_op_differs() -> None:
    # SUM against MAX completes: the desync check reports it once the ranks return.
    total, most = (
        Op("all_reduce", f"all_reduce({op}, float32[4])", f"all_reduce({op}, float32[4])", op)
        for op in ("SUM", "MAX")
    )
    running = {0: RUN, 1: RUN}
    assert not verdicts.can_never_finish({0: _trace([total]), 1: _trace([most])}, running, 2)
    wider = Op("all_reduce", "all_reduce(MAX, float32[8])", "all_reduce(MAX, float32[8])", "MAX")
    assert verdicts.can_never_finish({0: _trace([total]), 1: _trace([wider])}, running, 2)


def test_certain_not_where_a_waiting_rank_saw_a_collective_raise() -> None:
    # Rank 0's broadcast #1 raised (a bad root torch rejects before the backend) and was
    # handled; its all_reduce #2 is rank 1's #1, which rank 1 finished: no proof.
    states = {0: RUN, 1: DONE}
    returned = _trace([_AR], COMPLETED)
    assert not verdicts.can_never_finish({0: _trace([_BC, _AR], raised=1), 1: returned}, states, 2)
    # Where the waiting rank saw none raise, the returned rank's count is the proof.
    assert verdicts.can_never_finish({0: _trace([_BC, _AR]), 1: returned}, states, 2)


_MB = Op("monitored_barrier", "monitored_barrier()", "monitored_barrier")


def test_certain_not_where_the_waiting_collective_raises_before_the_deadline() -> None:
    # Rank 1 returned after #1; rank 0 waits in #2. A monitored_barrier raises at its own
    # timeout, as does any collective of a group whose timeout comes first: the test may
    # expect that error (a rank that skips a barrier on purpose).
    states = {0: RUN, 1: DONE}
    returned = _trace([_AR], COMPLETED)
    assert verdicts.can_never_finish({0: _trace([_AR, _AR]), 1: returned}, states, 2, deadline=120)
    assert not verdicts.can_never_finish(
        {0: _trace([_AR, _MB]), 1: returned}, states, 2, deadline=120
    )
    short = {0: _trace([_AR, _AR], timeout=5.0), 1: _trace([_AR], COMPLETED, timeout=5.0)}
    assert not verdicts.can_never_finish(short, states, 2, deadline=120)
    assert not verdicts.can_never_finish(short, states, 2, deadline=None)  # it raises, in time
    long = {0: _trace([_AR, _AR], timeout=1800.0), 1: _trace([_AR], COMPLETED, timeout=1800.0)}
    assert verdicts.can_never_finish(long, states, 2, deadline=120)


def test_a_returned_rank_and_a_group_timeout_the_test_handles_pass(
    world3: harness.World,
) -> None:
    # Rank 1 returns while rank 0 waits in an all_reduce of a group whose own timeout is
    # 2 s: it raises then, and rank 0 handles it. Nothing is certain to hang.
    # Neither member destroys the group: reported, as what a real job would keep.
    with pytest.warns(RuntimeWarning, match=r"process group of ranks \[0, 1\] made at"):
        assert world3.run(fns.returned_rank_and_a_group_timeout) == [
            "timed out",
            "returned",
            None,
        ]


def test_classify_reports_a_certain_hang_as_the_deadline_would_with_its_own_summary() -> None:
    stacks = {0: "stack zero\n", 1: "stack one\n"}
    outcome = classify(Evidence({}, 2, timeout=600.0, stacks=stacks, certain=True))
    error = outcome.error
    assert type(error) is harness.WorldHang
    assert error.summary == (
        "the run can never finish: ranks 0, 1 wait in collectives that cannot complete "
        "(their stacks follow; the ranks were then killed)"
    )
    assert error.timeout is None
    assert error.stacks == stacks
    assert [f.message for f in error.failures.values()] == [
        "blocked in a collective that can never complete"
    ] * 2
    # At the deadline, the bound that passed is kept for its hint.
    late = classify(Evidence({}, 2, timeout=600.0, stacks=stacks)).error
    assert type(late) is harness.WorldTimeout
    assert late.timeout == 600.0


_MAX = Op("all_reduce", "all_reduce(MAX, float32[4])", "all_reduce MAX float32[4]", "MAX")
_SUM_MAX = "collective #1 on the default group differs: rank 0 all_reduce(SUM, float32[4]) at "


def test_a_mismatch_is_the_verdict_however_the_call_ended() -> None:
    # SUM against MAX: Gloo may complete it (the desync check sees it), or the ranks may be
    # seen inside it first (the hang watch stops the call), or the deadline may come first.
    # Which happens is timing; the verdict is the mismatch each time.
    stacks = {0: "stack zero\n", 1: "stack one\n"}
    inside = {0: _trace([_AR]), 1: _trace([_MAX])}
    done = {0: _trace([_AR], COMPLETED), 1: _trace([_MAX], COMPLETED)}
    returned = classify(
        Evidence(dict.fromkeys(range(2), Done(pickle.dumps(None))), 2, timeout=600.0)
    )
    assert returned.values == [None, None]
    ended = [
        desync(replace(returned, suspect=True), done, 2).error,
        classify(Evidence({}, 2, timeout=600.0, stacks=stacks, traces=inside, certain=True)).error,
        classify(Evidence({}, 2, timeout=600.0, stacks=stacks, traces=inside)).error,
    ]
    for error in ended:
        assert type(error) is harness.CollectiveMismatch
        assert len(error.verdicts) == 1
        assert error.verdicts[0].startswith(_SUM_MAX), error.verdicts
        assert error.verdicts[0] in error.summary
    stopped, late = ended[1:]
    assert stopped.summary.endswith(
        "; the run was stopped with ranks 0, 1 still running (their stacks follow; the ranks "
        "were then killed)"
    )
    assert late.summary.endswith(
        "; ranks 0, 1 still running after 600 s (their stacks at the deadline follow; the "
        "ranks were then killed)"
    )
    assert {rank: f.traceback for rank, f in late.failures.items()} == stacks


def test_a_returned_rank_after_a_mismatch_is_the_mismatch() -> None:
    # Rank 1 returned after a SUM against MAX that completed; rank 0 is seen inside a
    # collective that rank 1 never issues: proven, but the mismatch came first.
    traces = {0: _trace([_AR, _AR]), 1: _trace([_MAX], COMPLETED)}
    seen = Evidence({1: Done(b"")}, 2, timeout=600.0, traces=traces, certain=True)
    error = classify(seen).error
    assert type(error) is harness.CollectiveMismatch
    assert error.summary.startswith(f"the ranks' collectives do not match: {_SUM_MAX}")
    assert set(error.failures) == {0}


def test_without_a_mismatch_or_the_desync_check_a_stopped_call_is_a_hang() -> None:
    inside = {0: _trace([_AR]), 1: _trace([_MAX])}
    # Without the desync check, the ops are not judged: the deadline's verdict.
    seen = Evidence({}, 2, timeout=600.0, traces=inside, check_collectives=False)
    assert type(classify(seen).error) is harness.WorldTimeout
    # A collective that raised (a test may handle that on purpose) is no mismatch, nor is
    # what follows it: the watch's proof stands.
    raised = {0: _trace([_BC, _AR], raised=1), 1: _trace([_MAX, _AR])}
    seen = Evidence({}, 2, timeout=600.0, traces=raised, certain=True)
    assert type(classify(seen).error) is harness.WorldHang


# ---------------------------------------------------------------- HangWatch rounds


class _Files:
    def __init__(self) -> None:
        self.answer: RankTrace | None = None
        self.written: RankTrace | None = None

    def trace(self) -> RankTrace | None:
        return self.written


class _Rank:
    """What HangWatch uses of a RankProcess: its files, liveness, and a trace request that
    the watchdog answers at once."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.files = _Files()

    def alive(self) -> bool:
        return True

    def ask_trace(self) -> bool:
        self.files.written = self.files.answer
        return True


def _round(watch: HangWatch, replies: dict[int, Any]) -> bool:
    assert not watch.step(replies)  # asks
    return watch.step(replies)  # reads and judges


def test_a_rank_that_returned_after_it_was_asked_is_judged_by_its_trace_of_then() -> None:
    ranks = [_Rank(0), _Rank(1)]
    watch = HangWatch(ranks, desync_check=True)  # type: ignore[arg-type]
    ranks[0].files.answer = _trace([_AR, _AR])  # inside #2
    ranks[1].files.answer = _trace([_AR], COMPLETED)  # busy in Python after #1
    assert not watch.step({})  # asked while both ran
    done = {1: Done(b"")}
    # Rank 1 returned meanwhile, but its trace is from before: no proof yet.
    assert not watch.step(done)
    # The next round asks rank 1 as returned: its trace is final, #2 never comes.
    assert _round(watch, done)


def test_a_slow_rank_and_a_settled_round() -> None:
    ranks = [_Rank(0), _Rank(1)]
    watch = HangWatch(ranks, desync_check=True)  # type: ignore[arg-type]
    ranks[0].files.answer = _trace([_AR, _AR])
    ranks[1].files.answer = _trace([_AR], COMPLETED)  # still running Python: never certain
    for _ in range(3):
        assert not _round(watch, {})
    assert watch.active
    watch.settle(timeout_s=0.0)
    assert not watch.step({})  # a fresh round starts after settling
