"""Where in the user's code a rank is: the call site of a collective, and the position of a
blocked thread, as a reader of a failure names them. This module runs INSIDE each rank;
:mod:`harness.rank.trace` uses it. It may import the stdlib, torch and ``harness.compat``
(frames are CPython's private API).

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


def is_call_site(path: str) -> bool:
    """Whether a frame of code in ``path`` is a call site a reader wants: anything but
    torch's implementation, the harness and :mod:`multiprocessing`. torch's own test code
    (``torch/testing``: PyTorch's distributed tests and their helpers) is a call site.

    Args:
        path: A frame's ``co_filename``.
    """
    if path.startswith(_TORCH_DIR):
        return path.startswith(_TORCH_TESTS_DIR)
    return not path.startswith(_NEVER_DIRS)


def call_site(frame: FrameType | None) -> tuple[str, int]:
    """Where the user called a collective, ``(file, line)``: from ``frame`` (the caller of
    the recorded function) outwards, the first frame that :func:`is_call_site`; where there
    is none (torch called it, and nothing but the harness called torch), the outermost frame
    outside the harness and multiprocessing, which names the torch function that was called;
    ``("?", 0)`` when there is neither."""
    outermost = None
    while frame is not None:
        path = frame.f_code.co_filename
        if is_call_site(path):
            return (path, frame.f_lineno)
        if path.startswith(_TORCH_DIR):
            outermost = frame
        frame = frame.f_back
    if outermost is None:
        return ("?", 0)
    return (outermost.f_code.co_filename, outermost.f_lineno)


_STDLIB_DIRS = tuple({sysconfig.get_paths()[name] + os.sep for name in ("stdlib", "platstdlib")})
_PACKAGE_DIRS = tuple({sysconfig.get_paths()[name] + os.sep for name in ("purelib", "platlib")})


def library(path: str) -> bool:
    """Whether a frame in ``path`` is torch's (its tests excepted, see
    :func:`is_call_site`), the harness's or the standard library's."""
    if not is_call_site(path):
        return True
    return path.startswith(_STDLIB_DIRS) and not path.startswith(_PACKAGE_DIRS)


def position(thread: int) -> str:
    """Where ``thread`` is, as a reader names it: ``"Event.wait at test_x.py:12"`` (the
    library function the user's code called), ``"time.sleep at test_x.py:30"`` (a C
    function: named from the source line), or '' when only library code is running."""
    frame = compat.frame_of_thread(thread)
    callee: FrameType | None = None
    while frame is not None and library(frame.f_code.co_filename):
        callee, frame = frame, frame.f_back
    if frame is None:
        return ""
    file, line = frame.f_code.co_filename, frame.f_lineno
    if callee is not None:
        code = callee.f_code
        what = getattr(code, "co_qualname", code.co_name)
    else:
        what = _called(linecache.getline(file, line))
    place = f"{os.path.basename(file)}:{line}"
    return f"{what} at {place}" if what else f"at {place}"


def _called(source: str) -> str:
    """The outermost function a line of source calls (``time.sleep``), '' when none."""
    try:
        tree = ast.parse(source.strip())
    except SyntaxError:
        return ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            try:
                return ast.unparse(node.func)
            except Exception:
                return ""
    return ""
