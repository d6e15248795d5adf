"""A rank's context and the serving of one call, in this process: no rank process, no process
group. The call's function runs here; its answer and what the context sent on the rank's pipe
(a real ``multiprocessing`` pipe) are read back."""

from __future__ import annotations

import os
import pickle
import unittest
from collections.abc import Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from harness import faults
from harness.protocol.messages import (
    OUTPUT_CAPTURE,
    Call,
    CallOptions,
    Done,
    Failed,
    Failing,
    Fired,
    RankSetup,
    Skipped,
)
from harness.protocol.rank_files import RankFiles
from harness.rank import current, inject, loop, recording
from harness.rank.context import RankContext, Running, skip_kind
from harness.rank.inject import Target
from harness.rank.recording.recorder import Recorder


@pytest.fixture
def pipe() -> Iterator[tuple[Connection, Connection]]:
    ours, theirs = Pipe()
    yield ours, theirs
    ours.close()
    theirs.close()


@pytest.fixture
def ctx(tmp_path: Path, pipe: tuple[Connection, Connection]) -> Iterator[RankContext]:
    setup = RankSetup(1, 2, "gloo", False, {}, {"RANK": "1"}, str(tmp_path), None)
    context = RankContext(setup, pipe[0], RankFiles(str(tmp_path), 1))
    yield context
    context.output.redirect("inherit")  # a captured call's redirection is kept in place


_DEFAULT = CallOptions()


def _call(fn: Any, *args: Any, options: CallOptions = _DEFAULT, **kw: Any) -> Call:
    return Call(pickle.dumps((fn, args, {})), options, **kw)


def add(a: int, b: int) -> int:
    return a + b


def fails() -> None:
    raise ValueError("boom")


def reports_then_fails() -> None:
    exc = ValueError("reported")
    current.context().report_failing(exc)
    current.context().report_failing(exc)  # a call reports once
    raise exc


def skips() -> None:
    raise unittest.SkipTest("not here")


def returns_unpicklable() -> Any:
    return lambda: None


def prints() -> None:
    os.write(1, b"hello from the call\n")  # fd 1 itself: pytest replaces sys.stdout


def test_a_call_returns_its_value(ctx: RankContext) -> None:
    reply = loop._call(ctx, _call(add, 2, 3))
    assert isinstance(reply, Done)
    assert pickle.loads(reply.value) == 5
    assert reply.reusable
    assert not reply.grouped  # no process group here
    assert reply.leaks == ()
    assert reply.unfired == ()
    assert ctx.running is None


def test_a_raising_call_fails_with_its_exception(ctx: RankContext) -> None:
    reply = loop._call(ctx, _call(fails))
    assert isinstance(reply, Failed)
    assert reply.failure.rank == 1
    assert "ValueError" in reply.failure.traceback
    assert "boom" in reply.failure.traceback
    assert not reply.fault
    assert ctx.running is None


def test_a_payload_that_does_not_unpickle_fails_the_call(ctx: RankContext) -> None:
    reply = loop._call(ctx, Call(b"not a pickle"))
    assert isinstance(reply, Failed)
    assert reply.failure.message.startswith("could not unpickle the call sent to rank 1: ")


def test_a_return_value_that_does_not_pickle_fails_the_call(ctx: RankContext) -> None:
    reply = loop._call(ctx, _call(returns_unpicklable))
    assert isinstance(reply, Failed)
    assert reply.failure.message.startswith("could not pickle the return value of rank 1 (")


def test_a_skip_is_answered_as_skipped(ctx: RankContext) -> None:
    reply = loop._call(ctx, _call(skips))
    assert isinstance(reply, Skipped)
    assert reply.kind == "unittest"
    assert reply.reason == "not here"


