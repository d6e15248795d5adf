"""GPU acceptance: the harness on a machine with CUDA GPUs, checked in one command.

Run by hand on a machine with at least one GPU, from the repository root, with the project
installed (``pip install -e '.[test]'`` and a CUDA build of torch)::

    python benchmarks/gpu_acceptance.py [--tests 200] [--hold 0.2] [--keep]
    python benchmarks/gpu_acceptance.py --self-check   # its parsers, on sample text; no GPU

It prints one table, a row per check, each PASS, FAIL or SKIP with its reason and numbers:

* (a) ``python -m harness check --backend nccl``, one rank per GPU: its result and time;
* (b) this repository's CUDA/NCCL tests (``tests/distributed/test_state_cuda.py`` and the
  plugin's NCCL tests): their counts; a test skipped for lack of GPUs that this machine
  has fails the row;
* (c) ``--tests`` single-rank NCCL tests (a small all_reduce on the rank's GPU) on a reused
  world, then the same file with ``--dist-isolate`` (fresh processes per test): the
  per-test cost of each (pytest's durations, from JUnit XML) and their ratio;
* (d) NCCL tests that hold their GPU for ``--hold`` seconds, run by ``-n 2`` and by more
  xdist workers than GPUs, while a thread here polls the GPUs' compute processes every
  50 ms (pynvml where it imports, else ``nvidia-smi --query-compute-apps``): the most
  worlds seen on one GPU at once (must be 1: a world of N ranks uses N GPUs, each once) and
  the processes seen on a GPU outside the run's ``CUDA_VISIBLE_DEVICES`` (must be 0). With
  3 GPUs or more the last one is left out of the run, so that there is one to watch. The
  ranks also record which GPU they used and when, which is checked the same way (and is
  what counts where the driver shows other pids, as in a container);
* (e) a test that makes a process group and does not destroy it: the leak warning must
  name the test and the line that made the group;
* (f) a test that keeps a CUDA tensor in a module global: the leak warning must name the
  test and the CUDA memory;
* (g) several NCCL ranks on one GPU (``ranks_per_gpu``, ``gpu_sharing.py``): ``harness
  check`` with 2 and with 4 ranks on one GPU, ``--tests`` tests of a 2-rank world on one GPU
  on a reused world with their per-test cost, and a planted desync that must be reported.
  They need torch 2.15 and NCCL 2.30: elsewhere each is a SKIP saying which is missing.

The first line it prints is the NCCL version torch has (``torch.cuda.nccl.version()``).

Exit status: 0 when no row failed, 1 when one did, 2 when this machine has no CUDA GPU (or
no NCCL), said on stderr before anything runs. Progress goes to stderr, the table to
stdout. Every child runs in its own session and its process group is killed when it ends;
everything is written under one temp dir, removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gpu_sharing

REPO = Path(__file__).resolve().parents[1]
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
NO_GPU_EXIT = 2
SAMPLE_EVERY_S = 0.05

# Bounds on each child, in seconds: a child past its bound is killed and its row fails.
CHECK_TIMEOUT_S = 240.0
REPO_TESTS_TIMEOUT_S = 300.0
REUSED_TIMEOUT_S = 180.0
ISOLATED_TIMEOUT_S = 360.0
CONTENTION_TIMEOUT_S = 240.0
LEAKS_TIMEOUT_S = 180.0

# The plugin's tests that run NCCL worlds where CUDA is visible (by node id).
PLUGIN_NCCL_TESTS = (
    "tests/plugin/test_plugin_bodies.py::test_nccl_without_enough_gpus_is_a_skip",
    "tests/plugin/test_plugin_bodies.py::test_dist_backend_option_overrides_auto_only",
)

PROBE = r"""
import json
try:
    import torch
    import torch.distributed as dist
