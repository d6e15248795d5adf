"""fhelium.distributed.init against real Gloo process groups, each case in a fresh process.

The code under test runs in child processes made by ``_fresh`` (its docstring says why a
child is a fresh interpreter as far as torch.distributed is concerned); what the children do
is in ``_init_children``, and the tests here assert on what they observed.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import _fresh
import _init_children as children
import pytest
import torch
import torch.distributed as dist
from _fresh import Outcome

WORLD_OF_ONE = {
    "initialized": True,
    "backend": "gloo",
    "world_size": 1,
    "rank": 0,
    "store": "HashStore",
    "group_count": 1,
}


def world_of_two(rank: int) -> dict[str, Any]:
    return {**WORLD_OF_ONE, "world_size": 2, "rank": rank, "store": "FileStore"}


def check_collectives(result: dict[str, Any], world: int) -> None:
    total = float(sum(r + 1 for r in range(world)))
    assert result["sync_returns"] is None
    assert result["sync_value"] == total
    assert result["work_is_work"] is True
    assert result["wait_returned"] is True
    assert result["work_completed"] is True
    assert result["async_value"] == total
    assert result["future_value"] == [total]
    assert result["broadcast"] == 10.0
    assert result["gathered"] == [float(r) for r in range(world)]


def check_recovery(recovery: dict[str, Any]) -> None:
    """Decision 4: after the failure, a corrected init in the same process works."""
    assert recovery["state"] == WORLD_OF_ONE
    assert recovery["sum"] == 2.0
    assert recovery["after_shutdown"] is False


def names_rank_and_world(message: str, rank: int, world_size: int) -> bool:
    return bool(
        re.search(rf"\brank\b\D{{0,12}}\b{rank}\b", message, re.IGNORECASE)
        and re.search(rf"\bworld[ _]size\b\D{{0,12}}\b{world_size}\b", message, re.IGNORECASE)
    )


def mentions(message: str, word: str) -> bool:
    """``word`` occurs in ``message``; a number only as a whole number (5 is not in 15)."""
    if re.fullmatch(r"-?\d+", word):
        return re.search(rf"(?<![\w.-]){re.escape(word)}(?![\w.])", message) is not None
    return word in message


# --------------------------------------------------------------------------- direct launch


def test_direct_world_size_one_launch_needs_no_environment() -> None:
    result = _fresh.run(children.direct_launch)
    assert result["env"] == dict.fromkeys(("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"))
    assert result["before"] is False
    assert result["returned"] is None
    assert result["state"] == WORLD_OF_ONE
    assert result["world_is_group"] is True
    check_collectives(result["collectives"], world=1)
    assert result["local_device"] == torch.device("cpu")


def test_explicit_gloo_backend() -> None:
    result = _fresh.run(children.explicit_gloo)
    assert result["returned"] is None
    assert result["state"] == WORLD_OF_ONE
    check_collectives(result["collectives"], world=1)


def test_init_again_after_shutdown_in_the_same_process() -> None:
    cycles = _fresh.run(children.reinit_cycles, 4)
    assert len(cycles) == 4
    for cycle in cycles:
        assert cycle["returned"] is None
        assert cycle["state"] == WORLD_OF_ONE
        assert cycle["sum"] == 5.0
        assert cycle["after"] is False


# --------------------------------------------------------------------------- timeout


def test_timeout_reaches_the_gloo_backend() -> None:
    assert _fresh.run(children.gloo_timeout_option, 7.0) == timedelta(seconds=7)


def test_timeout_is_the_collective_timeout(tmp_path: Path) -> None:
    """With timeout=2 s, an all_reduce that the other rank never joins fails after ~2 s.

    Had the timeout not been forwarded, Gloo's default (30 minutes) would apply and the
    helper would kill the child after its own 60 s instead.
    """
    rank0, _ = _fresh.run_world(children.collective_times_out, 2, str(tmp_path / "store"))
    outcome: Outcome = rank0["outcome"]
    assert outcome.raised, "all_reduce without the other rank should have timed out"
    assert 1.5 <= outcome.elapsed < 50, outcome


# --------------------------------------------------------------------------- pg_options


def test_pg_options_are_forwarded() -> None:
    result = _fresh.run(children.pg_options_reach_the_backend)
    assert result == {
        "returned": None,
        "same_options": True,
        "rank_size": (0, 1),
        "backend": "fhtest",
        "sum": [1.0, 1.0],
    }


# --------------------------------------------------------------------------- two-rank worlds


def test_supplied_store_two_ranks(tmp_path: Path) -> None:
    results = _fresh.run_world(children.with_store, 2, str(tmp_path / "filestore"))
    for rank, result in enumerate(results):
        assert result["returned"] is None
        assert result["state"] == {
            **WORLD_OF_ONE,
            "world_size": 2,
            "rank": rank,
            "store": "FileStore",
        }
        assert result["same_store"] is True
        assert result["again"] is None
        assert result["again_warnings"] == []
        assert result["state_again"] == result["state"]
        check_collectives(result["collectives"], world=2)
        assert result["after"] is False


@pytest.mark.parametrize("from_env", [False, True], ids=["arguments", "WORLD_SIZE-RANK-env"])
def test_supplied_init_method_two_ranks(tmp_path: Path, from_env: bool) -> None:
    url = (tmp_path / "rendezvous").as_uri()
    assert url.startswith("file://")
    env_for = (lambda rank: {"WORLD_SIZE": "2", "RANK": str(rank)}) if from_env else None
    results = _fresh.run_world(children.with_init_method, 2, url, from_env, rank_env=env_for)
    for rank, result in enumerate(results):
        assert result["returned"] is None
        assert result["state"] == {
            **WORLD_OF_ONE,
            "world_size": 2,
            "rank": rank,
            "store": "FileStore",
        }
        check_collectives(result["collectives"], world=2)


# --------------------------------------------------------------------------- Decision 5


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port that is taken: a TCPStore server could not listen on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"WORLD_SIZE": "1"},
        {"WORLD_SIZE": "1", "RANK": "0"},
        {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"},
    ],
    ids=["no-env", "WORLD_SIZE=1", "WORLD_SIZE=1-RANK=0", "torchrun-like-busy-port"],
)
def test_world_size_one_uses_a_hashstore(
    tmp_path: Path, env: dict[str, str], busy_port: int
) -> None:
    """Decision 5: no init_method, no store, world size 1 -> a HashStore, never env://.

    Without MASTER_ADDR an env:// rendezvous would raise; in the last case MASTER_ADDR and
    MASTER_PORT name a port that is taken, so a TCPStore server on rank 0 could not start.
    """
    if "MASTER_ADDR" in env:
        env = {**env, "MASTER_PORT": str(busy_port)}
    result = _fresh.run(children.store_kind, "default", str(tmp_path), env=env)
    assert result["state"] == WORLD_OF_ONE
    assert result["sum"] == 1.0


@pytest.mark.parametrize("kind", ["init_method", "store", "hashstore-supplied"])
def test_world_size_one_with_init_method_or_store_uses_it(tmp_path: Path, kind: str) -> None:
    """Decision 5, the other half: a given init_method or store is what PyTorch uses."""
    result = _fresh.run(children.store_kind, kind, str(tmp_path))
    expected = {"init_method": "FileStore", "store": "FileStore", "hashstore-supplied": "HashStore"}
    assert result["state"] == {**WORLD_OF_ONE, "store": expected[kind]}
    assert result["is_supplied"] is (kind != "init_method")
    assert result["sum"] == 1.0


# --------------------------------------------------------------------------- environment


@pytest.mark.parametrize(
    "env",
    [
        {"WORLD_SIZE": "abc", "RANK": "xyz"},
        {"WORLD_SIZE": "", "RANK": ""},
        {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
    ],
    ids=["bad-values", "empty-values", "a-two-rank-launch"],
)
def test_environment_is_read_only_for_minus_one(tmp_path: Path, env: dict[str, str]) -> None:
    """Decision 2: explicit world_size/rank win; the environment is not even parsed."""
    result = _fresh.run(children.store_kind, "explicit", str(tmp_path), env=env)
    assert result["state"] == WORLD_OF_ONE
    assert result["sum"] == 1.0


@pytest.mark.parametrize(
    "env",
    [{"LOCAL_RANK": "not-a-number"}, {"LOCAL_RANK": "7"}, {"WORLD_SIZE": "1"}, {"RANK": "0"}],
    ids=["LOCAL_RANK=garbage", "LOCAL_RANK=7", "WORLD_SIZE=1-only", "RANK=0-only"],
)
def test_environment_resolution_of_a_world_of_one(tmp_path: Path, env: dict[str, str]) -> None:
    """Decision 2: a missing variable means the direct-launch value; LOCAL_RANK is read only
    when CUDA picks the device, so without CUDA any value of it is ignored."""
    result = _fresh.run(children.store_kind, "default", str(tmp_path), env=env)
    assert result["state"] == WORLD_OF_ONE


# --------------------------------------------------------------------------- failures

# MASTER_ADDR/MASTER_PORT that no rendezvous could use: a check that came after an env://
# rendezvous would hang (rank > 0 connecting) or fail differently, not raise ValueError.
_NO_RENDEZVOUS = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}

VALUE_ERRORS = [
    # (id, env, kwargs, what the message must mention)
    ("WORLD_SIZE=abc", {"WORLD_SIZE": "abc"}, {}, ["WORLD_SIZE", "'abc'"]),
    ("WORLD_SIZE=-1", {"WORLD_SIZE": "-1"}, {}, ["WORLD_SIZE", "'-1'"]),
    ("WORLD_SIZE=1.5", {"WORLD_SIZE": "1.5"}, {}, ["WORLD_SIZE", "'1.5'"]),
    ("RANK=empty", {"RANK": ""}, {}, ["RANK", "''"]),
    ("RANK=abc", {"WORLD_SIZE": "2", "RANK": "abc"}, {}, ["RANK", "'abc'"]),
    ("WORLD_SIZE=abc-rank-given", {"WORLD_SIZE": "abc"}, {"rank": 0}, ["WORLD_SIZE", "'abc'"]),
    ("RANK=abc-world_size-given", {"RANK": "abc"}, {"world_size": 1}, ["RANK", "'abc'"]),
    ("rank=5-world_size=2", _NO_RENDEZVOUS, {"rank": 5, "world_size": 2}, ["5", "2"]),
    ("rank=2-world_size=2", _NO_RENDEZVOUS, {"rank": 2, "world_size": 2}, ["2"]),
    ("world_size=0", {}, {"world_size": 0}, ["0"]),
    ("world_size=-2-rank=0", {}, {"world_size": -2, "rank": 0}, ["-2", "0"]),
    ("rank=-2", {}, {"rank": -2}, ["-2", "1"]),
    ("rank=1-direct", {}, {"rank": 1}, ["1"]),
    ("env-RANK=3-WORLD_SIZE=2", {**_NO_RENDEZVOUS, "WORLD_SIZE": "2", "RANK": "3"}, {}, ["3", "2"]),
    ("env-WORLD_SIZE=0", {"WORLD_SIZE": "0"}, {}, ["0"]),
    ("device_id=0", {}, {"device_id": 0}, ["0"]),
    ("device_id=1", {}, {"device_id": 1}, ["1"]),
    ("device_id=-1", {}, {"device_id": -1}, ["-1"]),
    ("device_id=cuda:0", {}, {"device_id": "cuda:0"}, ["cuda:0"]),
    ("device_id=cuda", {}, {"device_id": "cuda"}, ["cuda"]),
    ("device_id=torch.device-cuda-0", {}, {"device_id": torch.device("cuda", 0)}, ["cuda"]),
    ("device_id=meta", {}, {"device_id": "meta"}, ["meta"]),
    ("device_id=not-a-device", {}, {"device_id": "not-a-device"}, ["not-a-device"]),
]


@pytest.mark.parametrize(
    ("env", "kwargs", "words"),
    [pytest.param(env, kwargs, words, id=id_) for id_, env, kwargs, words in VALUE_ERRORS],
)
def test_value_errors_leave_nothing_behind(
    env: dict[str, str], kwargs: dict[str, Any], words: list[str]
) -> None:
    """Decisions 1-4: a ValueError (never a RuntimeError, never a hang), then a fixed init works."""
    result = _fresh.run(children.failing_then_fixed, kwargs, env=env, timeout=30)
    outcome: Outcome = result["outcome"]
    assert outcome.exc_type == "ValueError", outcome
    assert not outcome.is_a("RuntimeError"), outcome
    for word in words:
        assert mentions(outcome.message, word), (word, outcome.message)
    assert outcome.elapsed < 15, "argument checks must come before any rendezvous"
    assert result["initialized_after"] is False
    assert result["groups_after"] == 0
    check_recovery(result["recovery"])


TYPE_ERRORS = [
    ("device_id=1.5", {"device_id": 1.5}),
    ("device_id=list", {"device_id": [0]}),
    ("device_id=dict", {"device_id": {"type": "cpu"}}),
    ("world_size=str", {"world_size": "2"}),
    ("rank=float", {"rank": 0.0}),
    ("backend=int", {"backend": 1}),
    ("timeout=int", {"timeout": 5}),
]


@pytest.mark.parametrize("kwargs", [pytest.param(kwargs, id=id_) for id_, kwargs in TYPE_ERRORS])
def test_type_errors_leave_nothing_behind(kwargs: dict[str, Any]) -> None:
    result = _fresh.run(children.failing_then_fixed, kwargs)
    outcome: Outcome = result["outcome"]
    assert outcome.exc_type == "TypeError", outcome
    assert result["initialized_after"] is False
    check_recovery(result["recovery"])


def test_init_method_and_store_together_is_a_value_error(tmp_path: Path) -> None:
    result = _fresh.run(children.init_method_and_store, str(tmp_path))
    outcome: Outcome = result["outcome"]
    assert outcome.exc_type == "ValueError", outcome
    assert "init_method" in outcome.message
    assert "store" in outcome.message
    assert result["initialized_after"] is False
    assert result["rendezvous_file_created"] is False
    check_recovery(result["recovery"])


def _unusable_backends() -> list[Any]:
    params = [pytest.param("no-such-backend", "AssertionError", id="unknown-backend")]
    for name, built in (("mpi", dist.is_mpi_available()), ("nccl", dist.is_nccl_available())):
        marks = pytest.mark.skipif(built, reason=f"{name} is built into this torch")
        params.append(pytest.param(name, None, id=f"{name}-not-built", marks=marks))
    return params


@pytest.mark.parametrize(("backend", "cause"), _unusable_backends())
def test_pytorch_failure_is_a_chained_runtime_error(backend: str, cause: str | None) -> None:
    """Decision 4: unknown or unbuilt backend -> RuntimeError naming backend, rank, world size."""
    result = _fresh.run(children.failing_then_fixed, {"backend": backend})
    outcome: Outcome = result["outcome"]
    assert outcome.exc_type == "RuntimeError", outcome
    assert backend in outcome.message
    assert names_rank_and_world(outcome.message, 0, 1), outcome.message
    assert outcome.cause_type is not None, "the PyTorch error must be chained as __cause__"
    if cause is not None:
        assert outcome.cause_type == cause
    assert result["initialized_after"] is False
    assert result["groups_after"] == 0
    check_recovery(result["recovery"])


def test_env_rendezvous_failure_is_a_runtime_error() -> None:
    """WORLD_SIZE=2 without MASTER_ADDR: PyTorch's env:// error, surfaced as RuntimeError."""
    env = {"WORLD_SIZE": "2", "RANK": "1"}
    result = _fresh.run(children.failing_then_fixed, {"backend": "gloo"}, env=env)
    outcome: Outcome = result["outcome"]
    assert outcome.exc_type == "RuntimeError", outcome
    assert "gloo" in outcome.message
    assert names_rank_and_world(outcome.message, 1, 2), outcome.message
    assert outcome.cause_type is not None
    assert "MASTER_ADDR" in outcome.message + outcome.cause_message
    assert result["initialized_after"] is False
    check_recovery(result["recovery"])


