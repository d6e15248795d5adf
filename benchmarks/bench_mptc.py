"""Benchmark ``--dist-mptc`` on PyTorch's own distributed tests: native run vs reused ranks.

Run by hand, never in CI (nothing here asserts on time). PyTorch's test files are not part of
its wheel: fetch ``test/distributed/test_distributed_spawn.py`` (and, for ``--c10d``,
``test_c10d_gloo.py`` with its helper ``test_c10d_common.py``) from the PyTorch repository of
the installed version into a directory outside this repository, then::

    python benchmarks/bench_mptc.py DIR [--keyword EXPR] [--c10d-keyword EXPR]

Each suite is run twice in a fresh ``python -m pytest -q -rs -p no:randomly`` child, same
selection: natively (each test spawns its processes) and with ``--dist-mptc``. The
``test_distributed_spawn.py`` children get ``BACKEND=gloo WORLD_SIZE=2``, a fresh
``TEMP_DIR`` (with its ``barrier`` directory) and ``INIT_METHOD=file://TEMP_DIR/init``, as
PyTorch's CI sets them. The table gives, per run, the counts pytest reports, whether the
skip reasons are the same, the wall time and the ratio native / ``--dist-mptc``.

Every child runs in its own session, its process group is killed when it ends, and its
temp files go to one directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

SPAWN_KEYWORD = (
    "test_all_reduce_sum or test_broadcast or test_get_rank or test_barrier_group "
    "or test_gather_object"
)
"""18 tests of ``TestDistBackendWithSpawnGLOO`` (torch 2.13): collectives, groups, object
collectives, and tests that skip on a CPU-only machine or at world size 2."""

C10D_KEYWORD = "ProcessGroupGlooTest and (allreduce_basics or broadcast_basics or checks)"
"""A handful of ``ProcessGroupGlooTest`` tests of ``test_c10d_gloo.py``."""

_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected)")


@dataclass
class Run:
    """One pytest child: its counts, skip reasons and wall time."""

    counts: dict[str, int] = field(default_factory=dict)
    skips: list[str] = field(default_factory=list)
    seconds: float = 0.0
    rc: int = 0
    tail: str = ""


def run_pytest(args: list[str], cwd: str, env: dict[str, str], timeout: float) -> Run:
    """Run ``python -m pytest ARGS`` in ``cwd``; its counts, skip reasons and wall time."""
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:randomly", *args]
    started = time.monotonic()
    child = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = child.communicate(timeout=timeout)
    finally:
        # Whatever the child left (its spawned test processes), killed with it.
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    run = Run(seconds=time.monotonic() - started, rc=child.returncode)
    lines = out.splitlines()
    summary = next((line for line in reversed(lines) if " in " in line and _COUNT.search(line)), "")
    for number, what in _COUNT.findall(summary):
        run.counts["errors" if what.startswith("error") else what] = int(number)
    # "SKIPPED [1] path:line: reason": the reason only (a skip raised by the class's check
    # is located at the check in either run).
    run.skips = sorted(
        line.split(": ", 1)[1] for line in lines if line.startswith("SKIPPED [") and ": " in line
    )
    run.tail = "\n".join(lines[-15:])
    return run


def counts_text(run: Run) -> str:
    return ", ".join(
        f"{run.counts.get(key, 0)} {key}" for key in ("passed", "skipped", "failed", "errors")
    )


def compare(name: str, args: list[str], cwd: str, env: dict[str, str], timeout: float) -> None:
    print(f"{name}: native run ...", file=sys.stderr)
    native = run_pytest(args, cwd, env, timeout)
    print(f"{name}: --dist-mptc run ...", file=sys.stderr)
    reused = run_pytest([*args, "--dist-mptc"], cwd, env, timeout)
    same = native.counts == reused.counts and native.skips == reused.skips
    ratio = native.seconds / reused.seconds if reused.seconds else float("nan")
    print(f"\n### {name}\n")
    print("| run | counts | wall time |")
    print("|-----|--------|-----------|")
    print(f"| native | {counts_text(native)} | {native.seconds:.1f} s |")
    print(f"| --dist-mptc | {counts_text(reused)} | {reused.seconds:.1f} s |")
    print(
        f"\nsame counts and skip reasons: {'yes' if same else 'NO'}; "
        f"native / --dist-mptc: {ratio:.1f}x"
    )
    for reason in sorted(set(native.skips)):
        print(f"  skipped ({native.skips.count(reason)}x): {reason}")
    if not same:
        print("\nnative run, last lines:\n" + native.tail)
        print("\n--dist-mptc run, last lines:\n" + reused.tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", help="directory with PyTorch's test_distributed_spawn.py")
    parser.add_argument("--keyword", default=SPAWN_KEYWORD, help="-k for the spawn suite")
    parser.add_argument(
        "--c10d",
        action="store_true",
        help="also run test_c10d_gloo.py (needs test_c10d_common.py beside it)",
    )
    parser.add_argument("--c10d-keyword", default=C10D_KEYWORD, help="-k for test_c10d_gloo.py")
    parser.add_argument("--timeout", type=float, default=3600.0, help="bound on each child")
    options = parser.parse_args()
    tests = os.path.abspath(options.dir)
    root = tempfile.mkdtemp(prefix="bench-mptc-")
    try:
        # An empty pytest.ini beside the copies: no configuration of another project applies.
        work = os.path.join(root, "tests")
        os.mkdir(work)
        names = ["test_distributed_spawn.py"]
        if options.c10d:
            names += ["test_c10d_gloo.py", "test_c10d_common.py"]
        for name in names:
            shutil.copy(os.path.join(tests, name), work)
        with open(os.path.join(work, "pytest.ini"), "w") as handle:
            handle.write("[pytest]\n")
        temp = os.path.join(root, "temp")
        os.makedirs(os.path.join(temp, "barrier"))
        env = {
            **os.environ,
            "TMPDIR": root,
            "BACKEND": "gloo",
            "WORLD_SIZE": "2",
            "TEMP_DIR": temp,
            "INIT_METHOD": f"file://{temp}/init",
        }
        env.pop("PYTEST_ADDOPTS", None)
        print(
            f"python {sys.version.split()[0]}, load average {os.getloadavg()}, "
            f"{os.cpu_count()} CPUs"
        )
        compare(
            "test_distributed_spawn.py (TestDistBackendWithSpawnGLOO)",
            ["test_distributed_spawn.py", "-k", options.keyword],
            work,
            env,
            options.timeout,
        )
        if options.c10d:
            compare(
                "test_c10d_gloo.py",
                ["test_c10d_gloo.py", "-k", options.c10d_keyword],
                work,
                env,
                options.timeout,
            )
        print(f"\nload average after: {os.getloadavg()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
