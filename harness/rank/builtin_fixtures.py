"""The built-in fixtures that run inside a rank.

They run there because their subject is the process they run in: the plugin's own (``rank``,
``world_size``, ``local_rank``, ``local_device``), and pytest's ``monkeypatch`` (undone in the
rank when the test ends, pass or fail), ``capsys``/``capsysbinary``/``capfd``/``capfdbinary``
(this rank's output), ``caplog`` (its log records), ``recwarn`` (its warnings) and
``tmp_path_factory`` (over the controller's base directory, for a rank-side fixture or body that
asks for it); ``request`` is :class:`harness.rank.fixtures.RankRequest`.

pytest builds its own from objects that exist only in the controller (the test item, the
capture manager), so these are small equivalents with the same public methods.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from harness import compat
from harness.protocol.pytest_calls import PLUGIN_FIXTURES
from harness.rank import current
from harness.rank.identity import rank_value


class CaptureResult(NamedTuple):
    """What ``readouterr()`` returns, as pytest's.

    It holds ``out`` and ``err`` (str or bytes).
    """

    out: Any
    err: Any


class _Capture:
    """The rank's ``capsys`` and ``capfd`` fixtures and their binary kinds.

    ``capsys``/``capsysbinary`` capture this rank's ``sys.stdout`` and ``sys.stderr``; with
    ``fd``, ``capfd``/``capfdbinary`` capture its file descriptors 1 and 2.
    """

    def __init__(self, *, binary: bool, fd: bool) -> None:
        self._binary, self._fd = binary, fd
        # Open until close(): the capture outlives this call, as the test uses it.
        self._files = [tempfile.TemporaryFile() if fd else io.BytesIO() for _ in range(2)]  # noqa: SIM115
        if fd:
            _flush()
            self._saved: list[Any] = [os.dup(1), os.dup(2)]
        else:
            self._saved = [sys.stdout, sys.stderr]
            self._streams = [
                io.TextIOWrapper(file, encoding="utf-8", errors="replace", write_through=True)
                for file in self._files
            ]
        self._route(captured=True)

    def _route(self, *, captured: bool) -> None:
        if not self._fd:
            sys.stdout, sys.stderr = self._streams if captured else self._saved
            return
        _flush()
        for fd, file, saved in zip((1, 2), self._files, self._saved, strict=True):
            os.dup2(file.fileno() if captured else saved, fd)

    def readouterr(self) -> CaptureResult:
        """The output written since the last call, consumed."""
        _flush()
        out, err = (self._take(file) for file in self._files)
        return CaptureResult(out, err)

    def _take(self, file: Any) -> Any:
        file.seek(0)
        data = file.read()
        file.seek(0)
        file.truncate()
        return data if self._binary else data.decode("utf-8", "replace")

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Let output through to the rank's streams meanwhile."""
        self._route(captured=False)
        try:
            yield
        finally:
            self._route(captured=True)

    def close(self) -> None:
        # What the test did not read goes where it would have gone, as pytest shows it.
        self._route(captured=False)
        for fd, saved, file in zip((1, 2), self._saved, self._files, strict=True):
            file.seek(0)
            data = file.read()
            file.close()
            if self._fd:
                os.close(saved)
                if data:
                    os.write(fd, data)
            elif data:
                saved.write(data.decode("utf-8", "replace"))
                saved.flush()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


class _LogHandler(logging.Handler):
    def __init__(self) -> None:
        # As pytest's: at its log_level, and its log_format for caplog.text.
        state = current.context().logs
        super().__init__(state.level() or logging.NOTSET)
        self.records: list[logging.LogRecord] = []
        self.stream = io.StringIO()
        self.setFormatter(state.formatter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.stream.write(self.format(record) + "\n")


class LogCapture:
    """``caplog``: the rank's log records during the test.

    It has pytest's methods.
    """

    def __init__(self) -> None:
        self.handler = _LogHandler()
        self._levels: dict[str | None, int] = {}
        logging.getLogger().addHandler(self.handler)

    @property
    def records(self) -> list[logging.LogRecord]:
        return self.handler.records

    @property
    def text(self) -> str:
        return self.handler.stream.getvalue()

    @property
    def messages(self) -> list[str]:
        return [record.getMessage() for record in self.records]

    @property
    def record_tuples(self) -> list[tuple[str, int, str]]:
        return [(r.name, r.levelno, r.getMessage()) for r in self.records]

    def get_records(self, when: str) -> list[logging.LogRecord]:
        """The test's records.

        A rank-side test is one phase, whatever ``when`` says.
        """
        return list(self.records)

    def clear(self) -> None:
        self.handler.records = []
        self.handler.stream = io.StringIO()

    def set_level(self, level: int | str, logger: str | None = None) -> None:
        """Set a logger's level until the test ends.

        The root logger's by default.
        """
        self._levels.setdefault(logger, logging.getLogger(logger).level)
        logging.getLogger(logger).setLevel(level)
        self.handler.setLevel(level)

    @contextlib.contextmanager
    def at_level(self, level: int | str, logger: str | None = None) -> Iterator[None]:
        """Set a logger's level for the duration.

        The root logger's by default.
        """
        target = logging.getLogger(logger)
        saved, saved_handler = target.level, self.handler.level
        target.setLevel(level)
        self.handler.setLevel(level)
        try:
            yield
        finally:
            target.setLevel(saved)
            self.handler.setLevel(saved_handler)

    def close(self) -> None:
        logging.getLogger().removeHandler(self.handler)
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)


