"""Where a rank is in the user's code.

Places are named as a reader of a failure names them: the call site of a collective, the
position of a blocked thread, the line that raised a skip (frames are CPython's private API,
read through ``harness.compat``).

A reader wants the first frame outside the libraries between their code and the collective:
torch's implementation, the harness and :mod:`multiprocessing` (:func:`is_call_site`); for a
blocked thread, the standard library too (:func:`library`).
"""

from __future__ import annotations

import ast
import linecache
import multiprocessing
import os
import sysconfig
from types import FrameType

import torch

from harness import compat

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_TORCH_TESTS_DIR = _TORCH_DIR + "testing" + os.sep
# The harness's frames, and multiprocessing's (the bootstrap below a rank's loop, and
# below the processes of a MultiProcessTestCase), are never what the user called from.
_NEVER_DIRS = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.path.abspath(multiprocessing.__file__)) + os.sep,
)
_PATHS = sysconfig.get_paths()
_STDLIB_DIRS = tuple({_PATHS[name] + os.sep for name in ("stdlib", "platstdlib")})
_PACKAGE_DIRS = tuple({_PATHS[name] + os.sep for name in ("purelib", "platlib")})
_PYTEST = ("pytest", "_pytest")


def is_call_site(path: str) -> bool:
    """Whether code in ``path`` can be a call site.

    ``path`` is a frame's ``co_filename``. Anything but torch's implementation, the harness and
    :mod:`multiprocessing` can. torch's own test code (``torch/testing``: PyTorch's
    distributed tests and their helpers) can.
    """
    if path.startswith(_TORCH_DIR):
        return path.startswith(_TORCH_TESTS_DIR)
    return not path.startswith(_NEVER_DIRS)


def in_stdlib(path: str) -> bool:
    """Whether a frame in ``path`` is the standard library's.

    A package installed there is not.
    """
    return path.startswith(_STDLIB_DIRS) and not path.startswith(_PACKAGE_DIRS)


def library(path: str) -> bool:
    """Whether a frame in ``path`` is library code.

    That is, no call site, or the standard library's.
    """
    return not is_call_site(path) or in_stdlib(path)


def call_site(frame: FrameType | None) -> tuple[str, int]:
    """Where the user called a collective, as ``(file, line)``.

    From ``frame`` (the caller of the recorded function) outwards, the first frame that
    :func:`is_call_site`; where there is none (torch called it, and nothing but the harness
    called torch), the outermost torch frame, which names the torch function that was
    called; else ``("?", 0)``.
    """
    outermost = None
    while frame is not None:
        path = frame.f_code.co_filename
        if is_call_site(path):
            return (path, frame.f_lineno)
        if path.startswith(_TORCH_DIR):
            outermost = frame
        frame = frame.f_back
    return ("?", 0) if outermost is None else (outermost.f_code.co_filename, outermost.f_lineno)


def raised_at(exc: BaseException) -> tuple[str, int] | None:
    """Where the user's code raised ``exc``, as ``(file, line)``.

    It is the innermost frame of its traceback that :func:`is_call_site`, outside the standard
    library and pytest (whose ``pytest.skip()`` raises the exception its caller means); None
    where there is none.
    """
    found = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if not library(code.co_filename) and module.partition(".")[0] not in _PYTEST:
            found = (code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return found


def position(thread: int) -> str:
    """Where ``thread`` is, as a reader names it.

    It reads ``"Event.wait at test_x.py:12"`` (the library function the user's code called),
    ``"time.sleep at test_x.py:30"`` (a C function: named from the source line), or '' when
    only library code is running.
    """
    frame = compat.frame_of_thread(thread)
    callee: FrameType | None = None
    while frame is not None and library(frame.f_code.co_filename):
        callee, frame = frame, frame.f_back
    if frame is None:
        return ""
    file, line = frame.f_code.co_filename, frame.f_lineno
    if callee is not None:
        what = getattr(callee.f_code, "co_qualname", callee.f_code.co_name)
    else:
        what = _called(linecache.getline(file, line))
    place = f"{os.path.basename(file)}:{line}"
    return f"{what} at {place}" if what else f"at {place}"


def _called(source: str) -> str:
    """The outermost function a line of source calls.

    For example ``time.sleep``; '' when none.
    """
    try:
        call = next(n for n in ast.walk(ast.parse(source.strip())) if isinstance(n, ast.Call))
        return ast.unparse(call.func)
    except Exception:  # no call, or not a line of Python
        return ""
