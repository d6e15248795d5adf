"""A project's own warm-up, run once in the forkserver.

It runs before the forkserver forks any rank (ini ``dist_preload``): every rank, of every
world and every rebuild, starts with it done.

The server imports this module after torch; it reads the entries from
:data:`~harness.protocol.messages.PRELOAD_VARIABLE`, set in the server's environment alone:
``module`` is imported, ``module:function`` imported and ``function()`` called. What an entry
raises never stops the server (a rank then imports what it needs itself): it is written,
one line per entry, to the file named by :data:`~harness.protocol.messages.PRELOAD_REPORT`,
which the controller reads once the first world is up.
"""

from __future__ import annotations

import importlib
import os
import traceback

from harness.protocol.messages import PRELOAD_REPORT, PRELOAD_VARIABLE


def run_entries(entries: str) -> list[str]:
    """Import or call each entry of ``entries``.

    ``entries`` is comma-separated. Returns one line per entry that failed:
    ``"entry: ExceptionType: message"``.
    """
    problems = []
    for entry in (part.strip() for part in entries.split(",")):
        if not entry:
            continue
        module, _, function = entry.partition(":")
        try:
            loaded = importlib.import_module(module)
            if function:
                getattr(loaded, function)()
        except BaseException as exc:  # a SystemExit or a pytest skip too: reported alike
            problems.append(f"{entry}: {traceback.format_exception_only(exc)[-1].strip()}")
    return problems


def _main() -> None:
    entries = os.environ.pop(PRELOAD_VARIABLE, "")
    report = os.environ.pop(PRELOAD_REPORT, "")
    problems = run_entries(entries) if entries else []
    if report:
        with open(report, "w") as out:
            out.write("".join(f"{line}\n" for line in problems))


_main()
