"""Which collective went wrong: per-rank traces, verdicts in every failure, and the desync
check after every passing call. Real ranks, real Gloo; the runs that hang are bounded by a
timeout that only has to be longer than reaching a collective (no timing is asserted)."""

from __future__ import annotations

import re
from array import array
from types import SimpleNamespace
from typing import Any

import collectives_rankfns as fns
import harness_rankfns
import pytest
import torch
import torch.distributed as dist
from verdict_testutil import verdict_lines

import harness
from harness import compat
from harness.controller import verdicts
from harness.protocol.traces import (
    COMPLETED,
    DEFAULT_GROUP,
    IN_FLIGHT,
    RAISED,
    SHOWN,
    Collective,
    Fingerprint,
    GroupHistory,
    Op,
    RankTrace,
    render,
)
from harness.rank import recording
from harness.rank.recording import describe

HANG_S = 3.0
"""Bound on a run that hangs on purpose: the ranks reach their collective long before."""


def _timeout(world: harness.World, fn: object) -> harness.WorldTimeout:
    with pytest.raises(harness.WorldTimeout) as info:
        world.run(fn, timeout=HANG_S)  # type: ignore[arg-type]
    return info.value


# ---------------------------------------------------------------- the desync check


def test_sum_against_max_completes_but_fails_the_call(world2: harness.World) -> None:
    world2.run(fns.many, args=(1,))  # a world an earlier test broke is rebuilt now
    pids = world2.pids
    with pytest.raises(harness.CollectiveMismatch) as info:
        world2.run(fns.sum_against_max)
    error = info.value
    verdict = (
        "collective #1 on the default group differs: "
        f"rank 0 all_reduce(SUM, float32[4]) at {fns.line_of('sum-max')}; "
        f"rank 1 all_reduce(MAX, float32[4]) at {fns.line_of('sum-max')}"
    )
    assert error.verdicts == [verdict]
    assert error.summary.endswith(verdict)
    assert error.failures == {}
    text = str(error)
    assert "---------- collectives ----------" in text
    assert "rank 1: (1 on the default group)\n  #1 all_reduce(MAX, float32[4])" in text
    # As after any failed call, the next call gets fresh ranks.
    assert world2.run(fns.many, args=(3,)) == [None, None]
    assert world2.pids != pids


def test_desync_check_off_returns_the_wrong_numbers(world2: harness.World) -> None:
    values = world2.run(fns.sum_against_max, check_collectives=False)
    # Gloo mixes both reductions (which element gets which depends on its algorithm): the
    # sum rank 0 asked for is never what both ranks get.
    assert len(values) == 2
    assert values != [[3.0, 6.0, 9.0, 12.0]] * 2


def test_desync_check_through_harness_run() -> None:
    with pytest.raises(harness.CollectiveMismatch):
        harness.run(fns.sum_against_max, world_size=2, backend="gloo", timeout=60)
    values = harness.run(
        fns.sum_against_max, world_size=2, backend="gloo", timeout=60, check_collectives=False
    )
    assert len(values) == 2


def test_differing_dtype_fails_and_rebuilds_the_world(world2: harness.World) -> None:
    world2.run(fns.many, args=(1,))
    pids = world2.pids
    with pytest.raises(harness.CollectiveMismatch) as info:
        world2.run(fns.float_against_int)
    assert info.value.verdicts == [
        "collective #1 on the default group differs: "
        f"rank 0 all_reduce(SUM, float32[4]) at {fns.line_of('dtype')}; "
        f"rank 1 all_reduce(SUM, int32[4]) at {fns.line_of('dtype')}"
    ]
    assert world2.run(fns.many, args=(1,)) == [None, None]
    assert world2.pids != pids


def test_subgroup_collectives_are_compared_among_members_only(world3: harness.World) -> None:
    assert world3.run(fns.subgroup_only) == [[5.0] * 4, [5.0] * 4, [5.0] * 4]


def test_subgroup_mismatch_is_found(world3: harness.World) -> None:
    with pytest.raises(harness.CollectiveMismatch) as info:
        world3.run(fns.subgroup_mismatch)
    where = fns.line_of("sub-sum-max")
    assert info.value.verdicts == [
        "collective #1 on the group of ranks 0, 1 differs: "
        f"rank 0 all_reduce(SUM, float32[4]) at {where}; "
        f"rank 1 all_reduce(MAX, float32[4]) at {where}"
    ]


def test_point_to_point_ops_are_not_compared(world2: harness.World) -> None:
    assert world2.run(fns.point_to_point) == [None, None]


