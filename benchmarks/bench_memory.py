"""Memory on a reused world: what measuring and giving freed memory back cost a test, and
what a rank holds after thousands of tests, with and without it.

Run by hand, never by the test suite (nothing here asserts on time). Each case is a generated
test module run by a pytest child (a fresh forkserver each) with a probe plugin that reads
the session's world after every test: each rank's resident memory after the first and the
last test, its peak, the leak findings about memory and the replacements for memory. The
ranks' memory step is switched per child through ini ``dist_preload`` (a function run in the
forkserver before it forks any rank):

* ``on``: as shipped;
* ``no-give-back``: measured, nothing given back (``malloc_trim`` taken away);
* ``mmap-threshold``: measured, nothing given back, glibc's mmap threshold fixed at 128 KiB
  (``mallopt``, as ``MALLOC_MMAP_THRESHOLD_=131072`` does): the other way to keep freed
  blocks from staying resident;
* ``off``: no memory step at all (the rank answers as before this feature).

Timed children also have each rank time its memory step (wall and CPU) and its CPU time for
each test, written outside the timed part.

Cases (``--cases``, all by default):

* ``cost``: an empty test and a test that makes a 1 MiB tensor and appends a line to a file,
  ``--cost-tests`` each, ``off``, ``on`` and ``mmap-threshold`` children interleaved for
  ``--rounds`` rounds: per test, median and p95, the rank's CPU time, the memory step (wall
  and CPU) and pytest's wall time (its runtest protocol, in the probe). On a loaded machine
  the wall times count the waits for a CPU: the CPU times are the ones to compare;
* ``growth``: ``--tests`` tests that make and drop a 1 MiB tensor without a collective, then
  ``--collective-tests`` that all_reduce it, one world of 2, each test appending a line to a
  file (the pattern that kept freed heap pages on torch 2.13) and, as ``plain``, without the
  line: resident memory after the first and the last test per rank, ``no-give-back``,
  ``on`` and ``mmap-threshold``;
* ``leak``: ``--leak-tests`` tests that each keep 2 MiB alive: which test the first memory
  finding names;
* ``limit``: the same under ``--dist-max-rank-memory`` (``--limit``, 400MiB): each rank's
  peak, the replacements, whether every test passed;
* ``ordinary``: ``--ordinary-tests`` tests of ordinary distributed work (a DDP step, a
  DTensor redistributed, a checkpoint saved and loaded, a subgroup, all_gathers), with the
  default threshold: how many memory findings (none is right).

    python benchmarks/bench_memory.py [--cases cost,growth,leak,limit,ordinary]
        [--tests 5000] [--collective-tests 1000] [--cost-tests 2000] [--rounds 3]
        [--leak-tests 300] [--limit 400MiB] [--ordinary-tests 300]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile
import textwrap
from pathlib import Path

from workload import child_env, fmt, median, python, run_child, table

MiB = 2**20

MODE = """
import ctypes
import os
import struct
import time

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def apply():
    from harness.rank import memory

    mode = os.environ["BENCH_MEMORY_MODE"]
    if mode in ("no-give-back", "mmap-threshold"):
        memory._malloc_trim = lambda: None
    if mode == "mmap-threshold":
        # A fixed threshold: every block of 128 KiB or more is mapped and unmapped on its own,
        # glibc's dynamic threshold off (as MALLOC_MMAP_THRESHOLD_=131072 does).
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    if mode == "off":
        memory.Memory.after_call = lambda self, growth, transient=0: (None, "")
    if os.environ.get("BENCH_MEMORY_TIMED"):
        _time(memory)


def _time(memory):
    # Each call: the step's wall and CPU time, and the rank's CPU time since the last step
    # (the test's own work in the rank), written outside the timed part.
    step = memory.Memory.after_call
    out = os.environ["BENCH_MEMORY_OUT"]
    files, last = {}, {}

    def timed(self, growth, transient=0):
        start, cpu = time.perf_counter(), time.thread_time()
        found = step(self, growth, transient)
        took, used = time.perf_counter() - start, time.thread_time() - cpu
        pid = os.getpid()
        if pid not in files:
            name = os.path.join(out, f"step-{pid}.bin")
            files[pid] = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        between = cpu - last.get(pid, cpu)
        os.write(files[pid], struct.pack("ddd", took, used, between))
        last[pid] = time.thread_time()
        return found

    memory.Memory.after_call = timed
"""

PROBE = """
import json
import os
import time

import pytest

from harness.plugin import lazy_session

