"""The clean run that counts a sweep's collectives: a pytest subprocess, its cache, its failure.

A sweep over ``at="all"`` (:mod:`harness.plugin.sweep_cases`) needs each rank's collectives of a
clean run of the test. :func:`count` runs the test alone in a pytest subprocess (its own
fixtures, conftests and ini, on fresh ranks), twice, whose ranks write what they issued and
the files they imported (:func:`harness.rank.sweep_body.counted`); the two must agree. Its
result is cached under pytest's cache directory by the test's node id, the world size,
``--dist-backend`` and the versions of torch, fhelium and Python, and reused for as long as
the project's files that the counting run imported are unchanged
(:mod:`harness.plugin.sweep_key`): editing the library under test counts again. The cache is
behind a file lock: under pytest-xdist every worker collects the same cases, and only the
first pays for the count. A clean run that fails is not cached: its own failure report,
written by the subprocess (:class:`CountingRun`), is what the sweep's case says.

A case whose run contradicts the count (:mod:`harness.plugin.sweep_recount`) counts again,
once per test and session (:func:`recount`). This module imports no torch.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.faults import ALL, Fault
from harness.plugin import report, settings, sweep_key

COUNT_TEST = "HARNESS_SWEEP_COUNT"
"""Set for the counting subprocess: the node id of the test being counted."""

COUNT_DIR = "HARNESS_SWEEP_COUNT_DIR"
"""Set for the counting subprocess: where its ranks write what they issued."""

FAILURE = "failure.txt"
"""The file of the counting subprocess's directory that holds its first failure report."""

FILES = "pytest.files.json"
"""The file of the counting subprocess's directory that lists what its pytest imported."""

Issued = dict[int, dict[str, list[list[str]]]]
"""Each rank's collectives of a clean run, per group (``""``: the default group; else its
sorted ranks joined by commas), each as ``[op, call site, origin]``."""


@dataclass
class Count:
    """A test's count, as this session holds it.

    Attributes:
        issued: What it counted.
        token: Which counting run it is (its cache entry's; '' where this session's cases
            were made from an earlier one, see :func:`count`).
        world_size: The world it was counted in.
        recounted: Whether this session counted it again (once per test: :func:`recount`).
        failure: Why counting again failed ('' when it did not).
    """

    issued: Issued
    token: str
    world_size: int
    recounted: bool = False
    failure: str = ""

    def of(self, fault: Fault) -> list[list[str]]:
        """The collectives counted of ``fault``'s rank on its group."""
        group = "" if fault.group is None else ",".join(map(str, fault.group))
        return self.issued.get(fault.rank, {}).get(group, [])


# Per test (its definition's node id): its count.
_COUNTED = pytest.StashKey[dict[str, Count]]()
_FLAGS = ("-p", "-o", "--confcutdir")  # passed on to the counting run
_OPTIONS = ("--dist-backend", "--dist-timeout", "--dist-gpus")
_TRANSCRIPT_LINES = 30  # of a counting run that failed without a report of its own


def counted_before(config: pytest.Config, nodeid: str) -> Count | None:
    """What :func:`count` found this session for the test ``nodeid`` (None: not counted)."""
    return config.stash.get(_COUNTED, {}).get(nodeid)


def count(config: pytest.Config, nodeid: str, world_size: int) -> Issued:
    """Each rank's collectives of a clean run of the test ``nodeid``, per group: from the
    cache where the project's files it imported are unchanged, else counted now (see the
    module's docstring).

    Under pytest-xdist, where a worker of this run counted again already (:func:`recount`),
    the count the run's cases were made from, so that every worker collects the same cases.

    Raises:
        ValueError: The clean run failed, or its two runs differ.
    """
    counted_here = config.stash.setdefault(_COUNTED, {})
    if nodeid in counted_here:
        return counted_here[nodeid].issued
    entry = _Entry(config, nodeid, world_size)
    with entry.locked():
        found = entry.read()
        if found is None:
            found = entry.write(_count_now(config, nodeid, entry.workdir))
    collected = found.get("collected", {})
    if collected.get("run") and collected.get("run") == _run(config):
        counted = Count(_issued(collected["issued"]), "", world_size)
    else:
        counted = Count(_issued(found["issued"]), found["token"], world_size)
    counted_here[nodeid] = counted
    return counted.issued


def recount(config: pytest.Config, nodeid: str) -> Count:
    """Count the test ``nodeid`` again, once per session (the count this session holds,
    after :func:`count`, stands for every later call): a case's run contradicted it.

    A count that another process made since this session read its own is taken as it is
    (a pytest-xdist worker counted again first). Where counting fails, the count's
    ``failure`` says why.
    """
    counted = config.stash[_COUNTED][nodeid]
    if counted.recounted:
        return counted
    entry = _Entry(config, nodeid, counted.world_size)
    with entry.locked():
        found = entry.read()
        if found is None or found["token"] == counted.token:
            try:
                made = _count_now(config, nodeid, entry.workdir)
            except ValueError as exc:
                counted.recounted, counted.failure = True, str(exc)
                return counted
            run = _run(config)
            # What this run's cases were made from, for its workers still collecting.
            collected = {"run": run, "issued": counted.issued} if run else None
            found = entry.write(made, collected)
    counted.issued, counted.token = _issued(found["issued"]), found["token"]
    counted.recounted = True
    return counted


