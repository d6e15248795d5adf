"""What one schedule costs (``schedules=N``), against a run of the same body without one.

Run by hand, never in CI (nothing here asserts on time)::

    python benchmarks/bench_schedules.py [--runs 60] [--tests 10] [--schedules 20]

Two measurements, each printing its ratio:

* **On a reused world** (``World.call``, 2 Gloo ranks): for each body (``blocking``: four
  all-reduces and a barrier; ``async``: an async all-reduce overlapped with some compute,
  waited on, then a barrier), ``--runs`` rounds of three calls in turn on the same world: the
  body without a schedule, counting its boundaries (``Schedule()``, what a test's first run
  under schedules does), and under the schedule of the round's seed (two holds, drawn as the
  plugin draws them). Medians per kind, the ratio to the plain call, and how the holds ended
  (their peers blocked, or at the delay).
* **Through pytest**: two pytest children on one file of ``--tests`` race-free tests
  (the blocking body), one with ``--dist-schedules=0``, one with ``--dist-schedules=N``;
  each test's setup + call + teardown as pytest times it. The per-schedule cost is the
  difference of the medians over N, printed next to a test's own cost without schedules.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import harness
from harness.protocol.messages import CallOptions
from harness.protocol.schedules import PEERS, Schedule, draw

CHILD_TIMEOUT_S = 1800.0


def blocking() -> None:
    tensor = torch.ones(16)
    for _ in range(4):
        dist.all_reduce(tensor)
    dist.barrier()


def overlapped() -> None:
    grad = torch.ones(16)
    work = dist.all_reduce(grad, async_op=True)
    x = torch.randn(64, 64)
    for _ in range(5):
        x = torch.tanh(x @ x)
    work.wait()
    dist.barrier()


BODIES = {"blocking": blocking, "async": overlapped}


def _timed(world: harness.World, body: object, schedule: Schedule | None) -> tuple[float, object]:
    options = CallOptions(120, schedule=schedule, keep_traces=schedule is not None)
    started = time.perf_counter()
    outcome = world.call(body, options=options)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - started
    if outcome.error is not None:
        raise outcome.error
    return elapsed, outcome


def on_a_reused_world(runs: int) -> None:
    print(f"On a reused world of 2 Gloo ranks, {runs} rounds (median ms per call):")
    print("| body | plain | counting | scheduled | scheduled / plain | holds ended by peers |")
    print("|---|---|---|---|---|---|")
    with harness.World(2, backend="gloo") as world:
        for name, body in BODIES.items():
            _, counted = _timed(world, body, Schedule())
            counts = {rank: trace.boundaries for rank, trace in counted.traces.items() if trace}  # type: ignore[attr-defined]
            times: dict[str, list[float]] = {"plain": [], "counting": [], "scheduled": []}
            holds, by_peers = 0, 0
            for seed in range(1, runs + 1):
                times["plain"].append(_timed(world, body, None)[0])
                times["counting"].append(_timed(world, body, Schedule())[0])
                elapsed, outcome = _timed(world, body, draw(seed, counts))
                times["scheduled"].append(elapsed)
                for trace in outcome.traces.values():  # type: ignore[attr-defined]
                    for held in trace.held if trace is not None else ():
                        holds += 1
                        by_peers += held.until == PEERS
            median = {kind: statistics.median(values) * 1e3 for kind, values in times.items()}
            print(
                f"| {name} | {median['plain']:.2f} | {median['counting']:.2f} | "
                f"{median['scheduled']:.2f} | {median['scheduled'] / median['plain']:.2f}x | "
                f"{by_peers}/{holds} |"
            )


TESTS = """\
import pytest
import torch
import torch.distributed as dist


@pytest.mark.parametrize("n", range({tests}))
@pytest.mark.distributed(world_size=2, backend="gloo")
def test_race_free(rank, n):
    tensor = torch.ones(16)
    for _ in range(4):
        dist.all_reduce(tensor)
    dist.barrier()
"""

CONFTEST = """\
import os


def pytest_runtest_logreport(report):
    with open(os.environ["BENCH_DURATIONS"], "a", encoding="utf-8") as handle:
        handle.write(f"{report.nodeid} {report.duration}\\n")
"""


def _pytest(directory: str, schedules: int) -> list[float]:
    """Each test's setup + call + teardown, in a pytest child with ``schedules``."""
    durations = os.path.join(directory, f"durations-{schedules}")
    env = {**os.environ, "BENCH_DURATIONS": durations}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    command.append(f"--dist-schedules={schedules}")
    done = subprocess.run(
        command, cwd=directory, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"pytest failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    total: dict[str, float] = {}
    with open(durations, encoding="utf-8") as handle:
        for line in handle:
            nodeid, seconds = line.rsplit(" ", 1)
            total[nodeid] = total.get(nodeid, 0.0) + float(seconds)
    # The first test pays for the world's start in both children: left out.
    return sorted(total.values())[: len(total) - 1] if len(total) > 1 else list(total.values())


def through_pytest(tests: int, schedules: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-schedules-") as directory:
        with open(os.path.join(directory, "test_bench.py"), "w", encoding="utf-8") as handle:
            handle.write(TESTS.format(tests=tests))
        with open(os.path.join(directory, "conftest.py"), "w", encoding="utf-8") as handle:
            handle.write(CONFTEST)
        plain = statistics.median(_pytest(directory, 0))
        scheduled = statistics.median(_pytest(directory, schedules))
    per_schedule = (scheduled - plain) / schedules
    print(
        f"\nThrough pytest, {tests} tests (median per test): without schedules "
        f"{plain * 1e3:.1f} ms; with {schedules} schedules {scheduled * 1e3:.1f} ms; one "
        f"schedule {per_schedule * 1e3:.1f} ms, {per_schedule / plain:.2f}x a test without"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--tests", type=int, default=10)
    parser.add_argument("--schedules", type=int, default=20)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    on_a_reused_world(args.runs)
    through_pytest(args.tests, args.schedules)


if __name__ == "__main__":
    main()
