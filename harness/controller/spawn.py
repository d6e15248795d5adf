"""The controller's process manager: where ranks are spawned and stopped.

* Start method: ranks fork from the warm server of :mod:`harness.controller.forkserver`,
  never from the controller itself (it may have touched CUDA or hold process groups).
* Rendezvous: a ``FileStore`` in the world's private (0700) directory, and Gloo/NCCL pinned
  to the loopback interface, so nothing listens on a reachable address and concurrent runs
  on one machine cannot meet each other.
* Stopping: every rank holds the read end of a lifeline pipe whose only write end is ours.
  Closing it (or our death, even by SIGKILL) wakes the rank's watchdog thread, which saves
  coverage and exits; what has not exited shortly after is SIGKILLed. Ranks also ask the
  kernel for SIGKILL when their parent (the forkserver) dies. Each rank leads a process
  group of its own, killed once the rank is gone: nothing a test started there outlives it.
* Generations: a failed call ends a World's ranks and the next call starts new ones;
  :class:`Generations` holds the live ones and their files, for the World and its finalizer.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import shutil
import signal
import socket
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from harness.controller import coverage
from harness.controller.forkserver import context
from harness.controller.gpus import Lease
from harness.protocol import devices
from harness.protocol.messages import TRACE_REQUEST, RankSetup
from harness.protocol.rank_files import RankFiles
from harness.rank import CODE_DIR, entry

# How long ranks get to save coverage and exit after their lifeline closes before SIGKILL.
STOP_GRACE_S = 5.0
STOP_GRACE_NO_COVERAGE_S = 1.0


def _loopback_interface() -> str:
    """Name of the loopback network interface.

    ``lo`` on Linux, ``lo0`` on macOS.
    """
    names = [name for _, name in socket.if_nameindex()]
    for name in ("lo", "lo0"):
        if name in names:
            return name
    loops = [name for name in names if name.startswith("lo")]
    return loops[0] if loops else "lo"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now.

    For ``MASTER_PORT``.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_env(
    rank: int,
    world_size: int,
    master_port: int,
    gpus: tuple[str, ...] = (),
    restarts: tuple[int, int] = (0, 0),
    *,
    cuda: bool = True,
) -> dict[str, str]:
    """The torchrun environment of one rank of a single-node world.

    With ``gpus``, the world's GPUs: every rank sees all of them, its own at
    ``cuda:LOCAL_RANK`` onwards, or shared (:func:`harness.protocol.devices.lease_env`); its
    ``restarts``: which restart this is, of how many, as torchrun's agent counts
    them; without ``cuda``, no GPU at all (an empty ``CUDA_VISIBLE_DEVICES``).
    """
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "default",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restarts[0]),
        "TORCHELASTIC_MAX_RESTARTS": str(restarts[1]),
        "TORCHELASTIC_RUN_ID": "harness",
    }
    # torchrun's default: one intra-op thread per rank, so N ranks do not fight over cores.
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"
    loopback = _loopback_interface()
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if name not in os.environ:
            env[name] = loopback
    if gpus:
        # Not the same order on every rank: see harness.protocol.devices for why.
        env.update(devices.lease_env(gpus, rank, world_size))
    elif not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@dataclass
class RankProcess:
    """One rank as the controller sees it.

    From its start until it is reaped.
    """

    rank: int
    pid: int
    process: Any  # multiprocessing.Process of the chosen context
    conn: Connection
    lifeline: Connection | None
    files: RankFiles
    # Told by the rank's Ready message; used to make its stack dumps readable.
    main_thread: int = 0
    watchdog_thread: int = 0
    code_dir: str = CODE_DIR
    reaped: bool = False

    def alive(self) -> bool:
        return not self.reaped and self.process.exitcode is None

    def ask_trace(self) -> bool:
        """Ask the rank's watchdog thread for its collective trace.

        It writes the trace to its trace file (``files.trace()`` reads it; the old one is
        forgotten first). Returns whether the request went out (not to a rank that is gone
        or never had a lifeline).
        """
        if not self.alive() or self.lifeline is None:
            return False
        self.files.forget_trace()
        try:
            self.lifeline.send_bytes(TRACE_REQUEST)
        except OSError:
            return False
        return True


def start_ranks(
    world_size: int,
    backend: str,
    workdir: str,
    coverage: dict[str, Any] | None,
    *,
    init: bool = True,
    gpus: tuple[str, ...] = (),
    restarts: tuple[int, int] = (0, 0),
) -> list[RankProcess]:
    """Start ``world_size`` rank processes.

    They rendezvous on their own, where ``init``, each seeing ``gpus``
    (``CUDA_VISIBLE_DEVICES``). Without ``gpus`` an NCCL world, or one whose calls make their
    own groups (``init=False``), sees what the controller sees; any other sees no GPU: the
    harness's ``init`` would bind rank r to ``cuda:r`` wherever CUDA
    is visible, a GPU that may not exist or may be another world's lease."""
    cuda = bool(gpus) or not init or "nccl" in backend
    ctx = context()
    port = free_port()
    inherited = dict(os.environ)
    ranks: list[RankProcess] = []
    try:
        for rank in range(world_size):
            setup = RankSetup(
                rank=rank,
                world_size=world_size,
                backend=backend,
                init=init,
                inherited=inherited,
                env=rank_env(rank, world_size, port, gpus, restarts, cuda=cuda),
                workdir=workdir,
                coverage=coverage,
            )
            ours, theirs = ctx.Pipe()
            life_read, life_write = ctx.Pipe(duplex=False)
            process = ctx.Process(  # type: ignore[attr-defined]
                target=entry.rank_main,
                args=(setup, theirs, life_read),
                name=f"harness-rank{rank}",
            )
            try:
                process.start()
            finally:
                # The child has its copies; keeping ours would hide its death from us.
                theirs.close()
                life_read.close()
            ranks.append(
                RankProcess(rank, process.pid, process, ours, life_write, RankFiles(workdir, rank))
            )
    except BaseException as exc:
        # Ctrl-C: the user wants out now, not the ranks' coverage.
        interrupted = isinstance(exc, KeyboardInterrupt)
        stop_ranks(ranks, grace_s=0.0 if interrupted else STOP_GRACE_NO_COVERAGE_S)
        raise
    return ranks


