"""init/local_device with CUDA and NCCL. Skipped where CUDA is absent.

On a GPU machine, run just these with ``pytest tests/distributed/test_state_cuda.py``. The
two-GPU cases also need ``torch.cuda.device_count() >= 2``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _cuda_children as children
import _fresh
import _torchrun
import pytest
import torch
from _fresh import Outcome

CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if CUDA else 0

pytestmark = pytest.mark.skipif(not CUDA, reason="needs CUDA")
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices" if CUDA else "needs CUDA")


def cuda(index: int) -> torch.device:
    return torch.device("cuda", index)


def check_collectives(result: dict[str, Any]) -> None:
    assert result["sum"] == result["expected"]
    assert result["async_sum"] == result["expected"]
    assert result["waited"] is True


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"device_id": 0}, {"device_id": "cuda:0"}, {"device_id": cuda(0)}, {"device_id": "cuda"}],
    ids=["default", "int-0", "str-cuda:0", "torch.device", "cuda-without-index"],
)
def test_default_backend_is_nccl_on_cuda_local_rank(kwargs: dict[str, Any]) -> None:
    result = _fresh.run(children.init_and_report, kwargs, cuda=True)
    assert result["returned"] is None
    assert result["state"]["backend"] == "nccl"
    assert (result["state"]["world_size"], result["state"]["rank"]) == (1, 0)
    assert result["state"]["store"] == "HashStore"
    assert result["current"] == 0
    assert result["local_device"] == cuda(0)
    assert result["bound"] == cuda(0)  # Decision 7: NCCL gets the device
    check_collectives(result["collectives"])


@two_gpus
def test_local_rank_selects_the_device() -> None:
    result = _fresh.run(children.init_and_report, {}, env={"LOCAL_RANK": "1"}, cuda=True)
    assert result["current"] == 1
    assert result["local_device"] == cuda(1)
    assert result["bound"] == cuda(1)
    check_collectives(result["collectives"])


@two_gpus
def test_explicit_device_id_wins_over_local_rank() -> None:
    result = _fresh.run(
        children.init_and_report, {"device_id": 1}, env={"LOCAL_RANK": "0"}, cuda=True
    )
    assert result["current"] == 1
    assert result["bound"] == cuda(1)


def test_local_rank_is_not_read_when_device_id_is_given() -> None:
    """Decision 2: LOCAL_RANK is read only when CUDA picks the device."""
    env = {"LOCAL_RANK": "not-a-number"}
    result = _fresh.run(children.init_and_report, {"device_id": 0}, env=env, cuda=True)
    assert result["current"] == 0
    assert result["bound"] == cuda(0)


def test_gloo_with_cuda_selects_but_does_not_bind_the_device() -> None:
    result = _fresh.run(children.init_and_report, {"backend": "gloo"}, cuda=True)
    assert result["state"]["backend"] == "gloo"
    assert result["current"] == 0
    assert result["local_device"] == cuda(0)
    assert result["bound"] is None  # Decision 7: not passed for Gloo
    check_collectives(result["collectives"])


CUDA_VALUE_ERRORS = [
    ("cpu", {}, {"device_id": "cpu"}, "cpu"),
    ("torch.device-cpu", {}, {"device_id": torch.device("cpu")}, "cpu"),
    ("ordinal-out-of-range", {}, {"device_id": GPUS}, str(GPUS)),
    ("negative-ordinal", {}, {"device_id": -1}, "-1"),
    ("cuda:99", {}, {"device_id": "cuda:99"}, "99"),
    ("LOCAL_RANK-out-of-range", {"LOCAL_RANK": "99"}, {}, "LOCAL_RANK"),
    ("LOCAL_RANK=abc", {"LOCAL_RANK": "abc"}, {}, "LOCAL_RANK"),
]


@pytest.mark.parametrize(
    ("env", "kwargs", "word"),
    [pytest.param(env, kwargs, word, id=id_) for id_, env, kwargs, word in CUDA_VALUE_ERRORS],
)
def test_incompatible_device_id_is_a_value_error(
    env: dict[str, str], kwargs: dict[str, Any], word: str
) -> None:
    result = _fresh.run(children.failing_then_fixed, kwargs, env=env, cuda=True)
    outcome: Outcome = result["outcome"]
    assert outcome.exc_type == "ValueError", outcome
    assert word in outcome.message, outcome.message
    assert result["initialized_after"] is False
    assert result["recovered"]["backend"] == "nccl"


def test_local_device_is_the_current_cuda_device_before_init() -> None:
    result = _fresh.run(children.local_device_report, None, cuda=True)
    assert result == {"device": cuda(0), "current": 0, "initialized": False}


@two_gpus
def test_local_device_follows_the_current_device() -> None:
    result = _fresh.run(children.local_device_report, 1, cuda=True)
    assert result == {"device": cuda(1), "current": 1, "initialized": False}


@two_gpus
def test_already_initialized_still_applies_the_device() -> None:
    result = _fresh.run(children.device_applied_when_initialized, cuda=True)
    assert result["returned"] is None
    assert result["current"] == 1
    assert result["local_device"] == cuda(1)
    assert result["same_group"] is True
    assert result["bound"] == cuda(0)
    assert result["warnings"] == []


@two_gpus
def test_nccl_world_of_two(tmp_path: Path) -> None:
    results = _fresh.run_world(
        children.nccl_world,
        2,
        str(tmp_path / "filestore"),
        rank_env=lambda rank: {"LOCAL_RANK": str(rank)},
        cuda=True,
    )
    for rank, result in enumerate(results):
        assert result["state"]["backend"] == "nccl"
        assert (result["state"]["world_size"], result["state"]["rank"]) == (2, rank)
        assert result["current"] == rank
        assert result["bound"] == cuda(rank)
        assert result["local_device"] == cuda(rank)
        check_collectives(result["collectives"])
        assert result["shutdown"] is None
        assert result["after"] is False


def test_torchrun_with_cuda(tmp_path: Path) -> None:
    """``init()`` under torchrun picks NCCL and cuda:LOCAL_RANK."""
    nproc = min(GPUS, 2)
    proc = _torchrun.start(nproc, tmp_path, hide_cuda=False)
    try:
        returncode, output, results = _torchrun.finish(proc)
    finally:
        _torchrun.stop(proc)
    assert returncode == 0, output
    assert [r["rank"] for r in results] == list(range(nproc)), output
    for rank, result in enumerate(results):
        assert result["backend"] == "nccl"
        assert result["local_device"] == f"cuda:{rank}"
        assert result["sum"] == float(nproc * (nproc + 1) // 2)
        assert result["initialized_after"] is False
        if nproc == 1:
            assert result["store"] == "HashStore"
