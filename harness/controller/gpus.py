"""GPUs a run may use, and exclusive leases on them, shared by every process on the machine.

A world that needs GPUs takes all of them at once, as a :class:`Lease`, from the run's
:class:`Inventory`, and holds them while it lives. Leases are OS file locks (``flock``) on one
file per GPU in a lease directory that every pytest process and xdist worker of the machine
shares, so a process that dies, even by SIGKILL, frees its GPUs with no clean-up step
(those files, and the errors of the directory, are :mod:`harness.controller.lease_files`).

Waiting is first come, first served: a waiter holds a ticket (a locked file named for when
it came) and nobody takes GPUs while an earlier ticket is live, so a world that needs many
GPUs is never starved by a stream of small ones. A process with idle worlds gives their
leases back when it sees a ticket of another process (:func:`others_waiting`), and before it
waits itself: no process waits while holding GPUs it is not using.
"""

from __future__ import annotations

import getpass
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from harness.controller import lease_files
from harness.controller.lease_files import LeaseError as LeaseError

POLL_S = 0.05
"""How often a waiter looks again for free GPUs."""


def default_lease_dir() -> str:
    """``<temp dir>/harness-gpu-leases-<user>``: one directory per user of the machine."""
    try:
        user = getpass.getuser()
    except Exception:  # no name for this uid (a container): the number will do
        user = str(os.getuid())
    return os.path.join(tempfile.gettempdir(), f"harness-gpu-leases-{user}")


@dataclass(frozen=True)
class Inventory:
    """The GPUs a run may use, as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs), and
    the directory of their lease files."""

    ids: tuple[str, ...]
    lease_dir: str


def inventory(
    given: str | None,
    environ: Mapping[str, str],
    cuda_count: Callable[[], int],
    lease_dir: str,
    where: str = "--dist-gpus",
) -> Inventory:
    """The GPUs the run may use.

    They are ``given`` (``"0,1,2,3"``), else every GPU that CUDA shows. Where
    ``CUDA_VISIBLE_DEVICES`` is set, the run never uses a device outside it: by default its devices
    are the run's, and ``given`` must name only those. Where CUDA shows no device, the ids given are
    leased as they are, so that a lease setup can be tried on any machine.

    Args:
        given: The ids given (``--dist-gpus``, ini ``dist_gpus``), comma-separated; None or
            '' for the default.
        cuda_count: How many devices CUDA shows (called only when nothing else says).
        where: How errors name the setting.

    Raises:
        ValueError: An id that is empty, given twice, or outside ``CUDA_VISIBLE_DEVICES``
            (or, without it, not one of the devices CUDA shows, where it shows some).
    """
    outer = environ.get("CUDA_VISIBLE_DEVICES")
    visible = _split(outer, "CUDA_VISIBLE_DEVICES") if outer is not None else None
    if not given:
        shown = visible if visible is not None else [str(i) for i in range(cuda_count())]
        return Inventory(tuple(shown), lease_dir)
    ids = _split(given, where)
    if visible is not None:
        outside = [gpu for gpu in ids if gpu not in visible]
        if outside:
            raise ValueError(
                f"{where} names GPU {outside[0]!r}, outside CUDA_VISIBLE_DEVICES="
                f"{outer!r}: valid ids are {', '.join(visible) or 'none'}"
            )
    else:
        count = cuda_count()
        shown = [str(index) for index in range(count)]
        unknown = [gpu for gpu in ids if gpu not in shown and not gpu.startswith(("GPU-", "MIG-"))]
        if count and unknown:
            raise ValueError(
                f"{where} names GPU {unknown[0]!r}, which CUDA does not show: valid ids are "
                f"{', '.join(shown)} (or UUIDs)"
            )
    return Inventory(tuple(ids), lease_dir)


def _split(text: str, where: str) -> list[str]:
    if not text.strip():
        return []
    ids = [part.strip() for part in text.split(",")]
    for gpu in ids:
        if not gpu:
            raise ValueError(f"{where} has an empty GPU id in {text!r}: give ids like 0,1,2,3")
        if ids.count(gpu) > 1:
            raise ValueError(f"{where} names GPU {gpu!r} twice in {text!r}")
    return ids


