"""torch's warning that it cannot use NumPy is printed once, by the controller's own import
of torch, not a second time by the forkserver that shares its stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness_testutil import subprocess_env

SCRIPT = """
import os

import harness

if __name__ == "__main__":
    print("ranks:", len(harness.run(os.getpid, world_size=1, backend="gloo", timeout=120)))
"""

WARNING = "UserWarning: Failed to initialize NumPy"


def test_torchs_numpy_warning_is_printed_once(tmp_path: Path) -> None:
    # A package named numpy first on the path that fails as a missing module does: torch
    # then warns at import that it cannot use NumPy.
    fake = tmp_path / "no_numpy" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"
    )
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), env["PYTHONPATH"]])
    (tmp_path / "script.py").write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(tmp_path / "script.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a safety bound only
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ranks: 1\n", result.stdout + result.stderr
    assert result.stderr.count(WARNING) == 1, result.stderr
