"""Process titles for the forkserver and each rank: what ``ps`` and ``top`` show for them."""

from __future__ import annotations

import setproctitle


def set_title(title: str) -> None:
    """Name this process ``title``: its command line (``ps``) and short name (``top``)."""
    setproctitle.setproctitle(title)
