"""When the forkserver that ranks fork from is started: as soon as the session is known to
need it, and never in a session that runs no distributed test.

The server imports torch first; a rank is a cheap fork of it after that. So the earlier it
starts, the more of that import overlaps work the pytest process does anyway. The points,
earliest first:

1. Before the project's conftests load (:func:`before_conftests`), when a test file named
   on the command line uses the marker: a conftest often imports torch, and the server's
   import then runs alongside, not after it.
2. At ``pytest_configure`` (:func:`at_configure`): the same check, now with the conftests'
   markers known; a server started at 1 for a marker that turns out to be the project's
   own is stopped here.
3. During collection, at the first file or test that uses the marker (:func:`at_collect`).
4. Once collection is done, when a selected test needs ranks (:func:`at_collection_finish`).

Points 1-3 are skipped when options may deselect tests (``-k``, ``-m``, ``--deselect``,
``--lf``): only 4 knows what is selected. Nothing starts where this process runs no test
(``--collect-only``, ``--help``, fixture listings, setup plans, an xdist controller) or where
pytest itself is a rank of a launcher such as torchrun. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from harness.plugin import settings
from harness.plugin.marker import choose_marker, launcher_world, marker_option

_STARTED_EARLY = pytest.StashKey[bool]()
"""Set on the config when :func:`before_conftests` started the server."""

_NO_TESTS_RUN = (
    "help",
    "version",
    "collectonly",
    "showfixtures",
    "show_fixtures_per_test",
    "markers",
    "setuponly",
    "setupplan",
)
"""Options (by ``dest``) under which this process runs no test body."""


def before_conftests(early_config: pytest.Config) -> None:
    """Point 1: start the server if a named test file uses the marker (``early_config``:
    the command line and the ini file are parsed, the conftests' markers and options are
    not known yet)."""
    options = early_config.known_args_namespace
    # An xdist worker cannot be told from its controller yet (both have -n): the worker
    # starts its server at configure instead.
    if _runs_no_tests(options, xdist_worker=False) or _may_deselect(options):
        return
    dist_marker = marker_option(early_config)
    if dist_marker and not dist_marker.isidentifier():
        return  # a usage error, reported at configure
    name = choose_marker(dist_marker, early_config.getini("markers"))
    args = getattr(options, "file_or_dir", None) or []
    if name is not None and _named_files_use(early_config.invocation_params.dir, args, name):
        if getattr(options, "cov_source", None) and "coverage" not in sys.modules:
            # pytest-cov (--cov) imports coverage right after this; imported first, it is
            # preloaded by the server too, instead of imported by each rank.
            importlib.import_module("coverage")
        early_config.stash[_STARTED_EARLY] = _start(early_config)


def at_configure(config: pytest.Config, name: str | None) -> None:
    """Point 2: start the server if a named test file uses the marker; stop one started
    before the conftests if the marker is the project's own (``name`` is None)."""
    if name is None:
        if config.stash.get(_STARTED_EARLY, False):
            from harness.controller import forkserver

            forkserver.stop_idle()
    elif _named_files_use(config.invocation_params.dir, config.args, name):
        at_collect(config)


def at_collect(config: pytest.Config) -> None:
    """Point 3: a file or test that uses the marker was found (or, at 2, named)."""
    if not _may_deselect(config.option):
        at_collection_finish(config)


def at_collection_finish(config: pytest.Config) -> None:
    """Point 4, and what the others come to: start the server unless no test runs here."""
    if not _runs_no_tests(config.option, xdist_worker=hasattr(config, "workerinput")):
        _start(config)


def file_uses(path: Path, name: str) -> bool:
    """Whether the file's text mentions ``mark.<name>`` (False when it cannot be read)."""
    try:
        return f"mark.{name}".encode() in path.read_bytes()
    except OSError:
        return False


def _named_files_use(invocation_dir: Path, args: Iterable[str], name: str) -> bool:
    """Whether a test file named on the command line (``path`` or ``path::test``) uses the
    marker: its distributed tests are as good as selected."""
    paths = (Path(invocation_dir, str(arg).split("::", 1)[0]) for arg in args)
    return any(path.suffix == ".py" and file_uses(path, name) for path in paths)


def _runs_no_tests(options: argparse.Namespace, *, xdist_worker: bool) -> bool:
    """Whether options make this process run no test body (or pytest is a launcher's rank)."""
    if any(getattr(options, dest, False) for dest in _NO_TESTS_RUN):
        return True
    xdist = (
        bool(getattr(options, "numprocesses", None))
        or getattr(options, "dist", "no") != "no"
        or bool(getattr(options, "tx", None))
    )
    return (xdist and not xdist_worker) or launcher_world() is not None


def _may_deselect(options: argparse.Namespace) -> bool:
    """Whether options may deselect collected tests."""
    return bool(
        getattr(options, "keyword", "")
        or getattr(options, "markexpr", "")
        or getattr(options, "deselect", None)
        or getattr(options, "lf", False)
    )


def _start(config: pytest.Config) -> bool:
    from harness.controller import forkserver

    try:
        forkserver.preload_also(settings.preload_option(config))
    except ValueError:
        pass  # a usage error, reported at configure
    return forkserver.warm_up()
