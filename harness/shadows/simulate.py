"""One simulated rank of a shadow world, in a process of its own forked from the host.

:func:`run` makes the forked process rank ``r`` of a world of ``N``: the torchrun variables
say so, a rank context of its own replaces the host's, and every process group it makes is
a :class:`~harness.shadows.backend.ShadowGroup` (the default group the harness makes, one
the body makes with ``init_process_group`` whatever its backend and rendezvous, and every
``new_group``, whose creation is noted as a :class:`~harness.shadows.records.Creation`). The
test body then runs as on a real rank (:mod:`harness.rank.pytest_body`), its collectives
recorded as there (:mod:`harness.rank.recording`), and what the rank did goes back to the host
through a pipe as a :class:`~harness.shadows.records.SimulatedRank`. The process then leaves
at once: it never returns into the host's code.

Imports: see :mod:`harness.shadows`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import faulthandler
import functools
import inspect
import os
import pickle
import sys
import sysconfig
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NoReturn, cast

import torch
import torch.distributed as dist

from harness import compat
from harness.protocol.failures import RankFailure
from harness.rank import current, loop, pytest_body, recording, reset, sites
from harness.rank.context import RankContext, Running, skip_kind
from harness.rank.recording import hooks
from harness.rank.recording.records import Record
from harness.shadows import backend
from harness.shadows.records import SHADOW_VARIABLE, Creation, ShadowJob, SimulatedRank

_HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

STORE_TIMEOUT = datetime.timedelta(seconds=1)
"""How long a simulated rank waits for a key of its store: no other rank ever sets one."""


class _Ranks:
    """What one simulated rank notes besides its trace: the groups it made, and the
    collectives its groups alone recorded."""

    def __init__(self) -> None:
        self.creations: list[Creation] = []
        self.below: dict[str, list[int]] = {}

    def noted(self, record: Record) -> None:
        if record.seq:
            self.below.setdefault(record.group.id, []).append(record.seq)


def run(
    host: RankContext, job: ShadowJob, rank: int, conn: Connection, output: str, first: bool
) -> NoReturn:
    """Be rank ``rank`` of ``job``'s shadow world, send what it did on ``conn``, and exit.

    Args:
        host: The host's rank context, which this process inherited.
        job: The shadow world.
        rank: This process's rank in it.
        conn: Where the :class:`SimulatedRank` goes.
        output: The file its output goes to, removed once it said what it did: what the
            host shows of a rank that died.
        first: Whether this is the first rank the host runs: it also reports the modules
            of installed packages it imported, for the host to import before the others.
    """
    try:
        _output_to(output)
        # At its bound the rank writes every thread's stack there, and leaves (exit code 1).
        faulthandler.dump_traceback_later(job.rank_timeout, exit=True, file=sys.stderr)
        done = _simulated(host, job, rank, first)
    except BaseException as exc:  # the harness's own, before the body ran
        context = f"could not start rank {rank} of a shadow world of {job.size}"
        done = SimulatedRank(rank, failure=_failure(exc, rank, context))
    try:
        conn.send_bytes(pickle.dumps(done))
        os.unlink(output)
    finally:
        os._exit(0)


def _simulated(host: RankContext, job: ShadowJob, rank: int, first: bool) -> SimulatedRank:
    """Set this process up as the rank, run the body, and say what it did."""
    loop.die_with_parent()
    # After a fork torch makes its thread pool again on first use, and the autograd engine's
    # threads race to (torch 2.15 aborts: "Invalid thread pool!"): made here, on one thread.
    torch.set_num_threads(torch.get_num_threads())
    if host.cov is not None:  # not measured: each of a thousand ranks would write its data
        with contextlib.suppress(Exception):
            host.cov.stop()
    before = set(sys.modules) if first else set()
    env = _environment(job, rank)
    os.environ.update(env)
    os.environ.pop("TORCH_DIST_INIT_BARRIER", None)  # a barrier through the store: none here
    setup = dataclasses.replace(host.setup, rank=rank, world_size=job.size, init=job.init, env=env)
    ctx = RankContext(setup, cast(Connection, _Unheard()), host.files)
    ctx.importer = host.importer  # the test's module is imported already
    current.replace(ctx)
    if job.seed is not None:
        reset.seed_all(job.seed)
    ranks = _Ranks()
    backend.noting(ranks.noted)
    hooks.record_only()  # this rank's groups record what torch issues below its functions
    _make_shadow_groups(job, rank, ranks)
    recorder = recording.Recorder()
    skip, problem = "", None
    with recorder, ctx.calling(Running(recorder)):
        try:
            if job.init:
                dist.init_process_group(backend.BACKEND)
            pytest_body.run_pytest_test(job.ref, job.plan)
        except BaseException as exc:
            if skip_kind(exc):
                skip = str(getattr(exc, "msg", None) or exc)
            else:
                problem = _failure(exc, rank)
    return SimulatedRank(
        rank,
        recorder.trace(),
        recorder.fingerprint(),
        tuple(ranks.creations),
        {group: tuple(seqs) for group, seqs in ranks.below.items()},
        problem,
        skip,
        _installed(set(sys.modules) - before) if first else (),
    )


def _failure(exc: BaseException, rank: int, context: str | None = None) -> RankFailure:
    """``exc`` as this rank's failure, the harness's frames left out (this module's, the
    rank side's that run the body)."""
    return RankFailure.from_exception(exc, rank, hidden_dir=_HARNESS_DIR, context=context)


class _Unheard:
    """The rank's pipe to the controller, which a simulated rank never writes to: what a
    failing body says early (``Failing``) is the host's to gather, from its result."""

    def send(self, message: object) -> None:
        return None


def _environment(job: ShadowJob, rank: int) -> dict[str, str]:
    """The torchrun variables of rank ``rank``: nodes of ``job.node_size`` ranks."""
    node, nodes = job.node_size, -(-job.size // job.node_size)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(job.size),
        "LOCAL_RANK": str(rank % node),
        "LOCAL_WORLD_SIZE": str(min(node, job.size - rank // node * node)),
        "GROUP_RANK": str(rank // node),
        "GROUP_WORLD_SIZE": str(nodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(job.size),
        SHADOW_VARIABLE: str(job.size),
    }


def _output_to(path: str) -> None:
    """Send the rank's output, and the stacks of a fatal error, to ``path`` (a thousand
    ranks would print a thousand copies to the test's output)."""
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd in (1, 2):
        os.dup2(out, fd)
    os.close(out)
    faulthandler.enable(file=sys.stderr, all_threads=True)


def _make_shadow_groups(job: ShadowJob, rank: int, ranks: _Ranks) -> None:
    """Make every process group of this process a shadow one, note each group made, and
    name the groups' backend Gloo's."""
    start = dist.init_process_group

    @functools.wraps(start)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        # Whatever backend, rendezvous and size the caller names: the shadow world's.
        store = dist.HashStore()  # type: ignore[attr-defined]
        store.set_timeout(STORE_TIMEOUT)
        start(backend.BACKEND, rank=rank, world_size=job.size, store=store)

    named = dist.get_backend

    @functools.wraps(named)
    def get_backend(group: Any = None) -> Any:
        # A shadow rank is a CPU rank with Gloo's semantics: code that branches on the
        # backend (monitored_barrier, the device of object collectives) goes Gloo's way.
        found = named(group)
        return dist.Backend.GLOO if found == backend.BACKEND else found

    for module in (dist, dist.distributed_c10d):
        module.init_process_group = init_process_group  # type: ignore[attr-defined]
        module.get_backend = get_backend  # type: ignore[attr-defined]
    recording.recorder.replace("monitored_barrier", _monitored_barrier)
    compat.set_group_maker(_noting(compat.group_maker(), ranks))


def _monitored_barrier(
    group: Any = None, timeout: Any = None, wait_all_ranks: bool = False
) -> None:
    """``torch.distributed.monitored_barrier`` on a shadow group: torch 2.15's refuses a group
    without the CPU among the devices of its C++ backends, which a group written in Python
    has none of."""
    if group is not None and dist.get_rank(group) < 0:
        return  # not a member: nothing to wait for, as torch's
    cast(Any, group or dist.group.WORLD).monitored_barrier(timeout, wait_all_ranks)


def _noting(make: Callable[..., Any], ranks: _Ranks) -> Callable[..., Any]:
    """``make`` (what every ``new_group`` calls) on the default group's backend, noting each
    group made and where."""
    names = _parameters(make)

    @functools.wraps(make)
    def making(*args: Any, **kwargs: Any) -> Any:
        given = dict(zip(names, args, strict=False))  # the rest by name
        given.update(kwargs)
        members = given.get("ranks")
        file, line = sites.call_site(compat.frame(1))
        ranks.creations.append(
            Creation(
                None if members is None else tuple(sorted(members)),
                f"{os.path.basename(file)}:{line}",
                bool(given.get("use_local_synchronization")),
            )
        )
        # A backend the body names (gloo, nccl) would connect for real: the shadow's instead.
        given["backend"] = given["backend_options"] = None
        return make(**given)

    return making


@functools.cache
def _parameters(make: Callable[..., Any]) -> tuple[str, ...]:
    """The names of ``make``'s parameters, in order, read once in the host (:func:`warm`)."""
    return tuple(inspect.signature(make).parameters)


def warm() -> None:
    """What every simulated rank needs, done once in the host before it forks them."""
    backend.register()
    _parameters(compat.group_maker())


def _installed(names: set[str]) -> tuple[str, ...]:
    """Of the modules ``names``, those of installed packages and the standard library: the
    host may import them (the project's own modules may read the rank at import time)."""
    paths = sysconfig.get_paths()
    roots = tuple({paths["stdlib"], paths["purelib"], paths["platlib"]})
    found = []
    for name in sorted(names):
        path = getattr(sys.modules.get(name), "__file__", None) or ""
        if path.startswith(roots):
            found.append(name)
    return tuple(found)
