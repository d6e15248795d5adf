"""What is left of a process session, for the Ctrl-C tests of the harness core and the plugin
(a child started with ``start_new_session=True`` leads a session of its own: its pid is the
session id, and whatever it started, ranks and forkserver included, is in that session)."""

from __future__ import annotations

import os
import time


def session_processes(sid: int) -> dict[int, str]:
    """Live processes of session ``sid`` (zombies left out), with their command lines."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # gone meanwhile
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            found[int(entry)] = command
    return found


def left_in_session(sid: int, bound_s: float = 30.0) -> dict[int, str]:
    """What of session ``sid`` is still alive ``bound_s`` after its leader exited (helpers
    such as the resource tracker exit on their own once they see that; a safety bound only)."""
    deadline = time.monotonic() + bound_s
    while True:
        left = session_processes(sid)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)
