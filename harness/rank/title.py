"""Process titles for the forkserver and each rank.

They are what ``ps`` and ``top`` show for them (``harness forkserver``,
``harness rank 1/4 (gloo)``) instead of the interpreter's command line.
"""

from __future__ import annotations

import setproctitle


def set_title(title: str) -> None:
    """Name this process ``title``.

    That sets its whole command line (``ps``) and, where the platform has one, its short name
    (``top``), with the ``setproctitle`` package (a dependency).
    """
    setproctitle.setproctitle(title)