def test_check_collectives_must_be_a_bool(world2: harness.World) -> None:
    with pytest.raises(TypeError, match="check_collectives must be True or False"):
        world2.run(fns.many, args=(1,), check_collectives="no")  # type: ignore[arg-type]


# ---------------------------------------------------------------- failures: verdicts


def _mismatch(world: harness.World, fn: object) -> harness.CollectiveMismatch:
    """The error of a run whose ranks hang in collectives that differ: the mismatch, seen as
    soon as they are inside them (the world's own timeout only bounds a harness bug)."""
    with pytest.raises(harness.CollectiveMismatch) as info:
        world.run(fn)  # type: ignore[arg-type]
    return info.value


def test_differing_op_that_hangs_is_a_mismatch_naming_both(world2: harness.World) -> None:
    error = _mismatch(world2, fns.all_reduce_against_broadcast)
    assert error.verdicts == [
        "collective #2 on the default group differs: "
        f"rank 0 all_reduce(SUM, float32[4]) at {fns.line_of('op-rank0')}; "
        f"rank 1 broadcast(src=0, float32[4]) at {fns.line_of('op-rank1')}"
    ]
    # The verdict is the summary's, the ranks' stacks and the collectives follow.
    assert error.summary.startswith(f"the ranks' collectives do not match: {error.verdicts[0]}; ")
    assert set(error.failures) == {0, 1}
    trace = error.collectives[1]
    assert trace is not None
    assert trace.in_flight is not None
    assert trace.in_flight.op.text == "broadcast(src=0, float32[4])"
    assert [c.state for c in trace.recent] == [COMPLETED, IN_FLIGHT]
    assert trace.count(DEFAULT_GROUP) == 2


def test_differing_shape(world2: harness.World) -> None:
    with pytest.raises(harness.CollectiveMismatch) as info:
        world2.run(fns.shapes_differ)
    where = fns.line_of("shape")
    assert info.value.verdicts == [
        "collective #1 on the default group differs: "
        f"rank 0 all_reduce(SUM, float32[2, 2]) at {where}; "
        f"rank 1 all_reduce(SUM, float32[4]) at {where}"
    ]


def test_differing_root(world2: harness.World) -> None:
    error = _mismatch(world2, fns.roots_differ)
    where = fns.line_of("root")
    assert error.verdicts == [
        "collective #1 on the default group differs: "
        f"rank 0 broadcast(src=0, float32[4]) at {where}; "
        f"rank 1 broadcast(src=1, float32[4]) at {where}"
    ]


def test_a_rank_that_never_reaches_the_collective_is_singled_out(
    world3: harness.World,
) -> None:
    # A rank blocked in Event.wait is named alike: tests/plugin/test_plugin_collectives.py's
    # hang report shows it, through the plugin.
    error = _timeout(world3, fns.one_rank_sleeps)
    assert error.verdicts == [
        "rank 2 never reached collective #2 (barrier) that ranks 0, 1 wait in; "
        f"rank 2 is in time.sleep at {fns.line_of('sleeps')}"
    ]
    text = str(error)
    assert f"  #2 barrier() at {fns.line_of('barrier')}  [in flight]" in text
    trace = error.collectives[2]
    assert trace is not None
    assert trace.in_flight is None
    assert trace.blocked_at == f"time.sleep at {fns.line_of('sleeps')}"


def test_a_rank_that_finished_early(world3: harness.World) -> None:
    error = _timeout(world3, fns.one_rank_returns_early)
    assert error.verdicts == [
        "rank 2 finished the call after #1; ranks 0, 1 wait in #2 (all_gather)"
    ]
    assert f"#2 all_gather(float32[4]) at {fns.line_of('gather')}  [in flight]" in str(error)


def test_rank_error_carries_the_collectives(world2: harness.World) -> None:
    with pytest.raises(harness.RankError) as info:
        world2.run(fns.one_rank_raises)
    error = info.value
    # Rank 0 is either still in the barrier (torn down: its trace taken on request) or
    # raised there once rank 1 was gone: either way the verdict says where it was.
    assert len(error.verdicts) == 1
    assert re.fullmatch(
        r"rank 1 failed after #1; rank 0 (waits|was) in #2 \(barrier\)", error.verdicts[0]
    )
    assert "---------- collectives ----------" in str(error)
    assert set(error.collectives) == {0, 1}


def test_traces_taken_while_the_ranks_still_record(world2: harness.World) -> None:
    # The ranks all-reduce from the call's first millisecond: a short bound is enough.
    with pytest.raises(harness.WorldTimeout) as info:
        world2.run(fns.all_reduce_forever, timeout=1)
    error = info.value
    # Where each rank was at that moment is a race; that both traces arrive, whole, is not.
    for rank in (0, 1):
        trace = error.collectives[rank]
        assert trace is not None
        assert trace.count(DEFAULT_GROUP) > 0
        assert trace.recent[-1].op.text == "all_reduce(SUM, float32[1])"
    assert "---------- collectives ----------" in str(error)


