"""What a shadow world costs: simulated ranks per second, and a 1,024-rank world's seconds.

Run by hand, never in CI (nothing here asserts on time)::

    python benchmarks/bench_shadow.py [--sizes 64,1024] [--bodies empty,ddp,fsdp2,dtensor]
    python benchmarks/bench_shadow.py --planted

``--planted`` runs, through pytest, the how-to's four planted bugs at the production sizes
they are scaled down from there (100 samples, a ``tp`` of 8 above 64 ranks, nodes of 8, 512
reporters), each with ``shadow=[1024]``, and prints pytest's output: each report, with the
smallest size that shows the bug, and the terminal summary's line per test with its time.

One host (``harness.World(1, init=False)``, as the plugin's) runs each body's shadow world of
each size, exactly as the plugin does after a test's real run (``harness.shadows.entry``):
every simulated rank forked from the host, as many at a time as this machine has cores. The
bodies, written into a temp module as a test file would hold them:

* ``empty``: a test body that does nothing: the floor, what a simulated rank costs itself
  (its fork, its world and groups, its report, its exit);
* ``ddp``: a DDP step (a 2-layer MLP: forward, backward, SGD step);
* ``fsdp2``: an FSDP2 step (``fully_shard`` on each layer and the model; forward,
  backward, step);
* ``dtensor``: a DTensor redistribute on a 2-D mesh (world / 8 x 8, ``dp`` x ``tp``): a
  tensor distributed ``[Shard(0), Shard(1)]`` and redistributed to ``[Replicate(),
  Replicate()]``;
* ``tp``: a tensor-parallel step on that mesh: an MLP parallelized colwise and rowwise on
  ``tp``, forward and backward (DTensor's sharding propagation, cold in every rank).

Each size of each body runs once after a warm-up run of 16 ranks (the host imports the
test's module and what the body imports on first use, as it would for a test's shadow of its
real size). The table shows, per run, its wall seconds and simulated ranks per second (what
a user waits for, at this machine's load), the CPU milliseconds one simulated rank costs
(its process's and the host's share, read from the kernel's accounting: what the load does
not change much), what a world of 1,024 would take at that cost on this machine's cores
alone, and whether every rank agreed (a correct step must).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import time

BODIES = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist
    import torch.nn as nn


    def test_empty():
        pass


    def _mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))


    def test_ddp():
        model = nn.parallel.DistributedDataParallel(_mlp())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 16)).sum().backward()
        optimizer.step()


    def test_fsdp2():
        from torch.distributed.fsdp import fully_shard

        model = _mlp()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 16)).sum().backward()
        optimizer.step()


    def test_dtensor():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        size = dist.get_world_size()
        mesh = init_device_mesh("cpu", (size // 8, 8), mesh_dim_names=("dp", "tp"))
        x = distribute_tensor(torch.randn(64, 16), mesh, [Shard(0), Shard(1)])
        x.redistribute(mesh, [Replicate(), Replicate()])


    def test_tp():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        size = dist.get_world_size()
        mesh = init_device_mesh("cpu", (size // 8, 8), mesh_dim_names=("dp", "tp"))
        model = parallelize_module(
            _mlp(), mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()}
        )
        model(torch.randn(4, 16)).sum().backward()
    """
)


