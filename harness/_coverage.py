"""Measure coverage inside ranks when the controller is measured, with no user configuration.

Ranks are started by forkserver or spawn, and coverage.py follows neither by itself (and
pytest-cov 7 no longer patches subprocesses). So when ``coverage.Coverage.current()`` is
active in the controller, each rank starts its own ``Coverage`` with the controller's
settings, writes its data into the world's private directory when it ends (also when it is
torn down after a failure), and the controller merges those files into its own live data
before pytest-cov (or ``coverage run``) saves and combines it. No ``.coverage.*`` file is
ever written next to the user's data file.

Runs on both sides: ``settings`` and ``merge`` in the controller, ``start`` and ``save`` in
a rank.
"""

from __future__ import annotations

import glob
import inspect
import os
import sys
from typing import Any

# Settings copied from the controller's Coverage to each rank's: (config attribute, keyword).
_COPIED = (
    ("branch", "branch"),
    ("source", "source"),
    ("source_pkgs", "source_pkgs"),
    ("source_dirs", "source_dirs"),
    ("run_include", "include"),
    ("run_omit", "omit"),
    ("cover_pylib", "cover_pylib"),
    ("timid", "timid"),
    ("context", "context"),
)


def _current() -> Any | None:
    # Nothing can be measuring us unless coverage was imported (checked first: this runs on
    # every world stop, and a failed import is not cached).
    coverage = sys.modules.get("coverage")
    if coverage is None:
        return None
    return coverage.Coverage.current()


def settings() -> dict[str, Any] | None:
    """The keyword arguments a rank's Coverage needs, or None when nothing measures us."""
    cov = _current()
    if cov is None:
        return None
    config = cov.config
    kwargs: dict[str, Any] = {"config_file": config.config_file or False}
    for attribute, keyword in _COPIED:
        if hasattr(config, attribute):
            kwargs[keyword] = getattr(config, attribute)
    return kwargs


def start(kwargs: dict[str, Any] | None, data_dir: str, rank: int) -> Any | None:
    """In a rank: start measuring with the controller's settings; return the Coverage."""
    if kwargs is None:
        return None
    import coverage

    accepted = inspect.signature(coverage.Coverage).parameters
    cov = coverage.Coverage(
        data_file=os.path.join(data_dir, ".coverage"),
        data_suffix=f"rank{rank}.{os.getpid()}",
        messages=False,
        **{key: value for key, value in kwargs.items() if key in accepted},
    )
    cov._warn_no_data = False  # a rank that ran none of the measured code is not news
    cov.start()
    return cov


def save(cov: Any | None) -> None:
    """In a rank: stop measuring and write the data file. Never raises: the rank is ending."""
    if cov is None:
        return
    try:
        cov.stop()
        cov.save()
    except Exception:
        pass


def merge(data_dir: str) -> None:
    """In the controller: merge the ranks' data files into the live data, then delete them."""
    paths = glob.glob(os.path.join(data_dir, ".coverage.*"))
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
