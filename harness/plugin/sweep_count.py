"""The clean run that counts a sweep's collectives: a pytest subprocess, its cache, its failure.

A sweep over ``at="all"`` (:mod:`harness.plugin.sweep_cases`) needs each rank's collectives of a
clean run of the test. :func:`count` runs the test alone in a pytest subprocess (its own
fixtures, conftests and ini, on fresh ranks), twice, whose ranks write what they issued
(:func:`harness.rank.sweep_body.counted`); the two must agree. Its result is cached under
pytest's cache directory by the test's node id, its file's source, the world size,
``--dist-backend`` and torch's version, behind a file lock: under pytest-xdist every worker
collects the same cases, and only the first pays for the count. A change in another file the
count depends on needs ``--cache-clear``. A clean run that fails is not cached: its own
failure report, written by the subprocess (:class:`FailureRecorder`), is what the sweep's
case says. This module imports no torch.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from harness.faults import ALL
from harness.plugin import report, settings

COUNT_TEST = "HARNESS_SWEEP_COUNT"
"""Set for the counting subprocess: the node id of the test being counted."""

COUNT_DIR = "HARNESS_SWEEP_COUNT_DIR"
"""Set for the counting subprocess: where its ranks write what they issued."""

FAILURE = "failure.txt"
"""The file of the counting subprocess's directory that holds its first failure report."""

# Per test (its definition's node id): each rank's collectives of a clean run, per group.
_COUNTED = pytest.StashKey[dict[str, dict[int, dict[str, list[list[str]]]]]]()
_FLAGS = ("-p", "-o", "--confcutdir")  # passed on to the counting run
_OPTIONS = ("--dist-backend", "--dist-timeout", "--dist-gpus")
_TRANSCRIPT_LINES = 30  # of a counting run that failed without a report of its own


def counted_before(config: pytest.Config, nodeid: str) -> dict[int, dict[str, Any]]:
    """What :func:`count` found this session for the test ``nodeid`` (empty: not counted)."""
    return config.stash.get(_COUNTED, {}).get(nodeid, {})