def test_a_call_without_collectives_has_no_collectives_section(world2: harness.World) -> None:
    with pytest.raises(harness.WorldTimeout) as info:
        world2.run(harness_rankfns.sleep_forever, timeout=1)
    assert info.value.collectives == {}
    assert "collectives" not in str(info.value)


def test_torchs_flight_recorder_adds_what_the_wrapper_cannot_see(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if compat.torch_distributed._probe_flight_recorder() is None:
        pytest.skip("this torch has no flight recorder")
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")  # the ranks inherit it
    with (
        harness.World(2, backend="gloo", timeout=60) as world,
        pytest.raises(harness.RankError) as info,
    ):
        world.run(fns.ddp_backward_then_fail)
    trace = info.value.collectives[1]
    assert trace is not None
    # DDP's gradient all-reduce (4x5 weights + 5 biases), issued from C++ during backward.
    if compat.collective_hooks_available():
        # torch's hooks show it to the recording itself: once, not again from the recorder.
        ours = [c for c in trace.recent if c.op.text == "all_reduce(float32[25]) in backward (DDP)"]
        assert [c.where for c in ours] == [fns.line_of("backward")], trace.recent
        assert not [line for line in trace.recorded if line.startswith("all_reduce(")]
        return
    expected = f"all_reduce(float32[25]) on pg 0, #4 (scheduled) at {fns.line_of('backward')}"
    assert expected in trace.recorded
    assert f"torch's flight recorder: {expected}" in str(info.value)


# ---------------------------------------------------------------- verdicts on plain data


def _history(group: str, ranks: tuple[int, ...] | None, ops: list[Op]) -> GroupHistory:
    distinct = list(dict.fromkeys(ops))
    ids = array("I", [distinct.index(op) for op in ops]).tobytes()
    return GroupHistory(
        group, ranks, len(ops), tuple(distinct), ids, (("/x/test_x.py", 7),), bytes(4 * len(ops))
    )


def _trace(*histories: GroupHistory, last_state: str = COMPLETED) -> RankTrace:
    recent = []
    for history in histories:
        for seq in range(1, history.count + 1):
            found = history.at(seq)
            assert found is not None
            state = last_state if seq == history.count else COMPLETED
            recent.append(Collective(history.group, seq, found[0], "/x/test_x.py", 7, state))
    return RankTrace(tuple(recent), {h.group: h for h in histories})


SUM = Op("all_reduce", "all_reduce(SUM, float32[4])", "all_reduce(SUM, float32[4])", "SUM")
MAX = Op("all_reduce", "all_reduce(MAX, float32[4])", "all_reduce(MAX, float32[4])", "MAX")
GATHER = Op("all_gather", "all_gather(float32[4])", "all_gather([float32[4] x 4])")


def test_verdict_groups_ranks_that_agree() -> None:
    traces = {
        rank: _trace(_history(DEFAULT_GROUP, None, [SUM, MAX if rank == 2 else SUM]))
        for rank in range(4)
    }
    found = verdict_lines(traces, dict.fromkeys(traces, verdicts.DONE), 4)
    assert found == [
        "collective #2 on the default group differs: ranks 0, 1, 3 all_reduce(SUM, float32[4]) "
        "at test_x.py:7; rank 2 all_reduce(MAX, float32[4]) at test_x.py:7"
    ]


def test_verdict_finished_early_and_ranks_phrases() -> None:
    traces = {
        rank: _trace(
            _history(DEFAULT_GROUP, None, [SUM] * 4 + ([GATHER] if rank < 3 else [])),
            last_state=IN_FLIGHT if rank < 3 else COMPLETED,
        )
        for rank in range(4)
    }
    states = {0: verdicts.RUNNING, 1: verdicts.RUNNING, 2: verdicts.RUNNING, 3: verdicts.DONE}
    assert verdict_lines(traces, states, 4) == [
        "rank 3 finished the call after #4; ranks 0-2 wait in #5 (all_gather)"
    ]


def test_unknown_and_outside_ranks_are_not_compared() -> None:
    pair = _history("0,1/1", (0, 1), [SUM, SUM])
    traces = {
        0: _trace(pair, _history(DEFAULT_GROUP, None, [SUM])),
        1: _trace(pair, _history(DEFAULT_GROUP, None, [SUM])),
        2: _trace(_history(DEFAULT_GROUP, None, [SUM])),
        3: None,  # died: unknown, never a verdict of its own
    }
    assert verdict_lines(traces, dict.fromkeys(traces, verdicts.DONE), 4) == []


def test_fingerprints_compare_members_only() -> None:
    everyone = (DEFAULT_GROUP, None, 1, 11)
    pair = ("0,1/1", (0, 1), 2, 22)
    prints = {0: (everyone, pair), 1: (everyone, pair), 2: (everyone,)}
    assert verdicts.agree(prints, 3)
    assert not verdicts.agree({**prints, 1: (everyone, ("0,1/1", (0, 1), 2, 23))}, 3)
    assert not verdicts.agree({**prints, 1: (everyone,)}, 3)  # a member that issued none
    assert verdicts.agree({0: None, 1: (everyone,)}, 2)  # the check was off


def test_rendered_section_shows_the_one_in_flight_last() -> None:
    text = render({0: _trace(_history(DEFAULT_GROUP, None, [SUM] * 8), last_state=IN_FLIGHT)})
    lines = text.splitlines()
    assert lines[0] == "rank 0: (8 on the default group)"
    assert len(lines) == 1 + SHOWN
    assert lines[-1] == "  #8 all_reduce(SUM, float32[4]) at test_x.py:7  [in flight]"


# ---------------------------------------------------------------- recording, in this process
# The recorder is called as its wrapper calls it, with a no-op in place of torch's function:
# what a call reads as and what the desync check compares need no process group.


def _noop(*args: object, **kwargs: object) -> None:
    return None


def _raise(*args: object, **kwargs: object) -> None:
    raise RuntimeError("connection closed")


def _record(
    recorder: recording.Recorder, name: str, *args: Any, fn: Any = _noop, **kwargs: Any
) -> None:
    original = getattr(dist, name)
    spec = describe.spec(name, getattr(original, "__harness_traced__", original))
    recorder.call(spec, fn, args, kwargs)


def _described(name: str, *args: Any, **kwargs: Any) -> Op:
    with recording.Recorder() as recorder:
        _record(recorder, name, *args, **kwargs)
    (recorded,) = recorder.trace().recent
    return recorded.op


_T = torch.ones(4)


def _p2p(op: Any, peer: int, tensor: torch.Tensor) -> SimpleNamespace:
    # What batch_isend_irecv's P2POp holds (a real one needs a process group).
    return SimpleNamespace(op=op, peer=peer, group_peer=None, tensor=tensor)


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "text", "key"),
    [
        ("all_reduce", (_T,), {}, "all_reduce(SUM, float32[4])", None),
        ("all_reduce", (_T,), {"op": dist.ReduceOp.MAX}, "all_reduce(MAX, float32[4])", None),
        (
            "all_reduce_coalesced",
            ([_T, torch.ones(2, dtype=torch.int64)],),
            {},
            "all_reduce_coalesced(SUM, [float32[4], int64[2]])",
            None,
        ),
        ("broadcast", (_T,), {"src": 1}, "broadcast(src=1, float32[4])", None),
        ("reduce", (_T, 1), {"op": dist.ReduceOp.MAX}, "reduce(dst=1, MAX, float32[4])", None),
        # The inputs may differ in size by rank; the list of outputs may not.
        (
            "all_gather",
            ([_T, _T], _T),
            {},
            "all_gather(float32[4])",
            "all_gather([float32[4], float32[4]])",
        ),
        # The output may be concatenated or stacked, by rank; the input may not differ.
        (
            "all_gather_into_tensor",
            (torch.ones(8), _T),
            {},
            "all_gather_into_tensor(float32[8], float32[4])",
            "all_gather_into_tensor(float32[4])",
        ),
        ("gather", (_T, None, 1), {}, "gather(dst=1, float32[4])", None),
        ("scatter", (_T,), {"src": 0}, "scatter(src=0, float32[4])", None),
        # Each rank's output may differ in size (uneven pieces); the list of inputs may not.
        (
            "reduce_scatter",
            (_T, [_T, _T]),
            {},
            "reduce_scatter(SUM, float32[4], [float32[4], float32[4]])",
            "reduce_scatter(SUM, [float32[4], float32[4]])",
        ),
        # Split sizes differ by rank: only the dtype and the number of chunks are compared.
        (
            "all_to_all",
            ([torch.ones(3), torch.ones(1)], [torch.ones(2), torch.ones(2)]),
            {},
            "all_to_all([float32[2], float32[2]])",
            "all_to_all(2 x float32)",
        ),
        (
            "all_to_all_single",
            (torch.ones(6), torch.ones(6, dtype=torch.int64)),
            {},
            "all_to_all_single(int64[6])",
            "all_to_all_single(int64)",
        ),
        ("barrier", (), {}, "barrier()", None),
        ("monitored_barrier", (), {}, "monitored_barrier()", None),
        (
            "broadcast_object_list",
            ([1, 2, 3],),
            {"src": 0},
            "broadcast_object_list(src=0, 3 objects)",
            None,
        ),
        ("all_gather_object", ([None], "x"), {}, "all_gather_object(1 object)", None),
        ("gather_object", ("x",), {"dst": 1}, "gather_object(dst=1)", None),
        # Point-to-point ops differ by role: nothing of them is compared.
        ("send", (_T, 1), {}, "send(dst=1, float32[4])", "send()"),
        ("irecv", (_T,), {"src": 0}, "irecv(src=0, float32[4])", "irecv()"),
        (
            "recv_object_list",
            ([None, None],),
            {"src": 0},
            "recv_object_list(src=0, 2 objects)",
            "recv_object_list()",
        ),
        (
            "batch_isend_irecv",
            ([_p2p(dist.isend, 1, _T), _p2p(dist.irecv, 0, torch.ones(2, dtype=torch.int64))],),
            {},
            "batch_isend_irecv(isend(dst=1, float32[4]), irecv(src=0, int64[2]))",
            "batch_isend_irecv()",
        ),
    ],
)
def test_how_a_call_reads(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any], text: str, key: str | None
) -> None:
    op = _described(name, *args, **kwargs)
    assert (op.name, op.text, op.key) == (name, text, key or text)