def _run(config: pytest.Config) -> str:
    """The pytest-xdist run this worker belongs to, the same in each of its workers ('':
    no worker of one)."""
    workerinput: dict[str, Any] = getattr(config, "workerinput", {})
    return str(workerinput.get("testrunuid", ""))


def _issued(loaded: dict[str, Any]) -> Issued:
    return {int(rank): groups for rank, groups in loaded.items()}


class _Entry:
    """A test's entry in the cache: its count, and the notes of the files it depends on."""

    def __init__(self, config: pytest.Config, nodeid: str, world_size: int) -> None:
        backend = settings.backend_option(config)
        versions = [_version("torch"), _version("fhelium"), platform.python_version()]
        parts = [nodeid, str(world_size), backend, *versions]
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]
        directory = _cache_dir(config)
        self.path = directory / f"{digest}.json"
        self.lock = directory / f"{digest}.lock"
        self.workdir = directory / digest
        self.test_file = str(config.rootpath / nodeid.partition("::")[0])

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the entry: one process counts; the others wait, then read."""
        with open(self.lock, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def read(self) -> dict[str, Any] | None:
        """The entry, where its files are unchanged (None: none, or stale)."""
        try:
            found: dict[str, Any] = json.loads(self.path.read_text(encoding="utf-8"))
            same, notes = sweep_key.unchanged(found["files"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # none yet, or one an older fhelium wrote
        if not same:
            return None
        if notes != found["files"]:  # read and found unchanged: the next check reads none
            found["files"] = notes
            self._save(found)
        return found

    def write(
        self, made: tuple[dict[str, Any], list[str]], collected: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Keep a count just made (what it issued, the files it imported); the entry."""
        issued, imported = made
        files = sweep_key.project_files([*imported, self.test_file])
        entry = {"token": uuid.uuid4().hex, "issued": issued, "files": sweep_key.noted(files)}
        if collected is not None:
            entry["collected"] = collected
        self._save(entry)
        return entry

    def _save(self, entry: dict[str, Any]) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(entry), encoding="utf-8")
        os.replace(temporary, self.path)


def _count_now(
    config: pytest.Config, nodeid: str, workdir: Path
) -> tuple[dict[str, Any], list[str]]:
    """Run the test's two clean runs in a pytest subprocess: each rank's collectives, and
    the files the subprocess and its ranks imported.

    Raises:
        ValueError: The clean run failed, or its two runs differ.
    """
    try:
        return _counted(config, nodeid, workdir)
    finally:  # its ranks' files and its tmp_path: the count is all that is kept
        shutil.rmtree(workdir, ignore_errors=True)


def _counted(config: pytest.Config, nodeid: str, workdir: Path) -> tuple[dict[str, Any], list[str]]:
    workdir.mkdir(parents=True, exist_ok=True)
    path, sep, rest = nodeid.partition("::")
    args = [sys.executable, "-m", "pytest", str(config.rootpath / path) + sep + rest]
    # -x: where the first clean run fails (a hang, say), the second would only fail alike.
    args += ["-q", "-x", "-p", "no:randomly", "-p", "no:cacheprovider", "--dist-isolate"]
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
    imported: set[str] = set()
    for file in sorted(workdir.glob("*.rank*.json")):
        case, _, rank = file.name.removesuffix(".json").rpartition(".rank")
        written = json.loads(file.read_text(encoding="utf-8"))
        runs.setdefault(case, {})[rank] = written["issued"]
        imported.update(written["files"])
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
    if (workdir / FILES).exists():
        imported.update(json.loads((workdir / FILES).read_text(encoding="utf-8")))
    return first, sorted(imported)


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


class CountingRun:
    """The counting subprocess's plugin: it writes the first failure report of its run (the
    clean run's own, as pytest would show it) to :data:`FAILURE` in ``directory``, and the
    files its pytest process imported (conftests, the test's module) to :data:`FILES`."""

    def __init__(self, directory: str) -> None:
        self._directory = Path(directory)
        self._path = self._directory / FAILURE

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

    def pytest_sessionfinish(self) -> None:
        if self._directory.is_dir():
            files = [getattr(module, "__file__", None) for module in list(sys.modules.values())]
            imported = sorted({path for path in files if isinstance(path, str)})
            (self._directory / FILES).write_text(json.dumps(imported), encoding="utf-8")

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
