"""The log records of a pytest test in a rank, for pytest's ``Captured log`` sections.

While a test runs (:meth:`LogState.captured`), a handler on the root logger takes the
records that pytest's own would take in-process (its ``log_level``; else the loggers'
levels, WARNING by default), formats them with its ``log_format`` and writes each line at
once to the rank's stderr as it was when the test started, marked with ``LOG_MARK`` and the
test's phase (:meth:`LogState.enter`). The controller moves those lines into the test's
``Captured log setup``, ``call`` and ``teardown`` sections, each prefixed with its rank;
under ``-s`` the prefixing pump strips the mark (:mod:`harness.rank.output`). Written as
they come, they survive a rank that crashes or hangs; written to a descriptor of their own,
they bypass a test's ``capfd`` and ``capsys``, as pytest's handler does. ``caplog`` takes
the level and format from here. A rank has one :class:`LogState`, on its context.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from harness.protocol.pytest_calls import LOG_MARK, LogSettings
from harness.protocol.rank_files import write_all

# pytest's default log_format, for a caplog outside a test's capture.
DEFAULT_FORMAT = "%(levelname)-8s %(name)s:%(filename)s:%(lineno)d %(message)s"


class _Handler(logging.Handler):
    """Writes each record's lines, marked with the phase of ``state``, to a file descriptor.

    One per rank, set up anew for each test (:meth:`prepare`): making a ``logging.Handler``
    registers it with the logging module (a lock, weak references), which a test need not
    pay for.
    """

    _fd = -1
    _settings: LogSettings | None = None

    def __init__(self, state: LogState) -> None:
        super().__init__()
        self._state = state

    def prepare(self, settings: LogSettings, fd: int) -> None:
        """Write to ``fd`` at the level and in the format of ``settings``."""
        if settings != self._settings:  # the same in every test of a session
            self.setLevel(settings.level or logging.NOTSET)
            self.setFormatter(logging.Formatter(settings.format, settings.date_format))
            self._settings = settings
        self._fd = fd

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            phase = self._state.phase
            marked = "".join(f"{LOG_MARK}{phase} {line}\n" for line in text.split("\n"))
            write_all(self._fd, marked.encode("utf-8", "replace"))
        except Exception:
            self.handleError(record)


class LogState:
    """A rank's log capture.

    Attributes:
        settings: Those of the test in progress (None between tests).
        phase: The phase of the test in progress.
        handler: Made at the first test that captures, then kept.
    """

    def __init__(self) -> None:
        self.settings: LogSettings | None = None
        self.phase = "setup"
        self.handler: _Handler | None = None

    @contextmanager
    def captured(self, settings: LogSettings | None) -> Iterator[None]:
        """Capture the block's log records as the module's docstring says; nothing for None."""
        if settings is None:
            yield
            return
        try:
            fd = os.dup(2)
        except OSError:  # no stderr: nowhere to write them, as without a handler
            yield
            return
        root = logging.getLogger()
        level = root.level
        self.settings, self.phase = settings, "setup"
        handler = self.handler = self.handler or _Handler(self)
        handler.prepare(settings, fd)
        if settings.level is not None and settings.level < level:
            root.setLevel(settings.level)  # as pytest: records of that level reach the handlers
        root.addHandler(handler)
        try:
            yield
        finally:
            root.removeHandler(handler)
            if root.level != level:  # setLevel clears every logger's cache: only when needed
                root.setLevel(level)
            os.close(fd)
            self.settings = None

    def enter(self, phase: str) -> None:
        """The test in progress enters its phase ``phase`` (``"call"``, ``"teardown"``)."""
        self.phase = phase

    def level(self) -> int | None:
        """``log_level`` of the test in progress; None where unset (or between tests)."""
        settings = self.settings
        return settings.level if settings is not None else None

    def formatter(self) -> logging.Formatter:
        """A formatter of the running test's ``log_format``; pytest's default between tests."""
        settings = self.settings
        if settings is None:
            return logging.Formatter(DEFAULT_FORMAT)
        return logging.Formatter(settings.format, settings.date_format)