@pytest.mark.parametrize("how", ["store", "init_method"])
def test_store_timeout_is_a_runtime_error(tmp_path: Path, how: str) -> None:
    """Rank 1 of 2 never joins: after the 1 s timeout, a RuntimeError and nothing left."""
    (result,) = _fresh.run_world(children.alone_in_a_world_of_two, 2, str(tmp_path), how, ranks=[0])
    outcome: Outcome = result["outcome"]
    assert outcome.exc_type == "RuntimeError", outcome
    assert "gloo" in outcome.message
    assert names_rank_and_world(outcome.message, 0, 2), outcome.message
    assert outcome.cause_type is not None
    assert 0.5 <= outcome.elapsed < 30, outcome
    assert result["initialized_after"] is False
    assert result["groups_after"] == 0
    check_recovery(result["recovery"])


# --------------------------------------------------------------------------- device_id


@pytest.mark.parametrize(
    "device_id",
    ["cpu", torch.device("cpu"), "cpu:0", None],
    ids=["str-cpu", "torch.device-cpu", "cpu:0", "None"],
)
def test_cpu_device_id_is_accepted_without_cuda(device_id: Any) -> None:
    result = _fresh.run(children.with_device_id, device_id)
    assert result["returned"] is None
    assert result["state"] == WORLD_OF_ONE
    assert result["local_device"] == torch.device("cpu")
    assert result["bound"] is None  # Decision 7: no device is bound for Gloo


