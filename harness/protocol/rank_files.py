"""The file layout of a world generation's private directory.

One layout, written by the ranks and read by the controller, both through this module.

::

    <workdir>/store                 the FileStore the ranks rendezvous through
    <workdir>/rendezvous.<N>        a fresh rendezvous file: a default group made again, or
                                    one call's INIT_METHOD in a world without a harness group
    <workdir>/rank<N>.out, .err     rank N's stdout / stderr during a captured call
    <workdir>/rank<N>.stacks        rank N's stacks, dumped on request (a timeout)
    <workdir>/rank<N>.crash         rank N's stacks, dumped by Python on a fatal signal
    <workdir>/rank<N>.trace         rank N's collective trace, written on request (a pickled
                                    RankTrace; see harness.protocol.traces)
    <workdir>/rank<N>.exit          where rank N called os._exit: file:line, then its stack
    <workdir>/.coverage.rank<N>.*   rank N's coverage data, merged by the controller
    <workdir>/progress              under a schedule, where each rank is in the call, read
                                    by the others (written and read by the ranks alone)

Files are used rather than pipes because they survive the process: the controller reads a
rank's output and its last stacks after the rank was killed or crashed.
"""

from __future__ import annotations

import glob
import os
import pickle
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from harness.protocol.traces import RankTrace


def store_path(workdir: str) -> str:
    """The rendezvous ``FileStore`` of a world generation."""
    return os.path.join(workdir, "store")


def rendezvous_path(workdir: str, number: int) -> str:
    """The ``number``-th fresh rendezvous file of a world generation.

    The controller numbers them, so no two rendezvous of a generation share a file.
    """
    return os.path.join(workdir, f"rendezvous.{number}")


def progress_path(workdir: str) -> str:
    """The file where a generation's ranks tell each other how far they are in a call under
    a schedule (:mod:`harness.rank.holds`)."""
    return os.path.join(workdir, "progress")


def coverage_data_file(workdir: str) -> str:
    """The base name of a rank's coverage data file.

    A rank's ``coverage.Coverage`` writes to it (with a suffix).
    """
    return os.path.join(workdir, ".coverage")


def coverage_data_files(workdir: str) -> list[str]:
    """The coverage data files a world generation's ranks wrote."""
    return glob.glob(coverage_data_file(workdir) + ".*")


