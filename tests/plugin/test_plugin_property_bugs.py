"""Issue 38's acceptance: three bugs planted in distributed code, each found by a ``@given``
test and shrunk to the minimal world and arguments, the report checked line by line.

* a shard size computed as ``numel // world_size`` (data lost where the size does not
  divide): shrinks to 2 ranks and a 1-element tensor;
* a rank count hard-coded as 2 in a mean (right on 2 ranks only): shrinks to 3 ranks, the
  smallest world past 2 the strategy draws, and the value 1;
* a data-parallel all-reduce skipped when the tensor-parallel mesh dimension has size 1:
  shrinks to 2 ranks with ``tp=1``.

Then a property test under ``-n 2`` (pytest-xdist), and Hypothesis's example database on:
a second run replays the failing example first.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("hypothesis")

BUGS = """
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings, strategies as st

from harness.strategies import tensor_shapes, world_sizes

QUICK = settings(database=None, derandomize=True, max_examples=60)


def shard(full, rank, world_size):
    flat = full.flatten()
    size = flat.numel() // world_size  # the planted bug: the remainder is lost
    return flat[rank * size : (rank + 1) * size]


@QUICK
@given(world_size=world_sizes(4), shape=tensor_shapes(max_dims=2, max_side=5))
@pytest.mark.distributed
def test_shards_gather_to_the_tensor(rank, world_size, shape):
    full = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    pieces = [None] * world_size
    dist.all_gather_object(pieces, shard(full, rank, world_size).tolist())
    assert sum(map(len, pieces)) == full.numel()


def mean_over_ranks(value):
    total = torch.tensor([float(value)])
    dist.all_reduce(total)
    return total.item() / 2  # the planted bug: the rank count hard-coded as 2


@QUICK
@given(world_size=world_sizes(4, min_size=2), value=st.integers(0, 100))
@pytest.mark.distributed
def test_the_mean_of_equal_values_is_the_value(rank, world_size, value):
    assert mean_over_ranks(value) == value


def data_parallel_sync(grad, dp_group, tp):
    if tp > 1:  # the planted bug: the dp all-reduce skipped when the tp dimension is 1
        dist.all_reduce(grad, group=dp_group)


@QUICK
@given(world_size=world_sizes(4), tp=st.sampled_from([2, 1]))
@pytest.mark.distributed
def test_gradients_are_summed_over_data_parallel_ranks(rank, world_size, tp):
    if world_size % tp:
        return  # no such mesh
    # Mesh (dp, tp): ranks with the same rank % tp form one dp group.
    groups = [dist.new_group(list(range(j, world_size, tp))) for j in range(tp)]
    grad = torch.tensor([float(rank + 1)])
    data_parallel_sync(grad, groups[rank % tp], tp)
    expected = sum(r + 1 for r in range(rank % tp, world_size, tp))
    for group in groups:
        dist.destroy_process_group(group)
    assert grad.item() == expected
"""


def test_three_planted_bugs_are_found_and_shrunk_to_the_minimal_world(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_bugs=BUGS)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "RankError: rank ? raised AssertionError: assert 0 == 1*",
            "minimal example (2 ranks, * examples run): "
            "test_shards_gather_to_the_tensor(world_size=2, shape=(1,))",
            "to replay it first, add above @given: @example(world_size=2, shape=(1,))",
            "confirmed on fresh processes; run (2 ranks, gloo): "
            "pytest test_bugs.py::test_shards_gather_to_the_tensor --dist-backend=gloo",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            # Every rank fails alike: whichever the harness saw first is named.
            "RankError: rank ? raised AssertionError: assert 1.5 == 1*",
            "minimal example (3 ranks, * examples run): "
            "test_the_mean_of_equal_values_is_the_value(world_size=3, value=1)",
            "to replay it first, add above @given: @example(world_size=3, value=1)",
            "confirmed on fresh processes; run (3 ranks, gloo): "
            "pytest test_bugs.py::test_the_mean_of_equal_values_is_the_value --dist-backend=gloo",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "RankError: rank ? raised AssertionError: assert ?.0 == 3*",
            "minimal example (2 ranks, * examples run): "
            "test_gradients_are_summed_over_data_parallel_ranks(world_size=2, tp=1)",
            "to replay it first, add above @given: @example(world_size=2, tp=1)",
        ]
    )


PROPERTY = """
import os
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings, strategies as st

# Where CI is set (this project's CI sets it), Hypothesis picks its "ci" profile, which keeps
# no example database: the default profile is what a developer's run has.
settings.load_profile("default")

RECORDS = {records!r}


@settings(max_examples=40)
@given(world_size=st.integers(1, 3), n=st.integers(0, 1000))
@pytest.mark.distributed
def test_capped(rank, world_size, n):
    if rank == 0:
        with open(os.path.join(RECORDS, os.environ.get("RUN", "run")), "a") as f:
            f.write(f"{{world_size}} {{n}}\\n")
    total = torch.tensor([float(n)])
    dist.all_reduce(total)
    assert total.item() == n * min(world_size, 2) or n < 2  # wrong from 3 ranks, n >= 2


@settings(max_examples=5, database=None)
@given(n=st.integers(0, 10))
@pytest.mark.distributed
def test_passes(rank, n):
    dist.barrier()
"""


def test_under_xdist_and_with_the_example_database_a_rerun_replays_the_failure_first(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    records = tmp_path_factory.mktemp("records")
    pytester.makepyfile(test_prop=PROPERTY.format(records=str(records)))
    expected = [
        "minimal example (3 ranks, * examples run): test_capped(world_size=3, n=2)",
        "to replay it first, add above @given: @example(world_size=3, n=2)",
    ]
    for run in ("first", "second"):
        os.environ["RUN"] = run  # the subprocess's workers inherit it
        try:
            result = pytester.runpytest_subprocess("-p", "no:randomly", "-n", "2")
        finally:
            del os.environ["RUN"]
        result.assert_outcomes(failed=1, passed=1)
        result.stdout.fnmatch_lines(expected)
    # The default database, under the project's directory (pytester's).
    assert (pytester.path / ".hypothesis" / "examples").is_dir()
    second = (Path(records) / "second").read_text().split("\n")
    assert second[0] == "3 2", second  # the saved minimal example, before any other
