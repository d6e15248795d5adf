"""The workload every benchmark runs, and the helpers they share.

The workload is deliberately tiny so that what is measured is the machinery around it:
each rank all-reduces a one-element tensor over the default (Gloo) process group and
then enters a barrier. ``noop`` is the same call with an empty body.

This module is imported by rank processes (the harness unpickles ``workload.noop`` there)
and by the generated test files of the PyTorch baselines, so it depends on nothing but
the standard library and torch, and it has no side effects at import time.

Helpers:

* ``memory_mib(pid)``: proportional set size and private memory of a process, from
  ``/proc/<pid>/smaps_rollup``.
* ``sample_pss()`` / ``record_pss(kind)``: run the workload, then every rank reads its own
  PSS while all ranks are alive (between two barriers), so the numbers of in-process
  baselines are comparable with what the harness controller samples from outside;
  ``record_pss`` writes them under ``$BENCH_OUT`` for the benchmark to ``read_pss``.
* ``median``, ``fmt_ms`` and friends: small formatting helpers for the tables.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
_TICK = os.sysconf("SC_CLK_TCK")


def all_reduce_barrier() -> float:
    """The workload: all_reduce a 1-element tensor, then a barrier; returns the sum."""
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    dist.barrier()
    value = float(tensor.item())
    if value != dist.get_world_size():
        raise AssertionError(f"all_reduce gave {value}, expected {dist.get_world_size()}")
    return value


def noop() -> None:
    """A call with an empty body: measures the per-call machinery alone."""


def workload_loop(times: int) -> None:
    """The workload ``times`` times in a row inside one call: the floor a call is set against."""
    for _ in range(times):
        all_reduce_barrier()


def small_all_reduce(rank: int) -> None:
    """The body of a typical small test: an all_reduce of 4 elements, told its rank."""
    tensor = torch.ones(4) * (rank + 1)
    dist.all_reduce(tensor)


def small_all_reduce_here() -> None:
    """:func:`small_all_reduce` as a ``World.run`` body (its rank read from the group)."""
    small_all_reduce(dist.get_rank())


def small_loop(times: int) -> None:
    """:func:`small_all_reduce_here` ``times`` times in a row inside one call: its floor."""
    for _ in range(times):
        small_all_reduce_here()


def tree_cpu() -> float:
    """CPU seconds of this process and all its descendants alive now (Linux: ``/proc``)."""
    total, pending = 0.0, [os.getpid()]
    while pending:
        pid = pending.pop()
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
                    pending += map(int, handle.read().split())
        except OSError:
            pass  # gone meanwhile
    return total


def memory_mib(pid: int | str = "self") -> tuple[float, float]:
    """(PSS, private) of a process in MiB, from ``/proc/<pid>/smaps_rollup`` (nan if unreadable).

    PSS counts each shared page divided by the number of processes sharing it; private is
    ``Private_Clean + Private_Dirty`` (pages no other process maps).
    """
    fields = {"Pss:": 0, "Private_Clean:": 0, "Private_Dirty:": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
            for line in handle:
                key, _, rest = line.partition(" ")
                if key in fields:
                    fields[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan"), float("nan")
    private = fields["Private_Clean:"] + fields["Private_Dirty:"]
    return fields["Pss:"] / 1024.0, private / 1024.0


def sample_pss() -> tuple[float, float]:
    """Run the workload, then read this rank's (PSS, private) while every rank is alive."""
    all_reduce_barrier()
    value = memory_mib()
    dist.barrier()
    return value


def record_pss(kind: str) -> None:
    """``sample_pss()`` on this rank, written to ``$BENCH_OUT/pss-<kind>-r<rank>-p<pid>``."""
    value = sample_pss()
    out = os.environ.get("BENCH_OUT")
    if out:
        path = os.path.join(out, f"pss-{kind}-r{dist.get_rank()}-p{os.getpid()}")
        with open(path, "w", encoding="ascii") as handle:
            handle.write(f"{value[0]!r} {value[1]!r}\n")


def read_pss(out: str) -> list[tuple[float, float]]:
    """Every (PSS, private) pair ``record_pss`` wrote under ``out``."""
    values = []
    for name in sorted(os.listdir(out)):
        if name.startswith("pss-"):
            with open(os.path.join(out, name), encoding="ascii") as handle:
                pss, private = handle.read().split()
            values.append((float(pss), float(private)))
    return values


