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
from typing import Any

import check_rankfns
import pytest
import torch
from check_rankfns import check_collectives
from cli_testutil import table, working

import harness
from harness import cli
from harness.cli import exit_code, merge_rows, summary
from harness.controller import waiting
from harness.rank import check_rows
from harness.rank.check_rows import Row

# Start-up (torch import, world start) dominates; the check itself takes well under a second.
CLI_TIMEOUT_S = 60

WORLD_SIZES = (1, 2, 3)
ENTRY_POINT_WORLD_SIZE = 2
"""The world size that ``test_cli_check_passes`` runs as ``python -m harness``."""

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


def test_row_names_cover_every_kind() -> None:
    names = check_rows.row_names()
    assert set(BASE_NAMES) <= set(names)
    assert any(n.startswith("all_gather_") and n not in BASE_NAMES for n in names)
    assert any(n.startswith("reduce_scatter_") and n not in BASE_NAMES for n in names)
    assert len(names) == len(set(names))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_cli_check_passes(world_size: int, capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available() and torch.cuda.device_count() < world_size:
        pytest.skip(f"auto means NCCL here and needs {world_size} CUDA devices")
    args = ["check", "--world-size", str(world_size), "--repeats", "2"]
    if world_size == ENTRY_POINT_WORLD_SIZE:
        # The command itself, `python -m harness`, once; the other sizes in this process.
        done = subprocess.run(
            [sys.executable, "-m", "harness", *args],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            check=False,
        )
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    else:
        code = cli.main(args)
        stdout, stderr = capsys.readouterr()
    assert code == 0, stdout + stderr
    lines = stdout.splitlines()
    header = lines[0]
    assert f"torch {torch.__version__}" in header
    assert f"world size {world_size}" in header
    assert "backend " in header
    assert "device " in header
    assert "start method " in header
    assert re.match(r"^collective\s+\| result\s+\|\s+latency$", lines[1])
    rows = table(stdout)
    assert list(rows) == check_rows.row_names()
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


def test_cli_stdout_holds_the_report_alone() -> None:
    """What a child process or C++ code writes to file descriptor 1 (torch's Gloo prints its
    connection lines there in some releases) reaches stderr: stdout holds the report only."""
    script = (
        "import os, subprocess, sys\n"
        "from harness.__main__ import keep_stdout_for_the_report\n"
        "keep_stdout_for_the_report()\n"
        "os.write(1, b'written to fd 1\\n')\n"
        "subprocess.run([sys.executable, '-c', 'print(\"a child process\")'], check=True)\n"
        "print('the report')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=True,
    )
    assert done.stdout == "the report\n"
    assert done.stderr.splitlines() == ["written to fd 1", "a child process"]


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
    # Which ranks are still running after 1 ms depends on the machine's load: at least one,
    # named in the summary, with its stack in its own section.
    still = re.search(r"ranks? ([0-9, ]+) still running", err)
    assert still, err
    for rank in still.group(1).split(", "):
        assert f"---------- rank {rank} ----------" in err, err


def test_cli_ctrl_c_exits_130_without_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A real SIGINT to this process while main() waits for the ranks of a long row (many
    # repetitions): main must turn the KeyboardInterrupt into 130 after the World stopped
    # its ranks. The signal is sent once the first row's call is under way, never after a
    # fixed delay: on a loaded machine that could land while the world is still starting.
    real_gather = waiting.gather
    waits: list[None] = []

    def gather(*args: Any, **kwargs: Any) -> Any:
        waits.append(None)
        if len(waits) == 3:  # the world's start, rank_info, then the first row
            threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGINT)).start()
        return real_gather(*args, **kwargs)

    monkeypatch.setattr(waiting, "gather", gather)
    # Python's own handler, also where pytest was started with SIGINT ignored (a background
    # job of a non-interactive shell), where Python leaves it ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = cli.main(["check", "--repeats", "100000", "--timeout", "60"])
    finally:
        signal.signal(signal.SIGINT, previous)
    captured = capsys.readouterr()
    assert code == 130, captured.out + captured.err
    assert captured.err.strip() == "interrupted"


