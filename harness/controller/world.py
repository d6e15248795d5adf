"""The controller's entry points, ``World`` and ``run``.

``World`` owns N ranks across calls, ``run`` is one call.

A World starts a generation of ranks (:mod:`~harness.controller.spawn`), then serves calls:
each is sent to every rank, answered (:mod:`~harness.controller.waiting`) and classified
(:mod:`~harness.controller.classify`). A failure stops the generation; the next call starts
a fresh one.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from harness import compat, validate
from harness.controller import calls, forkserver, spawn
from harness.controller.backends import resolve_backend, unavailable_reason
from harness.controller.exchange import call_message, exchange
from harness.controller.gpus import Lease
from harness.controller.leak_reports import leak_report
from harness.controller.memory import LimitBelowStart, Memories, RankMemory
from harness.controller.outcome import Classified, Outcome, Reply
from harness.controller.pickling import pickle_call
from harness.controller.restarts import run_attempts
from harness.faults import Fault
from harness.faults.checks import plan
from harness.protocol.failures import EXIT_MAIN_REIMPORTED
from harness.protocol.messages import OUTPUT_CAPTURE, Call, CallOptions, Regroup, megabytes
from harness.protocol.rank_files import rendezvous_path

START_TIMEOUT_S = 60.0
"""Bound on starting (or rebuilding) a world, separate from a run's timeout."""


_open_worlds: weakref.WeakSet[World] = weakref.WeakSet()

# Where a World says it replaced its ranks for memory: a line, never a warning (a test that
# passed must not fail under -W error for what the World did after it).
_log = logging.getLogger("harness")


def _close_open_worlds() -> None:
    for world in list(_open_worlds):
        world.close()


# At exit, worlds are closed (their ranks save coverage) before the forkserver is stopped.
forkserver.before_stop.append(_close_open_worlds)