except Exception as exc:
    print(json.dumps({"error": f"cannot import torch: {type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "count": 0, "uuids": []}
info["nccl"] = bool(dist.is_available() and dist.is_nccl_available())
try:
    import torch.cuda.nccl

    found = torch.cuda.nccl.version()
    numbers = []
    for part in found if isinstance(found, tuple) else ():
        if not isinstance(part, int):
            break
        numbers.append(part)
    info["nccl_version"] = numbers or None
except Exception:
    info["nccl_version"] = None
if torch.cuda.is_available():
    info["count"] = torch.cuda.device_count()
    for index in range(info["count"]):
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        text = None if uuid is None else str(uuid)
        if text is not None and not text.startswith(("GPU-", "MIG-")):
            text = "GPU-" + text
        info["uuids"].append(text)
print(json.dumps(info))
"""

REUSE_TESTS = """\
import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=1, backend="nccl")
@pytest.mark.parametrize("i", range({count}))
def test_all_reduce(rank, local_device, i):
    t = torch.ones(4, device=local_device)
    dist.all_reduce(t)
    assert t[0].item() == 1.0
"""

CONTENTION_TESTS = """\
import json
import os
import time

import pytest
import torch
import torch.distributed as dist

OUT = os.environ["GPU_ACCEPTANCE_RECORDS"]
HOLD_S = float(os.environ["GPU_ACCEPTANCE_HOLD_S"])


def hold(rank, world_size, local_device, test):
    # The world's name: rank 0's pid, which every rank learns through NCCL.
    owner = torch.tensor([os.getpid() if rank == 0 else 0], device=local_device)
    dist.all_reduce(owner)
    start = time.monotonic()
    x = torch.ones(1 << 18, device=local_device)
    while time.monotonic() < start + HOLD_S:
        x.mul_(1.0)
        torch.cuda.synchronize(local_device)
        time.sleep(0.005)
    end = time.monotonic()
    uuid = getattr(torch.cuda.get_device_properties(local_device), "uuid", None)
    uuid = None if uuid is None else str(uuid)
    if uuid is not None and not uuid.startswith(("GPU-", "MIG-")):
        uuid = "GPU-" + uuid
    record = {{
        "pid": os.getpid(),
        "world": f"{{os.environ.get('PYTEST_XDIST_WORKER', 'main')}}/{{int(owner.item())}}",
        "rank": rank,
        "world_size": world_size,
        "test": test,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "uuid": uuid,
        "start": start,
        "end": end,
    }}
    name = f"{{test}}-{{rank}}-{{os.getpid()}}.json"
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as handle:
        json.dump(record, handle)


@pytest.mark.distributed(world_size=1, backend="nccl")
@pytest.mark.parametrize("i", range({count}))
def test_one_gpu(rank, world_size, local_device, i):
    hold(rank, world_size, local_device, f"ws1-{{i}}")
"""

CONTENTION_TESTS_TWO = """

@pytest.mark.distributed(world_size=2, backend="nccl")
@pytest.mark.parametrize("i", range({count}))
def test_two_gpus(rank, world_size, local_device, i):
    hold(rank, world_size, local_device, f"ws2-{{i}}")
"""

LEAK_TESTS = """\
import pytest
import torch
import torch.distributed as dist

KEPT = []


def make_group(world_size):
    return dist.new_group(list(range(world_size)))


@pytest.mark.distributed(world_size=1, backend="nccl")
def test_leaks_a_group(rank, world_size, local_device):
    group = make_group(world_size)
    t = torch.ones(1, device=local_device)
    dist.all_reduce(t, group=group)
    torch.cuda.synchronize(local_device)


@pytest.mark.distributed(world_size=1, backend="nccl")
def test_keeps_cuda_memory(rank, local_device):
    KEPT.append(torch.ones(1 << 16, device=local_device))
"""


@dataclass
class Row:
    """One line of the table."""

    name: str
    result: str
    detail: str


@dataclass
class Machine:
    """What the probe found: torch, its GPUs and whether it has NCCL."""

    torch: str
    cuda: str | None
    count: int
    uuids: list[str | None]
    nccl: bool
    nccl_version: tuple[int, ...] | None = None


@dataclass
class Child:
    """A finished child process."""

    returncode: int
    output: str
    seconds: float
    timed_out: bool

    def why(self, timeout: float) -> str:
        """Why it failed, in a few words: its bound, else its exit status and last line."""
        if self.timed_out:
            return f"killed after {timeout:g} s"
        last = next((line for line in reversed(self.output.splitlines()) if line.strip()), "")
        return f"exit {self.returncode}: {last.strip()[:160]}"


@dataclass
class Skip:
    """One ``SKIPPED [count] where: reason`` line of pytest's short summary."""

    count: int
    where: str
    reason: str


@dataclass
class Sampler:
    """A thread that polls which processes use which GPU (pid, GPU UUID)."""

    samples: list[list[tuple[int, str]]] = field(default_factory=list)
    problem: str | None = None
    source: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        poll = _nvml_poller() or _smi_poller()
        if poll is None:
            self.problem = "neither pynvml nor nvidia-smi is available"
            return
        self.source, read = poll

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.samples.append(read())
                except Exception as exc:  # a driver hiccup ends the sampling, not the run
                    self.problem = f"{self.source} failed: {type(exc).__name__}: {exc}"
                    return
                self._stop.wait(SAMPLE_EVERY_S)

        self._thread = threading.Thread(target=loop, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def _nvml_poller() -> tuple[str, Any] | None:
    try:
        nvml: Any = importlib.import_module("pynvml")
        nvml.nvmlInit()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        names = [nvml.nvmlDeviceGetUUID(handle) for handle in handles]
    except Exception:  # not installed, or no driver it can talk to: nvidia-smi, then
        return None
    uuids = [name.decode() if isinstance(name, bytes) else str(name) for name in names]

    def read() -> list[tuple[int, str]]:
        found = []
        for handle, uuid in zip(handles, uuids, strict=True):
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                found.append((int(process.pid), uuid))
        return found

    return "pynvml", read


def _smi_poller() -> tuple[str, Any] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    argv = [smi, "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"]

    def read() -> list[tuple[int, str]]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True)
        return parse_compute_apps(done.stdout)

    return "nvidia-smi", read


# Parsers: pure functions of text, checked by --self-check.


def parse_compute_apps(text: str) -> list[tuple[int, str]]:
    """``(pid, GPU UUID)`` of each line of ``nvidia-smi --query-compute-apps=pid,gpu_uuid
    --format=csv,noheader`` (lines that are not such a pair, as "No running processes
    found", are left out)."""
    found = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].startswith(("GPU-", "MIG-")):
            found.append((int(parts[0]), parts[1]))
    return found


_OUTCOME = re.compile(
    r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|warnings?|deselected)\b"
)
_SUMMARY = re.compile(r"\bin \d+(?:\.\d+)?s\b")