def count(config: pytest.Config, nodeid: str, world_size: int) -> dict[int, dict[str, Any]]:
    """Each rank's collectives of a clean run of the test ``nodeid``, per group (``""``:
    the default group): from the cache, else counted now (see the module's docstring).

    Raises:
        ValueError: The clean run failed, or its two runs differ.
    """
    counted_here = config.stash.setdefault(_COUNTED, {})
    if nodeid in counted_here:
        return counted_here[nodeid]
    path, _, _ = nodeid.partition("::")
    source = (config.rootpath / path).read_bytes()
    backend = settings.backend_option(config)
    parts = [nodeid, str(world_size), backend, _version("torch"), _version("fhelium")]
    digest = hashlib.sha256("\0".join(parts).encode() + b"\0" + source).hexdigest()[:20]
    directory = _cache_dir(config)
    result = directory / f"{digest}.json"
    with open(directory / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process counts; the others wait, then read
        if not result.exists():
            try:
                found = _count_now(config, nodeid, directory / digest)
            finally:  # its ranks' files and its tmp_path: the count is all that is kept
                shutil.rmtree(directory / digest, ignore_errors=True)
            result.with_suffix(".tmp").write_text(json.dumps(found), encoding="utf-8")
            os.replace(result.with_suffix(".tmp"), result)
    loaded = json.loads(result.read_text(encoding="utf-8"))
    issued = {int(rank): groups for rank, groups in loaded.items()}
    counted_here[nodeid] = issued
    return issued


def _count_now(config: pytest.Config, nodeid: str, workdir: Path) -> dict[str, Any]:
    """Run the test's two clean runs in a pytest subprocess; each rank's collectives."""
    workdir.mkdir(parents=True, exist_ok=True)
    for old in [*workdir.glob("*.json"), workdir / FAILURE]:
        old.unlink(missing_ok=True)
    path, sep, rest = nodeid.partition("::")
    args = [sys.executable, "-m", "pytest", str(config.rootpath / path) + sep + rest]
    args += ["-q", "-p", "no:randomly", "-p", "no:cacheprovider", "--dist-isolate"]
    args += [f"--basetemp={workdir / 'tmp'}", f"--rootdir={config.rootpath}"]
    if config.pluginmanager.hasplugin("xdist"):
        args.append("-n0")
    if config.inipath is not None:
        args.append(f"--config-file={config.inipath}")
    args += _passed_on(list(config.invocation_params.args))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update({COUNT_TEST: nodeid, COUNT_DIR: str(workdir)})
    done = subprocess.run(
        args,
        cwd=config.invocation_params.dir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    runs: dict[str, dict[str, Any]] = {}
    for file in sorted(workdir.glob("*.rank*.json")):
        case, _, rank = file.name.removesuffix(".json").rpartition(".rank")
        runs.setdefault(case, {})[rank] = json.loads(file.read_text(encoding="utf-8"))
    if done.returncode != 0 or not runs:
        raise ValueError(_failed(done, workdir / FAILURE))
    first_name, first = next(iter(runs.items()))
    for name, other in runs.items():
        difference = _difference(first, other)
        if difference:
            raise ValueError(
                f"two clean runs issued different collectives ({first_name} and {name}: "
                f"{difference}); a sweep over {ALL!r} needs the same ones in every run: "
                "give at=range(...), or make the test deterministic"
            )
    return first


def _difference(one: dict[str, Any], other: dict[str, Any]) -> str:
    """How two clean runs' collectives differ ('' when they do not)."""
    for rank in sorted(set(one) | set(other), key=int):
        mine, theirs = one.get(rank, {}), other.get(rank, {})
        for group in sorted(set(mine) | set(theirs)):
            a, b = len(mine.get(group, [])), len(theirs.get(group, []))
            if a != b:
                where = "the default group" if not group else f"group ({group})"
                return f"rank {rank} made {_collectives(a)} on {where}, then {b}"
    return ""


def _collectives(count: int) -> str:
    return f"{count} collective{'' if count == 1 else 's'}"


def _passed_on(args: list[str]) -> list[str]:
    """The arguments of this run that the counting run needs as well (plugins, ini
    overrides, the harness's backend, timeout and GPUs)."""
    kept = []
    for index, arg in enumerate(args):
        name = arg.split("=", 1)[0]
        if arg in _FLAGS and index + 1 < len(args):
            kept += [arg, args[index + 1]]
        elif name in _OPTIONS or name == "--confcutdir":
            kept.append(arg if "=" in arg or index + 1 >= len(args) else f"{arg}={args[index + 1]}")
        elif arg[:2] in ("-p", "-o") and len(arg) > 2:
            kept.append(arg)
    return kept


def _cache_dir(config: pytest.Config) -> Path:
    cache = getattr(config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir("harness-sweeps"))
    found = Path(tempfile.gettempdir()) / f"harness-sweeps-{os.getuid()}"
    found.mkdir(exist_ok=True)
    return found


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


class FailureRecorder:
    """The counting subprocess's plugin: it writes the first failure report of its run (the
    clean run's own, as pytest would show it) to :data:`FAILURE` in ``directory``."""

    def __init__(self, directory: str) -> None:
        self._path = Path(directory) / FAILURE

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        made = yield
        if made.failed:
            # Without its last line, which runs the counting case by an id (test[clean1])
            # that exists only in this subprocess.
            repro = report.repro(item)
            text = made.longreprtext
            self._write(text.replace(repro, "").rstrip() if repro else text)
        return made

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._write(report.longreprtext)

    def _write(self, text: str) -> None:
        if not self._path.exists() and text.strip():
            self._path.write_text(text.strip() + "\n", encoding="utf-8")


def _failed(done: subprocess.CompletedProcess[str], failure: Path) -> str:
    """Why a count failed, the clean run's own failure report first (else, where it failed
    before any test reported, the end of the subprocess's output)."""
    need = (
        f"(a sweep over {ALL!r} counts the collectives of a run without faults, which must "
        f"pass; the counting run's exit status: {done.returncode})"
    )
    if failure.exists():
        report = failure.read_text(encoding="utf-8").strip()
        return f"its clean run failed: {report}\n{need}"
    if done.returncode == 0:
        return f"its clean run counted nothing (was it skipped?) {need}"
    transcript = (done.stdout + done.stderr).strip().splitlines()[-_TRANSCRIPT_LINES:]
    return "its clean run failed; the end of its output:\n" + "\n".join([*transcript, need])
