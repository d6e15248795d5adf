"""The harness's ``"auto"`` backend is the one ``fhelium.distributed.init`` picks without a
``backend``: the harness reads that rule from init's documentation, not from its code."""

from __future__ import annotations

import pytest
import torch
from unit_testutil import fresh_python

from harness.controller.backends import resolve_backend, unavailable_reason

SCRIPT = """
import torch.distributed as dist

import fhelium.distributed as fd
from harness.controller.backends import resolve_backend, unavailable_reason

fd.init(world_size=1, rank=0)
print(dist.get_backend(), resolve_backend("auto"))
fd.shutdown()
"""


def test_auto_is_the_backend_init_picks_here() -> None:
    # A world of one: init needs no rendezvous (a private store), and no other process.
    # The last line: Gloo prints a line of its own as it makes the group (torch 2.8, 2.10).
    picked, auto = fresh_python(SCRIPT).splitlines()[-1].split()
    assert auto == picked


@pytest.mark.parametrize(("cuda", "expected"), [(True, "nccl"), (False, "gloo")])
def test_auto_follows_whether_cuda_is_available(
    monkeypatch: pytest.MonkeyPatch, cuda: bool, expected: str
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_backend("auto") == expected
    assert resolve_backend("AUTO") == expected
    assert resolve_backend("Gloo") == "gloo"


@pytest.mark.parametrize(
    ("world_size", "reason"),
    [(1, "needs 1 CUDA device, found 0"), (2, "needs 2 CUDA devices, found 0")],
)
def test_nccl_without_devices_says_how_many_it_needs(
    monkeypatch: pytest.MonkeyPatch, world_size: int, reason: str
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert unavailable_reason("nccl", world_size) == reason
