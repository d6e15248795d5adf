"""What a sweep's count depends on: the project's source files that its clean run imported,
each noted by its size, modification time and content, and checked before the count is
reused.

A sweep over ``at="all"`` reuses a clean run's count (:mod:`harness.plugin.sweep_count`) for as
long as the code it ran is the same. The code is the project's files among those the counting
run imported, in its ranks and in its pytest process: every file outside the standard library
and outside installed distributions (a ``site-packages`` or ``dist-packages`` directory). That
is the test's file and its conftests, and the library under test wherever it lives: in the
rootdir, in a ``src/`` layout installed editable (whose files stay in the project's tree), in
a directory a conftest or ini ``pythonpath`` puts on ``sys.path``. What an installed
distribution holds is left out (the count is keyed by torch's and fhelium's versions
besides): a library installed into ``site-packages`` rather than editable, as tox installs a
project by default, is not followed; nor are files a test reads rather than imports.

A file is unchanged when its size and modification time are those noted, or, where they
differ, its content's hash is: an edit is seen, a file merely touched is not counted again.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from collections.abc import Iterable

Notes = dict[str, list[object]]
"""Per file (its absolute path): ``[size, st_mtime_ns, sha256 hex digest]``."""

_INSTALLED = ("site-packages", "dist-packages")
_PATHS = sysconfig.get_paths()
_STDLIB = tuple({os.path.join(_PATHS[name], "") for name in ("stdlib", "platstdlib")})


def project_files(paths: Iterable[str]) -> list[str]:
    """The project's files among ``paths`` (of imported modules), sorted: those that exist,
    outside the standard library and installed distributions."""
    found = set()
    for path in paths:
        full = os.path.abspath(path)
        parts = full.split(os.sep)
        if full.startswith(_STDLIB) or any(part in _INSTALLED for part in parts):
            continue
        if os.path.isfile(full):
            found.add(full)
    return sorted(found)


def noted(paths: Iterable[str]) -> Notes:
    """Each file of ``paths`` noted now (a file that went missing meanwhile is left out:
    its importer, noted too, tells an edit)."""
    notes: Notes = {}
    for path in paths:
        try:
            stat = os.stat(path)
            notes[path] = [stat.st_size, stat.st_mtime_ns, _digest(path)]
        except OSError:
            continue
    return notes


def unchanged(notes: Notes) -> tuple[bool, Notes]:
    """Whether every file noted is unchanged; and the notes with the size and time of each
    file whose content was read and found unchanged (the next check needs no read)."""
    current: Notes = {}
    for path, (size, mtime, digest) in notes.items():
        try:
            stat = os.stat(path)
            if (stat.st_size, stat.st_mtime_ns) != (size, mtime) and _digest(path) != digest:
                return False, notes
        except OSError:
            return False, notes
        current[path] = [stat.st_size, stat.st_mtime_ns, digest]
    return True, current


def _digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()
