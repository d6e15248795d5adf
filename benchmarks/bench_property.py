"""What one Hypothesis example of a distributed property test costs, on a reused world and
on a fresh world per example (``isolate=True``), through pytest.

Each case is a generated test file run by a pytest child twice, with ``max_examples`` low and
high: the difference in wall time over the difference in examples is the cost of one
example, without pytest's start, collection and the first world's start. Printed, never
asserted: a table for the machine it runs on.

    python benchmarks/bench_property.py [--examples 200] [--fresh-examples 20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BODIES = {
    "all_reduce, world 2": (
        "@given(n=st.integers(0, 10**6))\n"
        "@pytest.mark.distributed(world_size=2{isolate})\n"
        "def test_case(rank, n):\n"
        "    total = torch.tensor([float(n)])\n"
        "    dist.all_reduce(total)\n"
        "    assert total.item() == 2 * n\n"
    ),
    "all_reduce, world 1-4 drawn": (
        "@given(world_size=st.integers(1, 4), n=st.integers(0, 10**6))\n"
        "@pytest.mark.distributed({isolate_only})\n"
        "def test_case(rank, world_size, n):\n"
        "    total = torch.tensor([float(n)])\n"
        "    dist.all_reduce(total)\n"
        "    assert total.item() == world_size * n\n"
    ),
    "DTensor redistribute, world 4": (
        "@given(mesh_shape=mesh_shapes(4), source=placements(2, 2), target=placements(2, 2),\n"
        "       shape=tensor_shapes(min_dims=2, max_dims=2, max_side=6))\n"
        "@pytest.mark.distributed(world_size=4{isolate})\n"
        "def test_case(rank, mesh_shape, source, target, shape):\n"
        "    mesh = init_device_mesh('cpu', mesh_shape)\n"
        "    full = torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape)\n"
        "    ndim = len(mesh_shape)\n"
        "    moved = distribute_tensor(full, mesh, source[:ndim])\n"
        "    assert torch.equal(moved.redistribute(mesh, target[:ndim]).full_tensor(), full)\n"
        "    for dim in range(ndim):\n"
        "        if mesh.get_group(dim) is not dist.group.WORLD:\n"
        "            dist.destroy_process_group(mesh.get_group(dim))\n"
    ),
}

HEADER = """
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings, strategies as st
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor
from harness.strategies import mesh_shapes, placements, tensor_shapes

settings.register_profile("bench", database=None, derandomize=True,
                          max_examples=int({examples!r}))
settings.load_profile("bench")

"""


def _run(folder: Path, body: str, examples: int, isolate: bool) -> float:
    """Seconds one pytest child takes to run ``body`` for ``examples`` examples."""
    code = HEADER.format(examples=examples) + body.format(
        isolate=", isolate=True" if isolate else "",
        isolate_only="isolate=True" if isolate else "",
    )
    (folder / "test_bench.py").write_text(code)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    start = time.perf_counter()
    done = subprocess.run(
        [*args, "--dist-backend=gloo", "test_bench.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the benchmark's test failed:\n{done.stdout}\n{done.stderr}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="on reused worlds (200)")
    parser.add_argument("--fresh-examples", type=int, default=20, help="fresh worlds (20)")
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "pytest.ini").write_text("[pytest]\n")
        for name, body in BODIES.items():
            for isolate, many in ((False, options.examples), (True, options.fresh_examples)):
                few = max(many // 10, 1)
                low, high = _run(folder, body, few, isolate), _run(folder, body, many, isolate)
                per = (high - low) / (many - few) * 1000
                kind = "fresh world per example" if isolate else "reused worlds"
                rows.append((name, kind, many, high, per))
                print(f"{name:32} {kind:24} {many:5} examples {high:7.2f} s  {per:8.2f} ms/example")
    print()
    print("| property | worlds | examples | wall (s) | per example (ms) |")
    print("|---|---|---|---|---|")
    for name, kind, many, high, per in rows:
        print(f"| {name} | {kind} | {many} | {high:.2f} | {per:.1f} |")


if __name__ == "__main__":
    main()
