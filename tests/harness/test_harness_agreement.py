"""The desync check compares only what must agree across ranks: real ranks, real Gloo.

Collectives whose calls legitimately differ by rank (an uneven reduce_scatter or
all_to_all, a root named on one rank and left to its default on another) pass with their
right results; a reduce_scatter whose ranks disagree is still a ``CollectiveMismatch``.
``tests/unit/test_unit_describe.py`` covers every collective kind in this process.
"""

from __future__ import annotations

import agreement_rankfns as fns
import pytest

import harness


def test_an_uneven_reduce_scatter_passes(world2: harness.World) -> None:
    # Each input entry j is (r + 1) on rank r, summed over both ranks: 3.
    assert world2.run(fns.uneven_reduce_scatter) == [[3.0], [3.0, 3.0]]


def test_a_reduce_scatter_with_another_op_is_still_a_mismatch(world2: harness.World) -> None:
    with pytest.raises(harness.CollectiveMismatch) as info:
        world2.run(fns.reduce_scatter_ops_differ)
    where = fns.line_of("rs-ops")
    assert info.value.verdicts == [
        "collective #1 on the default group differs: "
        f"rank 0 reduce_scatter(SUM, float32[2], [float32[2], float32[2]]) at {where}; "
        f"rank 1 reduce_scatter(MAX, float32[2], [float32[2], float32[2]]) at {where}"
    ]


def test_an_uneven_all_to_all_single_passes(world2: harness.World) -> None:
    # Rank r receives rank 0's one element, then rank 1's two.
    assert world2.run(fns.uneven_all_to_all_single) == [[0.0, 1.0, 1.0]] * 2


def test_roots_named_or_left_to_their_default_pass(world2: harness.World) -> None:
    assert world2.run(fns.roots_named_or_defaulted) == [
        ([0.0, 0.0, 1.0, 1.0], [1.0]),
        ([], [1.0]),
    ]