def parse_outcomes(text: str) -> dict[str, int]:
    """pytest's closing counts (``{"passed": 3, "skipped": 1}``; ``error``/``warning``
    spelled in the plural), from its last summary line; {} where there is none."""
    for line in reversed(text.splitlines()):
        if _SUMMARY.search(line) and _OUTCOME.search(line):
            counts: dict[str, int] = {}
            for number, word in _OUTCOME.findall(line):
                key = {"error": "errors", "warning": "warnings"}.get(word, word)
                counts[key] = counts.get(key, 0) + int(number)
            return counts
    return {}


_SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] (.+?:\d+): (.*)$")


def parse_skips(text: str) -> list[Skip]:
    """The ``SKIPPED [N] path:line: reason`` lines of pytest's short summary (``-rs``)."""
    found = []
    for line in text.splitlines():
        match = _SKIPPED.match(line.strip())
        if match:
            found.append(Skip(int(match[1]), match[2], match[3]))
    return found


_NEEDS_GPUS = re.compile(r"needs (\d+) (?:GPUs?|CUDA devices?)\b")


def gpus_needed(reason: str) -> int | None:
    """How many GPUs a skip reason says the test lacked: the harness's ``needs 4 GPUs (4 x
    1), this run has 2``, ``needs 2 CUDA devices, found 1`` or this repository's ``needs 2
    CUDA devices`` and ``needs CUDA`` (1); None for a skip of any other kind."""
    match = _NEEDS_GPUS.search(reason)
    if match:
        return int(match[1])
    if re.search(r"\bneeds CUDA\b", reason):
        return 1
    return None


_GPU_SUMMARY = re.compile(
    r"harness: (\d+) distributed tests? ran on GPUs, (\d+) skipped for lack of them"
)


def parse_gpu_summary(text: str) -> tuple[int, int] | None:
    """``(ran, skipped)`` from the plugin's ``harness: N distributed tests ran on GPUs, M
    skipped for lack of them`` line; None where it did not print one."""
    match = _GPU_SUMMARY.search(text)
    return (int(match[1]), int(match[2])) if match else None


def parse_junit_times(text: str) -> list[float]:
    """Each test case's time (setup + call + teardown) in a JUnit XML report."""
    root = ET.fromstring(text)
    return [float(case.get("time", "nan")) for case in root.iter("testcase")]


