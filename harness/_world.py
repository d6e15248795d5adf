"""The controller: a ``World`` owns N ranks, sends them calls, and turns what comes back
into return values or one of the harness errors.

Supervision of a call (``_gather``) waits on every rank's pipe *and* its process sentinel,
so an answer, an exception and a death are all seen the moment they happen. The first
failure in time is the root cause; once it is seen, the other ranks get a short grace
period to report (a peer blocked in a collective with a rank that exited fails within
milliseconds) and are then torn down, so an error reaches the caller in about a second,
never after a process-group timeout.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import time
import unittest
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from harness import _coverage, _server, _spawn, _stacks
from harness._checks import check_timeout, check_world_size
from harness._errors import (
    DistributedError,
    RankCrash,
    RankError,
    RankFailure,
    WorldTimeout,
    describe_exitcode,
)
from harness._messages import Call, Done, Failed, RankMessage, Ready, Skipped, rank_file
from harness._spawn import RankProcess

START_TIMEOUT_S = 60.0
"""Bound on starting (or rebuilding) a world, separate from a run's timeout."""

FAILURE_GRACE_S = 0.5
"""After the first failure, how long the other ranks get to report before they are torn down."""

DEATH_SEEN_LATE_S = FAILURE_GRACE_S
"""How much earlier than we see it a rank may have died without a crash dump: a death seen
within this time after another rank's failure counts as that failure's cause."""

SKIP_GRACE_S = 2.0
"""After the first skip, how long the other ranks get to finish (a skip is usually unanimous)."""

_KNOWN_BACKENDS = ("gloo", "nccl", "ucc", "mpi", "xccl")


def resolve_backend(backend: object) -> str:
    """Turn ``"auto"`` into ``"nccl"`` or ``"gloo"``; check that a named backend exists.

    Raises:
        ValueError: If ``backend`` is not ``"auto"`` or a torch.distributed backend name.
    """
    valid = ("auto", *_KNOWN_BACKENDS)
    if not isinstance(backend, str) or backend.lower() not in valid:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(map(repr, valid))}")
    name = backend.lower()
    if name == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return name


def unavailable_reason(backend: str, world_size: int) -> str | None:
    """Why a world of this (resolved) backend and size cannot run here, or None if it can."""
    if backend == "nccl":
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < world_size:
            return f"needs {world_size} CUDA devices, found {found}"
    check = getattr(dist, "is_backend_available", None)
    available = check(backend) if check else getattr(dist, f"is_{backend}_available", bool)()
    if not dist.is_available() or not available:
        return f"backend {backend!r} is not available in this build of torch {torch.__version__}"
    return None


@dataclass
class _Died:
    """A rank process ended without answering."""

    exitcode: int | None
    at: float


_Reply = RankMessage | _Died


@dataclass
class Outcome:
    """Everything one call produced, before it is turned into a return value or an error."""

    values: list[Any] | None = None
    error: DistributedError | None = None
    skip: Skipped | None = None
    outputs: dict[int, tuple[str, str]] = field(default_factory=dict)
    reusable: bool = True

    def result(self) -> list[Any]:
        """The return values by rank; raises the error or the skip instead."""
        if self.error is not None:
            raise self.error
        if self.skip is not None:
            raise_skip(self.skip)
        assert self.values is not None
        return self.values


def raise_skip(skip: Skipped) -> NoReturn:
    """Raise the same kind of skip the ranks raised, pointing at the caller, not at us."""
    if skip.kind == "pytest":
        import pytest

        raise pytest.skip.Exception(skip.reason, _use_item_location=True)
    raise unittest.SkipTest(skip.reason)


@dataclass
class _State:
    """What a World must release; kept apart from it so a finalizer can hold it."""

    root: str
    ranks: list[RankProcess] = field(default_factory=list)
    workdir: str | None = None


def _release(state: _State) -> None:
    try:
        _stop(state)
    finally:
        shutil.rmtree(state.root, ignore_errors=True)


_open_worlds: weakref.WeakSet[World] = weakref.WeakSet()


def _close_open_worlds() -> None:
    for world in list(_open_worlds):
        world.close()


# At exit, worlds are closed (their ranks save coverage) before the forkserver is stopped.
_server.before_stop.append(_close_open_worlds)


