"""A rank's output during a call, as the controller asks for it:

* ``capture``: file descriptors 1 and 2 go to the rank's capture files
  (:meth:`harness.protocol.rank_files.RankFiles.capture`), read by the controller afterwards;
* ``prefix``: they go through pipes whose lines reach the rank's own stdout and stderr whole,
  each prefixed with ``[rank N] `` (pytest's ``-s``: several ranks share one terminal), a
  log record's line without its mark (:mod:`harness.rank.logs`);
* ``inherit``: untouched.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator

from harness.protocol.messages import OUTPUT_CAPTURE, OUTPUT_PREFIX
from harness.protocol.pytest_calls import LOG_MARK
from harness.protocol.rank_files import OutputCapture, RankFiles, flush_std_streams, write_all

_LOG_MARK = LOG_MARK.encode()

DRAIN_TIMEOUT_S = 2.0
"""How long the end of a call waits for the last prefixed lines, stdout's and stderr's
together. A subprocess the call left running may hold the pipes open; its later output is
then dropped rather than waited for."""


class PrefixedOutput:
    """From ``start`` to ``stop``, route fd 1 and 2 through pipes that prefix each line."""

    def __init__(self, rank: int) -> None:
        self._prefix = f"[rank {rank}] ".encode()
        self._saved: list[int] = []
        self._pumps: list[threading.Thread] = []

    def start(self) -> None:
        flush_std_streams()
        for fd in (1, 2):
            read_end, write_end = os.pipe()
            saved = os.dup(fd)
            os.dup2(write_end, fd)
            os.close(write_end)
            pump = threading.Thread(
                target=self._pump, args=(read_end, saved), name=f"harness-output-{fd}", daemon=True
            )
            pump.start()
            self._saved.append(saved)
            self._pumps.append(pump)

    def stop(self) -> None:
        flush_std_streams()
        for fd, saved in zip((1, 2), self._saved, strict=True):
            os.dup2(saved, fd)  # closes our copy of the pipe's write end: the pump sees EOF
        # One deadline for both pumps: a subprocess left running holds both pipes open.
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for pump in self._pumps:
            pump.join(max(0.0, deadline - time.monotonic()))
        for saved in self._saved:
            os.close(saved)

    def _pump(self, read_end: int, out: int) -> None:
        pending = b""
        try:
            while chunk := os.read(read_end, 65536):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if line.startswith(_LOG_MARK):  # a log record's line: its text alone
                        line = line[len(_LOG_MARK) :].partition(b" ")[2]
                    # One write per line: a line from another rank never lands inside it.
                    write_all(out, self._prefix + line + b"\n")
            if pending:
                write_all(out, self._prefix + pending + b"\n")
        except OSError:
            pass  # our stdout went away; nothing left to do with the output
        finally:
            os.close(read_end)


Redirection = OutputCapture | PrefixedOutput
"""A call's redirection of its rank's output (``start`` before the call, ``stop`` after)."""


class Router:
    """Where a rank's calls send their output; its capture is made at the first captured
    call and kept (in place between captured calls)."""

    def __init__(self, files: RankFiles, rank: int) -> None:
        self._files, self._rank = files, rank
        self._capture: OutputCapture | None = None

    def redirect(self, output: str) -> Redirection | None:
        """The redirection a call asked for, not yet started; None for ``inherit``."""
        if output == OUTPUT_CAPTURE:
            if self._capture is None:
                self._capture = self._files.capture()
            return self._capture
        if self._capture is not None:
            self._capture.release()  # kept in place since the last captured call
        if output == OUTPUT_PREFIX:
            return PrefixedOutput(self._rank)
        return None


@contextlib.contextmanager
def setup_output() -> Iterator[None]:
    """Keep what torch prints on stdout while the harness sets a rank up out of sight.

    Gloo, in several torch releases, prints a ``[Gloo] Rank N is connected to M peer ranks``
    line for every group it makes: on the terminal at each world start, and inside the
    stdout of a script that uses the harness. Printed while the block runs, that is the
    harness's setup, not output of the user's code: file descriptor 1 goes to a temporary
    file, dropped when the block ends normally and written to stderr when it raises (then it
    may say why).
    """
    flush_std_streams()
    saved = os.dup(1)
    try:
        with tempfile.TemporaryFile() as kept:
            os.dup2(kept.fileno(), 1)
            completed = False
            try:
                yield
                completed = True
            finally:
                flush_std_streams()
                os.dup2(saved, 1)
                if not completed:
                    kept.seek(0)
                    with contextlib.suppress(OSError):
                        write_all(2, kept.read())
    finally:
        os.close(saved)
