"""``python -m harness check``: the command line end to end, and its rank and merge halves."""

from __future__ import annotations

import os
import re
import runpy
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import harness
from harness import cli
from harness.cli import exit_code, merge_rows, summary
from harness.rank import collectives
from harness.rank.collectives import Row, check_collectives

# Start-up (torch import, world start) dominates; the check itself takes well under a second.
CLI_TIMEOUT_S = 60

WORLD_SIZES = (1, 2, 3)

# Row names that must appear whatever the torch version (the single-tensor all_gather and
# reduce_scatter are named after the function torch has: *_into_tensor / *_tensor / *_single).
BASE_NAMES = [
    "all_reduce",
    "all_reduce (async)",
    "broadcast",
    "broadcast (async)",
    "all_gather",
    "all_gather (async)",
    "reduce_scatter",
    "reduce_scatter (async)",
    "all_to_all",
    "all_to_all (async)",
    "all_to_all_single",
    "all_to_all_single (async)",
    "gather",
    "scatter",
    "send/recv",
    "isend/irecv (async)",
    "batch_isend_irecv",
    "barrier",
    "barrier (async)",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
]

TABLE_ROW = re.compile(
    r"^(?P<name>\S.*?)\s+\| (?P<status>ok|unsupported: .+|n/a: .+|FAIL: .+?)\s+\|\s+"
    r"(?P<latency>\d+\.\d{3} ms|-)$"
)


def _table(stdout: str) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in stdout.splitlines():
        match = TABLE_ROW.match(line)
        if match:
            rows[match["name"].strip()] = (match["status"], match["latency"])
    return rows


def test_row_names_cover_every_kind() -> None:
    names = collectives.row_names()
    assert set(BASE_NAMES) <= set(names)
    assert any(n.startswith("all_gather_") and n not in BASE_NAMES for n in names)
    assert any(n.startswith("reduce_scatter_") and n not in BASE_NAMES for n in names)
    assert len(names) == len(set(names))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_cli_check_passes(world_size: int) -> None:
    if torch.cuda.is_available() and torch.cuda.device_count() < world_size:
        pytest.skip(f"auto means NCCL here and needs {world_size} CUDA devices")
    # Run one after another: concurrent worlds on a small machine are slower than serial ones.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "check",
            "--world-size",
            str(world_size),
            "--repeats",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    header = lines[0]
    assert f"torch {torch.__version__}" in header
    assert f"world size {world_size}" in header
    assert "backend " in header
    assert "device " in header
    assert "start method " in header
    assert re.match(r"^collective\s+\| result\s+\|\s+latency$", lines[1])
    rows = _table(result.stdout)
    assert list(rows) == collectives.row_names()
    for name in BASE_NAMES:
        status, latency = rows[name]
        assert status == "ok" or status.startswith(("unsupported", "n/a")), (name, status)
        assert (latency != "-") == (status == "ok"), (name, status, latency)
    p2p = ["send/recv", "isend/irecv (async)", "batch_isend_irecv"]
    if world_size == 1:
        assert all(rows[name][0].startswith("n/a") for name in p2p)
    else:
        assert all(rows[name][0] == "ok" for name in p2p)
    assert re.fullmatch(r"all \d+ collectives ok( \(.*\))?", lines[-1]), lines[-1]


def test_cli_rejects_world_size_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["check", "--world-size", "0"])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "--world-size" in err
    assert "world size must be >= 1, got 0" in err


def test_cli_needs_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([])
    assert exit_info.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_cli_nccl_without_cuda_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: NCCL may well start here")
    assert cli.main(["check", "--backend", "nccl"]) == 2
    captured = capsys.readouterr()
    assert "CUDA" in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    assert captured.out == ""


def test_cli_timeout_reports_rank_stacks_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--timeout", "0.001"]) == 1
    err = capsys.readouterr().err
    assert "did not finish within" in err
    assert "rank 0" in err


