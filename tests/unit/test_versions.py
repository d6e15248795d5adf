"""The torch floor: the version strings it reads, what it refuses, and how it says so, to
``import harness`` and to a pytest run whose environment has an older torch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import versions
from harness.versions import TORCH_FLOOR, UnsupportedTorch, check_torch, torch_release

ROOT = Path(__file__).resolve().parents[2]
FLOOR = ".".join(map(str, TORCH_FLOOR))


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("2.13.0+cpu", (2, 13)),
        ("2.15.0", (2, 15)),
        ("2.8.0a0+git1234abc", (2, 8)),
        ("10.0", (10, 0)),
        ("nightly", None),
        ("", None),
    ],
)
def test_torch_release(version: str, release: tuple[int, int] | None) -> None:
    assert torch_release(version) == release


@pytest.mark.parametrize("version", [None, FLOOR + ".0", "2.15.0+cu132", "3.0.0", "unknown"])
def test_supported_or_unknown_torch_passes(version: str | None) -> None:
    check_torch(version)


@pytest.mark.parametrize("version", ["2.4.1+cu121", "2.7.1", "1.13.0"])
def test_older_torch_is_refused_naming_both_versions(version: str) -> None:
    with pytest.raises(UnsupportedTorch) as raised:
        check_torch(version)
    message = str(raised.value)
    assert f"torch {version} is installed" in message
    assert f"needs torch {FLOOR} or newer" in message
    assert "\n" not in message
    # pytest is imported here, as where the plugin is loaded: pytest prints it as one line.
    assert isinstance(raised.value, pytest.UsageError)
    assert isinstance(raised.value, ImportError)


def test_pyproject_requires_the_floor() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    with open(ROOT / "pyproject.toml", "rb") as handle:
        dependencies = tomllib.load(handle)["project"]["dependencies"]
    assert f"torch>={FLOOR}" in dependencies


def test_installed_torch_is_read_from_its_metadata() -> None:
    import torch

    installed = versions.installed_torch()
    assert installed is not None
    # PyPI's CUDA builds say "2.8.0" in their metadata and "2.8.0+cu128" in __version__.
    assert torch.__version__.startswith(installed)


def _older_torch_first(tmp_path: Path) -> dict[str, str]:
    """An environment whose first ``torch`` distribution on the path says 2.4.1: what
    ``importlib.metadata`` reads, as after ``pip install torch==2.4.1``."""
    info = tmp_path / "torch-2.4.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.4.1\n")
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path}


def test_import_harness_with_an_older_torch_fails_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import harness"],
        env=_older_torch_first(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"harness.versions.UnsupportedTorch: fhelium's harness needs torch {FLOOR} or newer; "
        f"torch 2.4.1 is installed (pip install 'torch>={FLOOR}')"
    )


def test_pytest_with_an_older_torch_is_a_usage_error_in_one_line(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_any.py").write_text("def test_any():\n    pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        env=_older_torch_first(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert re.fullmatch(
        rf"ERROR: fhelium's harness needs torch {re.escape(FLOOR)} or newer; torch 2\.4\.1 is "
        rf"installed \(pip install 'torch>={re.escape(FLOOR)}'\)",
        done.stderr.strip(),
    ), done.stderr
