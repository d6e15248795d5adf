"""A test's trace folder (``--dist-trace-dir``): its name, and the files written into it.

Each test gets ``DIR/<name>/`` holding ``timeline.html`` (the picture,
:mod:`harness.timeline.page`), ``trace.json`` (Chrome trace events,
:mod:`harness.timeline.chrome_trace`) and ``fr/`` (one Flight Recorder dump per rank,
:mod:`harness.timeline.flight_dumps`), all from one
:class:`~harness.timeline.model.Timeline`. The name is the test id made safe on Linux,
macOS and Windows (ASCII letters, digits, ``.``, ``_`` and ``-``; no reserved device name;
short enough for any path), followed by a hash of the whole id, so that two ids never share
a folder, not even on a file system that ignores case.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import unicodedata
from pathlib import Path

from harness.timeline.model import Timeline

__all__ = ["FILES", "check_writable", "folder_name", "write"]

FILES = ("timeline.html", "trace.json", "fr")
"""What a test's folder holds."""

SLUG_MAX = 64
"""The most characters of the readable part of a folder's name (a hash follows it)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# Windows reserves these names for devices, with any extension ("CON.py" too).
_RESERVED = frozenset(
    {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10))}
)


def folder_name(test: str) -> str:
    """The folder of test ``test`` (a pytest node id): its readable part, then a hash.

    ``tests/unit/test_x.py::TestA::test_b[ä/1]`` becomes ``test_x.py-TestA-test_b-a-1-``
    and 10 hex digits of the id's SHA-1: the directories of the path are left out (the
    hash keeps ids apart), other characters outside ``A-Za-z0-9._-`` become ``-``, accents
    are dropped, and a long name keeps its start and its end.
    """
    path, sep, rest = test.partition("::")
    readable = path.replace("\\", "/").rsplit("/", 1)[-1] + sep + rest
    ascii_text = unicodedata.normalize("NFKD", readable).encode("ascii", "ignore").decode()
    slug = _UNSAFE.sub("-", ascii_text).strip("-.") or "test"
    if len(slug) > SLUG_MAX:
        half = SLUG_MAX // 2
        slug = f"{slug[: half - 1]}--{slug[-(SLUG_MAX - half - 1) :]}"
    if slug.split(".", 1)[0].upper() in _RESERVED:
        slug = f"_{slug}"
    digest = hashlib.sha1(test.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{slug}-{digest}"


def check_writable(directory: str, where: str = "--dist-trace-dir") -> Path:
    """Make ``directory`` (and its parents) where missing, and check a file can be written
    in it; ``where`` names the setting that gave it.

    Returns:
        The directory, absolute.

    Raises:
        ValueError: It cannot be made or written in, naming it and why.
    """
    path = Path(directory).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".harness-check-"):
            pass
    except OSError as exc:
        raise ValueError(
            f"{where} {str(path)!r} cannot be used: {exc.strerror or exc}; give a "
            "directory this user can create and write in"
        ) from None
    return path


def write(directory: Path, timeline: Timeline) -> tuple[Path, dict[str, str]]:
    """Write ``timeline``'s folder under ``directory``, replacing an earlier run's.

    Each file is written on its own: one that cannot be (a writer's error) is left out and
    said, the others are still written.

    Returns:
        The folder, and why each of :data:`FILES` that could not be written was not, by
        name (empty when all were).
    """
    folder = directory / folder_name(timeline.test)
    problems = {}
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return folder, dict.fromkeys(FILES, f"the folder could not be made: {exc}")
    for name in FILES:
        target = folder / name
        try:
            _write_one(target, timeline)
        except Exception as exc:  # a writer's bug must not hide the test's own failure
            problems[name] = f"{type(exc).__name__}: {exc}"
    return folder, problems


def _write_one(target: Path, timeline: Timeline) -> None:
    """Write one of :data:`FILES` (writers imported here: a run without the option never
    loads them)."""
    if target.name == "fr":
        from harness.timeline import flight_dumps

        if target.is_dir():
            shutil.rmtree(target)  # an earlier run's dumps, maybe of more ranks
        target.mkdir()
        flight_dumps.write(target, timeline)
        return
    if target.name == "timeline.html":
        from harness.timeline import page

        text = page.render(timeline)
    else:
        from harness.timeline import chrome_trace

        text = json.dumps(chrome_trace.document(timeline), separators=(",", ":"))
    # Whole or not at all: a reader never sees half a file.
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, target)