@dataclass(frozen=True)
class RankFiles:
    """The files of one rank in a world generation's directory.

    They are the files of rank ``rank`` in the private directory ``workdir``.
    """

    workdir: str
    rank: int

    def path(self, kind: str) -> str:
        """Path of the rank's ``out``, ``err``, ``stacks`` or ``crash`` file."""
        return os.path.join(self.workdir, f"rank{self.rank}.{kind}")

    # -- written inside the rank ---------------------------------------------------------

    def open_dumps(self) -> tuple[TextIO, TextIO]:
        """Create and open ``(crash, stacks)`` for :mod:`faulthandler`.

        It writes to them from a signal handler: they must stay open while the rank lives.

        Raises:
            OSError: The directory is gone (the controller gave up on this world).
        """
        crash = open(self.path("crash"), "w")  # noqa: SIM115
        try:
            stacks = open(self.path("stacks"), "w")  # noqa: SIM115
        except BaseException:
            crash.close()
            raise
        return crash, stacks

    def write_trace(self, trace: RankTrace) -> None:
        """Replace the ``trace`` file with ``trace``, at once.

        The controller never reads half of it.

        Raises:
            OSError: The directory is gone.
        """
        path = self.path("trace")
        with open(path + ".tmp", "wb") as handle:
            pickle.dump(trace, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(path + ".tmp", path)

    def write_exit(self, where: str, stack: str) -> None:
        """Record where the rank is leaving through ``os._exit``.

        It records the place (``"test_x.py:12"``) and the stack there, whole (the process
        ends right after).

        Raises:
            OSError: The directory is gone.
        """
        path = self.path("exit")
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(f"{where}\n{stack}")
        os.replace(path + ".tmp", path)

    def capture(self) -> OutputCapture:
        """Redirect fd 1 and 2 to the ``out`` and ``err`` files.

        See :class:`OutputCapture`; make one per process and reuse it.
        """
        return OutputCapture(self.path("out"), self.path("err"))

    # -- read by the controller ----------------------------------------------------------

    def output(self) -> tuple[str, str]:
        """``(stdout, stderr)`` captured during the last call ('' where none)."""
        return _read(self.path("out")), _read(self.path("err"))

    def stack_dump(self) -> str:
        """The last stack dump taken on request ('' when none)."""
        return _read(self.path("stacks"))

    def forget_trace(self) -> None:
        """Remove the ``trace`` file (before asking for a fresh one)."""
        try:
            os.unlink(self.path("trace"))
        except OSError:
            pass

    def trace(self) -> RankTrace | None:
        """The trace the rank last wrote on request.

        None when there is none.
        """
        try:
            with open(self.path("trace"), "rb") as handle:
                trace = pickle.load(handle)
        except (OSError, EOFError, pickle.UnpicklingError):
            return None
        return trace if isinstance(trace, RankTrace) else None

    def exit_call(self) -> tuple[str, str] | None:
        """Where the rank called ``os._exit`` and its stack there.

        None when it did not.
        """
        where, _, stack = _read(self.path("exit")).partition("\n")
        return (where, stack) if where else None

    def crash_dump(self) -> str:
        """What Python wrote on a fatal signal ('' when nothing)."""
        return _read(self.path("crash"))

    def crash_dump_age(self) -> float | None:
        """Seconds since the crash dump was written.

        None when there is none.

        faulthandler writes it just before the process dies, so this dates a death by
        signal better than the moment the controller notices it.
        """
        try:
            info = os.stat(self.path("crash"))
        except OSError:
            return None
        if info.st_size == 0:
            return None
        return max(0.0, (time.time_ns() - info.st_mtime_ns) / 1e9)


class OutputCapture:
    """Point file descriptors 1 and 2 at two files.

    This is for captured calls.

    File descriptors rather than ``sys.stdout``: output of C++ code, subprocesses and
    ``os.write`` is captured too, and what was written before a crash is on disk. A rank
    uses one for every captured call: the files stay open and redirected from one captured
    call to the next (``release`` ends it before a call that is not captured), and ``start``
    empties only a file that was written to, as doing so at every call is a measurable part
    of a test's cost. What is written *between* two captured calls (by a thread or process a
    test left running) is no test's output: ``start`` and ``release`` pass it on to the
    rank's own stdout and stderr. ``written`` says whether the call has written so far.
    """

    def __init__(self, out: str, err: str) -> None:
        self._paths = (out, err)
        self._files: list[int] = []
        self._saved: list[int] = []  # the rank's own fd 1 and 2, while redirected
        # Where each file ended when the last call did; None until measured for this call.
        self._ends: list[int] | None = [0, 0]

    def start(self) -> None:
        flush_std_streams()
        if not self._files:
            # Readable too: what is written between calls is read back to be passed on.
            flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            self._files = [os.open(path, flags, 0o600) for path in self._paths]
        self._pass_on_and_empty()
        if not self._saved:
            for fd, target in zip((1, 2), self._files, strict=True):
                self._saved.append(os.dup(fd))
                os.dup2(target, fd)  # fd 1 and 2 themselves are inherited by subprocesses

    def stop(self) -> None:
        if self._ends is None:  # not measured yet by ``written`` (a call that failed)
            self.written()

    def written(self) -> bool:
        flush_std_streams()
        self._ends = [os.lseek(target, 0, os.SEEK_END) for target in self._files]
        return any(self._ends)

    def release(self) -> None:
        """Give fd 1 and 2 back to the rank's own streams."""
        if not self._saved:
            return
        flush_std_streams()
        self._pass_on_and_empty()
        for fd, saved in zip((1, 2), self._saved, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        self._saved.clear()

    def _pass_on_and_empty(self) -> None:
        ends = self._ends or [0, 0]
        for index, target in enumerate(self._files):
            end = os.lseek(target, 0, os.SEEK_END)
            if not end:
                continue
            if self._saved and end > ends[index]:
                _pass_on(target, ends[index], end, self._saved[index])
            os.ftruncate(target, 0)
            os.lseek(target, 0, os.SEEK_SET)
        self._ends = None  # the next captured call measures them again


def _pass_on(source: int, start: int, end: int, out: int) -> None:
    """Copy bytes ``start:end`` of file ``source`` to ``out`` (best effort)."""
    try:
        write_all(out, os.pread(source, end - start, start))
    except OSError:
        pass  # the rank's own stream is gone: nowhere left to write it


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to file descriptor ``fd``.

    A single ``os.write`` may write less.
    """
    while data:
        data = data[os.write(fd, data) :]


def flush_std_streams() -> None:
    """Flush Python's stdout and stderr buffers.

    This is done before their file descriptors change hands, or before ``os._exit``.
    Streams that cannot be flushed are ignored.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass  # closed, None, or replaced by something without flush


def _read(path: str) -> str:
    try:
        # Most calls print nothing: a stat is much cheaper than opening and reading.
        if os.stat(path).st_size == 0:
            return ""
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""
