"""Turn :mod:`faulthandler` dumps into tracebacks a person can read.

A rank's stacks are taken by :mod:`faulthandler` (at a timeout, or a fatal error): from a C
signal handler, it sees a main thread blocked in a collective or a sleep, where Python code
would never run. Its dump names files and lines only, most recent call first; the
controller, on the same machine, adds the source lines and puts the frames in traceback
order.
"""

from __future__ import annotations

import linecache
import os
import re

_THREAD = re.compile(
    r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[.*\])? \(most recent call first\):$"
)
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)$')

_MULTIPROCESSING_DIR = os.path.dirname(os.path.abspath(os.__file__)) + os.sep + "multiprocessing"


def format_dump(
    dump: str,
    *,
    code_dir: str,
    main_thread: int | None = None,
    hidden: tuple[int, ...] = (),
) -> str:
    """Rewrite a faulthandler dump as traceback-style text.

    The text has source lines: one block per thread, ``(most recent call last)``, without the
    harness's own outermost frames; lines that are no part of a stack
    (``Fatal Python error: ...``) stay at the top.

    Args:
        dump: What :mod:`faulthandler` wrote.
        code_dir: Directory of the rank-side harness code in the dumped process (as its
            ``Ready`` message said): outermost frames there are the harness's, not the user's.
        main_thread: Ident of the rank's main thread: it is listed first and labelled.
        hidden: Idents of harness threads to leave out.
    """
    preamble: list[str] = []
    threads: list[tuple[int, list[tuple[str, int, str]]]] = []
    for line in dump.splitlines():
        header = _THREAD.match(line.strip())
        if header:
            threads.append((int(header.group(1), 16), []))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1][1].append((frame["file"], int(frame["line"]), frame["name"]))
        elif not threads and line.strip() and not line.startswith("Extension modules"):
            preamble.append(line.rstrip())
    threads = [t for t in threads if t[0] not in hidden]
    threads.sort(key=lambda t: t[0] != main_thread)
    blocks = ["\n".join(preamble)] if preamble else []
    for ident, frames in threads:
        label = " (main thread)" if ident == main_thread else ""
        lines = [f"Thread {ident:#x}{label} (most recent call last):"]
        for path, lineno, name in _user_frames(frames[::-1], code_dir):
            lines.append(f'  File "{path}", line {lineno}, in {name}')
            source = linecache.getline(path, lineno).strip()
            if source:
                lines.append(f"    {source}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n" if blocks else dump


def _user_frames(frames: list[tuple[str, int, str]], code_dir: str) -> list[tuple[str, int, str]]:
    # Everything from the first frame of user code on (torch's test code included), less
    # the outermost frames of multiprocessing's bootstrap and the harness (the rank loop;
    # harness.compat's MultiProcessTestCase runner, in the package above the rank side)
    # and, past that, the rank side's collective-recording wrapper. A thread that is all
    # harness (the rank waiting for work) keeps its frames: the reader sees where it waits.
    package = os.path.dirname(code_dir.rstrip(os.sep)) + os.sep
    harness = (_MULTIPROCESSING_DIR, "<", code_dir, package)
    for index, (path, _, _) in enumerate(frames):
        if not path.startswith(harness):
            return [frame for frame in frames[index:] if not frame[0].startswith(code_dir)]
    return frames