def test_rank_function_rows_on_two_ranks() -> None:
    results = harness.run(check_collectives, world_size=2, kwargs={"repeats": 1}, timeout=60)
    assert len(results) == 2
    for rows in results:
        assert [row.name for row in rows] == check_rows.row_names()
        for row in rows:
            assert isinstance(row, Row)
            assert working(row.status), row
            if row.status == "ok":
                assert row.latency_ms is not None
                assert row.latency_ms >= 0
    merged = merge_rows(results)
    assert exit_code(merged) == 0


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
    assert summary(merged) == "1 collective ok (1 unsupported, 1 n/a)"
    assert summary([Row("all_reduce", "ok", 0.5), Row("barrier", "ok", 0.1)]) == (
        "all 2 collectives ok"
    )


def test_a_row_that_hangs_for_certain_is_no_timeout() -> None:
    # A row the ranks' collectives prove can never finish ended before its timeout.
    hang = harness.WorldHang("the run can never finish: rank 0 waits in a collective ...")
    assert cli._reason(hang, 30.0) == (
        "hang: its collectives can never complete (every rank's stack is on stderr)"
    )
    late = harness.WorldTimeout("the run did not finish within 30 s: ...", timeout=30.0)
    assert cli._reason(late, 30.0) == (
        "timeout: not done within 30 s (every rank's stack is on stderr)"
    )


def test_merge_disagreeing_or_missing_ranks_fail() -> None:
    merged = merge_rows([_rows("ok", "ok"), _rows("unsupported: gloo does not implement it")])
    assert merged[0].status.startswith("FAIL: ranks disagree: rank 0 ok, rank 1 unsupported")
    assert merged[1].status == "FAIL: not reported by rank 1"
    assert exit_code(merged) == 1
    # A status this module does not produce is never taken for success.
    assert exit_code(merge_rows([[Row("x", "fine", 1.0)]])) == 1


def test_unimplemented_collective_is_unsupported_not_failed() -> None:
    exc = RuntimeError("Backend gloo does not support alltoall")
    assert check_rows._classify(exc, "gloo") == "unsupported: gloo does not implement it"
    assert check_rows._classify(NotImplementedError(), "ucc").startswith("unsupported")
    other = check_rows._classify(RuntimeError("Connection reset by peer"), "gloo")
    assert other == "FAIL: RuntimeError: Connection reset by peer"


def test_table_is_fixed_width() -> None:
    lines = cli.format_table(
        [Row("all_reduce", "ok", 0.1234), Row("send/recv", "n/a: needs >= 2 ranks", None)]
    ).splitlines()
    assert lines[0].startswith("collective | result")
    assert lines[2] == "all_reduce | ok                    | 0.123 ms"
    assert lines[3] == "send/recv  | n/a: needs >= 2 ranks |        -"
    assert len({line.index("|") for line in lines if "|" in line}) == 1


def test_main_guard_keeps_children_from_rerunning_the_check() -> None:
    # forkserver/spawn children import the main module as __mp_main__: no check may start
    # (without the guard, main() would parse pytest's argv and exit).
    path = Path(cli.__file__).with_name("__main__.py")
    namespace = runpy.run_path(str(path), run_name="__mp_main__")
    assert namespace["main"] is cli.main


# --------------------------------------------------------------- never hangs, numpy optional

OBJECT_ROWS = ["broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list"]

# Safety net only: a healthy run takes seconds. Without the fix, this setup hung until the
# check's own timeout and exited 1.
NO_NUMPY_TIMEOUT_S = 300


def _without_numpy(tmp_path: Path, *path: Path) -> dict[str, str]:
    """An environment in which no process (controller, forkserver, ranks) can import numpy.

    A package named numpy first on PYTHONPATH that raises ModuleNotFoundError, as a missing
    module does: torch catches exactly that at import and then treats numpy as unavailable
    ("Numpy is not available" from ``Tensor.numpy()``); an ImportError would stop torch's
    import instead. Every process of the check inherits PYTHONPATH, ``path`` after it.
    """
    fake = tmp_path / "no_numpy" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"
    )
    env = dict(os.environ)
    entries = [str(fake.parent), *map(str, path), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, entries))
    return env