def test_cli_ctrl_c_exits_130_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    # A real SIGINT to this process while main() runs a long check (many repetitions):
    # main must turn the KeyboardInterrupt into 130 after the World stopped its ranks.
    timer = threading.Timer(1.0, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        code = cli.main(["check", "--repeats", "100000", "--timeout", "60"])
    finally:
        timer.cancel()
    captured = capsys.readouterr()
    assert code == 130, captured.out + captured.err
    assert captured.err.strip() == "interrupted"


def test_rank_function_rows_on_two_ranks() -> None:
    results = harness.run(check_collectives, world_size=2, kwargs={"repeats": 1}, timeout=60)
    assert len(results) == 2
    for rows in results:
        assert [row.name for row in rows] == collectives.row_names()
        for row in rows:
            assert isinstance(row, Row)
            assert row.status == "ok" or row.status.startswith("unsupported"), row
            if row.status == "ok":
                assert row.latency_ms is not None
                assert row.latency_ms >= 0
    merged = merge_rows(results)
    assert exit_code(merged) == 0


def test_wrong_result_on_one_rank_is_a_failure() -> None:
    # Real collectives; rank 1 alters its all_reduce result before verification.
    results = harness.run(
        check_collectives,
        world_size=2,
        kwargs={"repeats": 1, "corrupt": ("all_reduce", 1)},
        timeout=60,
    )
    status = {row.name: row.status for row in results[1]}
    assert status["all_reduce"].startswith("FAIL: result: expected [3, 6, 9, 12, ...], got [4,")
    assert status["all_reduce (async)"] == "ok"
    assert all(row.status == "ok" for row in results[0])
    merged = {row.name: row for row in merge_rows(results)}
    assert merged["all_reduce"].status.startswith("FAIL: rank 1: result: expected")
    assert exit_code(list(merged.values())) == 1


def _rows(*statuses: str) -> list[Row]:
    return [
        Row(f"c{i}", status, 1.0 if status == "ok" else None) for i, status in enumerate(statuses)
    ]


def test_merge_names_the_failing_rank_and_fails_the_exit_code() -> None:
    per_rank = [
        [Row("all_reduce", "ok", 0.5), Row("barrier", "ok", 0.1)],
        [Row("all_reduce", "ok", 0.7), Row("barrier", "FAIL: RuntimeError: boom", 0.2)],
        [Row("all_reduce", "ok", 0.6), Row("barrier", "FAIL: RuntimeError: bang", 0.3)],
    ]
    merged = merge_rows(per_rank)
    assert merged[0] == Row("all_reduce", "ok", 0.7)
    assert merged[1] == Row(
        "barrier", "FAIL: rank 1: RuntimeError: boom (also failed on rank 2)", 0.3
    )
    assert exit_code(merged) == 1
    assert summary(merged) == "1 problem: barrier"


def test_merge_unsupported_and_na_are_not_failures() -> None:
    unsupported = "unsupported: gloo does not implement it"
    per_rank = [_rows("ok", unsupported, "n/a: needs >= 2 ranks")] * 2
    merged = merge_rows(per_rank)
    assert [row.status for row in merged] == ["ok", unsupported, "n/a: needs >= 2 ranks"]
    assert exit_code(merged) == 0
    assert summary(merged) == "all 1 collectives ok (1 unsupported, 1 n/a)"


def test_merge_disagreeing_or_missing_ranks_fail() -> None:
    merged = merge_rows([_rows("ok", "ok"), _rows("unsupported: gloo does not implement it")])
    assert merged[0].status.startswith("FAIL: ranks disagree: rank 0 ok, rank 1 unsupported")
    assert merged[1].status == "FAIL: not reported by rank 1"
    assert exit_code(merged) == 1
    # A status this module does not produce is never taken for success.
    assert exit_code(merge_rows([[Row("x", "fine", 1.0)]])) == 1


def test_unimplemented_collective_is_unsupported_not_failed() -> None:
    exc = RuntimeError("Backend gloo does not support alltoall")
    assert collectives._classify(exc, "gloo") == "unsupported: gloo does not implement it"
    assert collectives._classify(NotImplementedError(), "ucc").startswith("unsupported")
    other = collectives._classify(RuntimeError("Connection reset by peer"), "gloo")
    assert other == "FAIL: RuntimeError: Connection reset by peer"


def test_table_is_fixed_width() -> None:
    table = cli.format_table(
        [Row("all_reduce", "ok", 0.1234), Row("send/recv", "n/a: needs >= 2 ranks", None)]
    ).splitlines()
    assert table[0].startswith("collective | result")
    assert table[2] == "all_reduce | ok                    | 0.123 ms"
    assert table[3] == "send/recv  | n/a: needs >= 2 ranks |        -"
    assert len({line.index("|") for line in table if "|" in line}) == 1


def test_main_guard_keeps_children_from_rerunning_the_check() -> None:
    # forkserver/spawn children import the main module as __mp_main__: no check may start
    # (without the guard, main() would parse pytest's argv and exit).
    path = Path(cli.__file__).with_name("__main__.py")
    namespace = runpy.run_path(str(path), run_name="__mp_main__")
    assert namespace["main"] is cli.main
