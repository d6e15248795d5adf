"""Where a test body runs: this module's ``run_test`` executes INSIDE each rank.

The controller (:mod:`harness.plugin`) sends a reference to the test function (module name,
file, class and function name), never the function object, and the fixture values it set
up. Here the module is imported the way pytest imported it in the controller (with its
``sys.path``, and with pytest's assertion rewriting when the controller's copy was
rewritten), the class (if any) is instantiated, the rank-side fixtures are filled in, and
the body is called.

What it may import: the standard library, ``torch``, ``fhelium.distributed`` and pytest's
assertion rewriter. The controller imports it only for ``TestRef`` and ``RankValue``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.util
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

RANK_FIXTURES = ("rank", "world_size", "local_rank", "local_device")
"""Fixtures whose value only a rank knows; the controller sends ``RankValue`` placeholders."""


@dataclass(frozen=True)
class RankValue:
    """Placeholder for a rank-side fixture, replaced by its value inside each rank."""

    name: str

    def __repr__(self) -> str:
        return f"<{self.name}: filled in inside each rank>"


@dataclass(frozen=True)
class TestRef:
    """How to find a test function inside a rank.

    Attributes:
        module: The module's name in the controller's ``sys.modules``.
        path: The module's file.
        cls: Qualified name of the test class, or None for a plain function.
        function: The function's name in its module or class.
        sys_path: The controller's ``sys.path`` when the test ran.
        rewrite: Whether pytest rewrote the module's asserts in the controller.
        instance_state: The controller's test-class instance ``__dict__`` (what xunit-style
            ``setup_method`` put there), copied onto the rank's instance.
    """

    __test__ = False  # not a test class, whatever pytest's collection patterns say

    module: str
    path: str
    cls: str | None
    function: str
    sys_path: tuple[str, ...]
    rewrite: bool
    instance_state: dict[str, Any] | None = None


def run_test(ref: TestRef, kwargs: dict[str, Any]) -> None:
    """Call the referenced test with ``kwargs``, rank-side fixtures filled in."""
    module = _import(ref)
    owner: Any = module
    if ref.cls is not None:
        for part in ref.cls.split("."):
            owner = getattr(owner, part)
        owner = owner()
        if ref.instance_state:
            owner.__dict__.update(ref.instance_state)
    function = getattr(owner, ref.function)
    function(**{name: _fill(value) for name, value in kwargs.items()})


def _fill(value: Any) -> Any:
    if not isinstance(value, RankValue):
        return value
    import torch.distributed as dist

    import fhelium.distributed

    if value.name == "rank":
        return dist.get_rank()
    if value.name == "world_size":
        return dist.get_world_size()
    if value.name == "local_rank":
        return int(os.environ.get("LOCAL_RANK", "0"))
    return fhelium.distributed.local_device()


def _import(ref: TestRef) -> ModuleType:
    loaded = sys.modules.get(ref.module)
    if loaded is not None and _same_file(getattr(loaded, "__file__", None), ref.path):
        return loaded
    sys.path[:0] = [entry for entry in ref.sys_path if entry not in sys.path]
    if not ref.rewrite:
        try:
            module = importlib.import_module(ref.module)
            if _same_file(getattr(module, "__file__", None), ref.path):
                return module
        except ImportError:
            pass
    # Load from the file under the controller's name (pytest's importlib mode does the same),
    # rewriting asserts when pytest did, so a failing assert explains itself here too.
    loader = _RewritingLoader(ref.path) if ref.rewrite else None
    spec = importlib.util.spec_from_file_location(ref.module, ref.path, loader=loader)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import test module {ref.module!r} from {ref.path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[ref.module] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[ref.module]
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
        from _pytest.assertion.rewrite import rewrite_asserts

        with open(self._path, "rb") as handle:
            source = handle.read()
        tree = ast.parse(source, filename=self._path)
        rewrite_asserts(tree, source, self._path)
        code = compile(tree, self._path, "exec", dont_inherit=True)
        exec(code, module.__dict__)
