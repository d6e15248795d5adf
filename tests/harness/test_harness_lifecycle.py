"""No leftovers: rank processes and files end with their World, at interpreter exit, and when
the controlling process is SIGKILLed; several controllers run at once without colliding."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness_rankfns as fns
import pytest
from harness_testutil import (
    BACKEND,
    alive,
    children,
    descendants,
    fast_bound,
    multiprocessing_helpers,
    subprocess_env,
    wait_gone,
)

import harness


def _our_processes() -> set[int]:
    """Our descendants, less the multiprocessing forkserver and resource tracker."""
    return descendants(os.getpid()) - multiprocessing_helpers()


def _assert_no_leftovers(pids: list[int], before: set[int]) -> None:
    assert wait_gone(pids, timeout=5) == [], "rank processes outlived their World"
    left = _our_processes() - before
    assert not left, f"processes left behind: {sorted(left)}"
    # In particular our direct children: at most the forkserver and the resource tracker,
    # besides whatever ran before this test.
    assert children(os.getpid()) - before - multiprocessing_helpers() == set()


def test_world_directory_is_private_and_removed_on_close() -> None:
    world = harness.World(2, backend=BACKEND)
    root = world._generations.root
    try:
        assert os.path.dirname(root) == tempfile.gettempdir()
        assert os.path.basename(root).startswith("harness-")
        mode = os.stat(root).st_mode
        assert stat.S_ISDIR(mode)
        assert stat.S_IMODE(mode) == 0o700
        assert world.run(fns.all_reduce_sum) == [3.0, 3.0]
    finally:
        world.close()
    assert not os.path.exists(root)


def test_no_process_left_after_close() -> None:
    before = _our_processes()
    world = harness.World(3, backend=BACKEND)
    pids = world.pids
    assert set(pids) <= _our_processes(), "ranks are descendants of the controller"
    assert world.run(fns.all_reduce_sum) == [6.0] * 3
    world.close()
    _assert_no_leftovers(pids, before)


@pytest.mark.parametrize(
    ("fn", "args", "timeout", "error"),
    [
        (fns.raise_on, (1, "boom"), None, harness.RankError),
        (fns.sleep_forever, (), 0.5, harness.WorldTimeout),
        (fns.segfault_on, (2,), None, harness.RankCrash),
    ],
    ids=["failure", "timeout", "crash"],
)
def test_no_process_left_after_an_error(
    fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None, error: type[Exception]
) -> None:
    before = _our_processes()
    with harness.World(3, backend=BACKEND) as world:
        pids = world.pids
        root = world._generations.root
        with pytest.raises(error):
            world.run(fn, args=args, timeout=timeout)
        # The torn-down ranks are gone as soon as the error reaches us.
        assert [pid for pid in pids if alive(pid)] == []
    _assert_no_leftovers(pids, before)
    assert not os.path.exists(root)


def test_harness_run_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A private temp root for this test, so that worlds of other processes (pytest-xdist
    # workers) cannot show up in it.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = _our_processes()
    with harness.World(1, backend=BACKEND) as world:
        assert os.path.dirname(world._generations.root) == str(tmp_path)
    with pytest.raises(harness.RankError):
        harness.run(fns.raise_on, world_size=2, backend=BACKEND, args=(0, "x"))
    assert len(harness.run(fns.getpid, world_size=2, backend=BACKEND)) == 2
    _assert_no_leftovers([], before)
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith("harness-")] == []


def _python(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_ranks_die_with_a_sigkilled_controller() -> None:
    child = _python(
        """
        import json, time, harness, harness_rankfns as fns

        if __name__ == "__main__":
            world = harness.World(3, backend="gloo")
            assert world.run(fns.all_reduce_sum) == [6.0] * 3
            print(json.dumps({"pids": world.pids, "root": world._generations.root}), flush=True)
            time.sleep(3600)
        """
    )
    root = None
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, child.stderr.read() if child.stderr else "no output"
        info = json.loads(line)
        root = info["root"]
        tree = descendants(child.pid)
        assert set(info["pids"]) <= tree
        assert all(alive(pid) for pid in info["pids"])
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        assert child.returncode == -signal.SIGKILL
        assert wait_gone(info["pids"], timeout=15) == [], "ranks outlived their controller"
        # Nothing the controller started survives it (forkserver, resource tracker).
        assert wait_gone(tree, timeout=15) == []
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()
        # A SIGKILLed controller cannot remove its files; that is the one exception.
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def test_several_controllers_at_once_and_close_at_interpreter_exit() -> None:
    # Each child is a controller of its own (like pytest-xdist workers): a fresh world, a
    # reused one, and one left open when the interpreter exits, which must then close it.
    code = """
        import json, harness, harness_rankfns as fns

        if __name__ == "__main__":
            env = harness.run(fns.torchrun_env, world_size=2, backend="gloo", timeout=120)
            with harness.World(2, backend="gloo", timeout=120) as world:
                sums = [world.run(fns.all_reduce_sum) for _ in range(10)]
            left_open = harness.World(2, backend="gloo", timeout=120)
            assert left_open.run(fns.all_reduce_sum) == [3.0, 3.0]
            print(json.dumps({
                "env": env,
                "sums": sums,
                "open_pids": left_open.pids,
                "open_root": left_open._generations.root,
            }))
            # No close(): the interpreter exits with this World still open.
        """
    children = [_python(code) for _ in range(2)]
    outputs = []
    try:
        for child in children:
            out, err = child.communicate(timeout=180)
            assert child.returncode == 0, err
            outputs.append(json.loads(out.splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.communicate()
    for output in outputs:
        assert output["sums"] == [[3.0, 3.0]] * 10
        assert [env["RANK"] for env in output["env"]] == ["0", "1"]
    assert len({output["open_root"] for output in outputs}) == len(outputs)
    for output in outputs:
        assert wait_gone(output["open_pids"], timeout=10) == [], "World not closed at exit"
        assert not os.path.exists(output["open_root"]), "World files left after exit"


def test_world_that_cannot_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An interface that does not exist makes Gloo fail in every rank's init. It is set after
    # the forkserver started (by earlier worlds), so this also proves the user's choice of
    # interface reaches the ranks.
    harness.run(fns.getpid, world_size=1, backend=BACKEND)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nonexistent0")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = _our_processes()
    start = time.monotonic()
    with pytest.raises(harness.DistributedError) as excinfo:
        harness.World(2, backend=BACKEND)
    assert time.monotonic() - start < fast_bound() * 2
    error = excinfo.value
    assert type(error) is harness.DistributedError
    assert "did not start: rank 0, rank 1 did not come up" in str(error)
    assert set(error.failures) == {0, 1}
    assert "nonexistent0" in error.failures[0].message
    _assert_no_leftovers([], before)
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith("harness-")] == []


def _run_script(path: Path, code: str) -> subprocess.CompletedProcess[str]:
    # A script file, not `python -c`: ranks re-import a main module only when it has a file.
    path.write_text(textwrap.dedent(code))
    return subprocess.run(
        [sys.executable, str(path)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_script_without_the_main_guard_is_told_to_add_it(tmp_path: Path) -> None:
    result = _run_script(
        tmp_path / "no_guard.py",
        """
        import harness, harness_rankfns as fns

        print(harness.run(fns.rank_and_size, world_size=2, backend="gloo"))
        """,
    )
    assert result.returncode == 1
    lines = result.stderr.rstrip().splitlines()
    assert 'put the code that calls the harness under `if __name__ == "__main__":`' in lines[-1]
    assert "did not start: rank 0, rank 1 did not come up" in result.stderr
    assert "re-imported the main module" in result.stderr
    # The ranks end quietly: one traceback (the script's), not multiprocessing's per rank.
    assert result.stderr.count("Traceback (most recent call last)") == 1, result.stderr


def test_a_guarded_script_may_import_world_and_run_at_the_top(tmp_path: Path) -> None:
    result = _run_script(
        tmp_path / "guarded.py",
        """
        from harness import World, run
        import harness_rankfns as fns

        if __name__ == "__main__":
            print(run(fns.rank_and_size, world_size=2, backend="gloo"))
            with World(2, backend="gloo") as world:
                print(world.run(fns.rank_and_size))
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[(0, 2), (1, 2)]"] * 2


