"""Ops compared only where both sides know a field: a collective recorded through torch's
process-group hooks has no reduce op, against the same collective recorded by the Python
layer (``verdicts.same_op``), in the desync check, its verdicts and the proof that a hang
can never end; and the two records of one call made as each side makes them. Plain data."""

from __future__ import annotations

from array import array
from typing import Any

import pytest
import torch
import torch.distributed as dist
from verdict_testutil import verdict_lines

from harness.controller import verdicts
from harness.controller.verdicts import DONE, RUNNING
from harness.protocol.traces import (
    COMPLETED,
    DEFAULT_GROUP,
    IN_FLIGHT,
    Collective,
    GroupHistory,
    Op,
    RankTrace,
)
from harness.rank.recording import describe, hook_ops

SUM = Op("all_reduce", "all_reduce(SUM, float32[4])", "all_reduce(SUM, float32[4])", "SUM")
MAX = Op("all_reduce", "all_reduce(MAX, float32[4])", "all_reduce(MAX, float32[4])", "MAX")
HOOKED = Op(
    "all_reduce",
    "all_reduce(float32[4]) in functional all_reduce",
    "all_reduce(float32[4])",
    origin="functional all_reduce",
)
HOOKED_8 = Op("all_reduce", "all_reduce(float32[8])", "all_reduce(float32[8])")
REDUCE = Op(
    "reduce", "reduce(dst=0, SUM, float32[2, 3])", "reduce(dst=0, SUM, float32[2, 3])", "SUM"
)
REDUCE_HOOKED = Op("reduce", "reduce(dst=0, float32[2, 3])", "reduce(dst=0, float32[2, 3])")
REDUCE_OTHER_ROOT = Op("reduce", "reduce(dst=1, float32[2, 3])", "reduce(dst=1, float32[2, 3])")
SCATTER = Op(
    "reduce_scatter_tensor",
    "reduce_scatter_tensor(AVG, float32[2], float32[4])",
    "reduce_scatter_tensor(AVG, float32[2])",
    "AVG",
)
SCATTER_HOOKED = Op(
    "reduce_scatter_tensor",
    "reduce_scatter_tensor(float32[2])",
    "reduce_scatter_tensor(float32[2])",
)
BARRIER = Op("barrier", "barrier()", "barrier()")


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        pytest.param(SUM, SUM, True, id="equal"),
        pytest.param(SUM, HOOKED, True, id="reduce-op-known-on-one-side"),
        pytest.param(HOOKED, MAX, True, id="either-side"),
        pytest.param(SUM, MAX, False, id="reduce-ops-differ"),
        pytest.param(SUM, HOOKED_8, False, id="shapes-differ"),
        pytest.param(REDUCE, REDUCE_HOOKED, True, id="reduce-op-after-the-root"),
        pytest.param(REDUCE, REDUCE_OTHER_ROOT, False, id="roots-differ"),
        pytest.param(SCATTER, SCATTER_HOOKED, True, id="reduce-op-alone-before-a-tensor"),
        pytest.param(HOOKED, BARRIER, False, id="ops-differ"),
        pytest.param(HOOKED, HOOKED_8, False, id="neither-knows-and-shapes-differ"),
    ],
)
def test_a_field_is_compared_only_where_both_sides_know_it(
    first: Op, second: Op, same: bool
) -> None:
    assert verdicts.same_op(first, second) is same
    assert verdicts.same_op(second, first) is same


def _trace(ops: list[Op], state: str = COMPLETED) -> RankTrace:
    """A rank's trace on the default group: ``ops`` in order, the last one in ``state``."""
    distinct = list(dict.fromkeys(ops))
    ids = array("I", [distinct.index(op) for op in ops]).tobytes()
    places = tuple(("/src/test_x.py", 10 + n) for n in range(len(ops)))
    history = GroupHistory(
        DEFAULT_GROUP,
        None,
        len(ops),
        tuple(distinct),
        ids,
        places,
        array("I", range(len(ops))).tobytes(),
    )
    recent = tuple(
        Collective(
            DEFAULT_GROUP,
            seq,
            op,
            "/src/test_x.py",
            9 + seq,
            COMPLETED if seq < len(ops) else state,
        )
        for seq, op in enumerate(ops, start=1)
    )
    return RankTrace(recent, {DEFAULT_GROUP: history})


def test_a_python_layer_and_a_hook_record_of_one_collective_give_no_verdict() -> None:
    traces = {0: _trace([SUM, BARRIER]), 1: _trace([HOOKED, BARRIER])}
    assert verdict_lines(traces, {0: DONE, 1: DONE}, 2) == []


def test_members_whose_known_reduce_ops_differ_still_differ() -> None:
    traces = {0: _trace([SUM]), 1: _trace([HOOKED]), 2: _trace([MAX])}
    assert verdict_lines(traces, dict.fromkeys(range(3), DONE), 3) == [
        "collective #1 on the default group differs: rank 0 all_reduce(SUM, float32[4]) at "
        "test_x.py:10; rank 1 all_reduce(float32[4]) in functional all_reduce at "
        "test_x.py:10; rank 2 all_reduce(MAX, float32[4]) at test_x.py:10"
    ]


@pytest.mark.parametrize(
    ("ops", "proven"),
    [
        pytest.param([SUM, HOOKED], False, id="same-collective"),
        pytest.param([SUM, MAX], False, id="reduce-ops-differ"),  # it completes
        pytest.param([HOOKED, BARRIER], True, id="ops-differ"),
    ],
)
def test_members_inside_one_collective_recorded_two_ways_are_no_proof_of_a_hang(
    ops: list[Op], proven: bool
) -> None:
    traces = {rank: _trace([op], IN_FLIGHT) for rank, op in enumerate(ops)}
    assert verdicts.can_never_finish(traces, {0: RUNNING, 1: RUNNING}, 2) is proven


def _raw(*shapes: tuple[int, ...]) -> tuple[tuple[Any, Any, Any], ...]:
    return tuple((torch.float32, torch.Size(shape), torch.device("cpu")) for shape in shapes)


@pytest.mark.parametrize(
    ("name", "args", "kind", "raw"),
    [
        pytest.param("all_reduce", (torch.ones(4),), "ALLREDUCE", _raw((4,)), id="all_reduce"),
        pytest.param(
            "all_reduce_coalesced",
            ([torch.ones(4), torch.ones(2)],),
            "ALLREDUCE_COALESCED",
            _raw((4,), (2,)),
            id="all_reduce_coalesced",
        ),
        pytest.param(
            "reduce_scatter_tensor",
            (torch.ones(2), torch.ones(4)),
            "REDUCE_SCATTER_BASE",
            _raw((2,)),
            id="reduce_scatter_tensor",
        ),
    ],
)
def test_a_call_through_the_python_layer_and_the_hooks_record_of_it_are_the_same(
    name: str, args: tuple[Any, ...], kind: str, raw: tuple[Any, ...]
) -> None:
    spec = describe.spec(name, getattr(dist, name))
    python_layer = describe.op(spec, describe.raw(spec, args, {}), None)
    hooks_record = hook_ops.op(hook_ops.KINDS[kind], raw, -1, True, f"functional {name}", None)
    assert python_layer.reduce_op == "SUM"
    assert not hooks_record.reduce_op
    assert verdicts.same_op(python_layer, hooks_record), (python_layer.key, hooks_record.key)
