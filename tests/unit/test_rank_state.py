"""What a rank keeps or puts back between calls, tested in this process: the environment
(``reset``), the seeding, the captured state restored, where output goes (``output``) and the
log records of a test's phases (``logs``). No rank process, no process group."""

from __future__ import annotations

import logging
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from harness.protocol.messages import OUTPUT_CAPTURE, OUTPUT_INHERIT, OUTPUT_PREFIX
from harness.protocol.pytest_calls import LOG_MARK, LogSettings
from harness.protocol.rank_files import OutputCapture, RankFiles
from harness.rank import logs, output, reset

# ---------------------------------------------------------------- reset


def test_update_environ_sets_and_unsets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_T_KEEP", "old")
    monkeypatch.setenv("HARNESS_T_GONE", "x")
    reset.update_environ({"HARNESS_T_KEEP": "new", "HARNESS_T_GONE": None})
    assert os.environ["HARNESS_T_KEEP"] == "new"
    assert "HARNESS_T_GONE" not in os.environ


def test_update_environ_exact_unsets_every_other(monkeypatch: pytest.MonkeyPatch) -> None:
    saved = dict(os.environ)
    try:
        reset.update_environ({"HARNESS_T_ONLY": "1"}, exact=True)
        assert dict(os.environ) == {"HARNESS_T_ONLY": "1"}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_seed_all_draws_alike_after_the_same_seed() -> None:
    reset.seed_all(7)
    first = (random.random(), torch.rand(3).tolist())
    reset.seed_all(7)
    again = (random.random(), torch.rand(3).tolist())
    reset.seed_all(8)
    other = (random.random(), torch.rand(3).tolist())
    assert first == again
    assert first != other


def test_process_state_puts_back_what_a_call_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HARNESS_T_ADDED", raising=False)
    monkeypatch.setenv("HARNESS_T_CHANGED", "before")
    state = reset.ProcessState.capture()
    root = logging.getLogger()
    handler = logging.NullHandler()
    try:
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)
        sys.path.insert(0, str(tmp_path))
        os.chdir(tmp_path)
        os.environ["HARNESS_T_ADDED"] = "1"
        os.environ["HARNESS_T_CHANGED"] = "after"
        root.setLevel(logging.DEBUG if root.level != logging.DEBUG else logging.INFO)
        root.addHandler(handler)
    finally:
        state.restore()
    assert torch.get_default_dtype() == state.dtype
    assert torch.is_grad_enabled() == state.grad
    assert sys.path == state.sys_path
    assert os.getcwd() == state.cwd
    assert "HARNESS_T_ADDED" not in os.environ
    assert os.environ["HARNESS_T_CHANGED"] == "before"
    assert root.level == state.log_level
    assert handler not in root.handlers


# ---------------------------------------------------------------- output


def test_captured_output_reaches_the_rank_files(tmp_path: Path) -> None:
    files = RankFiles(str(tmp_path), 3)
    router = output.Router(files, 3)
    capture = router.redirect(OUTPUT_CAPTURE)
    assert isinstance(capture, OutputCapture)
    assert router.redirect(OUTPUT_CAPTURE) is capture  # made once, kept
    capture.start()
    try:
        os.write(1, b"to out\n")
        os.write(2, b"to err\n")
        capture.stop()
        assert capture.written()
        assert files.output() == ("to out\n", "to err\n")
    finally:
        assert router.redirect(OUTPUT_INHERIT) is None  # gives fd 1 and 2 back


def test_prefixed_output_marks_each_line_with_the_rank(tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    saved = os.dup(1)
    with open(sink, "wb") as handle:
        os.dup2(handle.fileno(), 1)  # the rank's own stdout, where prefixed lines go
    try:
        router = output.Router(RankFiles(str(tmp_path), 2), 2)
        prefixed = router.redirect(OUTPUT_PREFIX)
        assert isinstance(prefixed, output.PrefixedOutput)
        prefixed.start()
        try:
            os.write(1, b"one\n" + LOG_MARK.encode() + b"call a record\nlast")
        finally:
            prefixed.stop()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert sink.read_bytes() == b"[rank 2] one\n[rank 2] a record\n[rank 2] last\n"


def test_prefixed_output_waits_for_both_pipes_within_one_drain_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A subprocess the call left running holds both pipes open: neither pump ends, and the
    # two waits together last DRAIN_TIMEOUT_S, not that much each (a fake clock and pumps).
    now = [100.0]
    waits: list[float] = []

    class Stuck:
        def join(self, timeout: float) -> None:
            waits.append(timeout)
            now[0] += timeout

    monkeypatch.setattr(output.time, "monotonic", lambda: now[0])
    prefixed = output.PrefixedOutput(0)
    prefixed._saved = [os.dup(1), os.dup(2)]
    prefixed._pumps = [Stuck(), Stuck()]  # type: ignore[list-item]
    prefixed.stop()
    assert waits == [output.DRAIN_TIMEOUT_S, 0.0]


def _with_fds_in_files(tmp_path: Path, body: Callable[[], None]) -> tuple[bytes, bytes]:
    """What ``body`` leaves in file descriptors 1 and 2, each pointed at a file meanwhile."""
    saved = [os.dup(1), os.dup(2)]
    out, err = tmp_path / "out", tmp_path / "err"
    try:
        for fd, path in ((1, out), (2, err)):
            with open(path, "wb") as handle:
                os.dup2(handle.fileno(), fd)
        body()
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
    return out.read_bytes(), err.read_bytes()


def test_setup_output_keeps_torchs_stdout_out_of_sight(tmp_path: Path) -> None:
    def body() -> None:
        os.write(1, b"before\n")
        with output.setup_output():
            os.write(1, b"[Gloo] Rank 0 is connected to 1 peer ranks\n")
        os.write(1, b"after\n")

    assert _with_fds_in_files(tmp_path, body) == (b"before\nafter\n", b"")


def test_setup_output_that_failed_is_shown_on_stderr(tmp_path: Path) -> None:
    def fail_to_set_up() -> None:
        with output.setup_output():
            os.write(1, b"what torch said first\n")
            raise RuntimeError("no rendezvous")

    def body() -> None:
        with pytest.raises(RuntimeError, match="no rendezvous"):
            fail_to_set_up()
        os.write(1, b"after\n")

    assert _with_fds_in_files(tmp_path, body) == (b"after\n", b"what torch said first\n")


# ---------------------------------------------------------------- logs


def test_log_records_are_written_marked_with_their_phase(tmp_path: Path) -> None:
    sink = tmp_path / "err"
    saved = os.dup(2)
    with open(sink, "wb") as handle:
        os.dup2(handle.fileno(), 2)  # captured() writes to the stderr of the test's start
    logger = logging.getLogger("harness_t_logs")
    state = logs.LogState()
    try:
        with state.captured(LogSettings(logging.INFO, "%(levelname)s %(message)s")):
            assert state.level() == logging.INFO
            logger.info("in setup")
            state.enter("call")
            logger.debug("not taken")
            logger.warning("in the call\nsecond line")
            state.enter("teardown")
            logger.error("in teardown")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    assert sink.read_text().splitlines() == [
        f"{LOG_MARK}setup INFO in setup",
        f"{LOG_MARK}call WARNING in the call",
        f"{LOG_MARK}call second line",
        f"{LOG_MARK}teardown ERROR in teardown",
    ]
    assert state.level() is None  # between tests
    assert state.formatter()._fmt == logs.DEFAULT_FORMAT


def test_no_settings_capture_nothing() -> None:
    root = logging.getLogger()
    handlers = list(root.handlers)
    with logs.LogState().captured(None):
        assert root.handlers == handlers
