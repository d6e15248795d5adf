"""Coverage inside ranks: the controller's half.

Coverage is measured inside ranks when the controller is measured.

coverage.py follows neither forkserver nor spawn children (nor does pytest-cov 7). So when
``coverage.Coverage.current()`` is active here, each rank runs its own ``Coverage`` with
our :func:`settings` (:mod:`harness.rank.coverage`) and writes its data into the world's
private directory when it ends (also when torn down after a failure); :func:`merge` folds
those files into our live data before pytest-cov (or ``coverage run``) saves it. No
``.coverage.*`` file is ever written next to the user's data file.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from harness import compat
from harness.protocol.rank_files import coverage_data_files

_COPIED = (
    "run:branch",
    "run:source",
    "run:source_pkgs",
    "run:source_dirs",
    "run:include",
    "run:omit",
    "run:cover_pylib",
    "run:timid",
    "run:context",
)
"""The controller's ``[run]`` options a rank's Coverage is given, over its config file (they
may come from the command line or pytest-cov's options rather than a file)."""


def _current() -> Any | None:
    # Nothing can be measuring us unless coverage was imported (checked first: this runs on
    # every world stop, and a failed import is not cached).
    coverage = sys.modules.get("coverage")
    if coverage is None:
        return None
    return coverage.Coverage.current()


def settings() -> dict[str, Any] | None:
    """What a rank's Coverage needs, or None.

    None when nothing measures us.

    Returns:
        ``{"config_file": path or False, "options": {"run:branch": True, ...}}``; options
        this version of coverage does not know are left out.
    """
    cov = _current()
    if cov is None:
        return None
    options: dict[str, Any] = {}
    for name in _COPIED:
        try:
            options[name] = cov.get_option(name)
        except Exception:
            continue  # an option older versions of coverage do not have
    return {"config_file": compat.coverage_config_file(cov), "options": options}


def merge(workdir: str) -> None:
    """Merge the ranks' data files into the live data.

    Then delete them.
    """
    paths = coverage_data_files(workdir)
    if not paths:
        return
    cov = _current()
    if cov is not None:
        from coverage import CoverageData

        live = cov.get_data()
        for path in paths:
            data = CoverageData(basename=path)
            try:
                data.read()
                live.update(data)
            except Exception:
                # A rank killed while saving leaves a partial file; what it lost is lost.
                pass
    for path in paths:
        try:
            os.remove(path)
        except OSError:
            pass
