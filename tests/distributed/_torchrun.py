"""Launching ``_torchrun_worker.py`` under ``python -m torch.distributed.run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import _fresh
import pytest
from env_testutil import LAUNCH_MARKER, kill_marked

WORKER = Path(__file__).with_name("_torchrun_worker.py")
TIMEOUT = 120
_MARKERS: dict[int, str] = {}


def start(nproc: int, cwd: Path, *, hide_cuda: bool = True) -> subprocess.Popen[str]:
    """Start ``torchrun --standalone --nproc-per-node NPROC _torchrun_worker.py`` in ``cwd``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _fresh.LAUNCHER_ENV and not name.startswith(_fresh.LAUNCHER_ENV_PREFIXES)
    }
    if hide_cuda:
        # The CPU contract (gloo by default), also on a machine with GPUs.
        env["CUDA_VISIBLE_DEVICES"] = ""
    env["OMP_NUM_THREADS"] = "1"
    # Every process of this launch inherits the marker, so that finish() can find and kill
    # workers that outlive the launcher (torchrun starts them in sessions of their own).
    marker = uuid.uuid4().hex
    env[LAUNCH_MARKER] = marker
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.1",
        str(WORKER),
    ]
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    _MARKERS[proc.pid] = marker
    return proc


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, list[dict[str, Any]]]:
    """Wait for a launch; return its exit code, its output and the workers' results.

    Whatever happens, no process of the launch is left running afterwards.
    """
    marker = _MARKERS.pop(proc.pid, None)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_marked(marker)
        proc.kill()
        stdout, stderr = proc.communicate(timeout=30)
        pytest.fail(f"torchrun did not finish within {TIMEOUT} s:\n{stdout}\n{stderr}")
    finally:
        kill_marked(marker)
    # Each worker's result is one JSON object after its marker; workers write to one pipe at
    # once, so a result need not end its line: decode each object where its marker starts.
    decoder = json.JSONDecoder()
    results = [decoder.raw_decode(chunk)[0] for chunk in stdout.split("FHELIUM-RESULT ")[1:]]
    output = f"exit code {proc.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    return proc.returncode, output, sorted(results, key=lambda r: r["rank"])


def stop(proc: subprocess.Popen[str]) -> None:
    """Kill a launch and all its workers if still running (for ``finally`` blocks)."""
    kill_marked(_MARKERS.pop(proc.pid, None))
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