PLANTED = textwrap.dedent(
    """
    import pytest
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh


    @pytest.mark.distributed(world_size=4, shadow=[1024])
    def test_empty_shard(rank, world_size):
        model = nn.Linear(8, 1)
        shard = torch.randn(100, 8)[rank::world_size]
        if len(shard) == 0:
            return
        model(shard).sum().backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)


    @pytest.mark.distributed(world_size=4, shadow=[1024])
    def test_tp_above_64(world_size):
        tp = 8 if world_size > 64 else 1
        if world_size % tp:
            raise ValueError(f"{world_size} ranks do not make whole tp groups of {tp}")
        grid = init_device_mesh("cpu", (world_size // tp, tp), mesh_dim_names=("dp", "tp"))
        grad = torch.ones(4)
        dist.all_reduce(grad, group=grid.get_group("dp"))
        if tp > 1 and grid.get_local_rank("tp") == 0:
            dist.all_reduce(grad, group=grid.get_group("tp"))


    @pytest.mark.distributed(world_size=4, shadow=[1024])
    def test_group_order(rank, world_size):
        nodes = [list(range(s, min(s + 8, world_size))) for s in range(0, world_size, 8)]
        mine = rank // 8
        groups = [dist.new_group(r) for r in [nodes[mine], *nodes[:mine], *nodes[mine + 1 :]]]
        dist.all_reduce(torch.ones(1), group=groups[0])


    @pytest.mark.distributed(world_size=2, shadow=[1024])
    def test_below_512(rank):
        loss = torch.ones(1)
        dist.all_reduce(loss)
        if rank < 512:
            dist.all_reduce(loss)
    """
)


def planted() -> int:
    """Run the four planted bugs at 1,024 ranks through pytest; its exit status."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "test_planted.py"), "w") as file:
            file.write(PLANTED)
        command = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider"]
        print(f"load average {os.getloadavg()[0]:.1f} at the start", flush=True)
        status = subprocess.call([*command, "-W", "ignore::RuntimeWarning", tmp], cwd=tmp)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return status


def measured(job: object) -> tuple[object, float]:
    """The host's run of ``job`` (as the plugin calls it), and the CPU seconds it took: the
    host's and every simulated rank's (each reaped by the host)."""
    import resource

    from harness.shadows import entry

    before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    run = entry.simulate(job)  # type: ignore[arg-type]
    after = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(
        (a.ru_utime + a.ru_stime) - (b.ru_utime + b.ru_stime)
        for a, b in zip(after, before, strict=True)
    )
    return run, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="64,1024", help="shadow sizes (64,1024)")
    parser.add_argument("--bodies", default="empty,ddp,fsdp2,dtensor,tp")
    parser.add_argument("--planted", action="store_true", help="the four planted bugs")
    args = parser.parse_args()
    if args.planted:
        # pytest fails each test (each bug is found): exit 1 is what is expected.
        sys.exit(0 if planted() == 1 else 2)
    sizes = [int(s) for s in args.sizes.split(",")]

    import torch

    import harness
    from harness.protocol.pytest_calls import FixturePlan, TestRef
    from harness.shadows import check
    from harness.shadows.records import ShadowJob

    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {cores} cores, load average {load:.1f} at the start")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, harness.World(1, init=False) as host:
        path = os.path.join(tmp, "shadow_bodies.py")
        with open(path, "w") as file:
            file.write(BODIES)
        for body in args.bodies.split(","):
            ref = TestRef("shadow_bodies", path, None, f"test_{body}", (tmp,), False)
            for size in [16, *sizes]:
                job = ShadowJob(ref, FixturePlan(()), size, 8, rank_timeout=600.0)
                print(f"{body}: {size} ranks ...", file=sys.stderr, flush=True)
                start = time.perf_counter()
                run, cpu = host.run(measured, args=(job,), timeout=3600)[0]
                seconds = time.perf_counter() - start
                if size == 16:
                    continue  # the warm-up
                failed = run.failed
                verdict = (
                    f"rank {failed.rank} failed: {failed.failure or failed.skip}"
                    if failed is not None
                    else ("agree" if not check.differences(run) else "differ")
                )
                rows.append((body, size, seconds, cpu / size, verdict))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(
        f"{'body':<8} {'ranks':>6} {'seconds':>8} {'ranks/s':>8} {'CPU ms/rank':>12} "
        f"{f'1,024 on {cores} free cores (s)':>26}  verdict"
    )
    for body, size, seconds, cpu, verdict in rows:
        alone = 1024 * cpu / cores
        print(
            f"{body:<8} {size:>6} {seconds:>8.1f} {size / seconds:>8.1f} {cpu * 1000:>12.0f} "
            f"{alone:>26.0f}  {str(verdict)[:50]}"
        )


if __name__ == "__main__":
    main()
