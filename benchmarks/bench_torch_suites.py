"""Benchmark ``--dist-mptc`` on PyTorch's own distributed suites: outcomes and wall time.

Run by hand, never by the test suite (nothing here asserts on time). PyTorch's test files are
not part of its wheel: get the ``test/`` tree of the PyTorch version that is installed (for
torch 2.13: ``git clone --depth 1 --branch v2.13.0 https://github.com/pytorch/pytorch`` or
``git archive`` of that tag, keeping ``test/distributed``) into a directory outside this
repository, then::

    python benchmarks/bench_torch_suites.py PYTORCH/test [--suites dtensor,device_mesh,...]
        [--keyword SUITE=EXPR ...] [--results DIR] [--reuse-native]

Each suite (below) runs twice with the same selection, each time in a fresh
``python -m pytest -p no:randomly -p no:cacheprovider --junitxml=...`` child: natively (every
test spawns its processes) and with ``--dist-mptc``. The outcome of every test is read from the
JUnit XML. Per suite it prints the tests, the counts (passed, failed, skipped, error) of both
runs, every test whose outcome differs (id, native, ours), the wall times and the ratio native
/ ``--dist-mptc``; a Markdown table of all suites comes last.

The files are copied (``distributed/`` of the tree, with an empty ``pytest.ini``, so that no
configuration of PyTorch's repository applies) into a temporary directory, removed at the
end. Every child runs in its own session and its process group is killed when it ends. The
``spawn`` suite's children get ``BACKEND=gloo WORLD_SIZE=2``, a fresh ``TEMP_DIR`` (with its
``barrier`` directory) and ``INIT_METHOD=file://TEMP_DIR/init``, as PyTorch's CI sets them
(see ``bench_mptc.py``, which measures that suite's skip reasons too). ``--results DIR``
keeps each run's JUnit XML (``SUITE-native.xml``, ``SUITE-mptc.xml``: the failure messages)
and its outcomes and wall time (``SUITE-MODE.json``) there; ``--reuse-native`` then takes
the native runs from it instead of running them again (they take the longest).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

from bench_mptc import SPAWN_KEYWORD
from workload import run_child


@dataclass(frozen=True)
class Suite:
    """One of PyTorch's suites: its files (relative to ``test/``) and default selection."""

    name: str
    files: tuple[str, ...]
    keyword: str = ""
    spawn_env: bool = False


SUITES = {
    suite.name: suite
    for suite in (
        # DTensor: the files of test/distributed/tensor/ written on DTensorTestBase (a
        # MultiProcessTestCase); pass --keyword dtensor=... or your own file list to widen it.
        Suite("dtensor", ("distributed/tensor/test_dtensor.py",)),
        Suite("device_mesh", ("distributed/test_device_mesh.py",)),
        Suite("c10d_common", ("distributed/test_c10d_common.py",)),
        Suite("c10d_gloo", ("distributed/test_c10d_gloo.py",)),
        Suite(
            "spawn",
            ("distributed/test_distributed_spawn.py",),
            keyword=SPAWN_KEYWORD,
            spawn_env=True,
        ),
        # The TensorPipe RPC agent's RPC tests (39 in torch 2.13); the file's other classes
        # (dist autograd, optimizer, remote module, DDP) are there for --keyword rpc=...
        Suite(
            "rpc",
            ("distributed/rpc/test_tensorpipe_agent.py",),
            keyword="TensorPipeRpcTestWithSpawn",
        ),
    )
}

OUTCOMES = ("passed", "failed", "skipped", "error")


@dataclass
class Run:
    """One pytest child: each test's outcome (by test id) and the wall time."""

    outcomes: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    rc: int = 0
    tail: str = ""

    def counts(self) -> dict[str, int]:
        """How many tests ended in each outcome."""
        found = dict.fromkeys(OUTCOMES, 0)
        for outcome in self.outcomes.values():
            found[outcome] = found.get(outcome, 0) + 1
        return found

    def to_json(self) -> dict[str, object]:
        """The run as ``--results`` keeps it."""
        return {"outcomes": self.outcomes, "seconds": self.seconds, "rc": self.rc}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Run:
        """A run ``--results`` kept."""
        outcomes = data["outcomes"]
        assert isinstance(outcomes, dict)
        seconds = data["seconds"]
        rc = data["rc"]
        assert isinstance(seconds, float)
        assert isinstance(rc, int)
        return cls(outcomes=dict(outcomes), seconds=seconds, rc=rc)


