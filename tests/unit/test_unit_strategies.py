"""harness.strategies: what each strategy draws, and that each shrinks to its simple case.

Shrinking is checked with Hypothesis's ``find``: the smallest example satisfying a condition
is what a failing property would be reported with.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

hypothesis = pytest.importorskip("hypothesis")

import torch  # noqa: E402
from hypothesis import find, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.distributed.tensor import Partial, Replicate, Shard  # noqa: E402

from harness import strategies  # noqa: E402

QUICK = settings(database=None, derandomize=True, max_examples=300)


def test_world_sizes_shrink_to_the_smallest_world() -> None:
    assert find(strategies.world_sizes(4), lambda _: True, settings=QUICK) == 1
    assert find(strategies.world_sizes(4), lambda size: size >= 3, settings=QUICK) == 3


def test_world_sizes_refuse_an_empty_or_rankless_range() -> None:
    with pytest.raises(ValueError, match="min_size must be >= 1"):
        strategies.world_sizes(4, min_size=0)
    with pytest.raises(ValueError, match="min_size 3 is above max_size 2"):
        strategies.world_sizes(2, min_size=3)


@given(data=st.data(), world_size=st.integers(1, 12))
@settings(database=None, max_examples=50)
def test_a_mesh_covers_its_world(data: st.DataObject, world_size: int) -> None:
    shape = data.draw(strategies.mesh_shapes(world_size, max_dims=3))
    assert math.prod(shape) == world_size
    assert 1 <= len(shape) <= 3


def test_mesh_shapes_shrink_to_one_dimension_then_to_leading_ones() -> None:
    assert find(strategies.mesh_shapes(8), lambda _: True, settings=QUICK) == (8,)
    two_d = find(strategies.mesh_shapes(8), lambda shape: len(shape) == 2, settings=QUICK)
    assert two_d == (1, 8)
    even = find(
        strategies.mesh_shapes(8), lambda shape: shape[0] > 1 and len(shape) == 2, settings=QUICK
    )
    assert even == (2, 4)


def test_placements_shrink_to_replicated() -> None:
    every = strategies.placements(2, 2, partial=True)
    assert find(every, lambda _: True, settings=QUICK) == (Replicate(), Replicate())
    sharded = find(every, lambda p: any(isinstance(x, Shard) for x in p), settings=QUICK)
    assert sharded == (Replicate(), Shard(0))
    assert find(every, lambda p: Partial() in p, settings=QUICK) == (Replicate(), Partial())


def test_a_scalar_is_only_replicated() -> None:
    assert find(strategies.placements(1, 0), lambda _: True, settings=QUICK) == (Replicate(),)


def test_tensor_shapes_shrink_to_an_empty_tensor_and_reach_uneven_sides() -> None:
    assert find(strategies.tensor_shapes(), lambda _: True, settings=QUICK) == (0,)
    uneven = find(strategies.tensor_shapes(), lambda s: s[0] % 3 == 1, settings=QUICK)
    assert uneven == (1,)
    full = strategies.tensor_shapes(min_dims=2, min_side=1)
    assert find(full, lambda _: True, settings=QUICK) == (1, 1)


def test_dtypes_shrink_to_float32() -> None:
    assert find(strategies.dtypes("gloo"), lambda _: True, settings=QUICK) == torch.float32
    found = find(strategies.dtypes("gloo"), lambda d: not d.is_floating_point, settings=QUICK)
    assert found == torch.int32
    floats = strategies.dtypes("nccl", floating=True)
    assert find(floats, lambda d: d.itemsize == 2, settings=QUICK) == torch.float16


def test_dtypes_name_the_backends_they_know() -> None:
    with pytest.raises(ValueError, match="backend must be one of 'gloo', 'nccl', not 'mpi'"):
        strategies.dtypes("mpi")


def test_faults_shrink_to_the_first_rank_and_collective() -> None:
    from harness import faults

    drawn = strategies.faults("kill", ranks=[1, 0], at=st.integers(1, 5), when="after")
    assert find(drawn, lambda _: True, settings=QUICK) == faults.kill(1, 1, when="after")
    later = find(drawn, lambda fault: fault.at >= 3, settings=QUICK)
    assert later == faults.kill(1, 3, when="after")
    exits = strategies.faults(faults.exit, ranks=range(2), at=2, code=3)
    assert find(exits, lambda _: True, settings=QUICK) == faults.exit(0, 2, 3)


def test_faults_name_a_bad_kind_argument_or_range() -> None:
    with pytest.raises(ValueError, match="unknown fault kind 'kil'; valid: kill, exit"):
        strategies.faults("kil", ranks=1, at=1)
    with pytest.raises(TypeError, match="code"):
        strategies.faults("kill", ranks=1, at=1, code=3)
    with pytest.raises(ValueError, match="at is empty: give at least one int"):
        strategies.faults("kill", ranks=1, at=range(1, 1))
    with pytest.raises(TypeError, match="ranks must be an int, a range or list of ints, or a "):
        strategies.faults("kill", ranks="1", at=1)


def test_without_hypothesis_the_import_says_what_to_install() -> None:
    code = "import sys; sys.modules['hypothesis'] = None; import harness.strategies"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 1
    assert "ImportError: harness.strategies needs Hypothesis: pip install hypothesis" in (
        result.stderr
    )
