"""What ``--dist-trace-dir`` and ``--dist-trace-all`` cost a passing marked test.

Run by hand, never in CI (nothing here asserts on time)::

    python benchmarks/bench_trace_dir.py [--tests 300] [--big-tests 30] [--rounds 4]
                                         [--world-size 2]

Two comparisons, each as ``--rounds`` pairs of pytest children over one generated file,
the order within a pair alternating from round to round (a shared machine's speed drifts):

* **small**: ``--tests`` tests of one ``all_reduce`` of one element, without options against
  ``--dist-trace-dir`` (a passing test must cost nothing more: its traces are not asked for);
* **big**: ``--big-tests`` tests of 1,000 such ``all_reduce`` calls, ``--dist-trace-dir``
  against ``--dist-trace-dir --dist-trace-all`` (every passing test's folder written: the
  ranks' traces sent with their answers, the timeline built and the three files written by
  the background writer).

Each child's figures: the median over its tests (the first ``WARM`` not counted: the world
starts) of setup + call + teardown as pytest measured them (the ranks run the whole test in
the setup phase), and the CPU time of the child and all it waited for (the forkserver, the
ranks, the background writer) per test, start-up included: what the machine spent,
including the work the writer does off the tests' path. Printed: each round, then per
comparison and figure the median of each side over the rounds and the median of the paired
differences.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WARM = 5

TEST = """
import pytest
import torch
import torch.distributed as dist


@pytest.mark.parametrize("i", range({count}))
@pytest.mark.distributed(world_size={world_size}, backend="gloo")
def test_body(rank, i):
    tensor = torch.ones(1)
    for _ in range({collectives}):
        dist.all_reduce(tensor)
"""

CONFTEST = """
import json
import os

_TIMES = {}


def pytest_runtest_logreport(report):
    _TIMES[report.nodeid] = _TIMES.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    with open(os.environ["BENCH_TIMES"], "w") as handle:
        json.dump(list(_TIMES.values()), handle)
"""


def child(project: Path, args: list[str]) -> tuple[float, float]:
    """One pytest child on ``project`` with ``args``: the median seconds per timed test, and
    the CPU seconds per test of the child and every process it waited for (the forkserver,
    the ranks, the trace writer), start-up included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    times = project / "times.json"
    env = dict(os.environ, BENCH_TIMES=str(times), PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_ADDOPTS", None)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=project,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    per_test: list[float] = json.loads(times.read_text())
    return statistics.median(per_test[WARM:]), cpu / len(per_test)


def compare(name: str, project: Path, sides: tuple[list[str], list[str]], rounds: int) -> None:
    """Run the two sides ``rounds`` times each, alternating which goes first."""
    walls: tuple[list[float], list[float]] = ([], [])
    cpus: tuple[list[float], list[float]] = ([], [])
    for number in range(rounds):
        order = (0, 1) if number % 2 == 0 else (1, 0)
        for side in order:
            wall, cpu = child(project, sides[side])
            walls[side].append(wall)
            cpus[side].append(cpu)
        print(
            f"  {name} round {number + 1}: wall {walls[0][-1] * 1000:.2f} -> "
            f"{walls[1][-1] * 1000:.2f} ms, CPU {cpus[0][-1] * 1000:.2f} -> "
            f"{cpus[1][-1] * 1000:.2f} ms per test",
            flush=True,
        )
    for what, results in (("wall", walls), ("CPU", cpus)):
        first, second = (statistics.median(r) * 1000 for r in results)
        change = statistics.median([(b - a) * 1000 for a, b in zip(*results, strict=True)])
        print(
            f"| {name} | {what} | {' '.join(sides[0]) or '(none)'} | {first:.2f} ms | "
            f"{' '.join(sides[1])} | {second:.2f} ms | {change:+.2f} ms ({change / first:+.1%}) |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--tests", type=int, default=300)
    parser.add_argument("--big-tests", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"bench_trace_dir: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        traces = str(root / "traces")
        for name, count, collectives, sides in (
            ("small", args.tests, 1, ([], [f"--dist-trace-dir={traces}"])),
            (
                "big",
                args.big_tests,
                1000,
                (
                    [f"--dist-trace-dir={traces}"],
                    [f"--dist-trace-dir={traces}", "--dist-trace-all"],
                ),
            ),
        ):
            project = root / name
            project.mkdir()
            (project / "conftest.py").write_text(CONFTEST)
            (project / "test_bench.py").write_text(
                TEST.format(count=count + WARM, world_size=args.world_size, collectives=collectives)
            )
            compare(name, project, sides, args.rounds)
    print(f"load {os.getloadavg()[0]:.1f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
