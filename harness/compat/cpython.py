"""Access to CPython's private names.

They cover frames, multiprocessing's forkserver and bootstrap state, the bytes behind
``os.environ``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

__all__ = [
    "bootstrapping",
    "environ_bytes",
    "forget_forkserver",
    "forkserver_pid",
    "frame",
    "frame_of_thread",
]


def frame(depth: int) -> FrameType | None:
    """The frame ``depth`` calls above the caller.

    0 is the caller's own; None past the outermost. Private: ``sys._getframe``;
    ``inspect.stack()`` formats every frame, far too slow for a call site taken at every
    collective.
    """
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None


def frame_of_thread(ident: int) -> FrameType | None:
    """The frame a thread is running now, or None.

    Another thread's too, while it is blocked in C. Private: ``sys._current_frames``;
    ``faulthandler`` writes text, not frames.
    """
    return sys._current_frames().get(ident)


def forkserver_pid() -> int | None:
    """The pid of this process's multiprocessing forkserver.

    None when none runs. Private: ``_forkserver._forkserver_pid``; multiprocessing documents
    no way to reach it.
    """
    import multiprocessing.forkserver

    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


def forget_forkserver() -> None:
    """Close this process's side of the forkserver and forget it.

    This is after it was killed. There is no public way to stop a forkserver;
    ``_forkserver._stop()`` closes our socket and reaps the server so that multiprocessing
    does not try to use it again.
    """
    import multiprocessing.forkserver

    multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]


def bootstrapping() -> bool:
    """Whether this process still imports its parent's main module.

    That is, a multiprocessing child still importing it (spawn and forkserver re-run it, as
    ``__mp_main__``, before the child's target). multiprocessing checks the private
    ``current_process()._inheriting`` and then raises a long generic error; the harness
    checks first to say what to do instead.
    """
    import multiprocessing

    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def environ_bytes() -> Mapping[bytes, bytes]:
    """The live ``os.environ`` as the bytes mapping it keeps.

    Read it, never write it.

    ``os.environ``'s Mapping methods decode every key and value, a cost every rank would
    pay at every call to put its environment back; ``os.environ._data``, the dict of bytes
    they read, is copied and compared at C speed. There is no public equivalent.
    """
    data: Mapping[bytes, bytes] = os.environ._data  # type: ignore[attr-defined]
    return data


# -- probes: each raises once an upgrade has removed what it checks --------------------------


def _probe_forkserver() -> object:
    import multiprocessing.forkserver

    server: Any = multiprocessing.forkserver._forkserver
    return server._forkserver_pid, server._stop


def _probe_inheriting() -> object:
    import inspect
    import multiprocessing.spawn

    spawn: Any = multiprocessing.spawn
    source = inspect.getsource(spawn._check_not_importing_main)
    if "_inheriting" not in source:
        raise AttributeError("multiprocessing no longer flags bootstrapping with '_inheriting'")
    return source


def _probe_environ_bytes() -> object:
    data = environ_bytes()
    if not isinstance(data, dict) or (data and not isinstance(next(iter(data)), bytes)):
        raise TypeError("os.environ._data is no longer a dict of bytes")
    return data


def _probe_frames() -> object:
    import threading

    here = frame(0)
    if here is None or here.f_code.co_name != "_probe_frames":
        raise AttributeError("sys._getframe no longer returns the caller's frame")
    if frame_of_thread(threading.get_ident()) is None:
        raise AttributeError("sys._current_frames no longer lists this thread")
    return here


PROBES: dict[str, Callable[[], object]] = {
    "multiprocessing.forkserver._forkserver (._forkserver_pid, ._stop)": _probe_forkserver,
    "multiprocessing.current_process()._inheriting": _probe_inheriting,
    "os.environ._data (the bytes behind os.environ)": _probe_environ_bytes,
    "sys._getframe, sys._current_frames": _probe_frames,
}
