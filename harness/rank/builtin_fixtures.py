"""The built-in fixtures that run inside a rank: this module runs INSIDE each rank.

Some fixtures mean something per process, so in a distributed test they run in every rank
rather than in the controller: the plugin's own (``rank``, ``world_size``,
``local_rank``, ``local_device``) and pytest's per-test built-ins whose subject is the
process they run in: ``monkeypatch`` (undone in the rank when the test ends, pass or fail),
``capsys``/``capsysbinary``/``capfd``/``capfdbinary`` (this rank's output), ``caplog``
(this rank's log records), ``recwarn`` (this rank's warnings), ``tmp_path_factory`` (for
the body or a rank-side fixture that asks for it: over the controller's base directory) and
``request`` (:class:`RankRequest`, a view of the test).

pytest builds its own versions of these from objects that exist only in the controller
(the test item, the capture manager), so the ones here are small equivalents with the same
public methods. Each is a generator function: setup, ``yield`` the value, teardown.

What it may import: see :mod:`harness.rank`; pytest only through ``harness.compat``.
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
from harness.protocol.messages import PLUGIN_FIXTURES, RequestInfo
from harness.rank.identity import rank_value


class CaptureResult(NamedTuple):
    """What ``readouterr()`` returns, as pytest's: ``out`` and ``err`` (str or bytes)."""

    out: Any
    err: Any


class _SysCapture:
    """``capsys`` / ``capsysbinary``: ``sys.stdout`` and ``sys.stderr`` of this rank."""

    def __init__(self, binary: bool) -> None:
        self._binary = binary
        self._saved = (sys.stdout, sys.stderr)
        self._buffers = (io.BytesIO(), io.BytesIO())
        self._streams = tuple(
            io.TextIOWrapper(buffer, encoding="utf-8", errors="replace", write_through=True)
            for buffer in self._buffers
        )
        sys.stdout, sys.stderr = self._streams

    def readouterr(self) -> CaptureResult:
        """The output written since the last call, consumed."""
        out, err = (self._take(buffer) for buffer in self._buffers)
        return CaptureResult(out, err)

    def _take(self, buffer: io.BytesIO) -> Any:
        data = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return data if self._binary else data.decode("utf-8", "replace")

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Let output through to the rank's own streams for the duration."""
        sys.stdout, sys.stderr = self._saved
        try:
            yield
        finally:
            sys.stdout, sys.stderr = self._streams

    def close(self) -> None:
        # What the test did not read goes where it would have gone, as pytest shows it.
        out, err = (buffer.getvalue() for buffer in self._buffers)
        sys.stdout, sys.stderr = self._saved
        for stream, data in ((sys.stdout, out), (sys.stderr, err)):
            if data:
                stream.write(data.decode("utf-8", "replace"))
                stream.flush()