def parse_junit(path: str) -> dict[str, str]:
    """Each test's outcome in a pytest JUnit XML file.

    Args:
        path: The file ``--junitxml`` wrote.

    Returns:
        ``{"classname::name": outcome}``, outcome one of :data:`OUTCOMES` (an error in setup
        or teardown counts as ``error``, as pytest's own summary counts it).
    """
    outcomes: dict[str, str] = {}
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return outcomes
    for case in root.iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        if "error" in tags:
            outcome = "error"
        elif "failure" in tags:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        # A test that failed and then errored in teardown is listed twice: the worse stays.
        if outcomes.get(test) != "error":
            outcomes[test] = outcome
    return outcomes


def run_pytest(args: list[str], cwd: str, env: dict[str, str], timeout: float, xml: str) -> Run:
    """Run ``python -m pytest ARGS --junitxml=XML`` in ``cwd``; each test's outcome and the
    child's wall time.

    Args:
        args: pytest's arguments (files, ``-k``, ``--dist-mptc``).
        cwd: Where the child runs.
        env: Its environment.
        timeout: Seconds before the child (and what it started) is killed.
        xml: Where its JUnit XML goes.

    Returns:
        The run; tests the child never reported (killed at the timeout) are missing.
    """
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        f"--junitxml={xml}",
        *args,
    ]
    # In a session of its own: whatever the child left (its spawned test processes) is
    # killed with it, also at the timeout.
    ran = run_child(command, timeout=timeout, cwd=cwd, env=env)
    tail = "\n".join(ran.output.splitlines()[-15:])
    if ran.returncode == -signal.SIGKILL:
        tail += f"\nkilled after {timeout} s"
    return Run(parse_junit(xml), ran.wall, ran.returncode, tail)


def _environment(root: str, spawn_env: bool) -> dict[str, str]:
    """A child's environment: ours, temp files under ``root``, ``test_distributed_spawn.py``'s
    variables where ``spawn_env``."""
    env = {**os.environ, "TMPDIR": root}
    env.pop("PYTEST_ADDOPTS", None)
    if spawn_env:
        temp = tempfile.mkdtemp(prefix="spawn-", dir=root)
        os.makedirs(os.path.join(temp, "barrier"))
        env.update(
            {
                "BACKEND": "gloo",
                "WORLD_SIZE": "2",
                "TEMP_DIR": temp,
                "INIT_METHOD": f"file://{temp}/init",
            }
        )
    return env


def _counts_text(run: Run) -> str:
    counts = run.counts()
    return ", ".join(f"{counts[key]} {key}" for key in OUTCOMES)


@dataclass
class Compared:
    """One suite, both ways."""

    suite: str
    native: Run
    ours: Run
    selection: str = "whole file"

    def differences(self) -> list[tuple[str, str, str]]:
        """``(test id, native outcome, ours)`` of every test whose outcome differs."""
        tests = sorted(set(self.native.outcomes) | set(self.ours.outcomes))
        return [
            (test, self.native.outcomes.get(test, "-"), self.ours.outcomes.get(test, "-"))
            for test in tests
            if self.native.outcomes.get(test) != self.ours.outcomes.get(test)
        ]

    def ratio(self) -> float:
        return self.native.seconds / self.ours.seconds if self.ours.seconds else float("nan")


