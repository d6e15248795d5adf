"""Leak checks: what a call leaves running or open.

These are what it leaves in its rank that no reset can undo, reported rather than put back
(:mod:`harness.rank.reset` puts back what it can). Each finding is one line, which the
controller shows with the call and the rank:

* **threads** the call started (``threading.Thread.start``, daemon or not) that are still
  alive when it returns, with where each was started: the first frame outside the standard
  library, so a ``ThreadPoolExecutor`` worker points at the test line that submitted to it;
* **child processes** of the rank that were not there before the call and still run
  (zombies run nothing and are left out), with their command line;
* **file descriptors** opened during the call and still open that point at a file or
  directory, with its path (a descriptor closed and reopened during the call is not seen);
* **process groups** the call made and did not destroy, in a world with a harness default
  group, with where each was made (the harness destroys them before the next call, but a
  library whose own teardown forgets them leaks one per test in a real job);
* **CUDA memory** allocated during the call and still allocated after it, where CUDA was in
  use (``torch.cuda.memory_allocated``, after a garbage collection).

Left out on purpose: sockets, pipes and anonymous inodes (epoll, eventfd), which the backends
open for each process group (Gloo: a self-pipe, an epoll instance and a socket per peer)
while the groups a call leaves are destroyed only when the next call starts
(:func:`harness.rank.loop._call`); a pipe to a subprocess is reported through the
subprocess. Also device files under ``/dev``, which CUDA and NCCL open once per process, in
whichever call first needs them. Child processes and file descriptors are read from
``/proc`` (Linux); elsewhere only threads are checked.
"""

from __future__ import annotations

import gc
import inspect
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from harness import compat
from harness.rank.sites import call_site, in_stdlib

_FD_DIR = "/proc/self/fd"
_TASK_DIR = "/proc/self/task"

_PROC = os.path.isdir(_TASK_DIR)  # Linux
# Whether the kernel lists each thread's children (a build option, on in common kernels).
_CHILDREN_FILES = _PROC and os.path.exists(f"{_TASK_DIR}/{os.getpid()}/children")

_THREADING_FILE = threading.__file__
_OWN_FILE = __file__


class Watch:
    """The leaks of one call.

    It is made just before the call runs (it notes the open file descriptors and live child
    processes), :meth:`threads` is used around the call (:meth:`lasting` around what in it
    is meant to outlive it), and :meth:`findings` once it has returned. With ``enabled``
    False it finds nothing; files under the directory ``own`` are the harness's.
    """

    def __init__(self, *, enabled: bool = True, own: str = "", groups: bool = False) -> None:
        self._enabled = enabled
        # With a harness default group, every other group a call leaves is the call's own.
        self._groups = compat.live_process_groups() if enabled and groups else None
        self._cuda = _cuda_allocated() if enabled else None
        # The rank's own files (``own``, a directory): the watchdog thread writes a trace
        # there whenever the controller asks, also while the call runs.
        self._own = os.path.join(own, "") if own else None
        self._fds = _open_fds() if enabled else set()
        self._children = _live_children() if enabled else set()
        self._started: dict[threading.Thread, str] = {}

    @contextmanager
    def threads(self) -> Iterator[None]:
        """Record where each thread started inside the block was started.

        ``threading.Thread.start`` is wrapped for the block only: the rank's own threads
        (its watchdog, the output pumps) start outside calls, unobserved.
        """
        if not self._enabled:
            yield
            return
        original: Callable[..., Any] = threading.Thread.start
        started = self._started

        def start(thread: threading.Thread, /) -> None:
            started[thread] = _where_started(inspect.currentframe())
            original(thread)

        threading.Thread.start = start  # type: ignore[method-assign, assignment]
        try:
            yield
        finally:
            threading.Thread.start = original  # type: ignore[method-assign]

    @contextmanager
    def lasting(self) -> Iterator[None]:
        """Mark what the block starts or opens as lasting.

        It is meant to outlive the call: a wider-scoped fixture's threads, files, processes
        end with its scope: not a leak of the call.
        """
        if not self._enabled:
            yield
            return
        before = set(self._started)
        try:
            yield
        finally:
            for thread in set(self._started) - before:
                del self._started[thread]
            self._fds |= _open_fds()
            self._children |= _live_children()

    def findings(self, lasting_groups: set[Any] | frozenset[Any] = frozenset()) -> tuple[str, ...]:
        """What the call left behind, one line each.

        A thread alive now (nothing waits for it) outlives the call; ``lasting_groups`` are
        meant to (a wider-scoped fixture's).
        """
        if not self._enabled:
            return ()
        found = [
            f"thread {thread.name!r} started at {where} is still alive"
            for thread, where in self._started.items()
            if thread.is_alive()
        ]
        self._started.clear()  # holds no thread beyond the call
        for pid in sorted(_live_children() - self._children):
            found.append(f"child process {pid} ({_command(pid)}) is still running")
        for fd in sorted(_open_fds() - self._fds):
            target = _file_target(fd)
            if target is not None and not (self._own and target.startswith(self._own)):
                found.append(f"file descriptor {fd} ({target}) is still open")
        if self._groups is not None:
            found += _left_groups(self._groups | lasting_groups)
        if self._cuda is not None or _cuda_allocated() is not None:
            found += _left_cuda_memory(self._cuda or 0)
        return tuple(found)


def note_group_sites() -> None:
    """Note where each process group is made from now on.

    Called once, as the rank starts.
    """

    def where() -> str:
        path, line = call_site(inspect.currentframe())
        return f"{_shown(path)}:{line}"

    compat.note_group_creation(where)


