"""fhelium.distributed.init() under a real launcher: ``python -m torch.distributed.run``.

Each launch costs seconds (the launcher and every worker import torch), so there are two:
a world of two, and a world of one, where Decision 5 says a HashStore is used even though
torchrun provides MASTER_ADDR/MASTER_PORT.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import _torchrun


def check(nproc: int, returncode: int, output: str, results: list[dict[str, Any]]) -> None:
    assert returncode == 0, output
    assert [r["rank"] for r in results] == list(range(nproc)), output
    total = float(nproc * (nproc + 1) // 2)
    for rank, result in enumerate(results):
        assert result["env"] == {
            "RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_RANK": str(rank),
        }
        assert result["launcher"] == {"MASTER_ADDR": True, "MASTER_PORT": True}
        assert result["returned"] is None
        assert result["initialized"] is True
        assert result["backend"] == "gloo"
        assert (result["rank"], result["world_size"]) == (rank, nproc)
        # Decision 5: a world of one uses a HashStore, also under torchrun; a world of two
        # rendezvouses through the launcher's env:// store.
        if nproc == 1:
            assert result["store"] == "HashStore"
        else:
            assert result["store"] != "HashStore"
        assert result["sum"] == total
        assert result["async_sum"] == total
        assert result["waited"] is True
        assert result["completed"] is True
        assert result["gathered"] == [float(r) for r in range(nproc)]
        assert result["local_device"] == "cpu"
        assert result["shutdown_returned"] is None
        assert result["initialized_after"] is False


def test_init_without_arguments_under_torchrun(tmp_path: Path) -> None:
    """``--nproc-per-node 2`` and ``--nproc-per-node 1``, launched side by side.

    One test rather than two so that the launches overlap, whatever pytest-xdist does.
    """
    procs: dict[int, subprocess.Popen[str]] = {}
    try:
        for nproc in (2, 1):
            cwd = tmp_path / f"nproc{nproc}"
            cwd.mkdir()
            procs[nproc] = _torchrun.start(nproc, cwd)
        finished = {nproc: _torchrun.finish(proc) for nproc, proc in procs.items()}
    finally:
        for proc in procs.values():
            _torchrun.stop(proc)
    for nproc, (returncode, output, results) in finished.items():
        check(nproc, returncode, f"--nproc-per-node {nproc}: {output}", results)
