"""Constants and helpers of the harness core tests: /proc inspection of processes and
sockets (Linux), and the environment of child Python processes.

Importable both in the controlling test process and inside ranks (stdlib only).
"""

from __future__ import annotations

import ipaddress
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import socket
import time
from collections.abc import Iterable

HERE = os.path.dirname(os.path.abspath(__file__))

BACKEND = "gloo"
"""Explicit, so that the suite means the same on a machine with GPUs."""

SAFETY_TIMEOUT_S = 60.0
"""Default bound on each run of a fixture world, so a broken harness fails instead of hanging."""


def tagged_line(path: str, tag: str) -> str:
    """``name.py:N``: where the line of the file ``path`` tagged ``# <tag>`` is (so that
    editing a rank-function module does not break the tests that expect its lines)."""
    with open(path) as handle:
        for number, line in enumerate(handle, start=1):
            if line.rstrip().endswith(f"# {tag}"):
                return f"{os.path.basename(path)}:{number}"
    raise LookupError(tag)


def measured() -> bool:
    """Whether this process runs under coverage."""
    try:
        import coverage
    except ImportError:
        return False
    return coverage.Coverage.current() is not None


def fast_bound() -> float:
    """Bound in seconds for "within about a second, not after a process-group timeout".

    Generous on purpose: on a loaded machine (CI, two CPU hogs beside the suite) tearing
    ranks down can take seconds, while what it guards against, a process-group timeout,
    takes 30 minutes. More when measured: ranks then save coverage data before they exit.
    """
    return 60.0 if measured() else 30.0


def subprocess_env() -> dict[str, str]:
    """Environment for a child Python: our helpers importable, no inherited coverage or
    pytest hooks, no network settings of ours."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("COV_CORE_", "COVERAGE_", "PYTEST_", "GLOO_", "NCCL_"))
    }
    env["PYTHONPATH"] = os.pathsep.join([HERE, *filter(None, [env.get("PYTHONPATH")])])
    return env


_TCP_LISTEN = "0A"


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, ppid)`` of a process, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as gone: it runs nothing)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def wait_gone(pids: Iterable[int], timeout: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the deadline."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid in pids if alive(pid)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def children(pid: int) -> set[int]:
    """Live direct children of ``pid``."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and stat[1] == pid and stat[0] not in ("Z", "X"):
                found.add(int(name))
    return found


def descendants(pid: int) -> set[int]:
    """Live descendants of ``pid`` (children, their children, ...)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def multiprocessing_helpers() -> set[int]:
    """Pids of this process's multiprocessing forkserver and resource tracker, if running."""
    pids = {
        getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None),
        getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None),
    }
    return {pid for pid in pids if pid}


def _socket_inodes(pid: int | str) -> set[str]:
    inodes: set[str] = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _decode(address: str) -> tuple[str, int]:
    """Decode a ``/proc/net/tcp{,6}`` address (``0100007F:8E3B``) into ``(ip, port)``."""
    host, port = address.split(":")
    raw = bytes.fromhex(host)
    # The kernel prints each 32-bit word in host byte order (little-endian here).
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw), int(port, 16)


def listening_addresses(pid: int | str = "self") -> list[tuple[str, int]]:
    """``(ip, port)`` of every TCP socket of process ``pid`` that is listening."""
    inodes = _socket_inodes(pid)
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _TCP_LISTEN and fields[9] in inodes:
                found.append(_decode(fields[1]))
    return found


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
