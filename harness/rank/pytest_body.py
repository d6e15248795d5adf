"""Where a pytest test body runs in a rank: :func:`run_pytest_test`.

The plugin sends a :class:`~harness.protocol.pytest_calls.TestRef` (never the function
object) and a :class:`~harness.protocol.pytest_calls.FixturePlan`. Here the module is
imported the way pytest imported it in the controller, the class (if any) is instantiated,
the rank-side fixtures are set up, the body is called, and they are torn down: after a
failure, only once the controller heard of it (:func:`harness.rank.loop.report_failing`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import itertools
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from harness import compat
from harness.protocol.failures import TIMES_ATTR
from harness.protocol.pytest_calls import FixturePlan, FunctionRef, TestRef
from harness.rank import fixtures, logs


def run_pytest_test(ref: TestRef, plan: FixturePlan) -> tuple[float, float, float]:
    """Run a pytest test with its rank-side fixtures, its log records captured.

    Raises what the test raised, or what a fixture raised marked with its phase.

    Returns:
        The seconds spent in the test's setup, call and teardown, as pytest reports its
        phases' durations; they are set on what it raises too (``TIMES_ATTR``).
    """
    marks = [time.perf_counter()]  # when setup, call and teardown started
    with logs.captured(plan.logs):
        try:
            _run(ref, plan, marks)
        except BaseException as exc:
            # An exception type with __slots__ takes no attribute: its phases are not told apart.
            with contextlib.suppress(AttributeError, TypeError):
                setattr(exc, TIMES_ATTR, _times(marks))
            raise
    return _times(marks)


def _run(ref: TestRef, plan: FixturePlan, marks: list[float]) -> None:
    module = import_test_module(ref)
    cls: Any = None
    instance: Any = None
    if ref.cls is not None:
        cls = functools.reduce(getattr, ref.cls.split("."), module)
        instance = cls()
        if ref.instance_state:
            instance.__dict__.update(ref.instance_state)
    function = getattr(module if instance is None else instance, ref.function)
    if not plan.args and not plan.fixtures:
        _enter("call", marks)
        function()  # nothing to set up or tear down
        return
    test = {"module": module, "cls": cls, "instance": instance, "function": function}
    # Here, not at the top: the controller imports this module too (through mptc_body, for
    # --dist-mptc), and needs no rank loop.
    from harness.rank import loop

    setup = fixtures.Setup(plan, test, _load_fixture, failing=loop.report_failing)
    kwargs = setup.arguments()
    _enter("call", marks)
    try:
        function(**kwargs)
    except BaseException as exc:
        # The controller hears of the failure before the teardown, which may take long or
        # be cut short: this rank's failure is the root cause when it came first.
        loop.report_failing(exc)
        _enter("teardown", marks)
        setup.teardown(quiet=True)
        raise
    _enter("teardown", marks)
    setup.teardown()


def _enter(phase: str, marks: list[float]) -> None:
    marks.append(time.perf_counter())
    logs.phase(phase)


def _times(marks: list[float]) -> tuple[float, float, float]:
    """The seconds from each mark to the next (the last: until now); 0 for a phase not reached."""
    points = [*marks, time.perf_counter()]
    spans = [end - start for start, end in itertools.pairwise(points)]
    setup, call, teardown = [*spans, 0.0, 0.0][:3]
    return (setup, call, teardown)


def _load_fixture(ref: FunctionRef) -> Callable[..., Any]:
    """The function behind a fixture: pytest's decorator wraps it (``__wrapped__``)."""
    module: Any = _import(ref.module, ref.path, ref.rewrite)
    owner = functools.reduce(inspect.getattr_static, ref.qualname.split("."), module)
    function: Callable[..., Any] = inspect.unwrap(owner)
    return function


def import_test_module(ref: TestRef) -> ModuleType:
    """Import a referenced test's module as the controller did.

    With its ``sys.path`` first (kept for what the body imports later, until the call ends),
    and pytest's assertion rewriting where the controller's copy has it.
    """
    missing = set(ref.sys_path).difference(sys.path)
    sys.path[:0] = [entry for entry in ref.sys_path if entry in missing]
    return _import(ref.module, ref.path, ref.rewrite)


# The module found for each (name, file): looked for once, not at every test of it
# (checking that a module comes from a file costs two ``stat`` calls). A cache of this
# process's imports, as ``sys.modules`` is: module-level.
_imported: dict[tuple[str, str], ModuleType] = {}


def _import(name: str, path: str, rewrite: bool) -> ModuleType:
    """The module ``name`` from the controller's file ``path``, looked for once."""
    loaded = sys.modules.get(name)
    if loaded is not None and _imported.get((name, path)) is loaded:
        return loaded
    module = _imported[(name, path)] = _find(name, path, rewrite, loaded)
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