class _FdCapture:
    """``capfd`` / ``capfdbinary``: file descriptors 1 and 2 of this rank."""

    def __init__(self, binary: bool) -> None:
        self._binary = binary
        _flush()
        # Open until close(): the capture outlives this call, as the test uses it.
        self._files = [tempfile.TemporaryFile() for _ in range(2)]  # noqa: SIM115
        self._saved = [os.dup(1), os.dup(2)]
        for fd, file in zip((1, 2), self._files, strict=True):
            os.dup2(file.fileno(), fd)

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
        """Let output through to the rank's own file descriptors for the duration."""
        _flush()
        for fd, saved in zip((1, 2), self._saved, strict=True):
            os.dup2(saved, fd)
        try:
            yield
        finally:
            _flush()
            for fd, file in zip((1, 2), self._files, strict=True):
                os.dup2(file.fileno(), fd)

    def close(self) -> None:
        _flush()
        for fd, saved, file in zip((1, 2), self._saved, self._files, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
            file.seek(0)
            data = file.read()
            file.close()
            if data:
                os.write(fd, data)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


_LOG_FORMAT = "%(levelname)-8s %(name)s:%(filename)s:%(lineno)d %(message)s"
"""pytest's default log format, which ``caplog.text`` uses."""


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.stream = io.StringIO()
        self.setFormatter(logging.Formatter(_LOG_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.stream.write(self.format(record) + "\n")

    def reset(self) -> None:
        self.records = []
        self.stream = io.StringIO()


class LogCapture:
    """``caplog``: the log records of this rank during the test, with pytest's methods."""

    def __init__(self) -> None:
        self.handler = _Recorder()
        self._levels: dict[str | None, int] = {}
        self._handler_level = self.handler.level
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
        """The records of the test; every phase of a rank-side test is one (``when`` is
        accepted for pytest's signature)."""
        return list(self.records)

    def clear(self) -> None:
        self.handler.reset()

    def set_level(self, level: int | str, logger: str | None = None) -> None:
        """Set a logger's level (the root's by default) until the test ends."""
        target = logging.getLogger(logger)
        self._levels.setdefault(logger, target.level)
        target.setLevel(level)
        self.handler.setLevel(level)

    @contextlib.contextmanager
    def at_level(self, level: int | str, logger: str | None = None) -> Iterator[None]:
        """Set a logger's level (the root's by default) for the duration."""
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
        self.handler.setLevel(self._handler_level)


class WarningsRecorder(list):  # type: ignore[type-arg]
    """``recwarn``: the warnings this rank emitted during the test (``warnings.WarningMessage``
    objects), with pytest's ``pop`` and ``clear``."""

    def __init__(self) -> None:
        super().__init__()
        self._catcher = warnings.catch_warnings(record=True)
        self._log = self._catcher.__enter__()
        warnings.simplefilter("always")

    def _sync(self) -> None:
        if self._log:
            self.extend(self._log)
            del self._log[:]

    @property
    def list(self) -> list[Any]:
        self._sync()
        return self

    def __len__(self) -> int:
        self._sync()
        return super().__len__()

    def __iter__(self) -> Iterator[Any]:
        self._sync()
        return super().__iter__()

    def __getitem__(self, index: Any) -> Any:
        self._sync()
        return super().__getitem__(index)

    def pop(self, cls: type[Warning] = Warning) -> Any:  # type: ignore[override]
        """The first recorded warning that is an instance of ``cls``, removed."""
        self._sync()
        for index, message in enumerate(self):
            if issubclass(message.category, cls):
                return super().pop(index)
        raise AssertionError(f"{cls!r} not found in warning list")

    def clear(self) -> None:
        self._sync()
        super().clear()

    def close(self) -> None:
        self._catcher.__exit__(None, None, None)


class TempPathFactory:
    """``tmp_path_factory`` in a rank: the controller's base directory, shared by all ranks.

    Args:
        basetemp: The controller's ``tmp_path_factory.getbasetemp()``.
    """

    def __init__(self, basetemp: str) -> None:
        self._basetemp = Path(basetemp)

    def getbasetemp(self) -> Path:
        """The session's base directory (the controller's)."""
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
            taken = [
                int(m.group(1))
                for entry in os.listdir(self._basetemp)
                if (m := pattern.match(entry)) is not None
            ]
            path = self._basetemp / f"{basename}{max(taken, default=-1) + 1}"
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:
                continue  # another rank took this number first
            return path


class _Marks:
    """The test's marks, for ``request.node``."""

    def __init__(self, marks: tuple[Any, ...]) -> None:
        self._marks = marks

    def iter_markers(self, name: str | None = None) -> Iterator[Any]:
        return (mark for mark in self._marks if name is None or mark.name == name)

    def get_closest_marker(self, name: str, default: Any = None) -> Any:
        return next(self.iter_markers(name), default)


class RankNode(_Marks):
    """``request.node`` in a rank: the test's ``name``, ``nodeid`` and marks."""

    def __init__(self, info: RequestInfo) -> None:
        super().__init__(info.marks)
        self.name = info.name
        self.nodeid = info.nodeid

    def __repr__(self) -> str:
        return f"<RankNode {self.nodeid}>"


_NOTSET = object()


class RankConfig:
    """``request.config`` in a rank: the controller's options and ini values."""

    def __init__(self, info: RequestInfo) -> None:
        self._options = info.options
        self._ini = info.ini

    def getoption(self, name: str, default: Any = _NOTSET, skip: bool = False) -> Any:
        """An option's value, by its ``dest`` (or ``--flag`` spelling)."""
        key = name.lstrip("-").replace("-", "_")
        if key in self._options:
            return self._options[key]
        if default is not _NOTSET:
            return default
        raise ValueError(f"no option named {name!r} (or its value could not be sent to the ranks)")

    def getini(self, name: str) -> Any:
        """An ini option's value."""
        try:
            return self._ini[name]
        except KeyError:
            raise ValueError(
                f"unknown ini option {name!r} (or its value could not be sent to the ranks)"
            ) from None


class RankRequest:
    """``request`` inside a rank: a view of the test and of the fixture being set up.

    Answers what a fixture usually asks: ``node`` (``name``, ``nodeid``,
    ``get_closest_marker``, ``iter_markers``), ``param``, ``fixturename``, ``scope``,
    ``config`` (``getoption``, ``getini``), ``function``, ``cls``, ``instance``, ``module``,
    and ``addfinalizer`` (run in this rank when the fixture ends).
    """

    def __init__(
        self,
        info: RequestInfo | None,
        test: dict[str, Any],
        *,
        fixturename: str | None,
        scope: str,
        param: Any,
        has_param: bool,
        finalizers: list[Callable[[], object]],
    ) -> None:
        self._info = info
        self.fixturename = fixturename
        self.scope = scope
        self.function = test.get("function")
        self.cls = test.get("cls")
        self.instance = test.get("instance")
        self.module = test.get("module")
        self._finalizers = finalizers
        if has_param:
            self.param = param

    def _need(self) -> RequestInfo:
        if self._info is None:  # the controller sends it whenever `request` is asked for
            raise RuntimeError("the test's request information did not reach this rank")
        return self._info

    @property
    def node(self) -> RankNode:
        return RankNode(self._need())

    @property
    def config(self) -> RankConfig:
        return RankConfig(self._need())

    @property
    def keywords(self) -> dict[str, Any]:
        return {mark.name: mark for mark in reversed(self._need().marks)}

    def addfinalizer(self, finalizer: Callable[[], object]) -> None:
        """Call ``finalizer`` in this rank when the fixture (or test) ends."""
        self._finalizers.append(finalizer)

    def getfixturevalue(self, argname: str) -> Any:
        raise RuntimeError(
            f"request.getfixturevalue({argname!r}) is not available inside a rank: "
            "request the fixture as an argument instead"
        )

    def __repr__(self) -> str:
        nodeid = self._info.nodeid if self._info is not None else "?"
        return f"<RankRequest for {nodeid} fixture={self.fixturename!r}>"


def builtin(name: str, basetemp: str | None) -> Generator[Any, None, None]:
    """Set up the built-in fixture ``name`` in this rank: a generator that yields its value
    once and tears it down when resumed.

    Args:
        name: One of the protocol's ``PLUGIN_FIXTURES`` or ``PER_PROCESS_FIXTURES``.
        basetemp: The controller's base temporary directory (for ``tmp_path_factory``).

    Raises:
        ValueError: ``name`` is not a built-in that runs in the ranks.
    """
    if name in PLUGIN_FIXTURES:
        return _value(rank_value(name))
    if name == "monkeypatch":
        return _closing(compat.monkeypatch(), "undo")
    if name in ("capsys", "capsysbinary"):
        return _closing(_SysCapture(binary=name.endswith("binary")), "close")
    if name in ("capfd", "capfdbinary"):
        return _closing(_FdCapture(binary=name.endswith("binary")), "close")
    if name == "caplog":
        return _closing(LogCapture(), "close")
    if name == "recwarn":
        return _closing(WarningsRecorder(), "close")
    if name == "tmp_path_factory" and basetemp is not None:
        return _value(TempPathFactory(basetemp))
    raise ValueError(f"{name!r} is not a built-in fixture that runs in the ranks")


def _value(value: Any) -> Generator[Any, None, None]:
    yield value


def _closing(value: Any, method: str) -> Generator[Any, None, None]:
    try:
        yield value
    finally:
        getattr(value, method)()
