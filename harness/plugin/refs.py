"""Where a rank finds the functions it runs, and the values that must pickle on the way.

A rank imports a test, or a user's fixture, by reference (module, file, attribute path)
rather than receiving the function by pickle; the values it is sent must pickle, and
:func:`check_picklable` fails the test, naming the one that does not.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from harness import compat
from harness.controller.pickling import pickle_problem
from harness.protocol.pytest_calls import FunctionRef, TestRef
from harness.validate import short_repr


def reference(item: pytest.Function, function: str, *, state: bool = False) -> TestRef:
    """Where a rank finds a test: its module, the attribute path to its class there
    (``__qualname__``, or the name pytest collected it under: classes made by torch's
    ``instantiate_device_type_tests`` are module attributes under another name) and the
    name of its function.

    Args:
        item: The test.
        function: The function's (or method's) name in its module or class.
        state: Whether to send the test class instance's ``__dict__`` (what xunit-style
            setup methods put there) for the rank's instance.

    Raises:
        pytest.fail.Exception: ``state``, and an attribute's value does not pickle.
    """
    module = item.module
    assert module is not None
    assert module.__file__ is not None
    cls = item.cls
    path = None
    if cls is not None:
        path = cls.__qualname__
        owner: Any = module
        for part in path.split("."):
            owner = getattr(owner, part, None)
        if owner is not cls:
            path = item.parent.name if item.parent is not None else cls.__name__
    instance_state = None
    if state and cls is not None and item.instance is not None and vars(item.instance):
        instance_state = dict(vars(item.instance))
        for name, value in instance_state.items():
            check_picklable(
                value,
                f"attribute {name!r} of the test class instance",
                "build it in the test, or in a @harness.fixture (each rank builds its own), "
                "or make it picklable",
            )
    return TestRef(
        module=module.__name__,
        path=module.__file__,
        cls=path,
        function=function,
        sys_path=tuple(sys.path),
        rewrite=compat.asserts_rewritten(module),
        instance_state=instance_state,
    )


def function_ref(function: Callable[..., Any]) -> FunctionRef | None:
    """Where a rank finds a function defined at module or class level (None for one it
    cannot import: defined inside a function, or in a module without a file)."""
    qualname = getattr(function, "__qualname__", "")
    module = sys.modules.get(getattr(function, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if module is None or path is None or "<locals>" in qualname:
        return None
    return FunctionRef(module.__name__, path, qualname, compat.asserts_rewritten(module))


def check_picklable(value: Any, what: str, fix: str) -> None:
    """Fail the test, naming ``what`` and saying how to ``fix`` it, when ``value`` does not
    pickle."""
    problem = pickle_problem(value)
    if problem is None:
        return
    pytest.fail(
        f"{what} cannot be sent to the ranks: its value {short_repr(value)} does not pickle "
        f"({problem}); {fix}",
        pytrace=False,
    )
