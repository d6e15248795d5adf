"""``python -m harness check`` with a fault in one row, placed with :mod:`harness.faults`:
that row is a FAIL, the error is on stderr, and the next rows run."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import check_rankfns
import pytest
from cli_testutil import table, working

import harness
from harness import cli, faults
from harness.rank import check_rows


class _RowFaultWorld(harness.World):
    """The check's World, except that the call of a row named in ``row_faults`` (the call's
    ``name`` argument) runs with that row's faults: one row breaks, on one rank, as the
    public fault API breaks it."""

    def __init__(
        self, *args: Any, row_faults: Mapping[str, Sequence[faults.Fault]], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.row_faults = row_faults

    def call(
        self,
        fn: Callable[..., Any],
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: harness.CallOptions | None = None,
    ) -> Any:
        name = (kwargs or {}).get("name")
        if name in self.row_faults:
            options = dataclasses.replace(
                options or harness.CallOptions(), faults=tuple(self.row_faults[name])
            )
        return super().call(fn, args, kwargs, options)


def _fault_run(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    row_faults: Mapping[str, Sequence[faults.Fault]],
    *options: str,
) -> tuple[int, dict[str, tuple[str, str]], str, str]:
    """``harness check`` in this process, on a world that injects ``row_faults``."""
    monkeypatch.setattr(cli, "World", functools.partial(_RowFaultWorld, row_faults=row_faults))
    code = cli.main(["check", "--world-size", "2", "--backend", "gloo", "--repeats", "1", *options])
    captured = capsys.readouterr()
    return code, table(captured.out), captured.out, captured.err


def _others_ok(rows: dict[str, tuple[str, str]], failed: str, output: str) -> None:
    names = check_rows.row_names()
    assert list(rows) == names, output
    for name in names:
        if name != failed:
            assert working(rows[name][0]), (name, output)


def test_cli_row_raising_on_one_rank_fails_that_row_and_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Rank 1 raises in its second broadcast (the timed repetition) instead of running it,
    # as torch does without numpy on the receiving ranks: rank 0 is already waiting in that
    # broadcast. Before each row became its own call, that wait lasted until the check's
    # timeout; now rank 0's broadcast fails (its peer is gone) and the next rows run.
    injected = faults.error(1, 2, RuntimeError("injected failure in broadcast"))
    code, rows, out, err = _fault_run(monkeypatch, capsys, {"broadcast": [injected]})
    status, latency = rows["broadcast"]
    # The faulted rank's own error is no failure: the row names rank 0's.
    assert re.fullmatch(r"FAIL: rank 0: \w+: .+", status), out + err
    assert latency == "-"
    _others_ok(rows, "broadcast", out + err)
    assert out.splitlines()[-1] == "1 problem: broadcast"
    # The whole error is on stderr: the survivor's, then the fault that caused it.
    assert "harness check: broadcast: rank 0 raised " in err
    assert (
        "; rank 1 raised RuntimeError('injected failure in broadcast') at collective #2 "
        "(broadcast at <string>:1) on the default group (injected)"
    ) in err
    assert code == 1


def test_cli_row_hanging_on_one_rank_times_out_and_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The injected hang never ends: the per-row timeout set here ends the row, unless the
    # ranks' traces prove first that it can never finish (rank 0 waits in a collective that
    # rank 1, hung for good, never reaches). Which comes first depends on the machine's
    # load, so either verdict passes; both name the fault. A healthy row takes milliseconds
    # on ranks that are up (their start has a bound of its own).
    code, rows, out, err = _fault_run(
        monkeypatch, capsys, {"all_reduce (async)": [faults.hang(1, 1)]}, "--timeout", "3"
    )
    timed_out = "FAIL: timeout: not done within 3 s (every rank's stack is on stderr)"
    proven = "FAIL: hang: its collectives can never complete (every rank's stack is on stderr)"
    assert rows["all_reduce (async)"] in ((timed_out, "-"), (proven, "-")), out + err
    _others_ok(rows, "all_reduce (async)", out + err)
    assert out.splitlines()[-1] == "1 problem: all_reduce (async)"
    assert "rank 1 hung before collective #1 (all_reduce" in err
    if rows["all_reduce (async)"][0] == timed_out:
        # Rank 0's stack at the deadline is in the row it waits in.
        assert (
            "harness check: all_reduce (async): the run did not finish within 3 s: rank 0 "
            "still running "
        ) in err
        rank_0 = err.split("---------- rank 0 ----------", 1)[1]
        assert "check_rows.py" in rank_0.split("----------", 1)[0]
    else:
        assert "rank 1 never reached collective #1 (all_reduce) that rank 0 waits in" in err
    assert code == 1


def test_cli_row_with_a_wrong_result_on_one_rank_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Real collectives; rank 0's input of the gather's warm-up gets 1 added before it runs,
    # so only rank 1, where the pieces are gathered, receives a wrong result.
    code, rows, out, err = _fault_run(
        monkeypatch, capsys, {"gather": [faults.corrupt(0, 1, check_rankfns.add_one)]}
    )
    status, latency = rows["gather"]
    assert status == "FAIL: rank 1: result[0]: expected [1, 2, 3, 4, ...], got [2, 3, 4, 5, ...]", (
        out + err
    )
    assert latency != "-"  # it ran to the end on every rank
    _others_ok(rows, "gather", out + err)
    assert out.splitlines()[-1] == "1 problem: gather"
    assert code == 1
