"""Lines executed inside ranks count when the controller runs under coverage (``coverage run``
or pytest-cov), also for ranks torn down after a failure, with no configuration and no stray
``.coverage.*`` files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from harness_testutil import subprocess_env

pytest.importorskip("coverage")

TARGET = """\
import time

import torch.distributed as dist


def work():
    if dist.get_rank() == 0:
        value = "rank zero"  # RANK0
    else:
        value = "other rank"  # RANK1
    return value


def fail():
    if dist.get_rank() == 1:
        raise ValueError("boom")  # RAISES
    torn_down = "rank 0 sleeps until it is torn down"  # TORN_DOWN
    time.sleep(3600)
    return torn_down


def never():
    return "never called"  # NEVER
"""


def _lines(marker: str) -> int:
    """Line number of the line of TARGET that carries ``# marker``."""
    [number] = [i for i, line in enumerate(TARGET.splitlines(), 1) if line.endswith(f"# {marker}")]
    return number


def _write_target(directory: Path) -> None:
    (directory / "covtarget.py").write_text(TARGET)


def _check_report(directory: Path, report: Path) -> None:
    data = json.loads(report.read_text())
    files = {Path(name).name: info for name, info in data["files"].items()}
    assert "covtarget.py" in files, sorted(files)
    executed = set(files["covtarget.py"]["executed_lines"])
    missing = set(files["covtarget.py"]["missing_lines"])
    for marker in ("RANK0", "RANK1", "RAISES", "TORN_DOWN"):
        assert _lines(marker) in executed, f"line {marker} ran in a rank but is not covered"
    assert _lines("NEVER") in missing, "a line that never ran must stay uncovered"
    stray = sorted(path.name for path in directory.iterdir() if path.name.startswith(".coverage."))
    assert stray == [], f"stray coverage data files: {stray}"


def _run(args: list[str], cwd: Path, extra_env: dict[str, str] | None = None) -> str:
    env = subprocess_env()
    env.update(extra_env or {})
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, f"{args}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


def test_coverage_run_measures_ranks(tmp_path: Path) -> None:
    _write_target(tmp_path)
    (tmp_path / "script.py").write_text(
        textwrap.dedent(
            """
            import harness
            import covtarget

            if __name__ == "__main__":
                with harness.World(2, backend="gloo", timeout=120) as world:
                    assert world.run(covtarget.work) == ["rank zero", "other rank"]
                    try:
                        world.run(covtarget.fail)
                    except harness.RankError as error:
                        assert list(error.failures) == [1], error
                        print("RankError as expected")
                    else:
                        raise AssertionError("no RankError")
            """
        )
    )
    coverage = [sys.executable, "-m", "coverage"]
    out = _run([*coverage, "run", "--source=covtarget", "script.py"], tmp_path)
    assert "RankError as expected" in out
    _run([*coverage, "json", "-o", "cov.json"], tmp_path)
    _check_report(tmp_path, tmp_path / "cov.json")
    assert (tmp_path / ".coverage").is_file()


def test_pytest_cov_measures_ranks(tmp_path: Path) -> None:
    pytest.importorskip("pytest_cov")
    _write_target(tmp_path)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_target.py").write_text(
        textwrap.dedent(
            """
            import harness
            import pytest

            import covtarget


            def test_ranks_are_measured():
                with harness.World(2, backend="gloo", timeout=120) as world:
                    assert world.run(covtarget.work) == ["rank zero", "other rank"]
                    with pytest.raises(harness.RankError):
                        world.run(covtarget.fail)
            """
        )
    )
    out = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--cov=covtarget",
            "--cov-report=json:cov.json",
            "-q",
            "test_target.py",
        ],
        tmp_path,
    )
    assert "1 passed" in out
    _check_report(tmp_path, tmp_path / "cov.json")
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".coverage.")]