def test_what_an_op_says_besides_its_text() -> None:
    op = _described("reduce", _T, 1, op=dist.ReduceOp.MAX)
    assert (op.reduce_op, op.root, op.tensors, op.device, op.p2p) == (
        "MAX",
        "dst=1",
        ("float32[4]",),
        "cpu",
        False,
    )
    assert _described("send", _T, 1).p2p
    assert _described("barrier").device == ""


def test_a_call_site_is_the_callers_line() -> None:
    with recording.Recorder() as recorder:
        _record(recorder, "all_reduce", _T)
    (recorded,) = recorder.trace().recent
    assert recorded.where.startswith("test_harness_collectives.py:")
    assert (recorded.seq, recorded.state) == (1, COMPLETED)


def _fingerprint(*calls: tuple[str, tuple[Any, ...], dict[str, Any]]) -> Fingerprint:
    with recording.Recorder() as recorder:
        for name, args, kwargs in calls:
            _record(recorder, name, *args, **kwargs)
    return recorder.fingerprint()


_SUM = ("all_reduce", (_T,), {})
_MAX = ("all_reduce", (_T,), {"op": dist.ReduceOp.MAX})
_BROADCAST = ("broadcast", (_T,), {"src": 0})


def test_fingerprints_of_the_same_collectives_are_equal() -> None:
    same = _fingerprint(_SUM, _BROADCAST, _SUM)
    assert same == _fingerprint(_SUM, _BROADCAST, _SUM)
    assert [entry[:3] for entry in same] == [(DEFAULT_GROUP, None, 3)]
    assert same != _fingerprint(_SUM, _BROADCAST, _MAX)
    assert same != _fingerprint(_SUM, _SUM, _BROADCAST)
    assert same != _fingerprint(_SUM, _BROADCAST)
    assert _fingerprint() == ()


def test_fingerprints_leave_point_to_point_ops_out() -> None:
    sender = _fingerprint(("send", (_T, 1), {}), _SUM)
    receiver = _fingerprint(("recv", (_T, 0), {}), _SUM)
    assert sender == receiver == _fingerprint(_SUM)


def test_a_fingerprint_stops_before_the_collective_that_raised() -> None:
    with recording.Recorder() as recorder:
        _record(recorder, "all_reduce", _T)
        with pytest.raises(RuntimeError):
            _record(recorder, "broadcast", _T, 0, fn=_raise)
        _record(recorder, "all_reduce", _T, op=dist.ReduceOp.MAX)
    assert recorder.raised
    assert recorder.fingerprint() == _fingerprint(_SUM)
    states = [c.state for c in recorder.trace().recent]
    assert states == [COMPLETED, RAISED, COMPLETED]
    assert recorder.trace().groups[DEFAULT_GROUP].raised == 2


def test_a_call_reads_the_collectives_it_issued_so_far(world3: harness.World) -> None:
    issued = [("all_reduce", (0, 1, 2), "int64"), ("barrier", (0, 1, 2), None)]
    assert world3.run(fns.issued_so_far) == [issued] * 3
