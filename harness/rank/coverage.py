"""Coverage inside a rank: the rank's half.

This is the rank's half of :mod:`harness.controller.coverage`: a rank measures itself with
the controller's settings and writes its data into the world's directory when it ends; the
controller merges it.
"""

from __future__ import annotations

import os
from typing import Any

from harness.protocol.rank_files import coverage_data_file


def start(settings: dict[str, Any] | None, workdir: str, rank: int) -> Any | None:
    """Start measuring with the controller's settings.

    Returns the Coverage (None when the controller is not measured).
    """
    if settings is None:
        return None
    import coverage

    cov = coverage.Coverage(
        data_file=coverage_data_file(workdir),
        data_suffix=f"rank{rank}.{os.getpid()}",
        config_file=settings["config_file"],
        messages=False,
    )
    for name, value in settings["options"].items():
        cov.set_option(name, value)
    # A rank that ran none of the measured code is not news.
    disabled: list[str] = list(cov.get_option("run:disable_warnings") or [])  # type: ignore[arg-type]
    cov.set_option("run:disable_warnings", [*disabled, "no-data-collected"])
    cov.start()
    return cov


def save(cov: Any | None) -> None:
    """Stop measuring and write the data file. Never raises: the rank is ending."""
    if cov is None:
        return
    try:
        cov.stop()
        cov.save()
    except Exception:
        pass