def _stop(state: _State) -> None:
    """Stop the ranks of the current generation and fold their coverage into ours."""
    if state.ranks:
        grace = _spawn.STOP_GRACE_S if _coverage.settings() else _spawn.STOP_GRACE_NO_COVERAGE_S
        _spawn.stop_ranks(state.ranks, grace_s=grace)
    if state.workdir is not None:
        _coverage.merge(state.workdir)


class World:
    """A set of ranks kept alive between runs, with their default process group.

    Starting ranks costs far more than using them, so a World starts ``world_size`` ranks
    once and serves any number of ``run`` calls with them. Between calls each rank restores
    ``os.environ`` and its working directory and destroys the process groups a call left
    behind. After a failure, timeout or crash the World rebuilds itself (fresh processes,
    fresh rendezvous) before the next run, so one bad call never poisons the next.

    Not thread-safe: use one World from one thread at a time.

    Args:
        world_size: Number of ranks (>= 1).
        backend: ``"auto"`` (NCCL when CUDA is available, Gloo otherwise), ``"gloo"`` or
            ``"nccl"`` (or another backend torch was built with).
        timeout: Default bound in seconds for each ``run``; None means no bound.

    Raises:
        TypeError, ValueError: For an invalid ``world_size``, ``backend`` or ``timeout``.
        RuntimeError: If the backend cannot run here (not built into torch, or NCCL with
            fewer CUDA devices than ranks).
        DistributedError: If a rank does not come up within 60 s or fails to initialize.
    """

    def __init__(self, world_size: int, *, backend: str = "auto", timeout: float | None = None):
        self.world_size: int = check_world_size(world_size)
        self.backend: str = resolve_backend(backend)
        self.timeout: float | None = check_timeout(timeout)
        reason = unavailable_reason(self.backend, self.world_size)
        if reason:
            raise RuntimeError(f"cannot start a world of {world_size} ranks: {reason}")
        self._state = _State(tempfile.mkdtemp(prefix="harness-"))
        self._finalizer = weakref.finalize(self, _release, self._state)
        _open_worlds.add(self)
        self._generation = 0
        self._broken = False
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks, by rank (after a failed run: of the ranks torn down,
        until the next run rebuilds the world)."""
        return [proc.pid for proc in self._state.ranks]

    @property
    def closed(self) -> bool:
        """Whether ``close`` has run."""
        return not self._finalizer.alive

    def run(
        self,
        fn: Callable[..., Any],
        *,
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` once on every rank; return the results by rank.

        Args:
            fn: A picklable (module-level) callable.
            args: Positional arguments, pickled and sent to every rank.
            kwargs: Keyword arguments, pickled and sent to every rank.
            timeout: Bound in seconds for this run; None uses the World's timeout.

        Returns:
            ``[result of rank 0, result of rank 1, ...]``.

        Raises:
            RankError: Code raised on one or more ranks (root cause first).
            WorldTimeout: The run did not finish in time; carries every rank's stack.
            RankCrash: A rank process died during the run.
            DistributedError: ``fn``, an argument or a return value could not be pickled,
                or the world could not be rebuilt after an earlier failure.
            unittest.SkipTest, pytest.skip.Exception: Every rank skipped.
        """
        return self._call(fn, args, kwargs, timeout=timeout).result()

    def _call(
        self,
        fn: Callable[..., Any],
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        capture: bool = False,
    ) -> Outcome:
        """Run a call and return its ``Outcome`` instead of raising (the pytest plugin's entry).

        ``capture`` collects each rank's stdout and stderr into ``Outcome.outputs``.
        """
        if self.closed:
            raise RuntimeError("this World is closed; create a new one")
        timeout = check_timeout(timeout) if timeout is not None else self.timeout
        payload = _pickle_call(fn, args, kwargs, self.world_size)
        if self._broken:
            self._rebuild()
        ranks = self._state.ranks
        assert self._state.workdir is not None
        workdir = self._state.workdir
        environ = dict(os.environ)
        try:
            call = Call(payload, capture, None if environ == self._environ else environ)
            for proc in ranks:
                try:
                    proc.conn.send(call)
                except OSError:
                    pass  # died while idle; its sentinel reports it
            deadline = time.monotonic() + timeout if timeout is not None else None
            replies, timed_out = _gather(ranks, deadline)
            dumps = _spawn.dump_stacks(ranks) if timed_out else {}
            outcome = _interpret(replies, ranks, timeout, dumps, workdir)
        except BaseException:
            # KeyboardInterrupt or a bug of ours: never leave ranks mid-call behind.
            self._broken = True
            _stop(self._state)
            raise
        if outcome.error is not None or not outcome.reusable:
            self._broken = True
        if self._broken:
            _stop(self._state)
        if capture:
            outcome.outputs = {proc.rank: _read_output(workdir, proc.rank) for proc in ranks}
        return outcome

    def close(self) -> None:
        """Stop the ranks and remove the World's files. Idempotent; also runs on ``__exit__``,
        on garbage collection and at interpreter exit."""
        self._finalizer()

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("broken" if self._broken else "ready")
        return f"<harness.World world_size={self.world_size} backend={self.backend!r} {state}>"

    def _start(self) -> None:
        self._generation += 1
        workdir = os.path.join(self._state.root, f"g{self._generation}")
        os.mkdir(workdir, 0o700)
        self._state.workdir = workdir
        self._environ = dict(os.environ)  # what the ranks inherit; calls send only changes
        self._state.ranks = _spawn.start_ranks(
            self.world_size, self.backend, workdir, _coverage.settings()
        )
        replies, timed_out = _gather(self._state.ranks, time.monotonic() + START_TIMEOUT_S)
        for proc in self._state.ranks:
            reply = replies.get(proc.rank)
            if isinstance(reply, Ready):
                proc.main_thread, proc.watchdog_thread = reply.main_thread, reply.watchdog_thread
        if all(isinstance(reply, Ready) for reply in replies.values()) and not timed_out:
            self._broken = False
            return
        dumps = _spawn.dump_stacks(self._state.ranks) if timed_out else {}
        failures = _start_failures(replies, self._state.ranks, dumps, workdir)
        self._broken = True
        _stop(self._state)
        names = ", ".join(f"rank {rank}" for rank in failures)
        raise DistributedError(
            f"a world of {self.world_size} ranks ({self.backend}) did not start: {names} "
            f"did not come up",
            failures,
        )

    def _rebuild(self) -> None:
        _stop(self._state)
        if self._state.workdir is not None:
            shutil.rmtree(self._state.workdir, ignore_errors=True)
        self._start()


