"""What the desync check compares of each collective: only what must agree on every member.

Each case describes one collective as two ranks call it (``describe.op`` on the default
group, in this process: no rank, no process group) and says whether the check may tell the
two calls apart (``Op.key``). What a rank may size or lay out for itself (an uneven
reduce_scatter's output, all_to_all's splits, the concatenated or stacked form of a single
tensor collective, a root named or left to its default) must read the same; what the
members must agree on (the op, the reduce op, the root, the shared shapes and dtypes) must
not. Real processes running the same calls are in ``tests/harness/test_harness_agreement.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from harness.protocol.traces import Op
from harness.rank.recording import describe


def _op(name: str, *args: Any, **kwargs: Any) -> Op:
    """How a call of ``dist.<name>`` with these arguments reads, on the default group."""
    fn = getattr(dist, name)
    spec = describe.spec(name, getattr(fn, "__harness_traced__", fn))
    return describe.op(spec, describe.raw(spec, args, kwargs), None)


def _t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype)


Call = tuple[str, tuple[Any, ...], dict[str, Any]]


def _call(name: str, *args: Any, **kwargs: Any) -> Call:
    return name, args, kwargs


# Pairs of calls, as rank 0 and rank 1 make them, that are one and the same collective.
AGREE = {
    # Gloo gives each rank the size of its own entry of the input list.
    "reduce_scatter, uneven outputs": (
        _call("reduce_scatter", _t(1), [_t(1), _t(2)]),
        _call("reduce_scatter", _t(2), [_t(1), _t(2)]),
    ),
    "reduce_scatter_tensor, concatenated or stacked input": (
        _call("reduce_scatter_tensor", _t(3), _t(6)),
        _call("reduce_scatter_tensor", _t(3), _t(2, 3)),
    ),
    "all_gather_into_tensor, concatenated or stacked output": (
        _call("all_gather_into_tensor", _t(6), _t(3)),
        _call("all_gather_into_tensor", _t(2, 3), _t(3)),
    ),
    "all_gather, uneven inputs": (
        _call("all_gather", [_t(1), _t(2)], _t(1)),
        _call("all_gather", [_t(1), _t(2)], _t(2)),
    ),
    "all_to_all, uneven splits": (
        _call("all_to_all", [_t(1), _t(2)], [_t(1), _t(3)]),
        _call("all_to_all", [_t(3), _t(4)], [_t(2), _t(4)]),
    ),
    "all_to_all_single, uneven splits": (
        _call("all_to_all_single", _t(4), _t(3), [1, 3], [1, 2]),
        _call("all_to_all_single", _t(5), _t(6), [2, 3], [3, 3]),
    ),
    # torch reads no root as global rank 0.
    "gather, dst=0 or none": (
        _call("gather", _t(4), [_t(4), _t(4)], dst=0),
        _call("gather", _t(4)),
    ),
    "scatter, src=0 or none": (
        _call("scatter", _t(4), [_t(4), _t(4)], src=0),
        _call("scatter", _t(4)),
    ),
    "gather_object, dst=0 or none": (
        _call("gather_object", "x", [None, None], 0),
        _call("gather_object", "y"),
    ),
    "scatter_object_list, src=0 or none": (
        _call("scatter_object_list", [None], ["a", "b"], src=0),
        _call("scatter_object_list", [None]),
    ),
    "broadcast_object_list, src=0 or none": (
        _call("broadcast_object_list", [1, 2], src=0),
        _call("broadcast_object_list", [None, None]),
    ),
    # On the default group a group rank is the global rank.
    "broadcast, group_src=1 or src=1": (
        _call("broadcast", _t(4), group_src=1),
        _call("broadcast", _t(4), src=1),
    ),
    "reduce, group_dst=1 or dst=1": (
        _call("reduce", _t(4), group_dst=1),
        _call("reduce", _t(4), dst=1),
    ),
}

# Pairs of calls that are not the same collective: a desync the check must still find.
DIFFER = {
    "reduce_scatter, another input list": (
        _call("reduce_scatter", _t(2), [_t(2), _t(2)]),
        _call("reduce_scatter", _t(2), [_t(2), _t(3)]),
    ),
    "reduce_scatter, another reduce op": (
        _call("reduce_scatter", _t(2), [_t(2), _t(2)]),
        _call("reduce_scatter", _t(2), [_t(2), _t(2)], op=dist.ReduceOp.MAX),
    ),
    "reduce_scatter, another dtype": (
        _call("reduce_scatter", _t(2), [_t(2), _t(2)]),
        _call("reduce_scatter", _t(2), [_t(2, dtype=torch.int32), _t(2, dtype=torch.int32)]),
    ),
    "reduce_scatter_tensor, another output": (
        _call("reduce_scatter_tensor", _t(3), _t(6)),
        _call("reduce_scatter_tensor", _t(2), _t(4)),
    ),
    "all_gather_into_tensor, another input": (
        _call("all_gather_into_tensor", _t(6), _t(3)),
        _call("all_gather_into_tensor", _t(4), _t(2)),
    ),
    "all_gather, another output list": (
        _call("all_gather", [_t(1), _t(2)], _t(1)),
        _call("all_gather", [_t(1), _t(1)], _t(1)),
    ),
    "all_to_all, another number of chunks": (
        _call("all_to_all", [_t(1), _t(2)], [_t(1), _t(3)]),
        _call("all_to_all", [_t(1), _t(2), _t(3)], [_t(1), _t(2), _t(3)]),
    ),
    "all_to_all_single, another dtype": (
        _call("all_to_all_single", _t(4), _t(4)),
        _call("all_to_all_single", _t(4), _t(4, dtype=torch.float64)),
    ),
    "gather, dst=1 or none": (
        _call("gather", _t(4), dst=1),
        _call("gather", _t(4)),
    ),
    "scatter, another root": (
        _call("scatter", _t(4), src=1),
        _call("scatter", _t(4), src=0),
    ),
    "broadcast_object_list, src=1 or none": (
        _call("broadcast_object_list", [1, 2], src=1),
        _call("broadcast_object_list", [None, None]),
    ),
    "broadcast, another root": (
        _call("broadcast", _t(4), group_src=0),
        _call("broadcast", _t(4), src=1),
    ),
}


@pytest.mark.parametrize("pair", list(AGREE.values()), ids=list(AGREE))
def test_what_a_rank_chooses_for_itself_is_not_compared(pair: tuple[Call, Call]) -> None:
    first, second = (_op(name, *args, **kwargs) for name, args, kwargs in pair)
    assert first.key == second.key


@pytest.mark.parametrize("pair", list(DIFFER.values()), ids=list(DIFFER))
def test_what_the_members_must_agree_on_is_compared(pair: tuple[Call, Call]) -> None:
    first, second = (_op(name, *args, **kwargs) for name, args, kwargs in pair)
    assert first.key != second.key


def test_an_uneven_reduce_scatter_shows_each_ranks_output() -> None:
    # The check leaves the output out; what a rank's collectives read as keeps it.
    ops = [_op("reduce_scatter", _t(size), [_t(1), _t(2)]) for size in (1, 2)]
    assert [op.text for op in ops] == [
        "reduce_scatter(SUM, float32[1], [float32[1], float32[2]])",
        "reduce_scatter(SUM, float32[2], [float32[1], float32[2]])",
    ]
    assert {op.key for op in ops} == {"reduce_scatter(SUM, [float32[1], float32[2]])"}


def test_a_root_left_to_its_default_reads_as_rank_0() -> None:
    assert _op("gather", _t(4)).text == "gather(dst=0, float32[4])"
    assert _op("scatter", _t(4), group_src=1).text == "scatter(src=1, float32[4])"
    assert _op("gather", _t(4)).root == "dst=0"


def test_a_group_root_on_the_default_group_reads_as_the_global_root() -> None:
    op = _op("broadcast", _t(4), group_src=1)
    assert (op.text, op.root) == ("broadcast(src=1, float32[4])", "src=1")
