"""Sweeps over every rank and collective, ``verify=``, and what each case notes for the summary.

``faults.sweep("kill", ranks="all", at="all")`` is resolved at collection
(:func:`resolve`): ``"all"`` ranks are those of the test's world; ``"all"`` collectives are
those a clean run of the test makes on each rank, on the fault's group. The clean run is a
pytest run of the test alone in a subprocess (its own fixtures, conftests and ini, on fresh
ranks), twice, whose ranks write what they issued (:func:`harness.rank.sweep.counted`); the
two must agree. Its result is cached under pytest's cache directory by the test's node id,
its file's source, the world size, ``--dist-backend`` and torch's version, behind a file
lock: under pytest-xdist every worker collects the same cases, and only the first pays for
the count. A change in another file the count depends on needs ``--cache-clear``.

After each case that passed (its survivors coped, or its restarts resumed), the marker's
``verify=`` runs on every rank of a fresh world (:func:`after_case`); its failure is the
case's, naming the kill point. Each case of a sweep notes itself for the terminal summary
(:func:`note`, :mod:`harness.plugin.sweep_report`).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import inspect
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from harness import validate
from harness.faults import ALL, Fault, OpenSweep, Sweep
from harness.plugin import report
from harness.plugin.marker import FAULT_PARAM, CleanRun, MarkSpec, find_mark, parse_mark
from harness.plugin.sweep_report import CASE, MAX_CASES, Case, fault_label, too_many, verdict
from harness.protocol.messages import OUTPUT_CAPTURE, CallOptions
from harness.rank.sweep import RANK_ARGS, counted, verified

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome
    from harness.controller.world import World

COUNT_TEST = "HARNESS_SWEEP_COUNT"
"""Set for the counting subprocess: the node id of the test being counted."""

COUNT_DIR = "HARNESS_SWEEP_COUNT_DIR"
"""Set for the counting subprocess: where its ranks write what they issued."""

# Per test (its definition's node id): each rank's collectives of a clean run, per group.
_COUNTED = pytest.StashKey[dict[str, dict[int, dict[str, list[list[str]]]]]]()
# The name of the verify= function that failed after a case.
_VERIFY_FAILED = pytest.StashKey[str]()
_FLAGS = ("-p", "-o", "--confcutdir")  # passed on to the counting run
_OPTIONS = ("--dist-backend", "--dist-timeout", "--dist-gpus")


def resolve(metafunc: pytest.Metafunc, spec: MarkSpec, sweep: OpenSweep) -> list[Any]:
    """The cases of a sweep over ``"all"`` ranks or collectives, for the marker to
    parametrize: its faults, or, in the counting subprocess, the clean runs.

    Raises:
        pytest.fail.Exception: The sweep cannot be resolved (a list of world sizes, a clean
            run that failed or differs from the other, more than ``MAX_CASES`` cases).
    """
    nodeid = metafunc.definition.nodeid
    counting = os.environ.get(COUNT_TEST)
    if counting is not None:  # the counting subprocess: no sweep, two clean runs
        return [CleanRun(1), CleanRun(2)] if counting == nodeid else [CleanRun(0)]
    try:
        if isinstance(spec.world_size, (list, tuple)):
            raise ValueError(
                f"a sweep over {ALL!r} needs one world_size, not {list(spec.world_size)}: "
                "give ranks and at explicitly, or one test per size"
            )
        size = validate.positive_int(spec.world_size, "world_size")
        sizes = validate.attempt_sizes(spec.restarts, size)
        attempt = sweep.options.get("attempt", 0)
        if sweep.at == ALL and attempt:
            raise ValueError(
                f"at={ALL!r} counts a clean run's collectives, and a clean run never "
                f"reaches attempt {attempt}: give at=range(...)"
            )
        if not isinstance(attempt, int) or not 0 <= attempt < len(sizes):
            raise ValueError(f"the sweep's attempt={attempt!r} is not an attempt of the run")
        counts = None
        if sweep.at == ALL:
            issued = count(metafunc.config, nodeid, size)
            key = "" if sweep.group is None else ",".join(map(str, sweep.group))

            def counts(rank: int) -> int:
                return len(issued.get(rank, {}).get(key, []))

        faults = sweep.faults(sizes[attempt], counts)
    except (TypeError, ValueError) as exc:
        raise pytest.fail.Exception(f"{nodeid}: {sweep}: {exc}", pytrace=False) from None
    if len(faults) > MAX_CASES:
        per_rank: dict[int, int] = {}
        for fault in faults:
            per_rank[fault.rank] = per_rank.get(fault.rank, 0) + 1
        raise pytest.fail.Exception(too_many(nodeid, len(faults), per_rank), pytrace=False)
    if not faults:
        raise pytest.fail.Exception(
            f"{nodeid}: {sweep} makes no case: a clean run issued no collective "
            f"on {'the default group' if sweep.group is None else f'group {sweep.group}'}",
            pytrace=False,
        )
    return list(faults)


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
    backend = str(config.getoption("dist_backend", None) or "auto")
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
    for old in workdir.glob("*.json"):
        old.unlink()
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
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        raise ValueError(
            f"the clean run that counts its collectives did not pass (exit status "
            f"{done.returncode}); a sweep over {ALL!r} needs a test that passes without "
            f"faults:\n{' '.join(args)}\n{tail}"
        )
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


def body(
    item: pytest.Item, fn: Callable[..., Any], args: tuple[Any, ...]
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The rank-side call of a test: ``fn(*args)``, or, for a clean run that counts a
    sweep, that call wrapped to write what the ranks issued."""
    param = _param(item)
    directory = os.environ.get(COUNT_DIR)
    if not isinstance(param, CleanRun) or not directory:
        return fn, args
    case = item.name.replace(os.sep, "_")  # test_x[clean1]: how a difference names it
    return counted, (os.path.join(directory, case), fn, *args)


