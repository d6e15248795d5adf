"""Shadow worlds through pytest: a test's body on every rank of a larger simulated world after
its real run passed, every group's collectives compared. Real Gloo ranks for the real run,
real simulated ranks (processes forked from the host) for the shadows; small sizes here (the
1,024-rank runs are the how-to's examples and the benchmark's)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from plugin_testutil import assert_no_internal_frames, reports

import harness
from harness.timeline.folder import folder_name


def failures(result: pytest.RunResult) -> dict[str, str]:
    """Each failed test's report, by name (a marker's error fails the setup phase, the
    shadow worlds' the call)."""
    found = {}
    for when in ("setup", "call"):
        for name, report in reports(result, when).items():
            if report.failed:
                found[name] = str(report.longrepr)
    return found


# Four bugs a real world of 2 or 4 ranks does not show, at sizes small enough for the suite.
PLANTED = """
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh


@pytest.mark.distributed(world_size=2, shadow=[8])
def test_empty_shard(rank, world_size):
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    shard = torch.randn(3, 4)[rank::world_size]
    if len(shard) == 0:
        return  # no data: DDP's gradient all_reduce is skipped on this rank
    model(shard).sum().backward()


@pytest.mark.distributed(world_size=2, shadow=[8])
def test_tp_above_4(world_size):
    tp = 2 if world_size > 4 else 1
    if world_size % tp:
        raise ValueError(f"{world_size} ranks do not make whole tp groups of {tp}")
    mesh = init_device_mesh("cpu", (world_size // tp, tp), mesh_dim_names=("dp", "tp"))
    grad = torch.ones(2)
    dist.all_reduce(grad, group=mesh.get_group("dp"))
    if tp > 1 and mesh.get_local_rank("tp") == 0:
        dist.all_reduce(grad, group=mesh.get_group("tp"))


@pytest.mark.distributed(world_size=2, shadow=[8])
def test_group_order(rank, world_size):
    nodes = [list(range(s, min(s + 2, world_size))) for s in range(0, world_size, 2)]
    mine = rank // 2
    groups = [dist.new_group(r) for r in [nodes[mine], *nodes[:mine], *nodes[mine + 1 :]]]
    dist.all_reduce(torch.ones(1), group=groups[0])


@pytest.mark.distributed(world_size=2, shadow=[8])
def test_below_4(rank):
    loss = torch.ones(1)
    dist.all_reduce(loss)
    if rank < 4:
        dist.all_reduce(loss)
"""


def test_four_planted_bugs_are_found_with_their_smallest_size(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=4)
    found = failures(result)
    expected = {
        "test_empty_shard": (
            4,
            "ranks 3-7 finished the call after #3; ranks 0-2 went on to #4 "
            "(all_reduce(float32[5]) in backward (DDP) at test_planted.py:14)",
        ),
        "test_tp_above_4": (6, "on the group of ranks 0, 1"),
        "test_group_order": (3, "group creation #1 differs (every rank makes every group"),
        "test_below_4": (5, "ranks 4-7 finished the call after #1; ranks 0-3 went on"),
    }
    for test, (smallest, verdict) in expected.items():
        text = found[test]
        first = text.splitlines()[0]
        assert first.startswith("ShadowMismatch: in a shadow world of 8 ranks"), text
        assert f"the smallest shadow world that shows it has {smallest} ranks" in first, text
        assert verdict in text, text
        assert_no_internal_frames(text)
    result.stdout.fnmatch_lines(
        [
            "*harness: shadow worlds*",
            "test_planted.py::test_below_4: shadow worlds: 2 (as the real run): agrees; "
            "8: differs (*s)",
        ]
    )
    # Size 5 cannot run the mesh of tp 2: stepped over, and said.
    assert "the body cannot run at 5 ranks" in found["test_tp_above_4"]


