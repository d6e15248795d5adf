"""GPU runners, tried on any machine: a declared GPU set (``--dist-gpus``) is leased as given
where CUDA shows no device, so the leases' exclusivity, the skips and the failures for lack
of GPUs are all tested here with Gloo worlds whose ranks only see ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.controller import gpus

# Without CUDA the ids given are leased as they are: the leases' logic, tried on any machine.
# Where CUDA shows devices, ids must be real ones; benchmarks/gpu_acceptance.py tests there.
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="simulates GPUs on a machine where CUDA shows none"
)

# Each body records what its ranks saw, and when, for the checks after the run.
RECORDING = """
import json, os, time
import pytest

OUT = os.environ["GPU_RECORDS"]


@pytest.mark.distributed(world_size=[1, 2, 4], backend="gloo", gpus_per_rank=1)
@pytest.mark.parametrize("i", range(8))
def test_gpu(rank, world_size, i):
    start = time.monotonic()
    time.sleep(0.02)
    seen = {
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "per_rank": os.environ.get("HARNESS_GPUS_PER_RANK"),
        "world_size": world_size,
        "test": f"{world_size}-{i}",
        "start": start,
        "end": time.monotonic(),
    }
    with open(os.path.join(OUT, f"{world_size}-{i}-{rank}.json"), "w") as out:
        json.dump(seen, out)


@pytest.mark.distributed(world_size=2, backend="gloo")
def test_cpu_only(rank):
    assert "HARNESS_GPUS_PER_RANK" not in os.environ