def run(
    fn: Callable[..., Any],
    *,
    world_size: int,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    backend: str = "auto",
    timeout: float | None = None,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` once on each of ``world_size`` fresh ranks.

    Each rank has the torchrun environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``) and a default process
    group from ``fhelium.distributed.init``. The ranks are stopped before this returns.

    A script that calls this at import time needs the ``if __name__ == "__main__":`` guard,
    as with multiprocessing's spawn and forkserver start methods.

    Args:
        fn: A picklable (module-level) callable.
        world_size: Number of ranks (>= 1).
        args: Positional arguments for ``fn``.
        kwargs: Keyword arguments for ``fn``.
        backend: ``"auto"`` (NCCL when CUDA is available, else Gloo), ``"gloo"`` or ``"nccl"``.
        timeout: Bound in seconds on the run (start-up has its own 60 s bound); None: none.

    Returns:
        The return values, index = rank.

    Raises:
        RankError, WorldTimeout, RankCrash, DistributedError: As ``World.run``.
        TypeError, ValueError, RuntimeError: As ``World``.
    """
    with World(world_size, backend=backend) as world:
        return world.run(fn, args=args, kwargs=kwargs, timeout=timeout)


def _pickle_call(
    fn: Callable[..., Any], args: Iterable[Any], kwargs: Mapping[str, Any] | None, n: int
) -> bytes:
    args = tuple(args)
    kwargs = dict(kwargs or {})
    try:
        return pickle.dumps((fn, args, kwargs))
    except Exception as exc:
        parts: list[tuple[str, Any]] = [("fn", fn)]
        parts += [(f"args[{i}]", arg) for i, arg in enumerate(args)]
        parts += [(f"kwargs[{key!r}]", value) for key, value in kwargs.items()]
        name, obj = next(((name, obj) for name, obj in parts if not _picklable(obj)), ("call", fn))
        raise DistributedError(
            f"could not pickle {name} ({_short_repr(obj)}) to send it to ranks 0..{n - 1}: "
            f"{type(exc).__name__}: {exc}. Functions must be defined at module level."
        ) from exc


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj)
    except Exception:
        return False
    return True


def _short_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception:
        text = f"<{type(obj).__qualname__} object>"
    return text if len(text) <= 80 else text[:77] + "..."


def _gather(ranks: list[RankProcess], deadline: float | None) -> tuple[dict[int, _Reply], bool]:
    """Wait for one reply (or death) per rank.

    Returns the replies by rank and whether the deadline passed. After the first reply
    that is not a success, the others get a grace period; those still silent after it are
    simply missing from the result (the caller tears them down).
    """
    replies: dict[int, _Reply] = {}
    pending = {proc.rank: proc for proc in ranks}
    grace_end: float | None = None
    while pending:
        limits = [t for t in (deadline, grace_end) if t is not None]
        now = time.monotonic()
        if limits and now >= min(limits):
            return replies, grace_end is None or (deadline is not None and now >= deadline)
        handles: dict[Any, RankProcess] = {}
        for proc in pending.values():
            handles[proc.conn] = proc
            handles[proc.process.sentinel] = proc
        for handle in wait(list(handles), min(limits) - now if limits else None):
            proc = handles[handle]
            if proc.rank not in pending:
                continue
            reply = _receive(proc)
            replies[proc.rank] = reply
            del pending[proc.rank]
            if not isinstance(reply, (Done, Ready)):
                grace = SKIP_GRACE_S if isinstance(reply, Skipped) else FAILURE_GRACE_S
                end = time.monotonic() + grace
                grace_end = end if grace_end is None else min(grace_end, end)
    return replies, False


def _receive(proc: RankProcess) -> _Reply:
    try:
        if proc.conn.poll():
            message: RankMessage = proc.conn.recv()
            return message
    except (EOFError, OSError):
        pass
    # Nothing to read: the process ended (or closed its pipe, and is about to). Its death is
    # seen now; joining then waits for the forkserver's report, which may lag behind peers
    # that already failed because of this death.
    seen = time.monotonic()
    proc.process.join(1.0)
    return _Died(proc.process.exitcode, _death_time(proc, seen))


def _death_time(proc: RankProcess, seen: float) -> float:
    """When a rank died, on the monotonic clock, as well as we can tell.

    Peers blocked in a collective with a rank fail the moment its sockets close, which is
    also when we can first see its death, so they often report a (consequential) failure
    stamped before the death is seen. A fatal signal makes faulthandler write the crash file
    just before the process dies: its mtime dates the death. Otherwise (``os._exit``, an
    external SIGKILL) the death is dated ``DEATH_SEEN_LATE_S`` before it was seen.
    """
    try:
        info = os.stat(rank_file(proc.workdir, proc.rank, "crash"))
    except OSError:
        info = None
    if info is None or info.st_size == 0:
        return seen - DEATH_SEEN_LATE_S
    written = seen - (time.time_ns() - info.st_mtime_ns) / 1e9
    return min(seen, written)


def _interpret(
    replies: dict[int, _Reply],
    ranks: list[RankProcess],
    timeout: float | None,
    dumps: dict[int, str],
    workdir: str,
) -> Outcome:
    n = len(ranks)
    by_rank = {proc.rank: proc for proc in ranks}
    done = {r: m for r, m in replies.items() if isinstance(m, Done)}
    skipped = {r: m for r, m in replies.items() if isinstance(m, Skipped)}
    if len(done) == n:
        return _values(done)
    if len(skipped) == n:
        return Outcome(skip=min(skipped.values(), key=lambda m: m.at))

    silent = [proc.rank for proc in ranks if proc.rank not in replies]
    events: list[tuple[float, int, Failed | _Died]] = sorted(
        ((m.at, r, m) for r, m in replies.items() if isinstance(m, (Failed, _Died))),
        key=lambda event: (event[0], event[1]),
    )
    if events:
        failures: dict[int, RankFailure] = {}
        exitcodes: dict[int, int] = {}
        for _, rank, reply in events:
            if isinstance(reply, Failed):
                failures[rank] = reply.failure
            else:
                failures[rank] = _crash_failure(rank, reply, by_rank[rank], workdir)
                exitcodes[rank] = reply.exitcode if reply.exitcode is not None else 0
        for rank, skip in skipped.items():
            failures[rank] = RankFailure(rank, "Skipped", skip.reason, f"Skipped: {skip.reason}\n")
        root = next(iter(failures.values()))
        summary = f"rank {root.rank} {_what(root)}"
        later = [r for r in failures if r != root.rank]
        if later:
            summary += f"; then {_ranks(later)} failed"
        if silent:
            summary += f"; {_ranks(silent)} torn down"
        if isinstance(events[0][2], _Died):
            return Outcome(error=RankCrash(summary, failures, exitcodes))
        return Outcome(error=RankError(summary, failures))

    if skipped:
        reasons = "; ".join(f"rank {r}: {m.reason}" for r, m in sorted(skipped.items()))
        others = [r for r in range(n) if r not in skipped]
        failures = {
            r: RankFailure(r, "Skipped", m.reason, f"Skipped: {m.reason}\n")
            for r, m in sorted(skipped.items(), key=lambda item: item[1].at)
        }
        return Outcome(
            error=RankError(
                f"{_ranks(list(skipped))} skipped but {_ranks(others)} did not; a distributed "
                f"run must skip on every rank or on none ({reasons})",
                failures,
            )
        )

    stacks = {rank: _readable_stacks(by_rank[rank], dumps.get(rank, "")) for rank in range(n)}
    failures = {
        rank: RankFailure(rank, "WorldTimeout", f"still running after {timeout:g} s", stacks[rank])
        for rank in silent
    }
    return Outcome(
        error=WorldTimeout(
            f"the run did not finish within {timeout:g} s: {_ranks(silent)} still running "
            "(their stacks at the deadline follow; the ranks were then killed)",
            failures,
            stacks,
        )
    )


def _values(done: dict[int, Done]) -> Outcome:
    values = []
    for rank in sorted(done):
        try:
            values.append(pickle.loads(done[rank].value))
        except Exception as exc:
            message = (
                f"could not unpickle the return value of rank {rank}: {type(exc).__name__}: {exc}"
            )
            failure = RankFailure(rank, type(exc).__name__, message, message + "\n")
            return Outcome(error=RankError(message, {rank: failure}))
    # A call that destroyed the default group leaves its result valid but the world unfit.
    return Outcome(values=values, reusable=all(reply.reusable for reply in done.values()))


def _crash_failure(rank: int, died: _Died, proc: RankProcess, workdir: str) -> RankFailure:
    how = describe_exitcode(died.exitcode)
    dump = _spawn.read_text(rank_file(workdir, rank, "crash"))
    return RankFailure(rank, "RankCrash", f"the process {how}", _readable_stacks(proc, dump))


def _readable_stacks(proc: RankProcess, dump: str) -> str:
    """A rank's faulthandler dump as traceback-style text ('' when there is none)."""
    if not dump.strip():
        return ""
    return _stacks.format_dump(dump, main_thread=proc.main_thread, hidden=(proc.watchdog_thread,))


def _start_failures(
    replies: dict[int, _Reply], ranks: list[RankProcess], dumps: dict[int, str], workdir: str
) -> dict[int, RankFailure]:
    failures: dict[int, RankFailure] = {}
    for proc in ranks:
        reply = replies.get(proc.rank)
        if isinstance(reply, Failed):
            failures[proc.rank] = reply.failure
        elif isinstance(reply, _Died):
            failures[proc.rank] = _crash_failure(proc.rank, reply, proc, workdir)
        elif reply is None:
            stack = _readable_stacks(proc, dumps.get(proc.rank, ""))
            failures[proc.rank] = RankFailure(
                proc.rank,
                "WorldTimeout",
                f"not up after {START_TIMEOUT_S:g} s (or torn down after a peer failed)",
                stack,
            )
    return failures


def _what(failure: RankFailure) -> str:
    if failure.exc_type == "RankCrash":
        return failure.message.replace("the process ", "", 1)
    return f"raised {failure.exc_type}: {failure.message}"


def _ranks(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _read_output(workdir: str, rank: int) -> tuple[str, str]:
    return (
        _spawn.read_text(rank_file(workdir, rank, "out")),
        _spawn.read_text(rank_file(workdir, rank, "err")),
    )