def check_verify(value: object) -> Callable[..., Any] | None:
    """The marker's ``verify=``, checked: None, or a module-level function.

    Raises:
        TypeError: It is neither, naming it.
    """
    if value is None:
        return None
    name = getattr(value, "__qualname__", repr(value))
    if not inspect.isfunction(value) or "<" in name:
        raise TypeError(
            f"verify must be a module-level function (it runs in the ranks of a fresh "
            f"world, by reference), not {value!r}"
        )
    try:
        pickle.dumps(value)
    except Exception as exc:
        raise TypeError(f"verify {name} does not pickle by reference ({exc})") from None
    return value


def after_case(
    item: pytest.Item,
    outcome: Outcome,
    new_world: Callable[[int], World],
    options: CallOptions,
) -> Outcome:
    """Run the marker's ``verify=`` on a fresh world after a case that passed; the outcome
    is the case's, or ``verify``'s failure, which names the case's fault.

    Raises:
        pytest.fail.Exception: ``verify`` is not a module-level function, or names an
            argument the test has no value for.
    """
    mark = find_mark(item)
    if mark is None:
        return outcome
    try:
        verify = check_verify(parse_mark(mark).verify)
    except TypeError as exc:
        problem = f"invalid @pytest.mark.{mark.name}: {exc}"
        raise pytest.fail.Exception(problem, pytrace=False) from None
    if verify is None or outcome.error is not None or outcome.skip is not None:
        return outcome
    if isinstance(_param(item), CleanRun):
        return outcome
    param = _param(item)
    fault = param if isinstance(param, Fault) else None
    kwargs: dict[str, Any] = {"_harness_rank_args": []}
    funcargs = {k: v for k, v in getattr(item, "funcargs", {}).items() if k != "request"}
    for name in inspect.signature(verify).parameters:
        if name in RANK_ARGS:
            kwargs["_harness_rank_args"].append(name)
        elif name == "fault":
            kwargs[name] = fault
        elif name in funcargs:
            kwargs[name] = funcargs[name]
        else:
            valid = sorted({*RANK_ARGS, "fault", *funcargs})
            raise pytest.fail.Exception(
                f"verify {verify.__qualname__} asks for {name!r}, which the test has no "
                f"value for; valid: {', '.join(valid)} (the test's own fixtures that run in "
                "the pytest process)",
                pytrace=False,
            )
    size = len(outcome.values or ()) or 1
    call = CallOptions(
        options.timeout,
        OUTPUT_CAPTURE,
        seed=options.seed,
        name=f"verify {verify.__qualname__} of test {item.nodeid}",
    )
    with new_world(size) as world:
        checked = world.call(verified, (verify, kwargs), options=call)
    error = checked.error
    if error is None:
        return outcome
    after = "a clean run" if fault is None else f"{fault} ({_point(item, fault)})"
    error.summary = f"verify {verify.__qualname__} failed after {after}: {error.summary}"
    item.stash[_VERIFY_FAILED] = verify.__qualname__
    return replace(outcome, values=None, error=error)


def _param(item: pytest.Item) -> object:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(FAULT_PARAM) if callspec is not None else None


def _point(item: pytest.Item, fault: Fault) -> str:
    """Where a case's fault acts: ``collective #3: all_reduce at x.py:12`` when a clean
    run counted the sweep, else ``collective #3``."""
    site = _site(item, fault)
    return f"collective #{fault.at}" + (f": {site}" if site else "")


def _site(item: pytest.Item, fault: Fault) -> str:
    definition = item.nodeid.partition("[")[0]
    issued = item.config.stash.get(_COUNTED, {}).get(definition, {})
    key = "" if fault.group is None else ",".join(map(str, fault.group))
    records = issued.get(fault.rank, {}).get(key, [])
    if not 1 <= fault.at <= len(records):
        return ""
    op, site = records[fault.at - 1]
    return f"{op} at {site}"


def note(item: pytest.Item, outcome: Outcome, option: str) -> None:
    """Note a sweep's case in its reports' ``user_properties``, for the terminal summary."""
    fault = _param(item)
    mark = find_mark(item)
    if not isinstance(fault, Fault) or mark is None:
        return
    try:
        swept = isinstance(parse_mark(mark).faults, (Sweep, OpenSweep))
    except ValueError:
        return
    if not swept:
        return
    error = outcome.error
    message = ""
    if error is not None:  # the root cause alone: the headline names the case's fault
        root = next(iter(error.failures.values()), None)
        message = f"{root.exc_type}: {root.message}" if root else f"{type(error).__name__}"
        if item.stash.get(_VERIFY_FAILED, ""):
            message = f"verify {item.stash[_VERIFY_FAILED]}: {message}"
    case = Case(
        test=item.nodeid.partition("[")[0],
        fault=fault_label(fault.kind, fault.when),
        rank=fault.rank,
        at=fault.at,
        site=_site(item, fault),
        verdict=verdict(error is not None, outcome.skip is not None, message),
        repro=report.command(item.config, [item.nodeid], option),
    )
    item.user_properties.append((CASE, case.dumps()))