"""


def _records(out: Path) -> list[dict[str, object]]:
    return [json.loads(path.read_text()) for path in sorted(out.glob("*.json"))]


def _overlapping(records: list[dict[str, object]]) -> list[tuple[object, object]]:
    """Pairs of records of two tests that ran at the same time and saw a common GPU."""
    found = []
    for index, one in enumerate(records):
        for other in records[index + 1 :]:
            if one["test"] == other["test"]:
                continue
            at_once = one["start"] < other["end"] and other["start"] < one["end"]  # type: ignore[operator]
            shared = set(str(one["visible"]).split(",")) & set(str(other["visible"]).split(","))
            if at_once and shared:
                found.append((one, other))
    return found


def _pytest_in_background(
    pytester: pytest.Pytester, lease_dir: str, test_file: str
) -> subprocess.Popen[str]:
    """A pytest process on ``test_file`` leasing GPUs 0 and 1, its output kept."""
    command = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider"]
    command += ["--dist-gpus=0,1", "-o", f"dist_gpu_lease_dir={lease_dir}", test_file]
    # Its temporary files under the test's: a World of a process killed by SIGKILL cannot
    # remove its directory.
    env = {**os.environ, "TMPDIR": str(pytester.path)}
    return subprocess.Popen(
        command,
        cwd=pytester.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture
def lease_dir(tmp_path: Path) -> str:
    return str(tmp_path / "leases")


def test_xdist_workers_never_share_a_gpu(
    pytester: pytest.Pytester, tmp_path: Path, lease_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "records"
    out.mkdir()
    monkeypatch.setenv("GPU_RECORDS", str(out))
    pytester.makepyfile(test_leases=RECORDING)
    # Two workers are enough to compete for the four GPUs: a world of 4 needs every one of
    # them, so each worker waits for the other's leases in turn; more workers would add a
    # torch import each, not another way to share a GPU.
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "-n",
        "2",
        "--dist-gpus=0,1,2,3",
        "-o",
        f"dist_gpu_lease_dir={lease_dir}",
    )
    result.assert_outcomes(passed=25)
    result.stdout.fnmatch_lines(["harness: 24 distributed tests ran on GPUs, 0 skipped*"])
    records = _records(out)
    assert len(records) == 8 * (1 + 2 + 4)
    by_test: dict[object, set[str]] = {}
    for record in records:
        by_test.setdefault(record["test"], set()).add(str(record["visible"]))
    assert all(len(seen) == 1 for seen in by_test.values()), by_test
    for record in records:
        visible = str(record["visible"]).split(",")
        assert len(visible) == record["world_size"], record
        assert len(set(visible)) == len(visible), record
        assert set(visible) <= {"0", "1", "2", "3"}, record
        assert record["per_rank"] == "1"
    assert _overlapping(records) == []


def test_an_outer_cuda_visible_devices_bounds_the_run(
    pytester: pytest.Pytester, tmp_path: Path, lease_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "records"
    out.mkdir()
    monkeypatch.setenv("GPU_RECORDS", str(out))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    pytester.makepyfile(test_leases=RECORDING)
    args = ("-p", "no:randomly", "-rs", "--dist-gpus=5,7", "-o", f"dist_gpu_lease_dir={lease_dir}")
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=17, skipped=8)
    result.stdout.fnmatch_lines(
        [
            "harness: 16 distributed tests ran on GPUs, 8 skipped for lack of them*",
            "SKIPPED [[]8[]] test_leases.py:*: needs 4 GPUs (4 x 1), this run has 2",
        ]
    )
    assert {str(r["visible"]) for r in _records(out)} <= {"5", "7", "5,7"}

    required = pytester.runpytest(*args, "--dist-require-gpus", "-k", "ws4 and 0")
    required.assert_outcomes(failed=1)
    required.stdout.fnmatch_lines(
        ["*needs 4 GPUs (4 x 1), this run has 2 (--dist-require-gpus: a test is not skipped*"]
    )


def test_a_gpu_outside_cuda_visible_devices_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    pytester.makepyfile(test_none="def test_nothing(): pass")
    result = pytester.runpytest("--dist-gpus=5,6")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--dist-gpus names GPU '6', outside CUDA_VISIBLE_DEVICES='5,7': valid ids are 5, 7"]
    )


def test_a_wait_that_outlasts_the_timeout_names_who_holds_the_gpus(
    pytester: pytest.Pytester, lease_dir: str
) -> None:
    held = gpus.acquire(
        gpus.Inventory(("0",), lease_dir), 1, holder="the test that holds it", timeout=0
    )
    try:
        pytester.makepyfile(
            test_wait="""
            import pytest

            @pytest.mark.distributed(world_size=1, backend="gloo", gpus_per_rank=1, timeout=1)
            def test_waits(rank):
                pass
            """
        )
        result = pytester.runpytest("--dist-gpus=0", "-o", f"dist_gpu_lease_dir={lease_dir}")
    finally:
        held.release()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [f"*waited 1.* s for 1 GPU; held by: GPU 0: pid {os.getpid()}, the test that holds it"]
    )


def test_a_killed_pytest_process_leaves_no_lease_behind(
    pytester: pytest.Pytester, tmp_path: Path, lease_dir: str
) -> None:
    started = tmp_path / "started"
    pytester.makepyfile(
        test_hold=f"""
        import pathlib, time
        import pytest

        @pytest.mark.distributed(world_size=2, backend="gloo", gpus_per_rank=1)
        def test_holds(rank):
            if rank == 0:
                pathlib.Path({str(started)!r}).write_text("")
            time.sleep(600)
        """
    )
    holder = _pytest_in_background(pytester, lease_dir, "test_hold.py")
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert holder.poll() is None, holder.communicate()[0]
            assert time.monotonic() < deadline, "the holding test never started"
            time.sleep(0.05)
        stock = gpus.Inventory(("0", "1"), lease_dir)
        assert len(gpus.holders(stock)) == 2
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    pytester.makepyfile(
        test_next="""
        import pytest

        @pytest.mark.distributed(world_size=2, backend="gloo", gpus_per_rank=1, timeout=60)
        def test_next(rank):
            pass
        """
    )
    result = pytester.runpytest(
        "test_next.py", "--dist-gpus=0,1", "-o", f"dist_gpu_lease_dir={lease_dir}"
    )
    result.assert_outcomes(passed=1)


def test_tests_without_gpus_take_no_lease(pytester: pytest.Pytester, lease_dir: str) -> None:
    pytester.makepyfile(
        test_cpu="""
        import os
        import pytest

        @pytest.mark.distributed(world_size=2, backend="gloo")
        def test_cpu(rank):
            assert "HARNESS_GPUS_PER_RANK" not in os.environ
        """
    )
    result = pytester.runpytest("--dist-gpus=0,1", "-o", f"dist_gpu_lease_dir={lease_dir}")
    result.assert_outcomes(passed=1)
    assert "ran on GPUs" not in result.stdout.str()
    assert not os.path.exists(lease_dir)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "gpus_per_rank must be >= 0, got -1"),
        ("'1'", "gpus_per_rank must be an int >= 0, not '1'"),
        ("1.0", "gpus_per_rank must be an int >= 0, not 1.0"),
    ],
)
def test_a_bad_gpus_per_rank_is_named(pytester: pytest.Pytester, value: str, message: str) -> None:
    pytester.makepyfile(
        test_bad=f"""
        import pytest

        @pytest.mark.distributed(world_size=1, backend="gloo", gpus_per_rank={value})
        def test_bad(rank):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*invalid @pytest.mark.distributed: {message}"])