def test_a_script_with_a_nanobind_module_exits_without_leak_reports(tmp_path: Path) -> None:
    # The exit's gc.freeze() would leave nanobind's objects uncollected, and nanobind would
    # report each of its modules' types and instances as leaked (triton's, which torch's
    # testing modules import from torch 2.15 on where triton is installed).
    if importlib.util.find_spec("triton") is None:
        pytest.skip("no nanobind module here: triton is not installed")
    result = _run_script(
        tmp_path / "with_triton.py",
        """
        import triton._C.libtriton
        from harness import run
        import harness_rankfns as fns

        if __name__ == "__main__":
            print(run(fns.rank_and_size, world_size=2, backend="gloo"))
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[(0, 2), (1, 2)]"]
    assert "nanobind" not in result.stderr, result.stderr


def test_output_between_two_captured_calls_reaches_the_ranks_own_streams(tmp_path: Path) -> None:
    # A thread a call left running writes while its rank is idle: that is no test's output,
    # and it must not be lost either (a rank keeps its capture in place between calls).
    child = _python(
        f"""
        import json, os, time, harness, harness_rankfns as fns

        if __name__ == "__main__":
            go, done = {str(tmp_path / "go")!r}, {str(tmp_path / "done")!r}
            world = harness.World(2, backend="gloo", leaks="off")
            capture = harness.CallOptions(output="capture")
            first = world.call(fns.print_between_calls, (go, done), options=capture)
            open(go, "w").close()
            deadline = time.monotonic() + 60
            while not all(os.path.exists(done + str(r)) for r in (0, 1)):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            second = world.call(fns.print_lines, ("second\\n", "2\\n"), options=capture)
            world.close()
            print(json.dumps([first.outputs, second.outputs]), flush=True)
        """
    )
    out, err = child.communicate(timeout=180)
    assert child.returncode == 0, err
    first, second = json.loads(out.splitlines()[-1])
    assert first == {"0": ["", ""], "1": ["", ""]}
    assert second == {"0": ["second\n", "2\n"], "1": ["second\n", "2\n"]}
    for rank in (0, 1):
        assert f"between calls, rank {rank} out" in out
        assert f"between calls, rank {rank} err" in err
