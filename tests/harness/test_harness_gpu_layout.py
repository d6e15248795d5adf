"""A World's lease as its rank processes see it, on a machine without GPUs: the ids are
leased as given, and each rank's environment is what makes torch 2.15's NCCL (which binds
``LOCAL_RANK % device_count`` of ``CUDA_VISIBLE_DEVICES``) land on that rank's own GPU.
The layouts themselves are ``tests/unit/test_unit_gpu_layout.py``'s subject."""

from __future__ import annotations

import gpu_layout_rankfns as fns

import harness
from harness.controller.gpus import Lease


def _bound(seen: dict[str, str | None]) -> str:
    visible = str(seen["CUDA_VISIBLE_DEVICES"]).split(",")
    return visible[int(str(seen["LOCAL_RANK"])) % len(visible)]


def test_ranks_sharing_two_gpus_see_both_and_may_share() -> None:
    with harness.World(4, backend="gloo", init=False, gpus=Lease(("0", "1"), [])) as world:
        seen = world.run(fns.gpu_environ)
    assert [_bound(one) for one in seen] == ["0", "1", "0", "1"]
    for one in seen:
        assert one["CUDA_VISIBLE_DEVICES"] == one["HARNESS_GPUS"] == "0,1"
        assert (one["HARNESS_RANKS_PER_GPU"], one["NCCL_MULTI_RANK_GPU_ENABLE"]) == ("2", "1")
        assert one["HARNESS_GPUS_PER_RANK"] is None


def test_two_gpus_per_rank_put_each_ranks_own_at_local_rank() -> None:
    lease = Lease(("4", "5", "6", "7"), [])
    with harness.World(2, backend="gloo", init=False, gpus=lease) as world:
        seen = world.run(fns.gpu_environ)
    assert [one["CUDA_VISIBLE_DEVICES"] for one in seen] == ["4,5,6,7", "5,6,7,4"]
    assert [_bound(one) for one in seen] == ["4", "6"]
    assert {one["HARNESS_GPUS_PER_RANK"] for one in seen} == {"2"}
    assert {one["NCCL_MULTI_RANK_GPU_ENABLE"] for one in seen} == {None}
