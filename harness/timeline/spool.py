"""Trace folders of passing tests, written when the session ends (``--dist-trace-all``).

Building a test's timeline and writing its three files costs far more CPU than running a
short test's collectives (tens of milliseconds for a thousand of them), and a passing test
has no report that waits for its folder. Written during the session, even by a process of
the lowest priority, that work took the CPU the ranks of the tests still running needed,
and their durations grew. So :class:`Writer` only spools each test's traces (pickled,
appended to a file in the trace directory) and, at :meth:`Writer.close`, has child
processes (``python -m harness.timeline.spool``, one per core, at most
``MAX_WORKERS``) build and write every folder. A folder a child cannot write is said on its
standard error.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from harness.protocol.traces import RankTrace

__all__ = ["MAX_WORKERS", "Writer"]

MAX_WORKERS = 8
"""The most child processes that write the spooled folders at once."""

_LENGTH = struct.Struct("!I")


class Writer:
    """Spools the folders to write, and writes them at :meth:`close`."""

    def __init__(self) -> None:
        self._spool: IO[bytes] | None = None
        self._count = 0

    def submit(
        self,
        directory: Path,
        traces: Mapping[int, RankTrace | None],
        world_size: int,
        **options: Any,
    ) -> Path:
        """Spool the folder of a call: its timeline, to be built from ``traces`` (see
        :func:`harness.timeline.build.build`, whose keyword arguments ``options``
        holds; ``test`` among them) and written into ``directory``.

        Returns:
            The folder it will be written to.

        Raises:
            OSError: The spool file cannot be made or written in ``directory``.
        """
        from harness.timeline.folder import folder_name

        job = pickle.dumps((str(directory), dict(traces), world_size, options), protocol=5)
        if self._spool is None:
            self._spool = tempfile.NamedTemporaryFile(  # noqa: SIM115 (open until close)
                dir=directory, prefix=".harness-spool-", delete=False
            )
        self._spool.write(_LENGTH.pack(len(job)) + job)
        self._count += 1
        return directory / folder_name(str(options["test"]))

    def close(self) -> None:
        """Write every folder spooled, in child processes, and wait for them."""
        spool, count = self._spool, self._count
        self._spool, self._count = None, 0
        if spool is None:
            return
        spool.close()
        # This very harness, wherever it was imported from.
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
        workers = max(1, min(os.cpu_count() or 1, count, MAX_WORKERS))
        children = []
        try:
            for index in range(workers):
                command = [sys.executable, "-m", __name__, spool.name, str(index), str(workers)]
                children.append(subprocess.Popen(command, env=dict(os.environ, PYTHONPATH=path)))
        finally:
            for child in children:
                child.wait()
            os.unlink(spool.name)


def _serve(spool: str, index: int, workers: int) -> None:
    """A child: build and write every ``workers``-th folder of the spool, from ``index``."""
    from harness.timeline import folder
    from harness.timeline.build import build

    with open(spool, "rb") as handle:
        number = 0
        while header := handle.read(_LENGTH.size):
            size = _LENGTH.unpack(header)[0]
            number += 1
            if (number - 1) % workers != index:
                handle.seek(size, os.SEEK_CUR)
                continue
            directory, traces, world_size, options = pickle.loads(handle.read(size))
            try:
                timeline = build(traces, world_size, **options)
                written, problems = folder.write(Path(directory), timeline)
            except Exception as exc:  # one folder's failure must not lose the others
                written, problems = Path(directory), {"all": f"{type(exc).__name__}: {exc}"}
            for name, problem in problems.items():
                print(f"harness: {written}: {name} not written: {problem}", file=sys.stderr)


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
