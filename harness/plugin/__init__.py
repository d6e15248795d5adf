"""The pytest plugin: options, the ``distributed`` marker, fixtures and hooks.

Registered through the ``pytest11`` entry point (``harness = "harness.plugin"``), so a
project that installs fhelium only has to mark its tests. This module only translates
between pytest and the harness core, which works without pytest (:mod:`harness.controller`).
The rest of the plugin is mapped module by module in ``docs/contributing.md``.

A test body itself runs inside the ranks, in :mod:`harness.rank.pytest_body`. The plugin is
loaded into every pytest run of an environment that has fhelium installed: this module
imports only the light parts (no torch, no rank side); the rest comes with the first
distributed test (or with ``--dist-mptc``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator
from typing import Any

import pytest

from harness import compat

# Before the plugin's other modules are imported: pytest rewrites the asserts of every module
# of a plugin's distribution and, where it cannot cache the result (read-only install,
# PYTHONDONTWRITEBYTECODE), does it again in every run. The harness's asserts do not need it.
compat.exempt_from_assert_rewriting("harness", "fhelium")

from harness import validate  # noqa: E402
from harness.plugin import (  # noqa: E402
    interrupts,
    lazy_session,
    marker,
    memory_report,
    report,
    settings,
    sweep_count,
    sweep_summary,
    warmup,
)

# The fixtures the plugin provides, defined in their own module: pytest finds a plugin's
# fixtures among the attributes of its module, so they are imported here.
from harness.plugin.fixtures import (  # noqa: E402, F401
    collectives,
    dist_world,
    local_device,
    local_rank,
    rank,
    restart_count,
    world_size,
)
from harness.plugin.marker import (  # noqa: E402
    MARKER,
    find_mark,
    launched,
    marker_name,
    run_mark,
)
from harness.protocol.schedules import DEFAULT_DELAY_S  # noqa: E402
from harness.validate import BACKEND_CHOICES  # noqa: E402

_MPTC = "harness-mptc"  # mptc.CasePlugin's name, when --dist-mptc is on


_FLAGS = {
    "--dist-no-collective-check": "do not compare the ranks' collectives after a distributed "
    "test that passed (the desync check: another op, reduce op, root, shape or dtype on some "
    "ranks fails the test)",
    "--dist-isolate": "run every distributed test in fresh rank processes instead of reused worlds",
    "--dist-mptc": "run unittest classes derived from torch's MultiProcessTestCase on reused "
    "ranks, one world per world size (default: ini dist_mptc)",
    "--dist-verify": "run every distributed test on its reused world and again on fresh "
    "processes; a differing outcome is reported (an order dependence), the fresh one is the "
    "verdict",
    "--dist-require-gpus": "fail, instead of skipping, a distributed test that needs more GPUs "
    "than this run has (default: ini dist_require_gpus), so that a GPU job cannot pass by "
    "skipping",
    "--dist-trace-all": "write the trace folder of every distributed test, passing ones too "
    "(needs --dist-trace-dir)",
}
# Their defaults are settings.py's, where an unset key ('') is read.
_INI = {
    "dist_confirm": "fresh (default): a distributed test that fails on a reused world runs "
    "again on fresh processes before it is reported (passing there, the fresh verdict stands "
    "and the order dependence is reported); off: failures are reported as they are",
    "dist_order_dependent": "what an order dependence found on fresh processes does: warn "
    "(default: a warning naming the earlier test that causes it) or fail (the test fails)",
    "dist_bisect_runs": "how many fresh worlds the search for the earlier test behind an "
    f"order dependence may start (default: {settings.DEFAULT_BISECT_RUNS}; 0: no search)",
    "dist_timeout": "default time limit of one distributed test in seconds "
    f"({settings.DEFAULT_TIMEOUT_S:g})",
    "dist_leaks": "what to do when a distributed test leaves threads, child processes or open "
    "files behind in a rank: warn (default), error (fail the test, rebuild the world) or off",
    "dist_marker": f"name of the marker that runs a test on ranks (default: {MARKER}; needed "
    f"where the project has a '{MARKER}' marker of its own)",
    "dist_gpus": "the GPUs this run may use, as --dist-gpus",
    "dist_ranks_per_gpu": "how many ranks of an NCCL test share one GPU where its marker "
    "does not say (default: 1; its world of N ranks leases ceil(N / K) GPUs; needs NCCL "
    ">= 2.30)",
    "dist_preload": "modules (mylib.models) and functions (mylib.testing:warm_up) the "
    "forkserver imports or calls once, before it forks any rank: every rank, also of a "
    "world rebuilt after a failure or a fault, starts with them done",
    "dist_trace_dir": "as --dist-trace-dir (relative to this file's directory)",
    "dist_gpu_lease_dir": "the directory of the GPU leases, shared by every pytest process "
    "that leases the same GPUs (default: harness-gpu-leases-<user> in the system's temp dir)",
    "dist_max_rank_memory": "as --dist-max-rank-memory",
    "dist_memory_growth": "how much a rank's resident memory may grow and stay over its "
    "latest 100 tests before the growth is a leak finding (as dist_leaks says; default: "
    f"{validate.DEFAULT_MEMORY_GROWTH // 2**20}MiB; 0: no look)",
    "dist_max_world_size": "the largest world a Hypothesis-drawn world_size may ask for: a "
    "strategy that can draw more fails its test before any example runs (default: 8)",
    "dist_schedules": "as --dist-schedules (default: 0)",
    "dist_schedule_delay": f"as --dist-schedule-delay, in seconds (default: {DEFAULT_DELAY_S:g})",
}
_BOOL_INI = {
    "dist_no_collective_check": "as --dist-no-collective-check (false)",
    "dist_require_gpus": "as --dist-require-gpus (false)",
    "dist_mptc": "run MultiProcessTestCase classes on reused ranks, as --dist-mptc (false)",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "distributed tests (fhelium harness)")
    group.addoption(
        "--dist-backend",
        choices=BACKEND_CHOICES,
        help="backend for distributed tests that ask for 'auto' (default: auto, i.e. NCCL "
        "when CUDA is available, else Gloo)",
    )
    group.addoption(
        "--dist-timeout",
        type=float,
        metavar="SECONDS",
        help="default time limit of one distributed test (default: ini dist_timeout, "
        f"else {settings.DEFAULT_TIMEOUT_S:g})",
    )
    group.addoption(
        "--dist-gpus",
        metavar="IDS",
        help="the GPUs this run may use, as CUDA_VISIBLE_DEVICES names them (0,1,2,3 or "
        "UUIDs): each world that needs GPUs leases them exclusively across every xdist "
        "worker and pytest process of the machine (default: ini dist_gpus, else every GPU "
        "CUDA shows)",
    )
    group.addoption(
        "--dist-max-rank-memory",
        metavar="SIZE",
        help="a rank's resident memory (2GiB, 2GB, 512MiB or bytes) above which, after a "
        "test, its world is replaced by fresh processes before the next test (default: ini "
        "dist_max_rank_memory, else no limit)",
    )
    group.addoption(
        "--dist-trace-dir",
        metavar="DIR",
        help="write a folder per failing distributed test into DIR: timeline.html (its "
        "collectives per rank on one time axis), trace.json (Chrome trace events, for "
        "Perfetto) and fr/ (Flight Recorder dumps); the report names it (default: ini "
        "dist_trace_dir)",
    )
    group.addoption(
        "--dist-shadow",
        action="append",
        metavar="N",
        help="after each distributed test passes, run its body again on every rank of a "
        "simulated world of N ranks (a shadow world) and compare every group's collectives "
        "there; may be given more than once (a marker's shadow=False opts a test out)",
    )
    group.addoption(
        "--dist-schedules",
        metavar="N",
        help="run each distributed test again under N seeded schedules after it passed: each "
        "holds ranks back at a few collective boundaries, to turn a race between ranks into "
        "a failure that replays from its seed (default: ini dist_schedules, else 0; a "
        "marker's schedules= wins)",
    )
    group.addoption(
        "--dist-schedule-seed",
        metavar="SEED",
        help="run only the schedule of this seed (a failure's report names it), for every "
        "distributed test that runs schedules or that this option alone asks to",
    )
    group.addoption(
        "--dist-schedule-delay",
        metavar="SECONDS",
        help="the longest a schedule holds a rank back at one boundary (default: ini "
        f"dist_schedule_delay, else {DEFAULT_DELAY_S:g}); a hold ends sooner once "
        "every other rank waits",
    )
    for flag, text in _FLAGS.items():
        group.addoption(flag, action="store_true", default=False, help=text)
    for name, text in _INI.items():
        parser.addini(name, help=text)
    for name, text in _BOOL_INI.items():
        parser.addini(name, type="bool", help=text, default=False)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> Generator[None, None, None]:
    # A wrapper, outermost: before the conftests are imported and before pytest starts
    # capturing (the server keeps this process's real stdout and stderr).
    warmup.before_conftests(early_config)
    launched(early_config)  # under a launcher or not: decided once, from the start's environment
    return (yield)


@pytest.hookimpl(trylast=True)  # after conftests: a marker of the project's own is seen
def pytest_configure(config: pytest.Config) -> None:
    name = marker.claim_marker(config)
    if name is not None:
        config.addinivalue_line(
            "markers",
            f"{name}(world_size=2, *, backend='auto', timeout=None, isolate=False, "
            "init=True, check_collectives=True, faults=(), gpus_per_rank=None, "
            "ranks_per_gpu=None, restarts=0, "
            "verify=None, shadow=(), schedules=None, schedule_seed=None, "
            "schedule_delay=None): run the test body on every rank "
            "of a torch.distributed world (lists of world sizes or backends, and a sweep of "
            "faults, parametrize the test; init=False: the ranks have the torchrun "
            "environment but no process group, the test makes its own; "
            "check_collectives=False: a passing test's collectives are not compared between "
            "ranks; faults: harness.faults injected at the ranks' collectives; "
            "gpus_per_rank: GPUs each rank leases, 1 with NCCL else 0; ranks_per_gpu: NCCL "
            "ranks that share one GPU (default: ini dist_ranks_per_gpu); restarts: how often the "
            "run starts again on fresh ranks when a rank fails, or each restart's world size; "
            "verify: a module-level function run on the ranks of a fresh world after each "
            "case of a sweep; shadow: larger world sizes on which the body runs again once "
            "it passed, every rank simulated, their collectives compared; schedules: how many "
            "seeded schedules the test runs after it passed, 0 for none (default: "
            "--dist-schedules); schedule_seed: the one schedule it runs; schedule_delay: the "
            "longest a schedule holds a rank, in seconds)",
        )
    # A bad --dist-timeout, dist_timeout, dist_leaks... is a usage error at once.
    chosen = settings.read(config)
    config.pluginmanager.register(report, "harness-report")
    config.pluginmanager.register(interrupts.Hooks(config), "harness-interrupts")
    counting = os.environ.get(sweep_count.COUNT_DIR)
    if counting:  # the clean run of a sweep: its failure is what the sweep's case says
        config.pluginmanager.register(sweep_count.CountingRun(counting), "harness-count")
    if chosen.mptc:
        from harness.plugin import mptc

        config.pluginmanager.register(mptc.CasePlugin(lambda: lazy_session.get(config)), _MPTC)
    if launched(config) is not None:
        from harness.plugin import launcher

        launcher.configure(config, lambda: lazy_session.get(config).launcher)
    memory_report.tell_replacements(config)
    warmup.at_configure(config, name)


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    name = marker_name(config)
    if name is None:
        lines.append(
            f"harness: this project has a '{MARKER}' marker of its own, so fhelium's is off "
            "(set ini dist_marker to use it under another name)"
        )
    elif name != MARKER:
        lines.append(
            f"harness: tests marked '{name}' run on the ranks of a world (ini dist_marker)"
        )
    if settings.read(config).verify:
        lines.append(
            "harness: --dist-verify: each distributed test that ran on a reused world after "
            "others runs again on fresh processes"
        )
    return lines


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    # Counted from the reports' user_properties, which pytest-xdist's workers send back:
    # the controller sees every worker's tests. A teardown's report holds what every phase
    # noted (a @given test's --dist-verify is noted in its call phase).
    noted: dict[str, list[str]] = {
        report.VERIFIED: [],
        report.GPU_TESTS: [],
        report.SHADOWS: [],
        sweep_summary.CASE: [],
        report.SCHEDULES: [],
    }
    for reports in terminalreporter.stats.values():
        for made in reports:
            if getattr(made, "when", None) == "teardown":
                for key, value in getattr(made, "user_properties", ()):
                    if key in noted:
                        noted[key].append(value)
    if settings.read(config).verify:
        verified = noted[report.VERIFIED]
        differ = verified.count("differs")
        terminalreporter.write_line(
            f"harness --dist-verify: {_count(len(verified), 'test')} also run on fresh "
            f"processes, {differ} differ"
            + (" (each reported as an order dependence)" if differ else "")
        )
    if noted[sweep_summary.CASE]:  # each sweep's cases, in ranges of the same verdict
        terminalreporter.write_sep("=", "harness: fault sweeps")
        cases = (sweep_summary.Case.loads(text) for text in noted[sweep_summary.CASE])
        for line in sweep_summary.summary(cases):
            terminalreporter.write_line(line)
    for key, title in ((report.SHADOWS, "shadow worlds"), (report.SCHEDULES, "schedules")):
        if noted[key]:  # each shadowed test (its sizes, its time); each that ran schedules
            terminalreporter.write_sep("=", f"harness: {title}")
            for line in noted[key]:
                terminalreporter.write_line(line)
    for line in memory_report.of(config).lines():
        terminalreporter.write_line(line)
    gpu_tests = noted[report.GPU_TESTS]
    if gpu_tests:
        ran, skipped = gpu_tests.count("ran"), gpu_tests.count("skipped")
        terminalreporter.write_line(
            f"harness: {_count(ran, 'distributed test')} ran on GPUs, {skipped} skipped for "
            "lack of them" + (" (--dist-require-gpus fails them instead)" if skipped else "")
        )


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    # pytest-xdist's controller, as a worker ends: its worlds' memory, for the summary.
    sent = getattr(node, "workeroutput", {}).get(memory_report.OUTPUT_KEY)
    if sent:
        memory_report.of(node.config).merge(sent)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def pytest_collectstart(collector: pytest.Collector) -> None:
    # Before pytest imports a test module that uses the marker: the server then imports
    # torch while the module does, instead of after it. Reading the file costs microseconds;
    # pytest reads it next anyway.
    name = marker_name(collector.config)
    if (
        name
        and isinstance(collector, pytest.Module)
        and "torch" not in sys.modules
        and warmup.file_uses(collector.path, name)
    ):
        warmup.at_collect(collector.config)


def pytest_itemcollected(item: pytest.Item) -> None:
    # At the first distributed test found: the rest of collection overlaps the server's start.
    if find_mark(item) is not None:
        warmup.at_collect(item.config)


def pytest_collection_finish(session: pytest.Session) -> None:
    # The controller's own imports (torch, the harness core) happen here, once the selected
    # tests are known, rather than inside the first distributed test: its duration, and a
    # pytest-timeout limit, then cover the test instead of a second of imports (an import
    # interrupted by pytest-timeout would leave torch half-initialised for the session).
    if session.config.option.collectonly:
        return
    mptc = session.config.pluginmanager.get_plugin(_MPTC)
    if any(
        find_mark(item) is not None or (mptc is not None and mptc.selected(item))
        for item in session.items
    ):
        warmup.at_collection_finish(session.config)
        lazy_session.get(session.config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Under a launcher a sweep over "all" is not resolved: counting its cases needs ranks
    # the harness starts (the test is skipped, saying so, in harness.plugin.launcher).
    marker.parametrize(metafunc, None if launched(metafunc.config) else _resolve_sweep)


def _resolve_sweep(metafunc: pytest.Metafunc, spec: marker.MarkSpec, sweep: Any) -> list[Any]:
    # Only for a sweep over "all": it counts a clean run, with torch.
    from harness.plugin import sweep_cases

    return sweep_cases.resolve(metafunc, spec, sweep)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    # Around pytest's own setup: first take the fixtures that run in the ranks out of its
    # hands (it sets up only the others), then, with those up, run the test on its ranks.
    session = lazy_session.peek(item.config)
    if session is not None and session.holds_gpus() and session.leases.wanted():
        # Before any test, distributed or not: another process waits for GPUs that an idle
        # world of ours holds, and gets them.
        session.give_back_gpus()
    if not isinstance(item, pytest.Function) or run_mark(item) is None:
        return (yield)
    if launched(item.config):
        launcher = lazy_session.get(item.config).launcher
        assert launcher is not None
        launcher.prepare(item)
        return (yield)
    from harness.plugin import rank_fixtures

    rank_fixtures.split(item)
    yield
    lazy_session.get(item.config).run_item(item)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if run_mark(pyfuncitem) is None:
        return None
    lazy_session.get(pyfuncitem.config).finish_call(pyfuncitem)
    return True


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, object, object]:
    # Inside pytest-cov's own wrapper: the worlds' ranks save their coverage when they stop,
    # and it must be merged before pytest-cov combines and reports.
    try:
        return (yield)
    finally:
        pytest_unconfigure(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = lazy_session.peek(config)
    if session is not None:
        session.close()