# --------------------------------------------------------------------------- Decision 6


def test_init_when_already_initialized_is_a_no_op_that_warns_on_mismatch() -> None:
    result = _fresh.run(children.already_initialized)
    calls = result["calls"]
    for label, _ in children.ALREADY_INITIALIZED_CALLS:
        assert calls[label]["returned"] is None, label
        assert calls[label]["same_group"] is True, label
        assert calls[label]["state"] == WORLD_OF_ONE, label
    for label in ("defaults", "same-explicit", "device-cpu"):
        assert calls[label]["warnings"] == [], label
    for label, words in [
        ("other-backend", ["nccl"]),
        ("other-world-size", ["2"]),
        ("other-rank", ["1"]),
        ("all-different", ["mpi", "3", "2"]),
    ]:
        (warning,) = calls[label]["warnings"]
        category, message, filename = warning
        assert category == "UserWarning", label
        for word in words:
            assert mentions(message, word), (label, message)
        assert filename == result["file"], "the warning should point at the caller of init"
    assert calls["bad-env"] == {"returned": None, "warnings": []}
    assert result["sum"] == 1.0


def test_already_initialized_two_ranks(tmp_path: Path) -> None:
    results = _fresh.run_world(
        children.already_initialized_two_ranks, 2, str(tmp_path / "filestore")
    )
    for rank, result in enumerate(results):
        (message,) = result["warnings"]
        assert mentions(message, str((rank + 1) % 2)), message
        assert result["sum"] == 2.0