STEPS = """
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import harness


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


@pytest.mark.distributed(world_size=2, shadow=[8])
def test_ddp():
    model = nn.parallel.DistributedDataParallel(_mlp())
    model(torch.randn(4, 8)).sum().backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()


@pytest.mark.distributed(world_size=2, shadow=[8])
def test_fsdp2():
    from torch.distributed.fsdp import fully_shard

    model = _mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    model(torch.randn(4, 8)).sum().backward()


@pytest.mark.distributed(world_size=4, shadow=[16])
def test_dtensor(world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size // 2, 2), mesh_dim_names=("dp", "tp"))
    full = torch.arange(64.0).reshape(16, 4)
    y = distribute_tensor(full, mesh, [Shard(0), Shard(1)]).redistribute(
        mesh, [Replicate(), Replicate()]
    )
    if not harness.shadow():
        assert torch.equal(y.to_local(), full)


@pytest.mark.distributed(world_size=2, shadow=[8])
def test_what_a_shadow_rank_sees(rank, world_size):
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [world_size] * 2  # SUM: as if every rank held this rank's ones
    assert dist.get_world_size() == world_size and dist.get_rank() == rank
    if world_size == 8:
        assert harness.shadow()
    gathered = [torch.zeros(1) for _ in range(world_size)]
    dist.all_gather(gathered, torch.tensor([float(rank)]))
    if harness.shadow():
        assert [g.item() for g in gathered] == [float(rank)] * world_size
    work = dist.all_reduce(torch.ones(1), async_op=True)
    assert work.wait() and work.get_future().value()[0].item() == world_size
    assert dist.get_backend() == "gloo"
    dist.monitored_barrier()  # Gloo's alone
    objects = [None] * world_size
    dist.all_gather_object(objects, {"rank": rank})
    if harness.shadow():
        assert objects == [{"rank": rank}] * world_size


@pytest.mark.distributed(world_size=2)
def test_a_real_rank_is_no_shadow():
    assert not harness.shadow()
"""


def test_correct_ddp_fsdp2_and_dtensor_steps_pass(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_steps=STEPS)
    result = pytester.runpytest("-p", "no:randomly", "-W", "ignore::RuntimeWarning")
    result.assert_outcomes(passed=5)
    assert not harness.shadow()
    result.stdout.fnmatch_lines(
        [
            "*harness: shadow worlds*",
            "test_steps.py::test_ddp: shadow worlds: 2 (as the real run): agrees; 8: agrees (*s)",
            "test_steps.py::test_fsdp2: shadow worlds: 2 (as the real run): agrees; 8: agrees*",
            "test_steps.py::test_dtensor: shadow worlds: 4 (as the real run): agrees; 16: agrees*",
        ]
    )


ODD = """
import os
import time
import pytest
import torch
import torch.distributed as dist
import harness
from harness import faults


@pytest.mark.distributed(world_size=2, shadow=[8])
def test_data_dependent(rank):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    if t.item() == 1:
        dist.barrier()


@pytest.mark.distributed(world_size=2, shadow=[8])
def test_raises_in_the_shadow(rank, world_size):
    dist.barrier()
    if world_size > 2 and rank in (3, 6):
        raise ValueError(f"rank {rank} has no data")


@pytest.mark.distributed(world_size=2, shadow=[8])
def test_dies_in_the_shadow(rank, world_size):
    if world_size > 2 and rank == 5:
        print("rank 5 about to abort")
        os.abort()


@pytest.mark.distributed(world_size=2, shadow=[4], timeout=10)
def test_hangs_in_the_shadow(rank, world_size):
    if world_size > 2 and rank == 3:
        time.sleep(3600)


@pytest.mark.distributed(world_size=2, shadow=[8])
def test_skips_in_the_shadow(world_size):
    if world_size > 2:
        pytest.skip("not at this size")


@pytest.mark.distributed(world_size=2, shadow=[8])
def test_skips_in_every_shadow():
    if harness.shadow():
        pytest.skip("not in a shadow")


@pytest.mark.distributed(world_size=2, init=False, shadow=[8])
def test_own_group(rank):
    dist.init_process_group("gloo")
    pair = dist.new_group([0, 1])
    if rank < 2:
        dist.all_reduce(torch.ones(1), group=pair)
    dist.destroy_process_group()


@pytest.mark.distributed(world_size=2, shadow=[1])
def test_too_small():
    pass


@pytest.mark.distributed(world_size=2, shadow=["64"])
def test_not_an_int():
    pass


@pytest.mark.distributed(world_size=2, shadow=[8], faults=[faults.kill(1, at=1)])
def test_with_faults():
    dist.barrier()
"""


