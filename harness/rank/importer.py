"""A test's module and its fixtures' functions, imported in a rank as the controller did.

The controller names a test (:class:`~harness.protocol.pytest_calls.TestRef`) and its
fixtures' functions (:class:`~harness.protocol.pytest_calls.FunctionRef`) by module name
and file. An :class:`Importer`, one per rank (on its
:class:`~harness.rank.context.RankContext`), imports each module under the controller's
name from the controller's file, with pytest's assertion rewriting where the controller's
copy has it, and keeps what it found for the rank's later tests.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from harness import compat
from harness.protocol.pytest_calls import FunctionRef, TestRef


class Importer:
    """Imports test modules for one rank, and keeps the modules it found."""

    def __init__(self) -> None:
        # The module found for each (name, file): looked for once, not at every test of it
        # (checking that a module comes from a file costs two ``stat`` calls).
        self._found: dict[tuple[str, str], ModuleType] = {}

    def test_module(self, ref: TestRef) -> ModuleType:
        """Import a referenced test's module as the controller did.

        With its ``sys.path`` first (kept for what the body imports later, until the call
        ends), and pytest's assertion rewriting where the controller's copy has it.
        """
        missing = set(ref.sys_path).difference(sys.path)
        sys.path[:0] = [entry for entry in ref.sys_path if entry in missing]
        return self._import(ref.module, ref.path, ref.rewrite)

    def fixture_function(self, ref: FunctionRef) -> Callable[..., Any]:
        """The function behind a fixture: pytest's decorator wraps it (``__wrapped__``)."""
        module: Any = self._import(ref.module, ref.path, ref.rewrite)
        owner = functools.reduce(inspect.getattr_static, ref.qualname.split("."), module)
        function: Callable[..., Any] = inspect.unwrap(owner)
        return function

    def _import(self, name: str, path: str, rewrite: bool) -> ModuleType:
        """The module ``name`` from the controller's file ``path``, looked for once."""
        loaded = sys.modules.get(name)
        if loaded is not None and self._found.get((name, path)) is loaded:
            return loaded
        module = self._found[(name, path)] = _find(name, path, rewrite, loaded)
        return module


def _find(name: str, path: str, rewrite: bool, loaded: ModuleType | None) -> ModuleType:
    if loaded is not None and _same_file(getattr(loaded, "__file__", None), path):
        return loaded
    if not rewrite:
        with contextlib.suppress(ImportError):
            module = importlib.import_module(name)
            if _same_file(getattr(module, "__file__", None), path):
                return module
    # Load from the file under the controller's name (pytest's importlib mode does the same),
    # rewriting asserts when pytest did, so a failing assert explains itself here too.
    loader = _RewritingLoader(path) if rewrite else None
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import module {name!r} from {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _same_file(a: str | None, b: str) -> bool:
    try:
        return a is not None and os.path.samefile(a, b)
    except OSError:
        return False


class _RewritingLoader(importlib.abc.Loader):
    """Execute a test module with pytest's assertion rewriting applied."""

    def __init__(self, path: str) -> None:
        self._path = path

    def exec_module(self, module: ModuleType) -> None:
        with open(self._path, "rb") as handle:
            source = handle.read()
        tree = ast.parse(source, filename=self._path)
        compat.rewrite_asserts(tree, source, self._path)
        code = compile(tree, self._path, "exec", dont_inherit=True)
        exec(code, module.__dict__)