OUT = os.environ["BENCH_MEMORY_OUT"]
SEEN = {"first": None, "last": None, "peak": {}, "times": [], "findings": [], "replaced": 0}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.perf_counter()
    result = yield
    SEEN["times"].append(time.perf_counter() - start)
    session = lazy_session.peek(item.config)
    for world in session._worlds.values() if session is not None else ():
        last = {rank: memory.last for rank, memory in world.memory.items()}
        SEEN["first"] = SEEN["first"] or last
        SEEN["last"] = last
        for rank, memory in world.memory.items():
            SEEN["peak"][rank] = max(SEEN["peak"].get(rank, 0), memory.peak)
        SEEN["replaced"] = world.replaced_for_memory
    return result


def pytest_warning_recorded(warning_message, when, nodeid, location):
    if "resident memory grew" in str(warning_message.message):
        SEEN["findings"].append(nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    SEEN["passed"] = len(terminalreporter.stats.get("passed", ()))
    with open(os.path.join(OUT, "probe.json"), "w") as handle:
        json.dump(SEEN, handle)
"""

HEAD = """
import os

import pytest
import torch
import torch.distributed as dist

LINES = os.environ.get("BENCH_MEMORY_LINES")
KEPT = []
"""

BODIES = {
    "empty": """
@pytest.mark.distributed(world_size=2)
@pytest.mark.parametrize("i", range({tests}))
def test_empty(i, rank):
    pass
""",
    "tensor": """
@pytest.mark.distributed(world_size=2)
@pytest.mark.parametrize("i", range({tests}))
def test_tensor(i, rank):
    t = torch.ones(2**18)  # 1 MiB
    if i >= {tests} - {collective}:
        dist.all_reduce(t)
    if LINES:  # the rank's resident size, read and appended to a file
        with open("/proc/self/statm") as statm:
            resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        with open(os.path.join(LINES, f"rank{{rank}}.txt"), "a") as f:
            f.write(f"{{i}} {{resident}}\\n")
""",
    "keeps": """
@pytest.mark.distributed(world_size=2)
@pytest.mark.parametrize("i", range({tests}))
def test_keeps(i, rank):
    KEPT.append(torch.ones(2**19))  # 2 MiB, never freed
""",
    "ordinary": """
import sys
sys.path.insert(0, {tests_dir!r})
import memory_rankfns


@pytest.mark.distributed(world_size=2)
@pytest.mark.parametrize("i", range({tests}))
def test_ordinary(i, rank, tmp_path_factory):
    memory_rankfns.ordinary(i, os.environ["BENCH_MEMORY_SHARED"])
""",
}


def run(
    root: Path, body: str, mode: str, tests: int, *, collective: int = 0, lines: bool = False,
    args: tuple[str, ...] = (), timed: bool = False,
) -> dict:  # fmt: skip
    """One pytest child on a generated module; what its probe saw (and, ``timed``, the
    ranks' times per test: ``step`` and ``step_cpu``, the memory step's wall and CPU time,
    ``rank_cpu`` the rank's CPU time for the test, the step included)."""
    case = Path(tempfile.mkdtemp(dir=root))
    (case / "bench_memory_mode.py").write_text(MODE)
    (case / "bench_memory_probe.py").write_text(PROBE)
    tests_dir = str(Path(__file__).resolve().parents[1] / "tests" / "harness")
    code = BODIES[body].format(tests=tests, collective=collective, tests_dir=tests_dir)
    (case / "test_bench.py").write_text(HEAD + textwrap.dedent(code))
    shared = case / "shared"
    shared.mkdir()
    env = child_env([str(case)])
    env.update(BENCH_MEMORY_MODE=mode, BENCH_MEMORY_OUT=str(case), BENCH_MEMORY_SHARED=str(shared))
    if lines:
        env["BENCH_MEMORY_LINES"] = str(shared)
    if timed:
        env["BENCH_MEMORY_TIMED"] = "1"
    argv = [
        python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
        "-p", "bench_memory_probe", "-o", "dist_preload=bench_memory_mode:apply",
        "--dist-backend=gloo", *args, "test_bench.py",
    ]  # fmt: skip
    done = run_child(argv, timeout=7200, cwd=str(case), env=env)
    probe = case / "probe.json"
    if done.returncode not in (0, 1) or not probe.exists():
        sys.exit(f"{body} ({mode}) failed:\n{done.output[-4000:]}")
    seen = json.loads(probe.read_text())
    steps = [
        values
        for path in case.glob("step-*.bin")
        for values in list(struct.iter_unpack("ddd", path.read_bytes()))[1:]  # not the first
    ]
    seen["step"] = [wall for wall, _, _ in steps]
    seen["step_cpu"] = [cpu for _, cpu, _ in steps]
    seen["rank_cpu"] = [cpu + between for _, cpu, between in steps]
    return seen


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.95 * (len(ordered) - 1))] if ordered else float("nan")


