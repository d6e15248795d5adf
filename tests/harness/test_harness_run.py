"""harness.run and World.run on the happy path: results by rank, arguments, world sizes,
async work handles, the torchrun environment, the resolved backend and the rank pids."""

from __future__ import annotations

import harness_rankfns as fns
import pytest
import torch
from harness_testutil import BACKEND, alive

import harness


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_run_returns_one_result_per_rank_in_rank_order(world_size: int) -> None:
    results = harness.run(fns.rank_and_size, world_size=world_size, backend=BACKEND)
    assert results == [(rank, world_size) for rank in range(world_size)]


def test_eight_ranks_all_reduce() -> None:
    results = harness.run(fns.all_reduce_sum, world_size=8, backend=BACKEND, timeout=60)
    assert results == [36.0] * 8  # 1 + 2 + ... + 8 on every rank


def test_args_and_kwargs_reach_every_rank(world2: harness.World) -> None:
    payload = {"nested": [1, 2.5, "three"], "tensor": torch.arange(3)}
    results = world2.run(fns.echo, args=(1, "two", payload), kwargs={"key": "value", "n": None})
    assert [rank for rank, _, _ in results] == [0, 1]
    for _, args, kwargs in results:
        assert args[:2] == (1, "two")
        assert args[2]["nested"] == [1, 2.5, "three"]
        assert torch.equal(args[2]["tensor"], torch.arange(3))
        assert kwargs == {"key": "value", "n": None}


def test_args_accepts_any_iterable_and_kwargs_none(world2: harness.World) -> None:
    results = world2.run(fns.echo, args=iter([7, 8]), kwargs=None)
    assert results == [(0, (7, 8), {}), (1, (7, 8), {})]


def test_module_function_run_accepts_args_and_kwargs() -> None:
    results = harness.run(
        fns.echo, world_size=2, backend=BACKEND, args=("a",), kwargs={"b": 2}, timeout=60
    )
    assert results == [(0, ("a",), {"b": 2}), (1, ("a",), {"b": 2})]


def test_collective_results(world3: harness.World) -> None:
    assert world3.run(fns.all_reduce_sum) == [6.0, 6.0, 6.0]


def test_async_work_handles(world3: harness.World) -> None:
    results = world3.run(fns.async_collectives)
    assert results == [
        {"sum": 3.0, "broadcast": 42.0, "from_left": float((rank - 1) % 3)} for rank in range(3)
    ]


def test_world_size_one_has_a_process_group() -> None:
    with harness.World(1, backend=BACKEND) as world:
        assert world.run(fns.rank_and_size) == [(0, 1)]
        assert world.run(fns.all_reduce_sum) == [1.0]


def test_torchrun_environment(world3: harness.World) -> None:
    envs = world3.run(fns.torchrun_env)
    ports = {env["MASTER_PORT"] for env in envs}
    assert len(ports) == 1, "all ranks must see the same MASTER_PORT"
    port = ports.pop()
    assert port is not None
    assert port.isdigit()
    assert 0 < int(port) < 65536
    for rank, env in enumerate(envs):
        assert env["RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "3"
        assert env["LOCAL_RANK"] == str(rank)
        assert env["LOCAL_WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1"


def test_backend_is_resolved_never_auto() -> None:
    expected = "nccl" if torch.cuda.is_available() else "gloo"
    if expected == "nccl":
        pytest.skip("a CUDA machine resolves 'auto' to NCCL; the Gloo checks below need CPU")
    with harness.World(2) as world:
        assert world.backend == "gloo"
        assert world.run(fns.backend_name) == ["gloo", "gloo"]
    with harness.World(1, backend="GLOO") as world:
        assert world.backend == "gloo"


def test_explicit_gloo_backend(world2: harness.World) -> None:
    assert world2.backend == "gloo"
    assert world2.world_size == 2
    assert world2.run(fns.backend_name) == ["gloo", "gloo"]


def test_pids_are_valid_at_once_and_alive() -> None:
    with harness.World(2, backend=BACKEND) as world:
        pids = world.pids  # before any run
        assert len(pids) == 2
        assert len(set(pids)) == 2
        assert all(alive(pid) for pid in pids)
        assert world.run(fns.getpid) == pids


def test_reused_world_keeps_its_ranks(world2: harness.World) -> None:
    pids = world2.pids
    for _ in range(5):
        assert world2.run(fns.getpid) == pids
    assert world2.pids == pids