def test_report_failing_sends_failing_once_dated_as_the_failed(
    ctx: RankContext, pipe: tuple[Connection, Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(current, "_context", ctx)
    reply = loop._call(ctx, _call(reports_then_fails))
    assert isinstance(reply, Failed)
    sent = pipe[1].recv()
    assert isinstance(sent, Failing)
    assert "reported" in sent.failure.traceback
    assert sent.at == reply.at
    assert not pipe[1].poll()  # only one Failing


def test_report_failing_outside_a_call_sends_nothing(
    ctx: RankContext, pipe: tuple[Connection, Connection]
) -> None:
    ctx.report_failing(ValueError("no call"))
    ctx.running = Running(Recorder())
    ctx.report_failing(unittest.SkipTest("a skip"))
    assert not pipe[1].poll()


def test_a_process_that_is_no_rank_has_no_rank_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(current, "_context", None)
    assert current.context_or_none() is None
    assert recording.current() is None
    with pytest.raises(RuntimeError, match="inside a rank process only"):
        current.context()


def test_a_process_installs_one_rank_context(
    ctx: RankContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(current, "_context", None)
    current.install(ctx)
    assert current.context() is ctx
    with pytest.raises(RuntimeError, match="is rank 1 already"):
        current.install(ctx)


def _records_into_the_call_in_progress() -> bool:
    running = current.context().running
    return running is not None and recording.current() is running.recorder


def test_the_recorder_of_the_call_in_progress_is_the_context_one(
    ctx: RankContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(current, "_context", ctx)
    assert recording.current() is None
    reply = loop._call(ctx, _call(_records_into_the_call_in_progress))
    assert isinstance(reply, Done)
    assert pickle.loads(reply.value) is True
    assert recording.current() is None  # between calls
    assert ctx.last_recorder is not None
    assert recording.snapshot(0) == ctx.last_recorder.trace()


def test_a_call_sees_the_call_env_under_the_rank_own_variables(
    ctx: RankContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("HARNESS_TEST_ENV", raising=False)
    env = {"RANK": "7", "HARNESS_TEST_ENV": "set"}
    reply = loop._call(ctx, _call(_environ, "RANK", "HARNESS_TEST_ENV", env=env))
    assert isinstance(reply, Done)
    assert pickle.loads(reply.value) == ["1", "set"]


def _environ(*names: str) -> list[str | None]:
    return [os.environ.get(name) for name in names]


def test_a_seeded_call_draws_as_a_fresh_seeded_process(ctx: RankContext) -> None:
    options = CallOptions(seed=1234)
    first = loop._call(ctx, _call(_draw, options=options))
    second = loop._call(ctx, _call(_draw, options=options))
    assert isinstance(first, Done)
    assert isinstance(second, Done)
    assert pickle.loads(first.value) == pickle.loads(second.value)


def _draw() -> tuple[float, float]:
    import random

    import torch

    return random.random(), float(torch.rand(()))


def test_captured_output_goes_to_the_rank_files(ctx: RankContext) -> None:
    reply = loop._call(ctx, _call(prints, options=CallOptions(output=OUTPUT_CAPTURE)))
    assert isinstance(reply, Done)
    assert reply.output_written
    out, _ = ctx.files.output()
    assert "hello from the call" in out


def test_a_fault_that_never_fires_is_listed(ctx: RankContext) -> None:
    options = CallOptions(faults=(faults.delay(1, 1, 0.0), faults.delay(0, 1, 0.0)))
    reply = loop._call(ctx, _call(add, 1, 1, options=options))
    assert isinstance(reply, Done)
    assert len(reply.unfired) == 1  # rank 0's fault is not this rank's
    assert "never fired: rank 1 made 0 collectives" in reply.unfired[0]


def test_plan_is_none_without_faults_of_this_rank(ctx: RankContext) -> None:
    def plan(*placed: faults.Fault) -> inject.Plan | None:
        return Recorder(inject.Plan(placed, ctx.rank, ctx.fire, ctx.exit)).plan

    assert plan() is None
    assert plan(faults.delay(0, 1, 0.0)) is None
    assert plan(faults.delay(1, 1, 0.0)) is not None


def test_fire_tells_the_controller_with_the_trace_so_far(
    ctx: RankContext, pipe: tuple[Connection, Connection]
) -> None:
    ctx.fire(0, "was delayed", False, Target(3, "all_reduce", "x.py:4", "backward (DDP)"))
    sent = pipe[1].recv()
    assert isinstance(sent, Fired)
    assert (sent.index, sent.what, sent.ends, sent.trace) == (0, "was delayed", False, None)
    assert (sent.number, sent.op, sent.site, sent.origin) == (
        3,
        "all_reduce",
        "x.py:4",
        "backward (DDP)",
    )
    ctx.running = Running(Recorder())
    ctx.fire(1, "hung", True, Target(1, "barrier", "", ""))
    assert pipe[1].recv().trace is not None


def test_skip_kind() -> None:
    assert skip_kind(unittest.SkipTest("x")) == "unittest"
    assert skip_kind(pytest.skip.Exception("x")) == "pytest"
    assert skip_kind(ValueError()) is None
