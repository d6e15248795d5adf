"""The trace folder of a test: safe, unique names for any test id; an unwritable directory
named in the error; each file written on its own (writers replaced by stand-ins here: the
real ones are tested on their own)."""

from __future__ import annotations

import json
import os
import re
import sys
import types
from pathlib import Path

import pytest
from timeline_samples import mismatch

from harness.timeline.folder import SLUG_MAX, check_writable, folder_name, write
from harness.timeline.model import Timeline

SAFE = re.compile(r"^[A-Za-z0-9._-]+$")

IDS = [
    "tests/test_model.py::test_step",
    "tests/test_model.py::test_step[ws4]",
    "tests/test_model.py::TestA::test_b[ä/1]",
    "tests\\win\\test_x.py::test_y",
    "t.py::test[\u65e5\u672c-\U0001f600]",
    't.py::test[a b*c?d<e>f|g"h:i]',
    "t.py::test[" + "x" * 500 + "]",
    "CON.py::test",
    "t.py::test[...]",
    "",
]


@pytest.mark.parametrize("test", IDS)
def test_a_folder_name_is_safe_everywhere(test: str) -> None:
    name = folder_name(test)
    assert SAFE.match(name), name
    assert len(name) <= SLUG_MAX + 11
    assert not name.endswith((".", " "))
    assert name.split(".", 1)[0].upper() not in {"CON", "PRN", "AUX", "NUL"}
    assert name == folder_name(test)  # the same test, the same folder


def test_folder_names_are_readable() -> None:
    assert folder_name("tests/test_model.py::test_step[ws4]").startswith(
        "test_model.py-test_step-ws4-"
    )
    assert folder_name("tests/test_x.py::TestA::test_b[ä/1]").startswith(
        "test_x.py-TestA-test_b-a-1-"
    )


def test_folder_names_are_unique_even_ignoring_case() -> None:
    ids = [
        *IDS,
        "tests/test_model.py::test_step[WS4]",
        "other/test_model.py::test_step[ws4]",
        "t.py::test[a/b]",
        "t.py::test[a-b]",
        "t.py::test[" + "x" * 500 + "y]",
    ]
    names = [folder_name(test).lower() for test in ids]
    assert len(set(names)) == len(ids)


def test_a_long_id_keeps_its_start_and_its_end() -> None:
    name = folder_name("t.py::test_long[" + "x" * 300 + "_end]")
    assert name.startswith("t.py-test_long-x")
    assert "x_end-" in name


def test_an_unwritable_directory_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=re.escape(repr(str(blocker / "traces")))):
        check_writable(str(blocker / "traces"))
    assert check_writable(str(tmp_path / "new" / "traces")) == tmp_path / "new" / "traces"
    assert not os.listdir(tmp_path / "new" / "traces")


def _stand_ins(monkeypatch: pytest.MonkeyPatch, broken: str = "") -> None:
    """The three writers, replaced by stand-ins (``broken``: that one raises)."""

    def fail(*args: object) -> None:
        raise RuntimeError("broken writer")

    def dumps(directory: Path, timeline: Timeline) -> None:
        for rank in range(timeline.world_size):
            (directory / str(rank)).write_bytes(b"dump")

    modules = {
        "page": ("render", lambda timeline: f"<html>{timeline.test}</html>"),
        "chrome_trace": ("document", lambda timeline: {"traceEvents": []}),
        "flight_dumps": ("write", dumps),
    }
    for name, (function, fn) in modules.items():
        module = types.ModuleType(f"harness.timeline.{name}")
        setattr(module, function, fail if name == broken else fn)
        monkeypatch.setitem(sys.modules, f"harness.timeline.{name}", module)
        monkeypatch.setattr(f"harness.timeline.{name}", module, raising=False)


def test_the_folder_holds_the_three_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_ins(monkeypatch)
    timeline = mismatch()
    folder, problems = write(tmp_path, timeline)
    assert problems == {}
    assert folder == tmp_path / folder_name(timeline.test)
    assert sorted(os.listdir(folder)) == ["fr", "timeline.html", "trace.json"]
    assert (folder / "timeline.html").read_text() == f"<html>{timeline.test}</html>"
    assert json.loads((folder / "trace.json").read_text()) == {"traceEvents": []}
    assert sorted(os.listdir(folder / "fr")) == ["0", "1", "2", "3"]
    # Written again (a smaller world): the earlier dumps are gone.
    write(tmp_path, Timeline(timeline.test, "", 2, "gloo", (), ()))
    assert sorted(os.listdir(folder / "fr")) == ["0", "1"]


def test_a_writer_that_fails_leaves_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_ins(monkeypatch, broken="chrome_trace")
    folder, problems = write(tmp_path, mismatch())
    assert problems == {"trace.json": "RuntimeError: broken writer"}
    assert sorted(os.listdir(folder)) == ["fr", "timeline.html"]