def cost(root: Path, tests: int, rounds: int) -> None:
    modes = ("off", "on", "mmap-threshold")
    rows = []
    for body in ("empty", "tensor"):
        seen: dict[str, dict[str, list[float]]] = {mode: {} for mode in modes}
        for _ in range(rounds):
            for mode in modes:  # interleaved: the machine's load falls on every mode alike
                found = run(root, body, mode, tests, lines=True, timed=True)
                for key in ("times", "step", "step_cpu", "rank_cpu"):
                    seen[mode].setdefault(key, []).extend(found[key][1:])
        for mode in modes:
            got = seen[mode]
            step = ["-"] * 4
            if mode != "off":
                step = [
                    f"{median(got[key]) * 1e3:.4f}" if last else f"{p95(got[key]) * 1e3:.4f}"
                    for key in ("step", "step_cpu")
                    for last in (True, False)
                ]
            rows.append(
                [
                    body, mode,
                    f"{median(got['rank_cpu']) * 1e3:.3f}", f"{p95(got['rank_cpu']) * 1e3:.3f}",
                    *step,
                    fmt(median(got["times"]), "ms"), fmt(p95(got["times"]), "ms"),
                ]
            )  # fmt: skip
    print(
        "\nPer test (ms): a rank's CPU time for the test, the memory step inside it (wall "
        "and CPU), and pytest's wall time for the test (its runtest protocol)"
    )
    print(
        table(
            [
                "test body", "mode", "rank CPU median", "rank CPU p95", "step median",
                "step p95", "step CPU median", "step CPU p95", "wall median", "wall p95",
            ],
            rows,
        )
    )  # fmt: skip


def _first_last(seen: dict) -> str:
    first, last = seen["first"], seen["last"]
    return ", ".join(f"{first[rank] / MiB:.0f} -> {last[rank] / MiB:.0f}" for rank in sorted(first))


def growth(root: Path, tests: int, collective: int) -> None:
    rows = []
    total = tests + collective
    for lines in (True, False):
        for mode in ("no-give-back", "on", "mmap-threshold"):
            seen = run(root, "tensor", mode, total, collective=collective, lines=lines)
            peak = ", ".join(f"{seen['peak'][r] / MiB:.0f}" for r in sorted(seen["peak"]))
            kind = "line appended" if lines else "plain"
            rows.append([kind, mode, _first_last(seen), peak, str(seen["passed"])])
    print(
        f"\n{tests} tests making and dropping a 1 MiB tensor, then {collective} that also "
        "all_reduce it, one world of 2: resident memory (MiB) per rank"
    )
    print(table(["tests", "mode", "first -> last test", "peak", "passed"], rows))


def leak(root: Path, tests: int, limit: str | None) -> None:
    seen = run(root, "keeps", "on", tests)
    named = seen["findings"][0] if seen["findings"] else "none"
    print(f"\n{tests} tests each keeping 2 MiB: first memory finding names {named}")
    print(f"  findings: {len(seen['findings'])}; first -> last: {_first_last(seen)} MiB")
    if limit is None:
        return
    seen = run(root, "keeps", "on", tests, args=(f"--dist-max-rank-memory={limit}",))
    peak = ", ".join(f"{seen['peak'][r] / MiB:.1f}" for r in sorted(seen["peak"]))
    print(
        f"  with --dist-max-rank-memory={limit}: peak per rank {peak} MiB, "
        f"{seen['replaced']} replacements, {seen['passed']} of {tests} passed"
    )


def ordinary(root: Path, tests: int) -> None:
    seen = run(root, "ordinary", "on", tests)
    print(
        f"\n{tests} tests of ordinary distributed work: {len(seen['findings'])} memory "
        f"findings; first -> last: {_first_last(seen)} MiB; {seen['passed']} passed"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="cost,growth,leak,limit,ordinary")
    parser.add_argument("--tests", type=int, default=5000)
    parser.add_argument("--collective-tests", type=int, default=1000)
    parser.add_argument("--cost-tests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--leak-tests", type=int, default=300)
    parser.add_argument("--limit", default="400MiB")
    parser.add_argument("--ordinary-tests", type=int, default=300)
    options = parser.parse_args()
    cases = set(options.cases.split(","))
    import torch

    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, load {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as temp:
        root = Path(temp)
        if "cost" in cases:
            cost(root, options.cost_tests, options.rounds)
        if "growth" in cases:
            growth(root, options.tests, options.collective_tests)
        if "leak" in cases or "limit" in cases:
            leak(root, options.leak_tests, options.limit if "limit" in cases else None)
        if "ordinary" in cases:
            ordinary(root, options.ordinary_tests)
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
