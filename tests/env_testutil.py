"""The environment an inner pytest run must not inherit from the outer one, and the marker
that finds every process of a launch (torchrun) to kill what outlived it."""

from __future__ import annotations

import os
import signal

OUTER_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "COVERAGE_PROCESS_START",
    "COVERAGE_FILE",
    "COV_CORE_SOURCE",
    "COV_CORE_CONFIG",
    "COV_CORE_DATAFILE",
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
)
"""Variables that would put an inner pytest into launcher mode (torchrun), or make an inner
run measure itself with the outer run's coverage or xdist settings."""

LAUNCH_MARKER = "FHELIUM_TEST_LAUNCH"
"""A variable every process of a launch inherits (a unique value per launch): torchrun
starts its workers in sessions of their own, where no process-group kill reaches them."""


def _environ(pid: int | str) -> list[bytes]:
    with open(f"/proc/{pid}/environ", "rb") as file:
        return file.read().split(b"\0")


def kill_marked(marker: str | None) -> None:
    """Kill every process whose environment holds ``LAUNCH_MARKER=marker`` (Linux: reads
    /proc)."""
    if marker is None or not os.path.isdir("/proc"):
        return
    wanted = f"{LAUNCH_MARKER}={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if wanted in _environ(entry):
                os.kill(int(entry), signal.SIGKILL)
        except OSError:
            continue