class World:
    """Ranks kept alive between runs, with their default process group.

    A World starts ``world_size`` ranks once and serves any number of ``run`` calls with
    them. After each call every rank puts back the state it came up with (see
    :mod:`harness.rank.reset`) and destroys the process groups the call left; after a
    failure, timeout, crash or fault, the World rebuilds itself (fresh processes, fresh
    rendezvous), so one bad call never poisons the next. What a call cannot have undone
    (threads, child processes, open files it left) is reported, as ``leaks`` says.

    With ``init=False`` the ranks have the torchrun environment but no process group: every
    call gets a private rendezvous (a fresh ``MASTER_PORT``, and ``INIT_METHOD`` a new
    ``file://``) to make its own (``dist.init_process_group("gloo")`` or
    ``fhelium.distributed.init()``); the next call starts with ``dist.is_initialized()``
    False.

    Not thread-safe: use one World from one thread at a time.

    Args:
        world_size: Number of ranks (>= 1).
        backend: ``"auto"`` (NCCL when CUDA is available, Gloo otherwise), ``"gloo"`` or
            ``"nccl"``. The ``backend`` attribute is the resolved one, never ``"auto"``:
            with ``init=False``, the backend a call should pass to ``init_process_group``.
        timeout: Default bound in seconds for each ``run`` (120 s by default, as for a
            distributed test); None means no bound.
        init: Whether the ranks start in a default process group (True) or without one,
            each call making its own (False).
        leaks: What to do when a call returns but leaves in a rank what no reset undoes
            (live threads it started, child processes, open files; see
            :mod:`harness.rank.leaks`): ``"warn"`` (a ``RuntimeWarning`` naming the call,
            the ranks and each finding), ``"error"`` (the call fails with a ``RankLeak``
            and the ranks are stopped, ending what they leaked) or ``"off"`` (no look).
            Growth of a rank's resident memory that stays is one such finding (see
            ``memory_growth``).
        gpus: GPUs the World holds while it lives (a lease of
            :mod:`harness.controller.gpus`), given back when it closes, also when it fails
            to start. Every rank sees exactly them as ``CUDA_VISIBLE_DEVICES``, and its own
            device is ``cuda:(LOCAL_RANK % len(gpus.ids))``, the one torch's NCCL binds by
            itself: with ``world_size`` times ``G`` GPUs, rank ``r``'s are ``cuda:r`` to
            ``cuda:r + G - 1`` (its view of the lease is rotated so); with fewer GPUs than
            ranks, the ranks share them (``NCCL_MULTI_RANK_GPU_ENABLE=1``, NCCL 2.30 and
            later). See :mod:`harness.protocol.devices`. None: the ranks of an NCCL world,
            or of one with ``init=False``, see what this process sees; those of any other
            see no GPU (lease GPUs for a Gloo world that works on CUDA tensors).
        memory_growth: How much a rank's resident memory may grow and stay over its latest
            100 calls before the growth is a leak finding (bytes, or a size such as
            ``"64MiB"``; 0: no look), as :mod:`harness.rank.memory` says; findings are
            reported as ``leaks`` says.
        max_rank_memory: A rank's resident memory (bytes, or a size such as ``"2GiB"``,
            ``"2GB"``) above which, after a call, the World replaces its ranks with fresh
            processes before the next call, saying so in one line on the ``harness``
            logger; the call's outcome stays as it was. None: no limit.

    Raises:
        TypeError, ValueError: For an invalid ``world_size``, ``backend``, ``timeout``,
            ``init`` (which must be a bool), ``leaks``, ``gpus`` (a lease of no GPU),
            ``memory_growth`` or ``max_rank_memory`` (not a size, or below what the ranks
            hold as they start: the World is closed again).
        RuntimeError: If the backend cannot run here (not built into torch, NCCL with
            fewer CUDA devices than ranks or leased GPUs, or ranks sharing a GPU on an
            NCCL older than 2.30).
        DistributedError: If a rank does not come up within 60 s or fails to initialize.
    """

    def __init__(
        self,
        world_size: int,
        *,
        backend: str = "auto",
        timeout: float | None = validate.DEFAULT_TIMEOUT_S,
        init: bool = True,
        leaks: str = "warn",
        gpus: Lease | None = None,
        memory_growth: int | str = validate.DEFAULT_MEMORY_GROWTH,
        max_rank_memory: int | str | None = None,
    ):
        if compat.bootstrapping():
            # A rank re-importing a main module that starts a world at import time: end this
            # process quietly; the controller says what to do (MAIN_GUARD_HINT).
            os._exit(EXIT_MAIN_REIMPORTED)
        try:
            self.world_size: int = validate.positive_int(world_size, "world_size")
            self.backend: str = resolve_backend(backend)
            self.timeout: float | None = calls.checked_timeout(timeout)
            self.init: bool = validate.flag(init, "init")
            self.leaks: str = validate.one_of(leaks, "leaks", validate.LEAK_CHOICES)
            self.memory_growth: int = validate.size(memory_growth, "memory_growth")
            limit = None
            if max_rank_memory is not None:
                limit = validate.size(max_rank_memory, "max_rank_memory")
            if gpus is not None and not gpus.ids:
                raise ValueError(
                    f"gpus must hold at least one GPU for {_ranks(self.world_size)}, not none"
                )
            devices = len(gpus.ids) if gpus is not None else None
            reason = unavailable_reason(self.backend, self.world_size, devices)
            if reason:
                raise RuntimeError(f"cannot start a world of {_ranks(world_size)}: {reason}")
        except BaseException:
            if gpus is not None:
                gpus.release()  # the World owns them from here on, also when it fails
            raise
        self._generations = spawn.Generations(tempfile.mkdtemp(prefix="harness-"), gpus)
        self._finalizer = weakref.finalize(self, self._generations.release)
        _open_worlds.add(self)
        self._rendezvous = 0  # how many fresh rendezvous files the World has named
        self._broken = False
        self._memory = Memories(limit)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks, by rank (after a failed run, of those torn down)."""
        return [proc.pid for proc in self._generations.ranks]

    @property
    def closed(self) -> bool:
        """Whether ``close`` has run."""
        return not self._finalizer.alive

    @property
    def generation(self) -> int:
        """How many times the World has started ranks (1 for its first; each rebuild adds one)."""
        return self._generations.count

    @property
    def memory(self) -> dict[int, RankMemory]:
        """Each rank's memory, by rank (:class:`~harness.RankMemory`: as its process started,
        after the last call, its peak), as the ranks said it; empty where the platform does
        not say (elsewhere than on Linux)."""
        return dict(self._memory.ranks)

    @property
    def replaced_for_memory(self) -> int:
        """How many times the ranks were replaced for holding more than ``max_rank_memory``."""
        return self._memory.replaced

    @property
    def broken(self) -> bool:
        """Whether the last call failed: its ranks are gone, the next call starts new ones."""
        return self._broken

    def run(
        self,
        fn: Callable[..., Any],
        *,
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        check_collectives: bool = True,
        faults: Sequence[Fault] = (),
        restarts: int = 0,
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` once on every rank; the results are returned by rank.

        Args:
            fn: A picklable (module-level) callable.
            args, kwargs: Arguments for ``fn``, pickled and sent to every rank.
            timeout: Bound in seconds for this run; None uses the World's timeout.
            check_collectives: Whether the ranks' collectives are compared after a call
                that returned on every rank, or whose ranks were stopped, with none failed
                (the desync check; see :class:`~harness.errors.CollectiveMismatch`).
            faults: Faults to inject (:mod:`harness.faults`), each at its rank's collective
                ``#at``. A rank a fault kills, exits, hangs, or whose fault's error escapes
                ``fn`` is no failure: its slot holds a :class:`~harness.faults.FaultFired`,
                and the verdict is the other ranks'. The world is rebuilt after such a run.
            restarts: How many times the run starts again, on fresh ranks of this World,
                when a rank fails or a fault ends it (see
                :mod:`harness.controller.restarts`); a fault acts in its own ``attempt``.

        Returns:
            ``[result of rank 0, result of rank 1, ...]`` of the last attempt.

        Raises:
            RankError: Code raised on one or more ranks (root cause first).
            WorldTimeout: The run did not finish in time (its message says how to change
                the bound); carries every rank's stack.
            WorldHang: The ranks' collectives can never complete (a ``WorldTimeout``
                raised before the deadline); carries every rank's stack.
            RankCrash: A rank process died during the run.
            CollectiveMismatch: Every rank returned, or was stopped, and their
                collectives differ; with ``check_collectives=False`` the values are
                returned instead (or the run hangs, a ``WorldTimeout``).
            FaultNotFired: A fault never acted (its rank made fewer collectives).
            DistributedError: ``fn``, an argument or a return value could not be pickled,
                or the world could not be rebuilt after an earlier failure.
            unittest.SkipTest, pytest.skip.Exception: Every rank skipped.
            KeyboardInterrupt: Ctrl-C while the ranks ran, re-raised once the ranks were
                stopped, with every rank's stack attached as a note (printed after it).
            TypeError, ValueError: ``args`` is not a tuple or list, ``kwargs`` not a
                mapping, ``check_collectives`` not a bool, or ``faults`` not a list of
                faults that fit this world.
        """
        # The World's own timeout in the record, so that checking it changes nothing.
        bound = self.timeout if timeout is None else timeout
        options = CallOptions(bound, check_collectives=check_collectives)
        planned = plan(options, faults, restarts, self.world_size)
        if set(planned.sizes) != {self.world_size}:
            raise ValueError(
                f"a World restarts at its own size ({self.world_size}), not "
                f"{list(planned.sizes[1:])}: give a schedule of sizes to harness.run or the marker"
            )
        outcome, _ = run_attempts(
            lambda _, attempt: self.call(fn, args, kwargs, attempt), planned.options, planned.sizes
        )
        return calls.result(outcome)

    def call(
        self,
        fn: Callable[..., Any],
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: CallOptions | None = None,
    ) -> Outcome:
        """Run a call and return its outcome instead of raising (for tools such as the plugin).

        Args:
            fn, args, kwargs: As :meth:`run`.
            options: How the call runs (:class:`~harness.CallOptions`: its timeout, where
                the ranks' output goes, a seed, its name in messages, the desync check,
                faults); None, or its ``timeout`` None: the World's timeout.

        Returns:
            The outcome; ``outcome.result()`` is what :meth:`run` returns or raises.

        Raises:
            RuntimeError: The World is closed.
            ValueError: ``options.timeout`` or ``options.output`` is invalid, or a fault
                does not fit this world.
            TypeError: ``options.check_collectives`` is not a bool, or ``options.faults``
                is not a list of faults.
            DistributedError: The call does not pickle, or the world could not be rebuilt.
            KeyboardInterrupt: As :meth:`run`.
        """
        if self.closed:
            raise RuntimeError("this World is closed; create a new one")
        options = calls.checked_options(options, self.timeout, self.world_size)
        payload = pickle_call(fn, args, kwargs, self.world_size)
        restarts = (options.attempt, options.restarts)
        if self._broken or restarts != self._generations.restarts:
            # An attempt of a run with restarts gets ranks of its own, as under torchrun.
            self._generations.stop()  # done already, unless a Ctrl-C cut it short
            self._start(restarts)
        name = options.name or f"the call of {getattr(fn, '__qualname__', None) or repr(fn)}"
        rendezvous = None if self.init else self._fresh_rendezvous_file()
        growth = self.memory_growth if self.leaks != "off" else 0
        message = call_message(
            payload, options, self._environ, rendezvous, self.leaks != "off", growth
        )
        classified, replies = self._exchange(message, options.timeout, name)
        if classified.regroup:
            classified.notice = self._regroup()
        if classified.notice:
            # A warning: under pytest it is listed with the test that caused it.
            warnings.warn(classified.notice, RuntimeWarning, stacklevel=calls.callers_level())
        if classified.leaks and self.leaks == "warn":
            report = leak_report(classified.leaks, name)
            warnings.warn(report, RuntimeWarning, stacklevel=calls.callers_level())
        outcome = classified.outcome()
        if options.output == OUTPUT_CAPTURE:
            for proc in self._generations.ranks:
                outcome.outputs[proc.rank] = calls.captured(proc, replies.get(proc.rank))
        self._keep_to_limit(name)
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

    def _start(self, restarts: tuple[int, int] = (0, 0)) -> None:
        # What the ranks inherit; calls send only changes.
        self._environ = dict(compat.environ_bytes())
        self._generations.start(self.world_size, self.backend, init=self.init, restarts=restarts)
        world = f"a world of {_ranks(self.world_size)} ({self.backend})"
        outcome, replies = self._exchange(None, START_TIMEOUT_S, world)
        if outcome.error is not None:
            raise outcome.error
        self._memory.started(replies)
        problem = self._memory.below_start()
        if problem:
            self._broken = True
            self._generations.stop()
            raise LimitBelowStart(problem)
        self._broken = False

    def _keep_to_limit(self, name: str) -> None:
        """Replace the ranks by fresh ones where one holds more than ``max_rank_memory``
        after ``name``; a start that fails then is the next call's to retry and report."""
        over = "" if self._broken else self._memory.over_limit()
        if not over:
            return
        self._memory.replaced += 1
        _log.warning(
            "harness: after %s, %s, above max_rank_memory (%s): the world of %s (%s) was "
            "replaced by fresh processes",
            name, over, megabytes(self._memory.limit or 0), _ranks(self.world_size), self.backend,
        )  # fmt: skip
        self._generations.stop()
        try:
            self._start(self._generations.restarts)
        except Exception:
            self._broken = True

    def _regroup(self) -> str:
        """Have every rank make a fresh default group (the call destroyed the harness's),
        bounded like a start; why that failed ('' when it did not)."""
        group = f"a fresh default process group ({self.backend})"
        outcome, _ = self._exchange(Regroup(self._fresh_rendezvous_file()), START_TIMEOUT_S, group)
        if outcome.error is None:
            return ""
        return (
            "the call destroyed the default process group, and a fresh one could not be made "
            f"on the same processes; the world is rebuilt before the next call: {outcome.error}"
        )

    def _exchange(
        self, message: Call | Regroup | None, timeout: float | None, what: str
    ) -> tuple[Classified, dict[int, Reply]]:
        """:func:`~harness.controller.exchange.exchange` with the live ranks, stopping them when
        it fails or is interrupted."""
        try:
            outcome, replies = exchange(
                self._generations.ranks, message, timeout, what, init=self.init, leaks=self.leaks
            )
        except BaseException as exc:
            self._broken = True
            self._generations.stop(interrupted=isinstance(exc, KeyboardInterrupt))
            raise
        if outcome.error is not None or not outcome.reusable:
            self._broken = True
            self._generations.stop()
        if isinstance(message, Call):
            self._memory.answered(replies)
        return outcome, replies

    def _fresh_rendezvous_file(self) -> str:
        """A rendezvous file no rendezvous used before, in the live generation's directory."""
        assert self._generations.workdir is not None
        self._rendezvous += 1
        return rendezvous_path(self._generations.workdir, self._rendezvous)


def _ranks(count: int) -> str:
    return f"{count} rank" + ("" if count == 1 else "s")