class Lease:
    """GPUs held exclusively by this process until :meth:`release` (or its death), in the
    order the world's ranks use them."""

    def __init__(self, ids: tuple[str, ...], files: list[int]) -> None:
        self.ids = ids
        self._files = files

    @property
    def visible_devices(self) -> str:
        """``CUDA_VISIBLE_DEVICES`` for every rank of the world that holds it."""
        return ",".join(self.ids)

    @property
    def held(self) -> bool:
        """Whether the GPUs are still held."""
        return bool(self._files)

    def release(self) -> None:
        """Give the GPUs back (idempotent)."""
        files, self._files = self._files, []
        for fd in files:
            os.close(fd)  # closing the file ends its lock

    def __repr__(self) -> str:
        state = "held" if self.held else "released"
        return f"<harness GPU lease {self.visible_devices} {state}>"


class LeaseTimeout(LeaseError):
    """A world's GPUs did not come free in time: it ``waited`` seconds for ``count`` GPUs,
    which ``holders`` held."""

    def __init__(self, waited: float, count: int, holders: list[str]) -> None:
        self.waited, self.count, self.holders = waited, count, holders
        gpus = "GPU" if count == 1 else "GPUs"
        held = "; ".join(holders) or "nobody (they were taken and given back meanwhile)"
        super().__init__(f"waited {waited:.1f} s for {count} {gpus}; held by: {held}")


def acquire(
    stock: Inventory,
    count: int,
    *,
    holder: str,
    timeout: float | None,
    before_waiting: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Lease:
    """Take ``count`` GPUs of ``stock``, all at once, waiting for them in turn.

    Args:
        holder: Who holds them, for the message of whoever waits (a test id).
        timeout: The most seconds to wait; None: no bound.
        before_waiting: Called once, before the first wait: the caller gives back the
            leases of its own idle worlds there.

    Raises:
        ValueError: ``count`` is not between 1 and ``len(stock.ids)``.
        LeaseTimeout: The GPUs did not come free within ``timeout``.
        LeaseDirectoryError: The lease directory cannot be created or locked.
    """
    if not 1 <= count <= len(stock.ids):
        raise ValueError(f"cannot lease {count} GPUs from {len(stock.ids)}: {stock.ids}")
    directory = lease_files.lease_directory(stock.lease_dir)
    started = clock()
    ticket: tuple[str, int] | None = None
    gave_back = False
    try:
        while True:
            with lease_files.locked(os.path.join(directory, "queue.lock")):
                if lease_files.first_in_line(directory, ticket[0] if ticket else None):
                    lease = _take(directory, stock.ids, count, holder)
                    if lease is not None:
                        return lease
                if ticket is None:
                    ticket = lease_files.take_ticket(directory)
            if not gave_back:
                before_waiting()  # then look again at once: that may have been enough
                gave_back = True
                continue
            if timeout is not None and clock() - started >= timeout:
                raise LeaseTimeout(clock() - started, count, holders(stock))
            sleep(POLL_S)
    finally:
        if ticket is not None:
            lease_files.drop_ticket(ticket)


def others_waiting(stock: Inventory) -> bool:
    """Whether another process waits for GPUs of ``stock`` (has a live ticket)."""
    try:
        names = os.listdir(stock.lease_dir)
    except OSError:
        return False
    mine = f"-{os.getpid()}{lease_files.TICKET}"
    return any(
        name.endswith(lease_files.TICKET)
        and not name.endswith(mine)
        and lease_files.live(os.path.join(stock.lease_dir, name))
        for name in names
    )


def holders(stock: Inventory) -> list[str]:
    """Who holds each held GPU of ``stock``, one line each: ``"GPU 0: pid 123, test_x.py::t"``."""
    found = []
    for gpu in stock.ids:
        path = lease_files.lock_path(stock.lease_dir, gpu)
        if not lease_files.live(path):
            continue
        try:
            with open(path + ".owner") as owner:
                who = owner.read().strip()
        except OSError:
            who = "unknown"
        found.append(f"GPU {gpu}: {who}")
    return found


def _take(directory: str, ids: Iterable[str], count: int, holder: str) -> Lease | None:
    """Lock the first ``count`` free GPUs in order; None if fewer are free."""
    taken: list[tuple[str, int]] = []
    for gpu in ids:
        fd = lease_files.try_lock(lease_files.lock_path(directory, gpu))
        if fd is None:
            continue
        taken.append((gpu, fd))
        if len(taken) == count:
            break
    if len(taken) < count:
        for _, fd in taken:
            os.close(fd)
        return None
    for gpu, _ in taken:
        with open(lease_files.lock_path(directory, gpu) + ".owner", "w") as owner:
            owner.write(f"pid {os.getpid()}, {holder}\n")
    return Lease(tuple(gpu for gpu, _ in taken), [fd for _, fd in taken])
