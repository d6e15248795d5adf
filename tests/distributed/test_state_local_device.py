"""fhelium.distributed.local_device without CUDA (see test_state_cuda.py for CUDA)."""

from __future__ import annotations

from pathlib import Path

import _fresh
import _local_device_children as children
import pytest
import torch

from fhelium.distributed import local_device

CPU = torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is visible to the test process")
def test_in_the_test_process() -> None:
    device = local_device()
    assert isinstance(device, torch.device)
    assert device == CPU


@pytest.mark.parametrize(
    "env",
    [{}, {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "2"}, {"LOCAL_RANK": "garbage"}],
    ids=["direct", "launcher-env", "bad-LOCAL_RANK"],
)
def test_before_init_is_cpu_and_initializes_nothing(env: dict[str, str]) -> None:
    result = _fresh.run(children.before_init, env=env)
    assert result == {"device": CPU, "initialized": False}


def test_around_a_world_of_one() -> None:
    assert _fresh.run(children.around_a_world_of_one) == [CPU, CPU, CPU]


def test_world_size_does_not_affect_the_result(tmp_path: Path) -> None:
    results = _fresh.run_world(children.in_a_world, 2, str(tmp_path / "filestore"))
    assert results == [{"device": CPU, "sum": 2.0}] * 2
