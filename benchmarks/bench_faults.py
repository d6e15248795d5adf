"""What a fault case costs above its body, with and without the project's warm-up.

Run by hand, never in CI (nothing here asserts on time)::

    python benchmarks/bench_faults.py [--cases 12] [--rounds 3]

A fault case ends its world: the next case runs on fresh ranks, which pay torch's lazy
first-use costs again (an optimizer's first step, its kernels, its imports). One pytest
child per round and setting runs a generated file: ``--cases`` cases of a sweep that kills
rank 1 at each of a training step's collectives, each body a few steps of a small model with
``AdamW`` (a realistic body), then as many cases of the same body without faults on the
reused world (the body's own cost), and as many of an empty body. The settings alternate
within each round: without ``dist_preload``, and with ``dist_preload`` naming a warm-up that
runs one such step in the forkserver. Per case: the median of pytest's own durations (setup,
call and teardown). Printed: each median, and what a fault case costs above its body.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

WARM = '''
import torch


def step(model, optimizer):
    loss = model(torch.randn(8, 64)).square().mean()
    loss.backward()
    return loss


def warm_up():
    """One training step, as a test's first one: the forkserver runs it once."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    step(model, optimizer)
    optimizer.step()
'''

TESTS = """
import pytest
import torch
import torch.distributed as dist
from harness import faults

import warm


def train(steps=2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        warm.step(model, optimizer)
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
        optimizer.step()
        optimizer.zero_grad()


KILLS = faults.sweep(faults.kill, ranks=[1], at=range(1, {cases} + 1))


@pytest.mark.distributed(world_size=2, backend="gloo", faults=KILLS)
def test_fault(rank):
    try:
        train(steps={steps})
    except RuntimeError:  # the peer is gone
        pass


@pytest.mark.distributed(world_size=2, backend="gloo")
@pytest.mark.parametrize("i", range({cases}))
def test_body(rank, i):
    train()


@pytest.mark.distributed(world_size=2, backend="gloo")
@pytest.mark.parametrize("i", range({cases}))
def test_empty(rank, i):
    pass
"""


def _run(directory: Path, preload: bool) -> dict[str, float]:
    """One child pytest run; the median duration per kind of case, in seconds."""
    ini = "[pytest]\npythonpath = .\n" + ("dist_preload = warm:warm_up\n" if preload else "")
    (directory / "pytest.ini").write_text(ini)
    report = directory / "report.json"
    code = (
        "import json, sys, pytest\n"
        "durations = {}\n"
        "class Collect:\n"
        "    def pytest_runtest_logreport(self, report):\n"
        "        durations[report.nodeid] = durations.get(report.nodeid, 0) + report.duration\n"
        "rc = pytest.main(['-q', '-p', 'no:randomly', '-p', 'no:cacheprovider', 'test_bench.py'],"
        " plugins=[Collect()])\n"
        f"json.dump(durations, open({str(report)!r}, 'w'))\n"
        "sys.exit(rc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=directory, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"the child run failed:\n{done.stdout}\n{done.stderr}")
    durations: dict[str, float] = json.loads(report.read_text())
    kinds: dict[str, list[float]] = {}
    for nodeid, seconds in durations.items():
        kind = nodeid.split("::", 1)[1].split("[", 1)[0]
        kinds.setdefault(kind, []).append(seconds)
    return {kind: statistics.median(values) for kind, values in kinds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=12, help="cases of each kind (default 12)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    args = parser.parse_args()
    # Each killed rank made (at - 1) collectives: enough steps that every kill point is met.
    steps = (args.cases + 5) // 6 + 1
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        directory = Path(tmp)
        (directory / "warm.py").write_text(textwrap.dedent(WARM))
        (directory / "test_bench.py").write_text(TESTS.format(cases=args.cases, steps=steps))
        os.environ.pop("PYTEST_ADDOPTS", None)
        for round_ in range(args.rounds):
            for preload in (round_ % 2 == 1, round_ % 2 == 0):  # alternate which goes first
                results[preload].append(_run(directory, preload))
    print(f"{args.cases} cases of each kind, {args.rounds} rounds (medians of per-case medians)")
    print(f"{'setting':<26}{'fault case':>12}{'body':>10}{'empty':>10}{'fault - body':>15}")
    for preload, rows in results.items():
        fault, body, empty = (
            statistics.median(row[kind] for row in rows)
            for kind in ("test_fault", "test_body", "test_empty")
        )
        name = "dist_preload = warm:warm_up" if preload else "no dist_preload"
        print(
            f"{name:<26}{fault * 1000:>10.0f}ms{body * 1000:>8.0f}ms{empty * 1000:>8.0f}ms"
            f"{(fault - body) * 1000:>13.0f}ms"
        )


if __name__ == "__main__":
    main()