def stop_ranks(ranks: list[RankProcess], *, grace_s: float) -> None:
    """Stop ranks and reap them.

    Close lifelines, give them ``grace_s`` to exit (0: none, as after Ctrl-C), SIGKILL the
    rest and their process groups, reap all (again on the same ranks: nothing more).
    """
    for proc in ranks:
        if proc.lifeline is not None:
            proc.lifeline.close()
            proc.lifeline = None
    ranks = [proc for proc in ranks if not proc.reaped]
    deadline = time.monotonic() + grace_s
    try:
        waiting = [proc for proc in ranks if proc.alive()]
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            multiprocessing.connection.wait([proc.process.sentinel for proc in waiting], left)
            waiting = [proc for proc in waiting if proc.alive()]
    finally:
        # Also when interrupted (Ctrl-C): whatever is still running is killed and reaped.
        for proc in ranks:
            if proc.alive():
                proc.process.kill()
    for proc in ranks:
        proc.process.join()
        proc.reaped = True
        proc.conn.close()
        proc.process.close()
        # What is left of the rank's process group (it leads one, whose id is its pid, not
        # handed out again while the group has a member): what a test started there.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass  # no such group left (the usual case), or a member that is not ours to kill


@dataclass
class Generations:
    """A World's ranks, one generation after another, and their files.

    A failure ends a generation. This is what a World must release, kept apart from it so
    that a finalizer can hold it.

    Attributes:
        root: The World's private directory; each generation's files are in one of its own.
        ranks: The live generation's ranks (after a failure: those torn down).
        workdir: The live generation's directory (None before the first).
        count: How many generations were started.
        lease: The GPUs the World holds for every generation, given back with its files.
        restarts: The live generation's restart and how many the run has
            (``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_MAX_RESTARTS``).
    """

    root: str
    lease: Lease | None = None
    ranks: list[RankProcess] = field(default_factory=list)
    workdir: str | None = None
    count: int = 0
    restarts: tuple[int, int] = (0, 0)

    def start(
        self, world_size: int, backend: str, *, init: bool, restarts: tuple[int, int] = (0, 0)
    ) -> None:
        """Start the next generation, as :func:`start_ranks`.

        The last one is stopped; the files of the one before are removed.
        """
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.count += 1
        self.workdir = os.path.join(self.root, f"g{self.count}")
        os.mkdir(self.workdir, 0o700)
        gpus = self.lease.ids if self.lease is not None else ()
        self.restarts = restarts
        self.ranks = start_ranks(
            world_size,
            backend,
            self.workdir,
            coverage.settings(),
            init=init,
            gpus=gpus,
            restarts=restarts,
        )

    def stop(self, *, interrupted: bool = False) -> None:
        """Stop the live generation's ranks and fold in their coverage.

        Their coverage goes into ours; after Ctrl-C they stop at once: the user wants out,
        not the ranks' coverage.
        """
        if self.ranks:
            grace = STOP_GRACE_S if coverage.settings() else STOP_GRACE_NO_COVERAGE_S
            stop_ranks(self.ranks, grace_s=0.0 if interrupted else grace)
        if self.workdir is not None:
            coverage.merge(self.workdir)

    def release(self) -> None:
        """Stop the ranks, remove the World's files, return its GPUs."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            if self.lease is not None:
                self.lease.release()
