"""The fresh-process helper itself: results, failures, timeouts, isolation."""

from __future__ import annotations

import os
import time

import _fresh
import _fresh_children as children
import pytest


def test_returns_the_value_and_passes_arguments() -> None:
    assert _fresh.run(children.add, 1, 2, c=3) == 6


def test_reports_the_child_exception_with_its_traceback() -> None:
    with pytest.raises(_fresh.ChildFailed) as info:
        _fresh.run(children.fail)
    assert info.value.type_name == "KeyError"
    assert "no such thing" in info.value.message
    assert "in fail" in info.value.traceback_text
    assert 'raise KeyError("no such thing")' in str(info.value)


def test_reports_a_child_that_dies_without_a_result() -> None:
    with pytest.raises(_fresh.ChildFailed, match="exited with code 3"):
        _fresh.run(children.crash)


def test_kills_a_child_that_runs_past_the_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(_fresh.ChildFailed, match="timed out after 1 s"):
        _fresh.run(children.sleep, 30, timeout=1)
    assert time.monotonic() - start < 25  # not the 30 s the child would sleep


def test_a_skip_in_the_child_skips_the_test() -> None:
    with pytest.raises(pytest.skip.Exception, match="skipped in the child"):
        _fresh.run(children.skip)


def test_rejects_functions_that_a_child_cannot_import() -> None:
    def local() -> None:  # pragma: no cover - never runs
        pass

    with pytest.raises(TypeError, match="module-level"):
        _fresh.run(local)


def test_every_child_starts_uninitialized() -> None:
    first = _fresh.run(children.init_world_of_one)
    second = _fresh.run(children.init_world_of_one)
    for seen in (first, second):
        assert seen["before"] is False
        assert seen["after"] is True
    assert len({first["pid"], second["pid"], os.getpid()}) == 3


def test_the_parent_main_module_is_not_run_in_the_child() -> None:
    assert _fresh.run(children.main_module_name) == "none"


def test_launcher_variables_are_removed_and_env_is_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A stale variable in the parent (as a launcher leaves) must not reach the child. The
    # fork server may already run with an older environment, so this shows the child's own
    # clean-up.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "stale")
    names = ["WORLD_SIZE", "RANK", "FHELIUM_PROBE", "CUDA_VISIBLE_DEVICES", "TORCHELASTIC_RUN_ID"]
    results = _fresh.run_world(
        children.environment,
        2,
        names,
        env={"WORLD_SIZE": "7", "FHELIUM_PROBE": "x"},
        rank_env=lambda rank: {"RANK": str(rank)},
    )
    for rank, seen in enumerate(results):
        assert seen == {
            "WORLD_SIZE": "7",
            "RANK": str(rank),
            "FHELIUM_PROBE": "x",
            "CUDA_VISIBLE_DEVICES": "",
            "TORCHELASTIC_RUN_ID": None,
        }