def compare(
    suite: Suite, work: str, root: str, keyword: str, options: argparse.Namespace
) -> Compared | None:
    """Run one suite natively (or take that run from ``--results``) and with ``--dist-mptc``,
    and print how they compare; None where its files are missing."""
    missing = [name for name in suite.files if not os.path.exists(os.path.join(work, name))]
    if missing:
        print(f"\n### {suite.name}: skipped, missing {', '.join(missing)}")
        return None
    args = [*suite.files, *(["-k", keyword] if keyword else [])]
    runs: dict[str, Run] = {}
    for mode, extra in (("native", []), ("mptc", ["--dist-mptc"])):
        kept = os.path.join(options.results, f"{suite.name}-{mode}.json") if options.results else ""
        if mode == "native" and options.reuse_native and kept and os.path.exists(kept):
            with open(kept) as handle:
                runs[mode] = Run.from_json(json.load(handle))
            print(f"{suite.name}: native run taken from {kept}", file=sys.stderr)
            continue
        print(f"{suite.name}: {mode} run ...", file=sys.stderr)
        xml = os.path.join(options.results or root, f"{suite.name}-{mode}.xml")
        env = _environment(root, suite.spawn_env)
        runs[mode] = run_pytest([*args, *extra], work, env, options.timeout, xml)
        if kept:
            with open(kept, "w") as handle:
                json.dump(runs[mode].to_json(), handle, indent=1)
    compared = Compared(
        suite.name, runs["native"], runs["mptc"], f"`{keyword}`" if keyword else "whole file"
    )
    print(f"\n### {suite.name}: {' '.join(suite.files)}" + (f" -k {keyword!r}" if keyword else ""))
    print(f"\ntests: {len(set(compared.native.outcomes) | set(compared.ours.outcomes))}")
    print(f"native:      {_counts_text(compared.native)} in {compared.native.seconds:.1f} s")
    print(f"--dist-mptc: {_counts_text(compared.ours)} in {compared.ours.seconds:.1f} s")
    print(f"native / --dist-mptc: {compared.ratio():.1f}x")
    differences = compared.differences()
    print(f"differences: {len(differences)}")
    for test, native, ours in differences:
        print(f"  {test}: native {native}, --dist-mptc {ours}")
    for name, run in (("native", compared.native), ("--dist-mptc", compared.ours)):
        # pytest's exit code 2 and up: interrupted, an internal error, a usage error.
        if not run.outcomes or run.rc not in (0, 1):
            print(f"\n{name} run: exit code {run.rc}; last lines:\n{run.tail}")
    return compared


def table(results: list[Compared]) -> str:
    """The Markdown table of every suite."""
    lines = [
        "| suite | selection | tests | native (pass/fail/skip/error) "
        "| `--dist-mptc` (pass/fail/skip/error) | differences | native | `--dist-mptc` | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for compared in results:
        counts = [
            "/".join(str(run.counts()[key]) for key in OUTCOMES)
            for run in (
                compared.native,
                compared.ours,
            )
        ]
        tests = len(set(compared.native.outcomes) | set(compared.ours.outcomes))
        lines.append(
            f"| {compared.suite} | {compared.selection} | {tests} | {counts[0]} | {counts[1]} "
            f"| {len(compared.differences())} | {compared.native.seconds:.1f} s "
            f"| {compared.ours.seconds:.1f} s | **{compared.ratio():.1f}x** |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("test_dir", help="PyTorch's test/ directory (with distributed/ in it)")
    parser.add_argument(
        "--suites",
        default=",".join(SUITES),
        help=f"comma-separated, of {', '.join(SUITES)} (default: all)",
    )
    parser.add_argument(
        "--keyword",
        action="append",
        default=[],
        metavar="SUITE=EXPR",
        help="-k for one suite (repeatable); SUITE= alone selects all of it",
    )
    parser.add_argument("--timeout", type=float, default=7200.0, help="bound on each child")
    parser.add_argument("--results", default="", help="keep each run's outcomes here (JSON)")
    parser.add_argument(
        "--reuse-native",
        action="store_true",
        help="take native runs from --results where it has them",
    )
    options = parser.parse_args()
    keywords = {suite.name: suite.keyword for suite in SUITES.values()}
    for item in options.keyword:
        name, _, expression = item.partition("=")
        if name not in SUITES:
            parser.error(f"--keyword: no suite {name!r}")
        keywords[name] = expression
    chosen = [name.strip() for name in options.suites.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SUITES]
    if unknown:
        parser.error(f"--suites: no suite {', '.join(unknown)}")
    if options.results:
        os.makedirs(options.results, exist_ok=True)
    source = os.path.join(os.path.abspath(options.test_dir), "distributed")
    if not os.path.isdir(source):
        parser.error(f"{source} is not a directory")
    root = tempfile.mkdtemp(prefix="bench-torch-suites-")
    try:
        work = os.path.join(root, "tests")
        shutil.copytree(source, os.path.join(work, "distributed"))
        with open(os.path.join(work, "pytest.ini"), "w") as handle:
            handle.write("[pytest]\n")
        import torch

        print(
            f"torch {torch.__version__}, python {sys.version.split()[0]}, "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()}"
        )
        results = []
        for name in chosen:
            compared = compare(SUITES[name], work, root, keywords[name], options)
            if compared is not None:
                results.append(compared)
        print(f"\nload average after: {os.getloadavg()}\n")
        print(table(results))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