# -- helpers for the benchmark scripts (controller side) ------------------------------------


def median(values: Sequence[float]) -> float:
    """Median, ``nan`` for an empty sequence."""
    return statistics.median(values) if values else float("nan")


def mean(values: Sequence[float]) -> float:
    """Mean of the finite values, ``nan`` if there are none."""
    finite = [v for v in values if v == v]
    return statistics.fmean(finite) if finite else float("nan")


def fmt(value: float, unit: str) -> str:
    """``12.3 ms`` / ``1.23 s`` / ``45.6 MiB``; ``n/a`` for nan."""
    if value != value:
        return "n/a"
    if unit == "ms":
        return f"{value * 1e3:.2f} ms" if value < 0.1 else f"{value * 1e3:.0f} ms"
    if unit == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    return f"{value:.1f} {unit}"


def ratio(baseline: float, ours: float) -> str:
    """``baseline / ours`` as ``12.3x`` (``n/a`` when either is missing)."""
    if baseline != baseline or ours != ours or ours <= 0 or baseline <= 0:
        return "n/a"
    value = baseline / ours
    return f"{value:.1f}x" if value >= 1 else f"{value:.2g}x"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table with a rule under the header (also valid Markdown)."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def child_env(extra_path: Sequence[str] = ()) -> dict[str, str]:
    """Environment for a benchmark child process: this directory importable, no site noise."""
    env = dict(os.environ)
    paths = [*extra_path, BENCH_DIR]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("RANK", None)  # never let a child think it runs under a launcher
    env.pop("WORLD_SIZE", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@contextlib.contextmanager
def child(argv: Sequence[str], **kwargs: object) -> Iterator[subprocess.Popen[str]]:
    """Start a child in its own session; on exit (also on Ctrl-C) kill its process group.

    Every process the child starts (ranks, forkserver, resource tracker) is in that group
    unless it made its own session, so nothing outlives the benchmark.
    """
    proc = subprocess.Popen(argv, start_new_session=True, text=True, **kwargs)  # type: ignore[call-overload]
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(2.0)
                except subprocess.TimeoutExpired:
                    pass
            # Grandchildren left behind by a dead child: the group still exists.
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class ChildRun:
    """What a finished child printed, with when (seconds after it was started).

    ``wall`` ends when the child itself exits; ``linger`` is how long a process it started
    kept its output pipe open after that (0 when none did; nan when one still had it open
    after the grace period and was killed).
    """

    wall: float
    returncode: int
    lines: list[tuple[float, str]] = field(default_factory=list)
    linger: float = 0.0

    @property
    def output(self) -> str:
        return "".join(line for _, line in self.lines)

    def first(self, prefix: str) -> tuple[float, list[str]] | None:
        """(time, words) of the first line starting with ``prefix``, or None."""
        for at, line in self.lines:
            if line.startswith(prefix):
                return at, line.split()
        return None

    def every(self, prefix: str) -> list[tuple[float, list[str]]]:
        """(time, words) of every line starting with ``prefix``."""
        return [(at, line.split()) for at, line in self.lines if line.startswith(prefix)]


def run_child(
    argv: Sequence[str],
    *,
    timeout: float,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    linger_s: float = 30.0,
) -> ChildRun:
    """Run a child to completion, timestamping each line of its output (stderr included).

    After ``timeout`` seconds its whole process group is killed (returncode then -9). Once
    the child has exited, processes it left behind get ``linger_s`` to close the output
    pipe; then the group is killed.
    """
    start = time.perf_counter()
    lines: list[tuple[float, str]] = []
    with child(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1
    ) as proc:
        stream = proc.stdout
        assert stream is not None

        def read() -> None:
            for line in stream:
                lines.append((time.perf_counter() - start, line))

        reader = threading.Thread(target=read, name="bench-child-output", daemon=True)
        reader.start()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            proc.wait()
        wall = time.perf_counter() - start
        reader.join(linger_s)
        linger = time.perf_counter() - start - wall if not reader.is_alive() else float("nan")
    reader.join()  # the group is gone now, so the pipe is closed
    stream.close()
    return ChildRun(wall, proc.returncode, lines, linger)


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def python() -> str:
    """The interpreter running the benchmark (the project's virtualenv)."""
    return sys.executable