def _left_groups(before: set[Any]) -> list[str]:
    """One line per place that made groups the call left.

    The default group is left aside: a call that replaced the harness's is handled as such.
    """
    import torch.distributed as dist

    default = dist.group.WORLD if dist.is_initialized() else None
    left = [g for g in compat.live_process_groups() - before if g is not default]
    by_site: dict[str, list[Any]] = {}
    for group in left:
        by_site.setdefault(compat.group_created_at(group) or "an unknown place", []).append(group)
    lines = []
    for site, groups in sorted(by_site.items()):
        if len(groups) == 1:
            ranks = dist.get_process_group_ranks(groups[0])
            what = f"process group of ranks {ranks} made at {site} was"
        else:
            what = f"{len(groups)} process groups made at {site} were"
        lines.append(f"{what} not destroyed")
    return lines


def _cuda_allocated() -> int | None:
    """Bytes of CUDA memory allocated on the current device.

    Only where CUDA is in use: this never initialises it, and returns None then.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.memory_allocated())


def _left_cuda_memory(before: int) -> list[str]:
    now = _cuda_allocated() or 0
    if now > before:
        gc.collect()  # tensors held only by reference cycles are no leak
        now = _cuda_allocated() or 0
    if now <= before:
        return []
    device = sys.modules["torch"].cuda.current_device()
    return [
        f"{now - before} bytes of CUDA memory allocated during the call are still allocated "
        f"on cuda:{device} (torch.cuda.memory_allocated)"
    ]


def kill_children() -> None:
    """SIGKILL this process's live children.

    This runs as the rank exits: a subprocess a test left running must not outlive it, also
    when the controller that would kill it is gone.
    """
    for pid in _live_children():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass  # gone meanwhile, or no longer ours to kill


def _where_started(frame: FrameType | None) -> str:
    """``file:line`` of the first caller outside the standard library.

    Else the first outside ``threading``. Paths under the working directory are shown
    relative to it.
    """
    fallback = None
    while frame is not None:
        name = frame.f_code.co_filename
        if name not in (_THREADING_FILE, _OWN_FILE):
            if fallback is None:
                fallback = frame
            if not in_stdlib(name):
                break
        frame = frame.f_back
    chosen = frame or fallback
    if chosen is None:
        return "<unknown>"
    return f"{_shown(chosen.f_code.co_filename)}:{chosen.f_lineno}"


def _shown(path: str) -> str:
    """``path``, relative to the working directory when under it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _open_fds() -> set[int]:
    """This process's open file descriptors."""
    if not _PROC:
        return set()
    fds = {int(entry) for entry in os.listdir(_FD_DIR)}
    if not fds:
        return fds
    # The listing holds the descriptor it read the directory through, closed by now. It was
    # the lowest free one then, and is again: a dup finds it (or fails, if it was the top
    # one). Left in, a file the call opens would take that number and go unnoticed.
    top = max(fds)
    try:
        own = os.dup(top)
    except OSError:
        fds.discard(top)
    else:
        os.close(own)
        fds.discard(own)
    return fds


def _file_target(fd: int) -> str | None:
    """The path ``fd`` points at, if a file or directory.

    Only paths outside ``/dev`` are returned.
    """
    try:
        target = os.readlink(f"{_FD_DIR}/{fd}")
    except OSError:
        return None  # closed since (the listing's own descriptor, say)
    if not target.startswith("/") or target.startswith("/dev/"):
        return None
    return target


def _live_children() -> set[int]:
    """Pids of this process's children that have not exited.

    Zombies are left out.
    """
    if not _PROC or not _has_children():
        return set()
    pids = _children_of_tasks() if _CHILDREN_FILES else _children_by_scan()
    return {pid for pid in pids if _running(pid)}


def _has_children() -> bool:
    """Whether this process has any child, exited or not.

    One system call, where reading ``/proc`` costs one read per thread (and most calls leave
    no child at all).
    """
    try:
        # WNOWAIT: a child that exited stays unreaped, for whoever waits for it.
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _children_of_tasks() -> set[int]:
    """Children as the kernel lists them for each thread.

    Read from ``/proc/self/task/*/children``: a listing and a few small reads.
    """
    pids: set[int] = set()
    for task in os.listdir(_TASK_DIR):
        try:
            with open(f"{_TASK_DIR}/{task}/children", "rb") as handle:
                pids.update(int(pid) for pid in handle.read().split())
        except OSError:
            continue  # the thread ended meanwhile
    return pids


def _children_by_scan() -> set[int]:
    """Children found by reading every process's parent from ``/proc``.

    The slow way, where the kernel was built without the per-thread ``children`` files.
    """
    me = str(os.getpid())
    return {
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and _stat_fields(int(entry))[1:2] == [me]
    }


def _stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name: state, ppid, ... ([] when gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    # The command name may hold spaces and parentheses: split after the last ')'.
    return text.rsplit(")", 1)[-1].split()


def _running(pid: int) -> bool:
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def _command(pid: int) -> str:
    # A child that subprocess.Popen has just started may still be inside execve: its parent
    # resumes before the kernel has laid out the new command line, which reads as empty
    # until then. Only found leaks get here, so waiting up to ~0.1 s for it costs nothing.
    for _ in range(50):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                text = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return "<gone>"
        if text:
            return text
        time.sleep(0.002)
    return "<no command line>"
