"""Trace folders written in the background, by a child process of the lowest priority.

Under ``--dist-trace-all`` every passing test gets a trace folder. Building its timeline and
writing the three files takes far longer than fetching the ranks' traces (tens of
milliseconds for a thousand collectives), and a passing test has no report to wait for: the
controller hands the traces to :class:`Writer`, which pickles them to a child
(``python -m harness.controller.trace_writer``) that builds and writes each folder at
``nice`` 19, with whatever CPU the ranks leave. A feeder thread does the sending, so a
test never waits for a busy child; :meth:`Writer.close` (at the session's end) waits until
every folder is written. A folder the child cannot write is said on its standard error.
"""

from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from harness.protocol.traces import RankTrace

__all__ = ["Writer"]

_LENGTH = struct.Struct("!I")


class Writer:
    """Writes trace folders in a child process, started with the first folder."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[bytes | None] = queue.Queue()
        self._child: subprocess.Popen[bytes] | None = None
        self._feeder: threading.Thread | None = None

    def submit(
        self,
        directory: Path,
        traces: Mapping[int, RankTrace | None],
        world_size: int,
        **build: Any,
    ) -> Path:
        """Have the folder of a call written: its timeline built from ``traces`` (see
        :func:`harness.controller.timeline_build.build`, whose keyword arguments ``build``
        holds; ``test`` among them) and written into ``directory``.

        Returns:
            The folder it will be written to.
        """
        from harness.controller.trace_dir import folder_name

        job = pickle.dumps((str(directory), dict(traces), world_size, build), protocol=5)
        if self._child is None:
            self._start()
        self._jobs.put(job)
        return directory / folder_name(str(build["test"]))

    def close(self) -> None:
        """Wait until every folder submitted is written, and end the child."""
        if self._child is None:
            return
        self._jobs.put(None)
        assert self._feeder is not None
        self._feeder.join()
        self._child.wait()
        self._child = self._feeder = None

    def _start(self) -> None:
        # This very harness, wherever it was imported from.
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
        self._child = subprocess.Popen(
            [sys.executable, "-m", "harness.controller.trace_writer"],
            stdin=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=path),
        )
        assert self._child.stdin is not None
        self._feeder = threading.Thread(
            target=_feed, args=(self._jobs, self._child.stdin), name="harness-trace-writer"
        )
        self._feeder.daemon = True
        self._feeder.start()


def _feed(jobs: queue.Queue[bytes | None], pipe: BinaryIO) -> None:
    """Send each job to the child as it comes (blocking here, never in a test), until None."""
    try:
        while (job := jobs.get()) is not None:
            pipe.write(_LENGTH.pack(len(job)) + job)
            pipe.flush()
    except OSError:
        pass  # the child is gone; it said why on its standard error
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _serve(pipe: BinaryIO) -> None:
    """The child: build and write each folder the pipe brings, until it closes."""
    from harness.controller import timeline_build, trace_dir

    while header := pipe.read(_LENGTH.size):
        directory, traces, world_size, build = pickle.loads(pipe.read(_LENGTH.unpack(header)[0]))
        try:
            timeline = timeline_build.build(traces, world_size, **build)
            folder, problems = trace_dir.write(Path(directory), timeline)
        except Exception as exc:  # one folder's failure must not lose the others
            folder, problems = Path(directory), {"all": f"{type(exc).__name__}: {exc}"}
        for name, problem in problems.items():
            print(f"harness: {folder}: {name} not written: {problem}", file=sys.stderr)


if __name__ == "__main__":
    if hasattr(os, "nice"):
        os.nice(19)  # the ranks of the tests still running come first
    _serve(sys.stdin.buffer)