def test_a_session_gives_its_own_idle_worlds_gpus_to_its_next_test(
    pytester: pytest.Pytester, lease_dir: str
) -> None:
    pytester.makepyfile(
        test_own="""
        import pytest

        @pytest.mark.distributed(world_size=2, backend="gloo", gpus_per_rank=1, timeout=60)
        def test_two(rank):
            pass

        @pytest.mark.distributed(world_size=1, backend="gloo", gpus_per_rank=1, timeout=60)
        def test_one(rank):
            pass
        """
    )
    result = pytester.runpytest(
        "-p", "no:randomly", "--dist-gpus=0,1", "-o", f"dist_gpu_lease_dir={lease_dir}"
    )
    result.assert_outcomes(passed=2)


def test_an_idle_world_of_another_process_gives_its_gpus_to_a_waiter(
    pytester: pytest.Pytester, tmp_path: Path, lease_dir: str
) -> None:
    idle, done = tmp_path / "idle", tmp_path / "done"
    # The holder: a world takes both GPUs; then, while it is idle, plain tests run. One of
    # them waits until the other process queues for GPUs, and the next one's setup gives
    # the idle world's GPUs away: it waits until the other process has used them.
    pytester.makepyfile(
        test_holder=f"""
        import os, pathlib, time
        import pytest

        def _wait_for(found, what):
            deadline = time.monotonic() + 120
            while not found():
                assert time.monotonic() < deadline, what
                time.sleep(0.05)

        @pytest.mark.distributed(world_size=2, backend="gloo", gpus_per_rank=1)
        def test_takes_both(rank):
            pass

        def test_idle_until_someone_waits():
            pathlib.Path({str(idle)!r}).write_text("")
            tickets = lambda: any(n.endswith(".ticket") for n in os.listdir({lease_dir!r}))
            _wait_for(tickets, "nobody queued for the GPUs")

        def test_while_the_other_uses_them():
            _wait_for(pathlib.Path({str(done)!r}).exists, "the waiter never got the GPUs")
        """
    )
    holder = _pytest_in_background(pytester, lease_dir, "test_holder.py")
    try:
        deadline = time.monotonic() + 120
        while not idle.exists():
            assert holder.poll() is None, holder.communicate()[0]
            assert time.monotonic() < deadline, "the holder's world never went idle"
            time.sleep(0.05)
        pytester.makepyfile(
            test_waiter=f"""
            import pathlib
            import pytest

            @pytest.mark.distributed(world_size=2, backend="gloo", gpus_per_rank=1, timeout=120)
            def test_waits_for_both(rank):
                if rank == 0:
                    pathlib.Path({str(done)!r}).write_text("")
            """
        )
        result = pytester.runpytest(
            "test_waiter.py", "--dist-gpus=0,1", "-o", f"dist_gpu_lease_dir={lease_dir}"
        )
        result.assert_outcomes(passed=1)
        output = holder.communicate(timeout=120)[0]
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert holder.returncode == 0, output


def test_a_lease_directory_that_cannot_be_made_fails_the_test_naming_it(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    pytester.makepyfile(
        test_dir="""
        import pytest

        @pytest.mark.distributed(world_size=1, backend="gloo", gpus_per_rank=1)
        def test_needs_a_gpu(rank):
            pass
        """
    )
    result = pytester.runpytest("--dist-gpus=0", "-o", f"dist_gpu_lease_dir={blocker}/leases")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [f"*cannot create the GPU lease directory '{blocker}/leases': Not a directory"]
    )
