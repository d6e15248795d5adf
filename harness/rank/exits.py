"""Where a rank left through ``os._exit``, recorded for the controller.

``os._exit`` ends the process at once, with no exception and no crash dump: without a record,
the controller could only say that the rank exited with some code. :func:`install` replaces
``os._exit`` in the rank with a function that first writes the caller's location and stack
to the rank's ``exit`` file (:meth:`~harness.protocol.rank_files.RankFiles.write_exit`),
which the controller reads when it classifies the death. The harness ends a rank through
:func:`real_exit`, which records nothing. (``sys.exit`` raises ``SystemExit``: the call
reports it as any exception, with its traceback.)
"""

from __future__ import annotations

import os
import traceback
from types import FrameType
from typing import NoReturn

from harness import compat
from harness.protocol.rank_files import RankFiles
from harness.rank import CODE_DIR

_os_exit = os._exit


def real_exit(code: int) -> NoReturn:
    """End the process now, as ``os._exit`` does, recording nothing."""
    _os_exit(code)


def install(files: RankFiles) -> None:
    """Make ``os._exit`` record its caller before exiting.

    In this process, it records its caller in ``files``; a process forked from the rank
    (multiprocessing's fork children call ``os._exit``) records nothing.
    """
    pid = os.getpid()

    def _exit(status: int) -> NoReturn:
        if os.getpid() == pid:
            try:
                where, stack = _caller(compat.frame(1))
                files.write_exit(where, stack)
            except Exception:
                pass  # the controller then says only how the process ended
        _os_exit(status)

    os._exit = _exit


def _caller(frame: FrameType | None) -> tuple[str, str]:
    """The place and stack of a call in ``frame``.

    They read ``("test_x.py:12", traceback-style stack)``: its frames out to the rank's own
    code, outermost first.
    """
    frames = []
    while frame is not None and not frame.f_code.co_filename.startswith(CODE_DIR):
        frames.append((frame, frame.f_lineno))
        frame = frame.f_back
    frames.reverse()
    summary = traceback.StackSummary.extract(frames)
    if not summary:
        return "", ""
    inner = summary[-1]
    where = f"{os.path.basename(inner.filename)}:{inner.lineno}"
    return where, "Traceback (most recent call last):\n" + "".join(summary.format())
