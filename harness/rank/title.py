"""Process titles: what ``ps`` and ``top`` show for the forkserver and each rank
(``harness forkserver``, ``harness rank 1/4 (gloo)``) instead of the interpreter's
command line."""

from __future__ import annotations

import ctypes
import sys

_PR_SET_NAME = 15
_NAME_BYTES = 15  # the kernel keeps this much of a process's short name


def set_title(title: str) -> None:
    """Name this process ``title``: its whole command line (``ps``) and short name (``top``)
    with the ``setproctitle`` package; without it, on Linux, the short name alone, cut to 15
    bytes; elsewhere nothing."""
    try:
        import setproctitle
    except ImportError:
        pass
    else:
        setproctitle.setproctitle(title)
        return
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_NAME, title.encode()[:_NAME_BYTES], 0, 0, 0)
        except (OSError, AttributeError):
            pass
