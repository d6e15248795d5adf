"""mylib on real ranks: each marked test's body runs on every rank of a Gloo (or NCCL) world."""

from __future__ import annotations

from pathlib import Path

import harness
import pytest
import torch
import torch.distributed as dist

import mylib


@pytest.mark.distributed(world_size=[1, 2, 4])
def test_sharded_sum(rank, world_size, local_device):
    tensor = torch.full((3,), float(rank + 1), device=local_device)
    total = mylib.sharded_sum(tensor)
    assert total.tolist() == [world_size * (world_size + 1) / 2] * 3
    assert tensor.tolist() == [float(rank + 1)] * 3, "the input is left unchanged"


@pytest.mark.distributed(world_size=2)
def test_average_gradients(rank, local_device, seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1).to(local_device)
    inputs = torch.full((2, 4), float(rank + 1), device=local_device)
    model(inputs).sum().backward()
    local = model.weight.grad.clone()

    mylib.average_gradients(model)

    everyone = mylib.gather_objects(local.cpu())
    expected = sum(everyone) / len(everyone)
    torch.testing.assert_close(model.weight.grad.cpu(), expected)


@pytest.mark.distributed(world_size=[2, 3])
@pytest.mark.parametrize("size", [0, 1, 7])
def test_shards_cover_everything_once(world_size, size):
    items = list(range(size))
    shards = mylib.gather_objects(mylib.shard(items))
    assert len(shards) == world_size
    assert sorted(item for part in shards for item in part) == items


class TestShardFiles:
    """A test class: it is instantiated inside each rank, after ``setup_method`` ran."""

    def setup_method(self):
        self.prefix = "shard"

    @pytest.mark.distributed(world_size=2)
    def test_ranks_share_tmp_path(self, rank, world_size, tmp_path, dataset):
        # tmp_path is one directory for all ranks: each writes its shard there.
        mine = mylib.shard(dataset)
        (tmp_path / f"{self.prefix}{rank}.txt").write_text(",".join(map(str, mine)))
        dist.barrier()
        files = sorted(Path(tmp_path).glob(f"{self.prefix}*.txt"))
        assert len(files) == world_size
        seen = [int(x) for path in files for x in path.read_text().split(",") if x]
        assert sorted(seen) == dataset

    @pytest.mark.distributed(world_size=2, timeout=30)
    def test_local_rank(self, rank, local_rank):
        assert local_rank == rank  # one node


# Ordinary tests can drive ranks themselves. The functions they run must be importable, and
# these helpers are CPU-only, so they ask for Gloo (on a GPU machine "auto" would be NCCL).


def test_harness_run_without_the_marker():
    results = harness.run(mylib.rank_and_size, world_size=3, backend="gloo")
    assert results == [(0, 3), (1, 3), (2, 3)]


def test_dist_world_fixture(dist_world):
    world = dist_world(2, backend="gloo")  # one World for the whole session
    assert world.run(mylib.rank_and_size) == [(0, 2), (1, 2)]
    assert world.run(mylib.gather_objects, args=("x",)) == [["x", "x"], ["x", "x"]]


def test_rank_errors_name_the_rank(dist_world):
    with pytest.raises(harness.RankError) as info:
        dist_world(2, backend="gloo").run(mylib.shard, args=(None,))
    assert sorted(info.value.failures) == [0, 1]
    assert info.value.failures[0].exc_type == "TypeError"