def test_cli_check_without_numpy_marks_object_collectives_na(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("auto means NCCL here; this checks the Gloo world of a CPU machine")
    result = subprocess.run(
        [sys.executable, "-m", "harness", "check", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=NO_NUMPY_TIMEOUT_S,
        env=_without_numpy(tmp_path),
        check=False,
    )
    output = result.stdout + result.stderr
    # The ranks themselves found that torch cannot use numpy (they ran Tensor.numpy()).
    assert "torch cannot use numpy in the ranks (RuntimeError: Numpy is not available)" in (
        result.stderr
    ), output
    assert "pip install numpy" in result.stderr
    # Not torch's own warning at import, of the command or of its forkserver: the report
    # says it in its own words, with the fix (as the docs show it).
    assert "Failed to initialize NumPy" not in result.stderr, result.stderr
    assert result.stdout.startswith(f"torch {torch.__version__} | backend gloo | "), output
    rows = table(result.stdout)
    assert list(rows) == check_rows.row_names(), output
    for name, (status, latency) in rows.items():
        if name in OBJECT_ROWS:
            assert (status, latency) == ("n/a: needs numpy", "-"), (name, output)
        else:
            assert working(status), (name, output)
    lacking = sum(status.startswith("unsupported") for status, _ in rows.values())
    notes = f"{lacking} unsupported, 4 n/a" if lacking else "4 n/a"
    expected = f"all {len(rows) - 4 - lacking} collectives ok ({notes})"
    assert result.stdout.splitlines()[-1] == expected, output
    assert result.returncode == 0, output


def test_check_collectives_without_numpy_agrees_on_na(tmp_path: Path) -> None:
    # The one-call rank function decides with an all_reduce before any object collective.
    script = (
        "import harness\n"
        "from check_rankfns import check_collectives\n"
        "if __name__ == '__main__':\n"
        "    for rows in harness.run(check_collectives, world_size=2, backend='gloo',\n"
        "                            kwargs={'repeats': 1}, timeout=120):\n"
        "        for row in rows:\n"
        "            print(row.name, '|', row.status)\n"
    )
    (tmp_path / "run_check.py").write_text(script)
    result = subprocess.run(
        [sys.executable, str(tmp_path / "run_check.py")],
        capture_output=True,
        text=True,
        timeout=NO_NUMPY_TIMEOUT_S,
        env=_without_numpy(tmp_path, Path(check_rankfns.__file__).parent),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 * len(check_rows.row_names())
    for line in lines:
        name, status = line.split(" | ")
        if name in OBJECT_ROWS:
            assert status == "n/a: needs numpy", line
        else:
            assert working(status), line


def test_cli_rejects_a_bad_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["check", "--timeout", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--timeout" in err
    assert "timeout must be a positive number of seconds, got '0'" in err


def test_numpy_status_is_one_decision_for_every_rank() -> None:
    info = check_rows.RankInfo
    missing = "RuntimeError: Numpy is not available"
    assert cli._numpy_status([info("cpu", None), info("cpu", None)]) is None
    assert cli._numpy_status([info("cpu", missing), info("cpu", missing)]) == "n/a: needs numpy"
    # Some ranks only: the object rows are n/a on all of them, and the row says where.
    partial = cli._numpy_status([info("cpu", None), info("cpu", missing)])
    assert partial == "n/a: needs numpy (missing on rank 1)"
    assert cli.status_kind(partial) == "n/a"
    rows = [Row("all_reduce", "ok", 1.0), Row("gather_object", partial, None)]
    assert exit_code(rows) == 0
    assert summary(rows) == "1 collective ok (1 n/a)"


def test_needs_numpy_names_the_object_rows() -> None:
    assert [n for n in check_rows.row_names() if check_rows.needs_numpy(n)] == OBJECT_ROWS
    with pytest.raises(ValueError, match=r"unknown collective row 'nope'; valid: all_reduce, "):
        check_rows.needs_numpy("nope")
