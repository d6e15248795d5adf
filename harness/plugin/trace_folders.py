"""``--dist-trace-dir`` in the plugin: which tests get a trace folder, and the report's line.

A distributed test that fails (a rank raised, crashed, hung, or the ranks' collectives do
not match) gets its folder from its error's traces; one whose injected faults fired gets it
too, and under ``--dist-trace-all`` every one does: a passing call's traces are then asked
of its ranks after it (``CallOptions.keep_traces``), which a run without that option never
pays for. The folder's contents are :mod:`harness.timeline.folder`'s; a failure report
ends with one line naming the folder (:func:`harness.plugin.report.set_trace_line`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness.controller.outcome import Outcome
from harness.faults import FaultFired
from harness.plugin import report
from harness.plugin.settings import Settings
from harness.timeline import folder, spool
from harness.timeline.build import from_error


class TraceFolders:
    """A session's trace folders, as its settings' ``trace_dir`` and ``trace_all`` say."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        # Passing tests' folders, written when the session ends (see harness.timeline.spool).
        self._background = spool.Writer()
        self._texts: dict[str, list[str]] = {}  # by test: the files write_texts wrote

    def write(self, item: pytest.Item, outcome: Outcome, world_size: int, backend: str) -> None:
        """Write ``item``'s trace folder where its outcome (the run whose verdict stands) calls
        for one, and note the report's line; a folder that cannot be written is said there."""
        settings = self._settings
        texts = self._texts.pop(item.nodeid, [])
        report.set_trace_line(item, "")
        if not settings.trace_dir or outcome.skip is not None:
            return
        error = outcome.error
        taken = time.monotonic()
        try:
            if error is not None:
                size = len(error.collectives) or world_size
                timeline = from_error(error, size, test=item.nodeid, backend=backend, taken=taken)
            else:
                fired = [v for v in outcome.values or () if isinstance(v, FaultFired)]
                if not outcome.traces or not (settings.trace_all or fired):
                    return
                failure = "; ".join(f"{f} (injected)" for f in fired)
                # No report waits for it: written when the session ends.
                self._background.submit(
                    Path(settings.trace_dir),
                    outcome.traces,
                    len(outcome.traces),
                    test=item.nodeid,
                    backend=backend,
                    failure=f"passed; {failure}" if failure else "",
                    taken=taken,
                )
                return
            written, problems = folder.write(Path(settings.trace_dir), timeline)
        except Exception as exc:  # never turn the test's own outcome into ours
            line = f"trace folder: not written ({type(exc).__name__}: {exc})"
            report.set_trace_line(item, line)
            return
        files = [name for name in folder.FILES if name not in problems]
        files += texts
        shown = ", ".join(name + ("/" if name == "fr" else "") for name in files)
        line = f"trace folder: {written}{os.sep}" + (f" ({shown})" if shown else "")
        if problems:
            line += "; not written: " + "; ".join(f"{k}: {v}" for k, v in problems.items())
        report.set_trace_line(item, line)

    def write_texts(self, item: pytest.Item, texts: dict[str, str], failed: bool) -> None:
        """Write ``texts`` (file name -> text) into ``item``'s trace folder, where it gets
        one: when the test failed, or under ``--dist-trace-all``; a file that cannot be
        written is left out (the test's outcome stands)."""
        settings = self._settings
        if not settings.trace_dir or not (failed or settings.trace_all):
            return
        where = Path(settings.trace_dir) / folder.folder_name(item.nodeid)
        written = self._texts[item.nodeid] = []
        try:
            where.mkdir(parents=True, exist_ok=True)
            for name, text in texts.items():
                (where / name).write_text(text, encoding="utf-8")
                written.append(name)
        except OSError:
            return

    def close(self) -> None:
        """Write the passing tests' folders, at the session's end."""
        self._background.close()