class WarningsRecorder:
    """``recwarn``: the warnings this rank emitted during the test.

    They are ``warnings.WarningMessage`` objects, in ``list``, with pytest's methods.
    """

    def __init__(self) -> None:
        self._catcher = warnings.catch_warnings(record=True)
        self.list: list[Any] = self._catcher.__enter__()
        warnings.simplefilter("always")

    def __len__(self) -> int:
        return len(self.list)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.list)

    def __getitem__(self, index: Any) -> Any:
        return self.list[index]

    def pop(self, cls: type[Warning] = Warning) -> Any:
        """Remove and return the first recorded ``cls`` warning."""
        for index, message in enumerate(self.list):
            if issubclass(message.category, cls):
                return self.list.pop(index)
        raise AssertionError(f"{cls!r} not found in warning list")

    def clear(self) -> None:
        self.list.clear()  # the same list: the warnings module appends to it

    def close(self) -> None:
        self._catcher.__exit__(None, None, None)


class TempPathFactory:
    """``tmp_path_factory`` in a rank.

    It works over ``basetemp``, the controller's base directory, which all ranks share.
    """

    def __init__(self, basetemp: str) -> None:
        self._basetemp = Path(basetemp)

    def getbasetemp(self) -> Path:
        return self._basetemp

    def mktemp(self, basename: str, numbered: bool = True) -> Path:
        """A new directory under the base: ``basename0``, ``basename1``, ... when
        ``numbered``; safe when several ranks ask at once (each gets its own)."""
        if os.path.normpath(basename) != basename or os.path.isabs(basename):
            raise ValueError(f"{basename!r} is not a normalized and relative path")
        if not numbered:
            path = self._basetemp / basename
            path.mkdir()
            return path
        pattern = re.compile(rf"^{re.escape(basename)}(\d+)$")
        while True:
            entries = os.listdir(self._basetemp)
            taken = [int(m.group(1)) for e in entries if (m := pattern.match(e)) is not None]
            path = self._basetemp / f"{basename}{max(taken, default=-1) + 1}"
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:
                continue  # another rank took this number first
            return path


# The built-ins that end with their close().
_CLOSED: dict[str, Callable[[], Any]] = {
    "capsys": lambda: _Capture(binary=False, fd=False),
    "capsysbinary": lambda: _Capture(binary=True, fd=False),
    "capfd": lambda: _Capture(binary=False, fd=True),
    "capfdbinary": lambda: _Capture(binary=True, fd=True),
    "caplog": LogCapture,
    "recwarn": WarningsRecorder,
}


def builtin(name: str, basetemp: str | None) -> Generator[Any, None, None]:
    """Set up the built-in fixture ``name`` in this rank.

    ``basetemp`` is the controller's base temporary directory, for ``tmp_path_factory``.
    This is a generator that yields its value once and tears it down when resumed.

    Raises:
        ValueError: ``name`` is not a built-in that runs in the ranks.
    """
    if name in PLUGIN_FIXTURES:
        return _fixture(rank_value(name))
    if name == "tmp_path_factory" and basetemp is not None:
        return _fixture(TempPathFactory(basetemp))
    if name == "monkeypatch":
        return _fixture(compat.monkeypatch(), "undo")
    if name in _CLOSED:
        return _fixture(_CLOSED[name](), "close")
    raise ValueError(f"{name!r} is not a built-in fixture that runs in the ranks")


def _fixture(value: Any, end: str = "") -> Generator[Any, None, None]:
    try:
        yield value
    finally:
        if end:
            getattr(value, end)()