def test_what_is_no_desync_reads_as_what_it_is(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_odd=ODD)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=3, failed=7)
    found = failures(result)
    unfaithful = (
        "ShadowUnfaithful: the shadow of the real world (2 ranks) did not issue what the "
        "real run did, so no larger shadow can say anything true of this test: rank 0's "
        "collective #2 was barrier() at test_odd.py:15 in the real run, none in the shadow "
        "of the same size."
    )
    assert found["test_data_dependent"][: len(unfaithful)] == unfaithful
    raised = found["test_raises_in_the_shadow"]
    assert raised.startswith(
        "RankError: in a shadow world of 8 ranks, rank 3 raised ValueError: rank 3 has no data"
    )
    assert 'test_odd.py", line 22, in test_raises_in_the_shadow' in raised
    assert_no_internal_frames(raised)
    assert "harness/shadows/" not in raised
    died = found["test_dies_in_the_shadow"]
    assert died.startswith(
        "RankCrash: in a shadow world of 8 ranks, rank 5 was killed by SIGABRT (exit code -6)"
    )
    assert "rank 5 about to abort" in died  # its output's end, and its stack
    assert 'test_odd.py", line 29 in test_dies_in_the_shadow' in died
    hung = found["test_hangs_in_the_shadow"]
    assert hung.startswith("WorldTimeout: in a shadow world of 4 ranks, rank 3 did not finish")
    assert 'test_odd.py", line 35 in test_hangs_in_the_shadow' in hung  # where it was
    assert "test_own_group" not in found  # a group of its own, on the shadow's backend
    assert "shadow size 1 is smaller than the test's world (2 ranks)" in found["test_too_small"]
    assert "each shadow size must be an int >= 1, not '64'" in found["test_not_an_int"]
    assert "shadow=[8] on a test with faults" in found["test_with_faults"]
    result.stdout.fnmatch_lines(
        [
            "test_odd.py::test_data_dependent: shadow worlds: 2 (as the real run): not faithful*",
            "test_odd.py::test_skips_in_the_shadow: shadow worlds: 2 (as the real run): "
            "agrees; 8: skipped (not at this size)*",
            "test_odd.py::test_skips_in_every_shadow: shadow worlds: 2 (as the real run): "
            "skipped (not in a shadow)*",
        ]
    )


FLAGGED = """
import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2)
def test_flagged(rank):
    dist.all_reduce(torch.ones(1))
    if rank >= 2:
        dist.barrier()


@pytest.mark.distributed(world_size=2, shadow=False)
def test_opted_out(rank):
    if rank >= 2:
        dist.barrier()


@pytest.mark.distributed(world_size=4)
def test_bigger_than_the_flag(rank):
    pass
"""


def test_the_flag_adds_a_size_to_every_test(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_flag=FLAGGED)
    out = tmp_path / "traces"
    result = pytester.runpytest("-p", "no:randomly", "--dist-shadow=3", f"--dist-trace-dir={out}")
    result.assert_outcomes(passed=1, failed=2)
    found = failures(result)
    assert (
        "--dist-shadow=3 is smaller than the test's world (4 ranks)"
        in (found["test_bigger_than_the_flag"])
    )
    assert "in a shadow world of 3 ranks" in found["test_flagged"]
    assert "test_opted_out" not in found
    folder = out / folder_name("test_flag.py::test_flagged")
    assert {"shadow-2.txt", "shadow-3.txt"} <= set(os.listdir(folder))
    text = (folder / "shadow-3.txt").read_text()
    assert text.splitlines()[:2] == [
        "shadow world of 3 ranks (3 of them run)",
        "the default group:",
    ]
    assert "  ranks 0, 1: 1 collective" in text
    assert "  rank 2: 2 collectives" in text


def test_a_bad_flag_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_flag=FLAGGED)
    result = pytester.runpytest("-p", "no:randomly", "--dist-shadow=many")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dist-shadow must be an int >= 1, not 'many'*"])
