"""CPython's private names: frames, multiprocessing's forkserver and bootstrap state, the
bytes behind ``os.environ``."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any

__all__ = [
    "bootstrapping",
    "environ_bytes",
    "forget_forkserver",
    "forget_parent_multiprocessing",
    "forkserver_pid",
    "forkserver_started_by",
    "frame",
    "frame_of_thread",
]


def frame(depth: int) -> FrameType | None:
    """The frame ``depth`` calls above the caller (0: the caller's own), None past the
    outermost. Private: ``sys._getframe``; ``inspect.stack()`` formats every frame, far too
    slow for a call site taken at every collective."""
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None


def frame_of_thread(ident: int) -> FrameType | None:
    """The frame a thread is running now (another thread's too, while it is blocked in C),
    or None. Private: ``sys._current_frames``; ``faulthandler`` writes text, not frames."""
    return sys._current_frames().get(ident)


def forkserver_pid() -> int | None:
    """The pid of this process's multiprocessing forkserver, or None when none runs.
    Private: ``_forkserver._forkserver_pid``; multiprocessing documents no way to reach it."""
    import multiprocessing.forkserver

    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


def forget_forkserver() -> None:
    """Close this process's side of the forkserver and forget it (after it was killed).
    There is no public way to stop a forkserver; ``_forkserver._stop()`` closes our socket
    and reaps the server so that multiprocessing does not try to use it again."""
    import multiprocessing.forkserver

    multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]


@contextlib.contextmanager
def forkserver_started_by(start: Callable[[str, Sequence[int]], int | None]) -> Iterator[None]:
    """While inside, multiprocessing starts its forkserver through ``start(command, fds)``.

    ``start`` returns the pid of a child of this process that runs the Python source
    ``command`` (what multiprocessing would run as ``python -c command``) holding the file
    descriptors ``fds``, or None to have multiprocessing start the new interpreter itself.
    Other processes multiprocessing starts meanwhile (its resource tracker) start as usual.
    multiprocessing has no way to choose how the server process is made: it calls
    ``multiprocessing.util.spawnv_passfds``, which this replaces for the duration.
    """
    import multiprocessing.forkserver
    import multiprocessing.util

    util: Any = multiprocessing.util
    spawnv_passfds = util.spawnv_passfds

    def spawn(path: str, args: Sequence[str], passfds: Sequence[int]) -> int:
        command = args[-1]
        pid = None
        if len(args) >= 2 and args[-2] == "-c" and "multiprocessing.forkserver" in command:
            pid = start(command, passfds)
        return spawnv_passfds(path, args, passfds) if pid is None else pid

    util.spawnv_passfds = spawn
    try:
        yield
    finally:
        util.spawnv_passfds = spawnv_passfds


def forget_parent_multiprocessing() -> None:
    """In a fork that is to serve as a forkserver: forget the parent's forkserver and
    resource tracker, as a new interpreter would not know them.

    The fork is made while the parent holds the forkserver's lock and knows its own
    resource tracker's pid; left as they are, a rank that starts processes of its own would
    wait for that lock forever. Each object gets the state of a new one
    (``multiprocessing.forkserver._forkserver``, ``resource_tracker._resource_tracker``):
    the module-level functions are bound to these very objects, so they cannot be replaced.
    """
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    for module, name in (
        (multiprocessing.forkserver, "_forkserver"),
        (multiprocessing.resource_tracker, "_resource_tracker"),
    ):
        obj = getattr(module, name)
        obj.__dict__.clear()
        obj.__dict__.update(type(obj)().__dict__)


def bootstrapping() -> bool:
    """Whether this process is a multiprocessing child still importing its parent's main
    module (spawn and forkserver re-run it, as ``__mp_main__``, before the child's target).
    multiprocessing checks the private ``current_process()._inheriting`` and then raises a
    long generic error; the harness checks first to say what to do instead."""
    import multiprocessing

    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def environ_bytes() -> Mapping[bytes, bytes]:
    """The live ``os.environ`` as the bytes mapping it keeps (read it, never write it).

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


def _probe_forkserver_start() -> object:
    import inspect
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker
    import multiprocessing.util

    util: Any = multiprocessing.util
    source = inspect.getsource(multiprocessing.forkserver.ForkServer.ensure_running)
    if "util.spawnv_passfds(" not in source or "'-c'" not in source:
        raise AttributeError("the forkserver is no longer started by util.spawnv_passfds -c")
    fresh = (
        multiprocessing.forkserver.ForkServer().__dict__,
        multiprocessing.resource_tracker.ResourceTracker().__dict__,
    )
    return util.spawnv_passfds, fresh


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
    "multiprocessing.util.spawnv_passfds starts the forkserver; ForkServer(), "
    "ResourceTracker() as new": _probe_forkserver_start,
    "multiprocessing.current_process()._inheriting": _probe_inheriting,
    "os.environ._data (the bytes behind os.environ)": _probe_environ_bytes,
    "sys._getframe, sys._current_frames": _probe_frames,
}