def most_worlds_at_once(records: Sequence[dict[str, Any]]) -> tuple[int, str]:
    """The most distinct worlds whose ranks held one GPU at the same time, from the ranks'
    records (``uuid``, ``world``, ``start``, ``end``), with the GPU where it happened."""
    best, where = 0, ""
    by_gpu: dict[str, list[tuple[float, int, str]]] = {}
    for record in records:
        events = by_gpu.setdefault(str(record["uuid"]), [])
        events.append((float(record["start"]), 1, str(record["world"])))
        events.append((float(record["end"]), -1, str(record["world"])))
    for gpu, events in by_gpu.items():
        live: dict[str, int] = {}
        for _, step, world in sorted(events, key=lambda event: (event[0], event[1])):
            live[world] = live.get(world, 0) + step
            if live[world] == 0:
                del live[world]
            if len(live) > best:
                best, where = len(live), gpu
    return best, where


def ranks_sharing_a_gpu(records: Sequence[dict[str, Any]]) -> int:
    """The most ranks of one world that used the same GPU (1 where each rank has its own)."""
    ranks: dict[tuple[str, str], set[int]] = {}
    for record in records:
        key = (str(record["world"]), str(record["uuid"]))
        ranks.setdefault(key, set()).add(int(record["rank"]))
    return max((len(found) for found in ranks.values()), default=0)


def sampled_worlds(
    samples: Sequence[Sequence[tuple[int, str]]], worlds: dict[int, str]
) -> tuple[int, int, int]:
    """From the polled ``(pid, GPU UUID)`` samples and each known rank pid's world: the
    most worlds seen on one GPU in one sample, the most processes of the run seen on one
    GPU, and how many samples saw a process of the run at all."""
    most_worlds = most_processes = seen = 0
    for sample in samples:
        on_gpu: dict[str, list[int]] = {}
        for pid, uuid in sample:
            if pid in worlds:
                on_gpu.setdefault(uuid, []).append(pid)
        if on_gpu:
            seen += 1
        for pids in on_gpu.values():
            most_worlds = max(most_worlds, len({worlds[pid] for pid in pids}))
            most_processes = max(most_processes, len(pids))
    return most_worlds, most_processes, seen


def outside_processes(
    samples: Sequence[Sequence[tuple[int, str]]], worlds: dict[int, str], inside: set[str]
) -> set[int]:
    """The run's processes seen on a GPU that is not one of ``inside`` (UUIDs)."""
    return {
        pid for sample in samples for pid, uuid in sample if pid in worlds and uuid not in inside
    }


def self_check() -> None:
    """The parsers on sample text (no GPU, no child process); AssertionError if one is off."""
    smi = "12345, GPU-0b1c2d3e-aaaa-bbbb-cccc-1234567890ab\n678, MIG-1a2b\n[Not Supported]\n"
    assert parse_compute_apps(smi) == [
        (12345, "GPU-0b1c2d3e-aaaa-bbbb-cccc-1234567890ab"),
        (678, "MIG-1a2b"),
    ]
    assert parse_compute_apps("No running processes found\n") == []
    out = (
        "..s.                                   [100%]\n"
        "harness: 3 distributed tests ran on GPUs, 1 skipped for lack of them\n"
        "=========================== short test summary info ============================\n"
        "SKIPPED [1] test_x.py:14: needs 4 GPUs (4 x 1), this run has 2\n"
        "SKIPPED [2] tests/distributed/test_state_cuda.py:53: needs 2 CUDA devices\n"
        "SKIPPED [1] tests/plugin/test_plugin_setup.py:170: needs a machine without CUDA\n"
        "3 passed, 4 skipped, 1 warning in 2.98s\n"
    )
    assert parse_outcomes(out) == {"passed": 3, "skipped": 4, "warnings": 1}
    assert parse_outcomes("===== 1 failed, 2 passed, 1 error in 0.50s =====") == {
        "failed": 1,
        "passed": 2,
        "errors": 1,
    }
    assert parse_outcomes("no summary here") == {}
    skips = parse_skips(out)
    assert [(s.count, s.where) for s in skips] == [
        (1, "test_x.py:14"),
        (2, "tests/distributed/test_state_cuda.py:53"),
        (1, "tests/plugin/test_plugin_setup.py:170"),
    ]
    assert [gpus_needed(s.reason) for s in skips] == [4, 2, None]
    assert gpus_needed("needs CUDA") == 1
    assert gpus_needed("needs 1 GPU (1 x 1), this run has 0") == 1
    assert gpus_needed("cannot start a world of 2 ranks: needs 2 CUDA devices, found 0") == 2
    assert parse_gpu_summary(out) == (3, 1)
    assert parse_gpu_summary("harness: 1 distributed test ran on GPUs, 0 skipped for lack of them")
    assert parse_gpu_summary("nothing") is None
    junit = (
        '<testsuites><testsuite><testcase name="a" time="0.5"/>'
        '<testcase name="b" time="0.25"/></testsuite></testsuites>'
    )
    assert parse_junit_times(junit) == [0.5, 0.25]
    records = [
        {"uuid": "GPU-a", "world": "w/1", "rank": 0, "start": 0.0, "end": 1.0},
        {"uuid": "GPU-b", "world": "w/1", "rank": 1, "start": 0.0, "end": 1.0},
        {"uuid": "GPU-a", "world": "w/2", "rank": 0, "start": 1.0, "end": 2.0},  # after
    ]
    assert most_worlds_at_once(records) == (1, "GPU-a")
    assert ranks_sharing_a_gpu(records) == 1
    overlapping = [*records, {"uuid": "GPU-b", "world": "w/3", "rank": 0, "start": 0.5, "end": 3}]
    assert most_worlds_at_once(overlapping) == (2, "GPU-b")
    shared = [*records, {"uuid": "GPU-a", "world": "w/1", "rank": 1, "start": 0.0, "end": 1.0}]
    assert ranks_sharing_a_gpu(shared) == 2
    samples = [[(10, "GPU-a"), (11, "GPU-b"), (99, "GPU-a")], [(10, "GPU-a"), (20, "GPU-a")], []]
    worlds = {10: "w/10", 11: "w/10", 20: "w/20"}
    assert sampled_worlds(samples, worlds) == (2, 2, 2)
    assert sampled_worlds(samples[:1], worlds) == (1, 1, 1)  # pid 99 is not the run's
    assert outside_processes(samples, worlds, {"GPU-a"}) == {11}


