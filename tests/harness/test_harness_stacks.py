"""Stack dumps made readable: the rank's own harness frames are found by the directory its
``Ready`` message names, whatever the modules there are called."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from harness.controller.stacks import format_dump


def test_outer_harness_frames_are_dropped_by_directory(tmp_path: Path) -> None:
    code_dir = str(tmp_path / "somewhere" / "rank") + os.sep
    user = tmp_path / "test_user.py"
    user.write_text("import time\n\ndef body():\n    time.sleep(3600)\n")
    dump = textwrap.dedent(
        f"""\
        Thread 0x00000001 (most recent call first):
          File "{user}", line 4 in body
          File "{code_dir}any_name_at_all.py", line 10 in run_test
          File "{code_dir}loop.py", line 20 in main
          File "<frozen runpy>", line 1 in _run
        Thread 0x00000002 (most recent call first):
          File "{code_dir}loop.py", line 99 in _watch
        """
    )
    text = format_dump(dump, code_dir=code_dir, main_thread=1, hidden=(2,))
    assert text.splitlines() == [
        "Thread 0x1 (main thread) (most recent call last):",
        f'  File "{user}", line 4, in body',
        "    time.sleep(3600)",
    ]


def test_a_thread_that_is_all_harness_keeps_its_frames(tmp_path: Path) -> None:
    code_dir = str(tmp_path) + os.sep
    dump = (
        "Current thread 0x00000001 (most recent call first):\n"
        f'  File "{code_dir}loop.py", line 5 in main\n'
    )
    text = format_dump(dump, code_dir=code_dir, main_thread=1)
    assert f'File "{code_dir}loop.py", line 5, in main' in text
