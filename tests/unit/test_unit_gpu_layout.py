"""Which GPU each rank of a leased world binds, and the environment it gets: pure logic.

torch 2.15's NCCL binds ``LOCAL_RANK % device_count`` of the rank's ``CUDA_VISIBLE_DEVICES``
where no ``device_id`` is given, whatever the current device: every layout is checked here
against that formula, so that a world whose ranks make their own groups (``init=False``)
lands each rank on its own leased GPU. No rank process starts.
"""

from __future__ import annotations

import pytest
import torch

import fhelium.distributed._state as state
from harness.controller import spawn
from harness.protocol import devices
from harness.rank import identity

LEASE = ("GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e", "GPU-f", "GPU-g", "GPU-h")


def _nccl2_binds(env: dict[str, str]) -> str:
    """The GPU torch 2.15's NCCL binds in a rank with ``env`` and no ``device_id``."""
    visible = env["CUDA_VISIBLE_DEVICES"].split(",")
    return visible[int(env["LOCAL_RANK"]) % len(visible)]


@pytest.mark.parametrize(("world_size", "per_rank"), [(1, 1), (2, 1), (4, 1), (2, 2), (2, 4)])
def test_whole_gpus_per_rank_put_each_ranks_own_first(world_size: int, per_rank: int) -> None:
    lease = LEASE[: world_size * per_rank]
    for rank in range(world_size):
        env = spawn.rank_env(rank, world_size, 29500, lease)
        visible = env["CUDA_VISIBLE_DEVICES"].split(",")
        assert sorted(visible) == sorted(lease), "every rank sees the whole lease"
        own = lease[rank * per_rank : (rank + 1) * per_rank]
        first = devices.own_device(rank, len(visible))
        assert first == rank
        assert visible[first : first + per_rank] == list(own)
        assert _nccl2_binds(env) == own[0]
        assert env["HARNESS_GPUS_PER_RANK"] == str(per_rank)
        assert env["HARNESS_GPUS"] == ",".join(lease)
        assert "NCCL_MULTI_RANK_GPU_ENABLE" not in env
        assert "HARNESS_RANKS_PER_GPU" not in env


def test_one_gpu_per_rank_keeps_torchruns_order_on_every_rank() -> None:
    envs = [spawn.rank_env(rank, 2, 29500, ("0", "1")) for rank in range(2)]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["0,1", "0,1"]


def test_two_gpus_per_rank_rotate_the_second_ranks_view() -> None:
    # Without the rotation nccl2 would bind rank 1 to GPU 1: rank 0's second.
    envs = [spawn.rank_env(rank, 2, 29500, ("0", "1", "2", "3")) for rank in range(2)]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["0,1,2,3", "1,2,3,0"]
    assert [_nccl2_binds(env) for env in envs] == ["0", "2"]


@pytest.mark.parametrize(
    ("world_size", "gpus", "most"),
    [(2, 1, "2"), (4, 1, "4"), (4, 2, "2"), (3, 2, "2"), (8, 3, "3")],
)
def test_ranks_sharing_gpus_see_the_lease_in_order_and_take_rank_mod_g(
    world_size: int, gpus: int, most: str
) -> None:
    lease = LEASE[:gpus]
    bound = []
    for rank in range(world_size):
        env = spawn.rank_env(rank, world_size, 29500, lease)
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(lease)
        assert env["NCCL_MULTI_RANK_GPU_ENABLE"] == "1"
        assert env["HARNESS_RANKS_PER_GPU"] == most
        assert "HARNESS_GPUS_PER_RANK" not in env
        assert devices.own_device(rank, gpus) == rank % gpus
        bound.append(_nccl2_binds(env))
    assert bound == [lease[rank % gpus] for rank in range(world_size)]
    assert max(bound.count(gpu) for gpu in lease) == int(most)


def test_a_lease_of_another_size_is_seen_in_order_by_every_rank() -> None:
    # --dist-mptc's lease of a test's own minimum: 3 GPUs for 2 ranks.
    envs = [spawn.rank_env(rank, 2, 29500, ("4", "5", "6")) for rank in range(2)]
    assert {env["CUDA_VISIBLE_DEVICES"] for env in envs} == {"4,5,6"}
    assert all("HARNESS_GPUS_PER_RANK" not in env for env in envs)
    assert all("NCCL_MULTI_RANK_GPU_ENABLE" not in env for env in envs)


def test_without_a_lease_nothing_of_it_is_set() -> None:
    env = spawn.rank_env(1, 2, 29500)
    assert not {"CUDA_VISIBLE_DEVICES", "HARNESS_GPUS", "HARNESS_GPUS_PER_RANK"} & set(env)
    assert spawn.rank_env(1, 2, 29500, cuda=False)["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize(
    ("gpus", "rank", "world_size", "message"),
    [
        ((), 0, 2, "a world's lease holds at least one GPU, got none"),
        (("0",), 2, 2, "rank 2 is not a rank of a world of 2"),
    ],
)
def test_a_lease_env_that_cannot_be_is_refused(
    gpus: tuple[str, ...], rank: int, world_size: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        devices.lease_env(gpus, rank, world_size)


# ---------------------------------------------------------------- what the rank reads back


@pytest.fixture
def cuda_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA available with 8 devices, as far as the device choice asks."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)


@pytest.mark.usefixtures("cuda_shown")
@pytest.mark.parametrize(("world_size", "gpus"), [(2, 4), (4, 2), (2, 2)])
def test_the_rank_side_first_gpu_is_the_one_nccl2_binds(
    monkeypatch: pytest.MonkeyPatch, world_size: int, gpus: int
) -> None:
    for rank in range(world_size):
        env = spawn.rank_env(rank, world_size, 29500, LEASE[:gpus])
        for name in ("HARNESS_GPUS", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"):
            monkeypatch.setenv(name, env[name])
        first = identity.first_gpu()
        assert first is not None
        assert env["CUDA_VISIBLE_DEVICES"].split(",")[first] == _nccl2_binds(env)


def test_no_first_gpu_without_a_lease_or_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARNESS_GPUS", raising=False)
    assert identity.first_gpu() is None
    monkeypatch.setenv("HARNESS_GPUS", "0,1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert identity.first_gpu() is None


@pytest.mark.usefixtures("cuda_shown")
def test_init_takes_local_rank_mod_device_count_where_ranks_share_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)
    with pytest.raises(ValueError, match=r"LOCAL_RANK=3 is not a visible CUDA device"):
        state._select_device(None, True)
    monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1")
    assert state._select_device(None, True) == torch.device("cuda", 1)
    assert state._select_device("cuda", True) == torch.device("cuda", 1)
    assert state._select_device(0, True) == torch.device("cuda", 0)  # given: as given


@pytest.mark.parametrize(
    ("backend", "binds"),
    [
        ("nccl", True),
        ("NCCL", True),
        ("nccl-legacy", True),
        ("nccl2", True),
        ("nccl-lazy", True),
        ("cpu:gloo,cuda:nccl", True),
        ("gloo", False),
        ("cpu:gloo", False),
        ("ucc", False),
    ],
)
def test_init_binds_its_device_to_every_nccl_backend(backend: str, binds: bool) -> None:
    assert state.binds_device(backend) is binds