# Children.

_current: subprocess.Popen[str] | None = None


def run(argv: Sequence[str], *, timeout: float, cwd: Path, env: dict[str, str]) -> Child:
    """Run a child in its own session to completion or ``timeout``; its process group is
    killed either way (nothing it started outlives it)."""
    global _current
    progress(f"$ {' '.join(argv)}")
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    _current = proc
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        output, _ = proc.communicate()
    finally:
        _kill_group(proc.pid)
        _current = None
    return Child(proc.returncode, output, time.monotonic() - start, timed_out)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def progress(text: str) -> None:
    print(f"[gpu_acceptance] {text}", file=sys.stderr, flush=True)


def child_env(visible: str | None = None, **extra: str) -> dict[str, str]:
    """This process's environment for a child: never under a launcher, no outer pytest
    options; ``visible`` as its ``CUDA_VISIBLE_DEVICES`` where given."""
    env = dict(os.environ)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PYTEST_ADDOPTS"):
        env.pop(name, None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    env.update(extra)
    return env


def probe() -> tuple[Machine | str, str]:
    """The machine's torch and GPUs, asked in a child (this process never touches CUDA), and
    the NCCL version torch has (``"2.30.7"``, ``"none"``, ``"unknown"``); a string says why
    there is nothing to run on."""
    found = _probe()
    if isinstance(found, Machine):
        return found, gpu_sharing.version_text(found.nccl_version)
    return found, _probe_nccl


_probe_nccl = "unknown"  # what the last probe learnt of NCCL, also where it found no GPU


def _probe() -> Machine | str:
    global _probe_nccl
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired:
        return "asking torch for its GPUs took over 300 s"
    try:
        info = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return f"could not ask torch for its GPUs: {done.stderr.strip()[-300:]}"
    if "error" in info:
        return str(info["error"])
    nccl_version = tuple(info["nccl_version"]) if info.get("nccl_version") else None
    _probe_nccl = gpu_sharing.version_text(nccl_version)
    machine = Machine(
        info["torch"], info["cuda"], info["count"], info["uuids"], info["nccl"], nccl_version
    )
    if machine.count == 0:
        build = f"CUDA {machine.cuda}" if machine.cuda else "a CPU-only build"
        return f"torch {machine.torch} ({build}) shows no CUDA GPU"
    if not machine.nccl:
        return f"torch {machine.torch} has no NCCL (torch.distributed.is_nccl_available())"
    return machine


def pytest_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", *args]


def write_project(directory: Path, files: dict[str, str]) -> None:
    """A pytest project of its own (an empty ``pytest.ini``: no configuration of this
    repository applies)."""
    directory.mkdir(parents=True)
    (directory / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if not ordered:
        return float("nan")
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


# The rows.


def row_check(gpus: int) -> Row:
    name = "(a) harness check --backend nccl"
    argv = [sys.executable, "-m", "harness", "check", "--backend", "nccl"]
    argv += ["--world-size", str(gpus)]
    done = run(argv, timeout=CHECK_TIMEOUT_S, cwd=REPO, env=child_env())
    last = next((line for line in reversed(done.output.splitlines()) if line.strip()), "")
    numbers = f"{done.seconds:.1f} s, {gpus} ranks: {last.strip()}"
    if done.returncode != 0 or done.timed_out:
        return Row(name, FAIL, f"{done.why(CHECK_TIMEOUT_S)}; {numbers}")
    return Row(name, PASS, numbers)


def row_repo_tests(gpus: int) -> Row:
    name = "(b) CUDA/NCCL tests of this repository"
    argv = pytest_argv("-q", "-rs", "tests/distributed/test_state_cuda.py", *PLUGIN_NCCL_TESTS)
    done = run(argv, timeout=REPO_TESTS_TIMEOUT_S, cwd=REPO, env=child_env())
    counts = parse_outcomes(done.output)
    numbers = ", ".join(f"{n} {what}" for what, n in counts.items()) or "no summary"
    numbers += f" in {done.seconds:.1f} s"
    if done.returncode != 0 or done.timed_out:
        return Row(name, FAIL, f"{done.why(REPO_TESTS_TIMEOUT_S)}; {numbers}")
    short: dict[str, int] = {}
    beyond: dict[str, int] = {}
    for skip in parse_skips(done.output):
        needed = gpus_needed(skip.reason)
        if needed is not None:
            found = short if needed <= gpus else beyond
            found[skip.reason] = found.get(skip.reason, 0) + skip.count

    def listed(found: dict[str, int]) -> str:
        return "; ".join(f"{count} x '{reason}'" for reason, count in found.items())

    if short:
        return Row(name, FAIL, f"skipped for lack of GPUs this machine has: {listed(short)}")
    if not counts.get("passed"):
        return Row(name, FAIL, f"no test passed: {numbers}")
    if beyond:
        numbers += f"; skipped, needing more than the {gpus} GPU(s) here: {listed(beyond)}"
    return Row(name, PASS, numbers)


def row_reuse(work: Path, visible: str, tests: int) -> list[Row]:
    name = f"(c) {tests} NCCL tests: reused world vs fresh processes"
    project = work / "reuse"
    write_project(project, {"test_reuse.py": REUSE_TESTS.format(count=tests)})
    per_test: dict[str, list[float]] = {}
    walls: dict[str, float] = {}
    for mode, extra, timeout in (
        ("reused", (), REUSED_TIMEOUT_S),
        ("isolated", ("--dist-isolate",), ISOLATED_TIMEOUT_S),
    ):
        junit = project / f"{mode}.xml"
        argv = pytest_argv("-q", "--dist-require-gpus", f"--junitxml={junit}", *extra)
        done = run(argv, timeout=timeout, cwd=project, env=child_env(visible))
        counts = parse_outcomes(done.output)
        if done.returncode != 0 or done.timed_out or counts.get("passed") != tests:
            return [Row(name, FAIL, f"{mode}: {done.why(timeout)}; {counts}")]
        per_test[mode] = parse_junit_times(junit.read_text(encoding="utf-8"))
        walls[mode] = done.seconds
    reused, isolated = median(per_test["reused"]), median(per_test["isolated"])
    ratio = f"{isolated / reused:.1f}x" if reused > 0 else "n/a"
    first = per_test["reused"][0] if per_test["reused"] else float("nan")
    detail = (
        f"per test (median): reused {ms(reused)}, fresh {ms(isolated)}, "
        f"ratio {ratio}; first reused test {ms(first)}; "
        f"wall {walls['reused']:.1f} s vs {walls['isolated']:.1f} s"
    )
    return [Row(name, PASS, detail)]


def row_contention(
    work: Path,
    run_gpus: list[str],
    outside: list[str] | None,
    workers: int,
    tests: int,
    hold: float,
) -> Row:
    """``outside``: the GPUs left out of the run (None: the run's GPUs are indices, as this
    torch gives no UUIDs, and which GPU a rank used cannot be told from them)."""
    name = f"(d) leases, -n {workers} on {len(run_gpus)} GPU{'s' if len(run_gpus) > 1 else ''}"
    try:
        importlib.import_module("xdist")
    except ImportError:
        return Row(name, SKIP, "pytest-xdist is not installed")
    project = work / f"contention-{workers}"
    records_dir = project / "records"
    source = CONTENTION_TESTS.format(count=tests)
    if len(run_gpus) >= 2:
        source += CONTENTION_TESTS_TWO.format(count=tests)
    write_project(project, {"test_contention.py": source})
    records_dir.mkdir()
    env = child_env(
        ",".join(run_gpus),
        GPU_ACCEPTANCE_RECORDS=str(records_dir),
        GPU_ACCEPTANCE_HOLD_S=str(hold),
    )
    argv = pytest_argv("-q", "-n", str(workers), "--dist-require-gpus")
    sampler = Sampler()
    sampler.start()
    try:
        done = run(argv, timeout=CONTENTION_TIMEOUT_S, cwd=project, env=env)
    finally:
        sampler.stop()
    counts = parse_outcomes(done.output)
    expected = tests * (2 if len(run_gpus) >= 2 else 1)
    if done.returncode != 0 or done.timed_out or counts.get("passed") != expected:
        return Row(name, FAIL, f"{done.why(CONTENTION_TIMEOUT_S)}; {counts}")
    records = [json.loads(path.read_text(encoding="utf-8")) for path in records_dir.glob("*.json")]
    inside = set(run_gpus) if outside is not None else None
    problems = []
    worlds_at_once, where = most_worlds_at_once(records)
    if worlds_at_once > 1:
        problems.append(f"{worlds_at_once} worlds on {where} at once (the ranks' records)")
    sharing = ranks_sharing_a_gpu(records)
    if sharing > 1:
        problems.append(f"{sharing} ranks of one world on one GPU")
    strays = sorted({str(r["uuid"]) for r in records if inside and r["uuid"] not in inside})
    if strays:
        problems.append(f"ranks ran on GPUs outside the run: {', '.join(strays)}")
    pid_world = {int(r["pid"]): str(r["world"]) for r in records}
    detail = (
        f"{counts.get('passed')} passed in {done.seconds:.1f} s; records: max worlds on a GPU "
        f"at once {worlds_at_once}, ranks per GPU {sharing}"
    )
    if sampler.problem and not sampler.samples:
        detail += f"; not sampled: {sampler.problem}"
    else:
        sampled, processes, seen = sampled_worlds(sampler.samples, pid_world)
        outside_pids = outside_processes(sampler.samples, pid_world, inside or set())
        if inside is None:
            outside_pids, watched = set(), "not judged: no UUIDs"
        else:
            count = len(outside or ())
            watched = f"{count} GPU{'s' if count != 1 else ''} outside watched"
        detail += (
            f"; {sampler.source}: {len(sampler.samples)} samples, {seen} with the run's ranks, "
            f"max worlds on a GPU at once {sampled}, max ranks on a GPU {processes}, "
            f"processes outside the run's GPUs {len(outside_pids)} ({watched})"
        )
        if sampled > 1:
            problems.append(f"{sampled} worlds on one GPU at once ({sampler.source})")
        if outside_pids:
            problems.append(f"pids {sorted(outside_pids)} on GPUs outside the run")
        if seen == 0:
            detail += " (it showed none of the run's pids: another pid namespace?)"
        if sampler.problem:
            detail += f"; sampling stopped: {sampler.problem}"
    if problems:
        return Row(name, FAIL, "; ".join(problems) + f"; {detail}")
    return Row(name, PASS, detail)


def row_leaks(work: Path, visible: str) -> list[Row]:
    group_row, memory_row = (
        "(e) a process group left is reported",
        "(f) CUDA memory kept is reported",
    )
    project = work / "leaks"
    write_project(project, {"test_leak.py": LEAK_TESTS})
    made = 1 + LEAK_TESTS.splitlines().index("    return dist.new_group(list(range(world_size)))")
    done = run(
        pytest_argv("-q", "-W", "default"),
        timeout=LEAKS_TIMEOUT_S,
        cwd=project,
        env=child_env(visible),
    )
    counts = parse_outcomes(done.output)
    if done.returncode != 0 or done.timed_out or counts.get("passed") != 2:
        reason = f"{done.why(LEAKS_TIMEOUT_S)}; {counts}"
        return [Row(group_row, FAIL, reason), Row(memory_row, FAIL, reason)]
    text = " ".join(done.output.split())  # pytest may wrap a long warning
    rows = []
    expected = [
        (
            group_row,
            "test test_leak.py::test_leaks_a_group left behind in a reused rank",
            f"made at test_leak.py:{made} was not destroyed",
        ),
        (
            memory_row,
            "test test_leak.py::test_keeps_cuda_memory left behind in a reused rank",
            "bytes of CUDA memory allocated during the call are still allocated on cuda:",
        ),
    ]
    for name, names_test, finding in expected:
        if names_test in text and finding in text:
            rows.append(Row(name, PASS, f"warning names the test and '{finding}'"))
        else:
            missing = names_test if names_test not in text else finding
            rows.append(Row(name, FAIL, f"no warning with '{missing}'"))
    return rows


def table(rows: Sequence[Row]) -> str:
    header = ("check", "result", "numbers / reason")
    cells = [header, *((row.name, row.result, row.detail) for row in rows)]
    widths = [max(len(cell[i]) for cell in cells) for i in range(2)]
    lines = [f"{a:<{widths[0]}} | {b:<{widths[1]}} | {c}" for a, b, c in cells]
    lines.insert(1, "-" * widths[0] + "-+-" + "-" * widths[1] + "-+-" + "-" * 16)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--tests", type=int, default=200, help="tests of row (c) (200)")
    parser.add_argument(
        "--contention-tests", type=int, default=12, help="tests per world size in row (d) (12)"
    )
    parser.add_argument(
        "--hold", type=float, default=0.2, help="seconds a row (d) test holds its GPU"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--self-check", action="store_true", help="check the parsers and exit")
    args = parser.parse_args(argv)
    if args.self_check:
        self_check()
        gpu_sharing.self_check()
        print("gpu_acceptance: self-check ok")
        return 0
    found, nccl = probe()
    print(f"NCCL {nccl} (torch.cuda.nccl.version())", flush=True)
    if isinstance(found, str):
        print(
            f"gpu_acceptance: nothing to check here: {found}. Run it on a machine with at "
            "least one CUDA GPU and a CUDA build of torch.",
            file=sys.stderr,
        )
        return NO_GPU_EXIT
    machine = found
    progress(f"torch {machine.torch}, CUDA {machine.cuda}, {machine.count} GPU(s): {machine.uuids}")
    known = [uuid for uuid in machine.uuids if uuid]
    if len(known) == machine.count:
        run_gpus = known[:-1] if len(known) >= 3 else known
        outside = [uuid for uuid in known if uuid not in run_gpus]
    else:  # no UUIDs from this torch: the GPUs by index, nothing left out
        run_gpus, outside = [str(index) for index in range(machine.count)], None
        progress("torch gives no GPU UUIDs: row (d) compares indices, and watches no GPU outside")
    visible = ",".join(run_gpus)
    work = Path(tempfile.mkdtemp(prefix="gpu-acceptance-"))
    started = time.monotonic()
    rows: list[Row] = []
    try:
        rows.append(row_check(machine.count))
        rows.append(row_repo_tests(machine.count))
        rows += row_reuse(work, visible, args.tests)
        for workers in sorted({2, len(run_gpus) + 1}):
            rows.append(
                row_contention(work, run_gpus, outside, workers, args.contention_tests, args.hold)
            )
        rows += row_leaks(work, visible)
        rows += gpu_sharing.rows(
            sys.modules[__name__],
            work,
            run_gpus[0],
            args.tests,
            machine.torch,
            machine.nccl_version,
        )
    except KeyboardInterrupt:
        if _current is not None:
            _kill_group(_current.pid)
        # An interrupted run still shows what it finished (a bound such as `timeout -s INT`).
        print(f"interrupted after {time.monotonic() - started:.0f} s; the rows done:")
        print(table(rows))
        raise
    finally:
        if args.keep:
            progress(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"torch {machine.torch}, CUDA {machine.cuda}, {machine.count} GPU(s); "
        f"{time.monotonic() - started:.0f} s in all"
    )
    print(table(rows))
    for row in rows:
        if row.result == SKIP:
            print(f"not run: {row.name}: {row.detail}")
    return 1 if any(row.result == FAIL for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
