"""The files behind GPU leases: one lock file per GPU, and the waiters' tickets.

Every lock is an OS file lock (``flock``) on a file of the lease directory, held through an
open file, so that the process's death, even by SIGKILL, ends it. A GPU is held while its
lock file (:func:`lock_path`) is locked; a waiter is in line while its ticket (a locked file
named for when it came, :func:`take_ticket`) is. Stale tickets, of processes that died waiting,
are removed by whoever meets them first. :mod:`harness.controller.gpus` builds the leases
and the first come, first served wait on these.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time

TICKET = ".ticket"
"""The ending of a ticket's file name."""


class LeaseError(Exception):
    """GPUs could not be leased (see the subclasses)."""


class LeaseDirectoryError(LeaseError, OSError):
    """The lease directory, or a file in it, cannot be created or opened (its path and why)."""


def lease_directory(path: str) -> str:
    """``path``, made where it is missing; ``LeaseDirectoryError`` if it cannot be, or
    written in."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise LeaseDirectoryError(
            exc.errno, f"cannot create the GPU lease directory {path!r}: {exc.strerror}"
        ) from None
    if not os.access(path, os.W_OK):
        raise LeaseDirectoryError(errno.EACCES, f"cannot write in the GPU lease directory {path!r}")
    return path


class locked:
    """Hold a blocking exclusive lock on ``path`` during the block."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd = -1

    def __enter__(self) -> None:
        self._fd = open_file(self._path)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc_info: object) -> None:
        os.close(self._fd)


def open_file(path: str) -> int:
    """A descriptor of ``path`` open for reading and writing, made where it is missing;
    ``LeaseDirectoryError`` if it cannot be opened."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise LeaseDirectoryError(
            exc.errno, f"cannot open the GPU lease file {path!r}: {exc.strerror}"
        ) from None


def lock_path(directory: str, gpu: str) -> str:
    # A UUID is a safe file name too; a path separator in an id is not.
    return os.path.join(directory, "gpu-" + gpu.replace(os.sep, "_") + ".lock")


def try_lock(path: str) -> int | None:
    """An open, exclusively locked ``path``; None where another open file holds it."""
    fd = open_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def live(path: str) -> bool:
    """Whether another open file holds ``path`` locked."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def take_ticket(directory: str) -> tuple[str, int]:
    """A live ticket of this process: a locked file whose name sorts by when it was made."""
    path = os.path.join(directory, f"{time.time_ns():020d}-{os.getpid()}{TICKET}")
    fd = open_file(path)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return path, fd


def drop_ticket(held: tuple[str, int]) -> None:
    """Give up a ticket of :func:`take_ticket`: its file removed, its lock ended."""
    path, fd = held
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)


def first_in_line(directory: str, mine: str | None) -> bool:
    """Whether no live ticket came before ``mine`` (None: a newcomer's); removes stale ones."""
    for name in sorted(os.listdir(directory)):
        if not name.endswith(TICKET):
            continue
        path = os.path.join(directory, name)
        if path == mine:
            return True
        if live(path):
            return False
        with contextlib.suppress(OSError):
            os.unlink(path)  # its process died while waiting
    return True
