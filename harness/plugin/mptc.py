"""Existing ``MultiProcessTestCase`` suites, unchanged, on reused ranks (``--dist-mptc``).

torch's ``MultiProcessTestCase`` runs each test in freshly spawned processes, each calling
the class's ``cls._run``, and judges their exit codes (``_check_return_codes``). Under
``--dist-mptc`` pytest still runs such a test as the unittest test it is (``setUp``,
``tearDown``, skip decorators, ``instantiate_parametrized_tests`` methods), but starting its
processes does nothing, and waiting for them runs ``_run`` on each rank of a reused
``World(init=False)`` instead (:mod:`harness.rank.mptc_body`), one world per world size. The
exit codes and pipe messages that come back feed the class's own check, so the verdict is
the class's; a failure is reported as the harness reports one. Every touch of torch's
private test API goes through :mod:`harness.compat`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import time
import unittest
import warnings
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pytest

from harness import compat, validate
from harness.errors import DistributedError, RankCrash, WorldTimeout
from harness.plugin import (
    after_run,
    gpu_needs,
    item_settings,
    refs,
    replay,
    report,
    schedules,
)
from harness.plugin.item_settings import WorldShape
from harness.plugin.leases import Holder
from harness.plugin.marker import launched
from harness.protocol.messages import CallOptions
from harness.protocol.pytest_calls import CaseCall, CaseExit

if TYPE_CHECKING:
    from harness.controller.outcome import Outcome
    from harness.controller.world import World
    from harness.plugin.session import DistSession

# The exit code of a process its parent terminated (SIGTERM), as a native run's parent does
# to the others once one has failed: the ranks the harness stopped.
_TERMINATED = -15


def selected(item: pytest.Item) -> bool:
    """Whether the item is a test of a ``MultiProcessTestCase`` class."""
    return isinstance(item, pytest.Function) and compat.mptc_is_case_class(item.cls)


class CasePlugin:
    """The hooks of ``--dist-mptc`` (``session`` makes the plugin's session on first use)."""

    def __init__(self, session: Callable[[], DistSession]) -> None:
        self._session = session

    selected = staticmethod(selected)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        # The case instance exists from pytest's setup phase on; its own setUp runs inside
        # the call phase (unittest's run), so diverting it here comes before its processes
        # start.
        if selected(item) and launched(item.config) is None:
            assert isinstance(item, pytest.Function)
            case = item.instance
            started: list[Any] = []

            def join(fn: Any) -> None:  # in place of _join_processes(fn)
                if started:
                    run_case(self._session(), item, case, fn)
                else:  # its setUp started no processes: the class's own wait and check
                    compat.mptc_join_natively(case, fn)

            # In place of _start_processes(proc): the ranks are up already.
            compat.mptc_divert(case, started.append, join)
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        # A wrapper: pytest's unittest plugin moves the test's exception into call.excinfo
        # inside this hook, after the harness's own report hook has looked.
        made = yield
        error = call.excinfo.value if call.excinfo is not None else None
        if made.failed and selected(item) and isinstance(error, DistributedError):
            longrepr: Any = report.DistributedFailureRepr(error, item)
            made.longrepr = longrepr
        return made


def run_case(session: DistSession, item: pytest.Function, case: Any, fn: Any) -> None:
    """Run one test (``fn``, as ``_join_processes`` receives it) on a world of its size and
    judge it with the class's own check (see :func:`_settle`)."""
    # Here, not at the top: the plugin loads in sessions that never import torch.
    from harness.rank.mptc_body import run_mptc_case as rank_body

    world_size = validate.positive_int(int(case.world_size), "world_size")
    # torch 2.15's GPU decorators record their minimum on the test: that many GPUs are
    # leased (the ranks see exactly them). Where the run has fewer, the decorator itself
    # decides on the ranks, as natively: it skips with torch's own reason, or runs the test
    # on the CPU (skip_if_lt_x_gpu(n, allow_cpu=True) on a machine without GPUs), which
    # the recorded minimum does not tell. Only --dist-require-gpus fails it here.
    need = _gpu_need(session, item, case, world_size)
    call = CaseCall(
        test=refs.reference(item, compat.mptc_test_name(case)),
        file_name=str(case.file_name),
        kwargs=compat.mptc_run_kwargs(case),
        environ=dict(os.environ),  # a native process's: as the test's setUp left it
    )
    # The run's desync check (--dist-no-collective-check) as for a marked test: a class has
    # no marker to turn it off for one test.
    run = session.settings
    keep = item_settings.keep_traces(run, ())
    options = CallOptions(
        compat.mptc_timeout(case),
        run.output,
        name=f"test {item.nodeid}",
        check_collectives=run.check_collectives,
        keep_traces=keep,
    )
    prepare = functools.partial(_empty_store, call.file_name)
    step = replay.Step(item.nodeid, rank_body, (call,), options, prepare=prepare)
    # The ranks make their own groups with whatever backend the test asks for; the world's
    # backend only names it (Gloo: a world of any size starts on any machine).
    shape = WorldShape(world_size, "gloo", False, need)
    # A wait for its GPUs ends with the test's time limit.
    holder = Holder(item.nodeid, time.monotonic() + compat.mptc_timeout(case) if need else None)
    # A test that turns torch's flight recorder on (a process-wide buffer of every group's
    # collectives, sized at its first use, that no call empties) expects it new, as its
    # native processes have it: it runs on fresh ranks.
    isolate = run.isolate or any(v in call.environ for v in compat.FLIGHT_RECORDER_VARIABLES)
    seeds, option = item_settings.schedule_seeds(run), "--dist-mptc"
    if seeds:

        def make(options: CallOptions) -> _CaseTest:
            return _CaseTest(replace(step, options=options), case, fn, world_size)

        exploration = schedules.Exploration(
            session.runner, item, make, _verdict, _outcome, shape, holder, isolate, option,
            _set_up_again(case, call),
        )  # fmt: skip
        explored = exploration.explore(options, seeds, run.schedule_delay)
        held, note = explored.held, explored.lines + explored.held.note
        option = f"{option} {explored.option}".strip()
    else:
        held = session.runner.run(
            item, _CaseTest(step, case, fn, world_size), shape, holder, isolate, option
        )
        note = held.note
    if held.failure is not None:
        raise held.failure
    ended = held.result
    # The world's backend only names it; the test's own groups say theirs, where they do.
    backend = getattr(type(case), "backend", None)
    named = replace(shape, backend=backend if isinstance(backend, str) else "gloo")
    ran = after_run.Ran(item, ended.outcome, named, options, holder, option, note)
    _settle(item, ended, after_run.after_run(session, ran).outcome.error)


def _settle(item: pytest.Function, ended: _Ended, error: DistributedError | None) -> None:
    """Raise the class's verdict on a test; a warning names a failing exit it accepts.

    Raises:
        unittest.SkipTest: The class's check says the test skipped.
        DistributedError: The class's check failed the test and the ranks failed too.
        Exception: The class's own failure where every rank ended normally.
    """
    if error is not None and ended.verdict == replay.FAILED:
        raise error from None  # the harness's account of the ranks' failure
    if ended.raised is not None:
        raise ended.raised
    if error is not None:
        warnings.warn(
            f"test {item.nodeid} passed by its class's own check although {error.summary}; "
            "its ranks were replaced by fresh processes for the next test",
            RuntimeWarning,
            stacklevel=3,
        )


def _gpu_need(
    session: DistSession, item: pytest.Function, case: Any, world_size: int
) -> gpu_needs.GpuNeed:
    """The GPUs a test's world leases, checked against the run's.

    torch 2.15's GPU decorators record their minimum on the test: that many GPUs are
    leased (the ranks see exactly them). Where the run has fewer, the decorator itself
    decides on the ranks, as natively: it skips with torch's own reason, or runs the test
    on the CPU (``skip_if_lt_x_gpu(n, allow_cpu=True)`` on a machine without GPUs), which
    the recorded minimum does not tell. Only ``--dist-require-gpus`` fails it here.

    Raises:
        pytest.fail.Exception: It needs more GPUs than the run has, under
            ``--dist-require-gpus``.
    """
    need = gpu_needs.mptc_need(compat.mptc_min_gpus(case))
    short = need.shortfall(world_size, len(session.leases.stock.ids)) if need else None
    if short is not None and not session.settings.require_gpus:
        need = gpu_needs.GpuNeed()
    session.leases.check(item, world_size, need)
    return need


def _empty_store(path: str) -> None:
    """Empty the test's ``FileStore`` file: an earlier run wrote ranks' addresses there."""
    if os.path.exists(path):
        with open(path, "wb"):
            pass


def _set_up_again(case: Any, call: CaseCall) -> Callable[[], None]:
    """What runs the case's ``tearDown`` and ``setUp`` again before each run of its test
    but the first (under schedules), so that each starts from what its ``setUp`` makes, as
    a native test does: ``distributed_test``'s makes a new ``TEMP_DIR``, whose barrier files
    are named after the processes that wrote them, and a run on new processes would count
    the earlier run's too. The ranks keep the first run's store file (emptied before each
    run); the environment ``setUp`` left is theirs."""
    runs = 0

    def again() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            return
        case.tearDown()
        case.setUp()
        if case.file_name != call.file_name:
            with contextlib.suppress(OSError):
                os.remove(case.file_name)
            case.file_name = call.file_name
        call.environ.clear()
        call.environ.update(os.environ)

    return again


def _verdict(ended: _Ended) -> str:
    """A run's verdict: its class's check's."""
    return ended.verdict


def _outcome(ended: _Ended) -> Outcome:
    """What a run's ranks did."""
    return ended.outcome


@dataclass
class _CaseTest:
    """A ``MultiProcessTestCase`` test as the runner runs it."""

    step: replay.Step
    case: Any
    fn: Any
    world_size: int

    def attempt(self, world: World, fresh: bool) -> tuple[str, _Ended]:
        from harness.rank.mptc_body import FreshAfter  # imported with run_mptc_case

        started = time.time()
        outcome = self.step.call(world)
        ended = _Ended(outcome, time.time() - started, self.world_size, world.pids)
        if any(isinstance(value, FreshAfter) for value in ended.returned.values()):
            world.close()  # the next test gets new processes
        return ended.judge(self.case, self.fn), ended


class _Ended:
    """How one run of a test ended, as the class's check sees its processes and pipes."""

    def __init__(self, outcome: Outcome, elapsed: float, world_size: int, pids: list[int]):
        self.outcome = outcome
        self.elapsed = elapsed
        self.verdict = replay.PASSED
        self.raised: Exception | None = None  # by the class's check
        values = outcome.values
        self.returned: dict[int, Any] = (
            dict(enumerate(values))
            if values is not None
            else {rank: pickle.loads(blob) for rank, blob in outcome.returned.items()}
        )
        ended: dict[int, tuple[int | None, list[str]]] = {
            rank: (value.exitcode, list(value.messages))
            for rank, value in self.returned.items()
            if isinstance(value, CaseExit)
        }
        error = outcome.error
        if error is not None:
            exitcodes = error.exitcodes if isinstance(error, RankCrash) else {}
            for rank, failure in error.failures.items():
                if failure.exc_type in ("WorldTimeout", "WorldHang"):
                    ended[rank] = (None, [])
                elif failure.exc_type == "RankCrash":
                    ended[rank] = (exitcodes.get(rank, _TERMINATED), [])
                else:
                    exitcode = failure.exitcode if failure.exitcode is not None else 1
                    ended[rank] = (exitcode, [failure.traceback])
        # Ranks the harness stopped after a peer failed (a native parent terminates them
        # too); after a timeout, every rank is one that did not finish.
        silent: int | None = None if isinstance(error, WorldTimeout) else _TERMINATED
        self.processes: list[_Exited] = []
        self.pipes: dict[int, _Sent] = {}
        for rank in range(world_size):
            code, messages = ended.get(rank, (silent, []))
            pid = pids[rank] if rank < len(pids) else -1 - rank
            self.processes.append(_Exited(pid, code, f"process {rank}"))
            self.pipes[pid] = _Sent(messages)

    def judge(self, case: Any, fn: Any) -> str:
        """The class's own check on this run: its verdict, kept with what it raised."""
        try:
            compat.mptc_check(case, fn, self.elapsed, self.processes, self.pipes)
        except unittest.SkipTest as exc:
            self.verdict, self.raised = replay.SKIPPED, exc
        except Exception as exc:
            self.verdict, self.raised = replay.FAILED, exc
        return self.verdict


@dataclass
class _Exited:
    """One rank as an ended process (exit code None: running at the deadline)."""

    pid: int
    exitcode: int | None
    name: str

    def terminate(self) -> None:
        pass

    def kill(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass

    def is_alive(self) -> bool:
        return False


@dataclass
class _Sent:
    """What one rank sent through its pipe."""

    messages: list[str] = field(default_factory=list)
    closed: bool = False

    def recv(self) -> str:
        if not self.messages:
            raise EOFError
        return self.messages.pop(0)

    def poll(self, timeout: float | None = None) -> bool:
        return bool(self.messages)

    def send(self, obj: Any) -> None:
        """Ignored: the harness has every rank's stacks already."""

    def close(self) -> None:
        self.closed = True
