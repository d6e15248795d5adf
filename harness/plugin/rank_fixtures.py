"""Where a distributed test's fixtures run, and what its ranks are sent (controller side).

A fixture runs in the controller unless it must run in the ranks. It runs
inside each rank when it is

(a) one of the plugin's (``rank``, ``world_size``, ``local_rank``, ``local_device``);
(b) a fixture that requests, directly or through others, a fixture that runs in the ranks
    (so ``@pytest.fixture def tag(rank): ...`` just works);
(c) one of pytest's per-process built-ins (``monkeypatch``, ``capsys``, ``capsysbinary``,
    ``capfd``, ``capfdbinary``, ``caplog``, ``recwarn``);
(d) declared with :func:`harness.fixture`.

pytest's own fixtures are left where pytest runs them, whatever they request: ``tmp_path``
stays one directory of the controller, shared by every rank. Asking for ``request`` does not
move a fixture: it gets the controller's request there and a view of it in a rank. Nor does
asking for ``tmp_path_factory``: it is the session's, the same for every rank, so a
controller fixture built on it (the everyday "directory shared by all ranks") stays in the
controller and its value reaches every rank; the test body or a rank-side fixture that asks
for it gets a rank-side twin over the controller's base directory.

:func:`split` decides before pytest sets anything up, and takes the rank-side fixtures out of
the item's ``fixturenames`` so that pytest does not run them in the controller;
:func:`plan` then builds the :class:`~harness.protocol.messages.FixturePlan` from the
controller fixtures' values. The ranks run the plan in :mod:`harness.rank.fixtures`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import pytest

from harness import compat
from harness.controller.pickling import pickle_problem, short_repr
from harness.protocol.messages import (
    ARG_FIXTURE,
    ARG_REQUEST,
    ARG_VALUE,
    IN_RANKS_ATTR,
    PER_PROCESS_FIXTURES,
    PLUGIN_FIXTURES,
    Arg,
    FixturePlan,
    FunctionRef,
    RankFixture,
    RequestInfo,
    TestRef,
)

F = TypeVar("F", bound=Callable[..., Any])

_SCOPES = ("function", "class", "module", "package", "session")
_PLUGIN_MODULE = "harness.plugin"
_SHARED_FACTORY = "tmp_path_factory"


@overload
def fixture(function: F, /) -> F: ...


@overload
def fixture(
    function: None = None,
    /,
    *,
    scope: str = "function",
    params: Iterable[object] | None = None,
    autouse: bool = False,
    ids: Sequence[object] | Callable[[Any], object] | None = None,
    name: str | None = None,
) -> Callable[[F], F]: ...


def fixture(
    function: Callable[..., Any] | None = None,
    /,
    *,
    scope: str = "function",
    params: Iterable[object] | None = None,
    autouse: bool = False,
    ids: Sequence[object] | Callable[[Any], object] | None = None,
    name: str | None = None,
) -> Any:
    """Declare a pytest fixture that runs inside each rank of a distributed test.

    Use it for what only a rank can build and what should not travel by pickle: a
    ``DeviceMesh``, a model on the rank's device, a subgroup. It takes ``pytest.fixture``'s
    arguments; ``scope`` decides how long the value lives in each rank: ``"function"`` (one
    test), ``"class"``, ``"module"``, ``"package"`` or ``"session"`` (as long as the world's
    processes; a rebuilt world sets it up again). Code after ``yield`` runs in the rank.
    Controller fixtures it requests arrive pickled. Used by a test that is not distributed,
    it runs in the pytest process like any fixture. Example::

        @harness.fixture(scope="session")
        def mesh(world_size):
            from torch.distributed.device_mesh import init_device_mesh
            return init_device_mesh("cpu", (world_size,))

    Args:
        function: The fixture function, when used as ``@harness.fixture`` without arguments.
        scope, params, autouse, ids, name: As ``pytest.fixture``.

    Returns:
        The fixture, as ``pytest.fixture`` returns it (or a decorator making one).

    Raises:
        ValueError: ``scope`` is not one of the scopes above.
    """
    if scope not in _SCOPES:
        raise ValueError(f"scope must be one of {', '.join(map(repr, _SCOPES))}, not {scope!r}")

    def declare(function: Callable[..., Any]) -> Any:
        setattr(function, IN_RANKS_ATTR, True)
        scoped: Any = scope  # checked above; pytest's stubs want a Literal
        return pytest.fixture(
            function, scope=scoped, params=params, autouse=autouse, ids=ids, name=name
        )

    return declare(function) if function is not None else declare


@dataclass
class RankSide:
    """A distributed test's fixtures that run in the ranks, in setup order.

    Attributes:
        fixtures: The rank-side definitions (``pytest.FixtureDef``), each after the ones it
            requests.
        args: For every test argument and rank-side fixture argument, where it comes from.
    """

    fixtures: list[Any] = field(default_factory=list)
    keys: dict[int, str] = field(default_factory=dict)
    wants_request: bool = False

    def key(self, fixturedef: Any) -> str:
        return self.keys[id(fixturedef)]


def split(item: pytest.Function) -> RankSide:
    """Decide which of the test's fixtures run in the ranks; leave only the others in
    ``item.fixturenames`` for pytest to set up in the controller.

    Raises:
        pytest.fail.Exception: A fixture that must run in the ranks cannot (defined inside a
            function, where a rank cannot import it).
    """
    defs = compat.fixture_defs(item)
    decided: dict[int, bool] = {}
    side = RankSide()
    for name in item.fixturenames:
        chain = defs.get(name)
        if chain and _in_ranks(chain[-1], defs, decided):
            _add(chain[-1], side, defs, decided)
    factory = defs.get(_SHARED_FACTORY)
    if factory and _shared_factory(factory[-1]) and _SHARED_FACTORY in compat.test_argnames(item):
        _add(factory[-1], side, defs, decided)
    rank_names = {fixturedef.argname for fixturedef in side.fixtures}
    # The controller's tmp_path_factory is still set up: the ranks share its base directory.
    keep = {_SHARED_FACTORY}
    item.fixturenames = [n for n in item.fixturenames if n not in rank_names or n in keep]
    side.wants_request = "request" in compat.test_argnames(item) or any(
        "request" in fixturedef.argnames for fixturedef in side.fixtures
    )
    return side


def plan(
    item: pytest.Function, side: RankSide, request_info: Callable[[], RequestInfo]
) -> FixturePlan:
    """The plan the ranks get, once pytest has set up the controller's fixtures.

    Args:
        item: The test.
        side: What :func:`split` decided for it.
        request_info: Builds the ``request`` view's data (only called when it is needed).

    Raises:
        pytest.fail.Exception: A controller fixture's value does not pickle (naming it).
    """
    defs = compat.fixture_defs(item)
    values: dict[str, Any] = {}

    def source(name: str, requester: Any | None) -> Arg:
        if name == "request":
            return Arg(ARG_REQUEST)
        fixturedef = _dependency(requester, name, defs) if requester is not None else None
        if fixturedef is None:
            chain = defs.get(name)
            fixturedef = chain[-1] if chain else None
        if fixturedef is not None and id(fixturedef) in side.keys:
            return Arg(ARG_FIXTURE, side.key(fixturedef))
        if name not in values:
            value = item.funcargs[name]
            check_picklable(
                value,
                f"fixture {name!r}"
                + (f" (requested by {requester.argname!r})" if requester is not None else ""),
            )
            values[name] = value
        return Arg(ARG_VALUE, name)

    params = getattr(item, "callspec", None)
    params = params.params if params is not None else {}
    fixtures = tuple(
        RankFixture(
            key=side.key(fixturedef),
            name=fixturedef.argname,
            scope=str(fixturedef.scope),
            scope_key=scope_node(item, str(fixturedef.scope))[0],
            function=_reference(fixturedef),
            builtin=None if _reference(fixturedef) is not None else fixturedef.argname,
            args=tuple((arg, source(arg, fixturedef)) for arg in fixturedef.argnames),
            param=params.get(fixturedef.argname),
            has_param=fixturedef.argname in params and fixturedef.params is not None,
        )
        for fixturedef in side.fixtures
    )
    args = tuple((name, source(name, None)) for name in compat.test_argnames(item))
    basetemp = None
    if any(f.builtin == _SHARED_FACTORY for f in fixtures):
        basetemp = str(item.funcargs[_SHARED_FACTORY].getbasetemp())  # type: ignore[attr-defined]
    return FixturePlan(
        args=args,
        fixtures=fixtures,
        values=values,
        request=request_info() if side.wants_request else None,
        basetemp=basetemp,
    )


def scope_node(item: pytest.Item, scope: str) -> tuple[str, Any | None]:
    """The node a scope belongs to for this test (None and ``""`` for the session), as
    pytest finds it: a class scope outside a class is the module's."""
    kinds: dict[str, tuple[type[pytest.Item | pytest.Collector], ...]] = {
        "function": (pytest.Function,),
        "class": (pytest.Class, pytest.Module),
        "module": (pytest.Module,),
        "package": (pytest.Package,),
    }
    for kind in kinds.get(scope, ()):
        node = item.getparent(kind)
        if node is not None:
            return node.nodeid, node
    return "", None


def _in_ranks(fixturedef: Any, defs: Mapping[str, Sequence[Any]], decided: dict[int, bool]) -> bool:
    known = decided.get(id(fixturedef))
    if known is not None:
        return known
    decided[id(fixturedef)] = False  # a cycle (pytest reports it) decides nothing
    module = getattr(fixturedef.func, "__module__", "") or ""
    name = fixturedef.argname
    if module == _PLUGIN_MODULE and name in PLUGIN_FIXTURES:
        result = True
    elif module.startswith("_pytest."):
        result = name in PER_PROCESS_FIXTURES
    elif getattr(fixturedef.func, IN_RANKS_ATTR, False):
        result = True
    else:
        result = any(
            dependency is not None and _in_ranks(dependency, defs, decided)
            for dependency in (
                _dependency(fixturedef, arg, defs)
                for arg in fixturedef.argnames
                if arg != "request"
            )
        )
    decided[id(fixturedef)] = result
    return result


def _dependency(requester: Any, name: str, defs: Mapping[str, Sequence[Any]]) -> Any | None:
    """The definition ``requester`` gets for ``name``: the one before it for its own name
    (an overriding fixture requesting the one it overrides), else the test's."""
    chain = defs.get(name)
    if not chain:
        return None
    if name == requester.argname:
        index = list(chain).index(requester) if requester in chain else 0
        return chain[index - 1] if index > 0 else None
    return chain[-1]


def _add(
    fixturedef: Any, side: RankSide, defs: Mapping[str, Sequence[Any]], decided: dict[int, bool]
) -> None:
    """Add a rank-side fixture after the rank-side fixtures it requests."""
    if id(fixturedef) in side.keys:
        return
    side.keys[id(fixturedef)] = ""  # in progress: a cycle stops here
    for arg in fixturedef.argnames:
        dependency = _dependency(fixturedef, arg, defs) if arg != "request" else None
        if dependency is None:
            continue
        if _in_ranks(dependency, defs, decided) or _shared_factory(dependency):
            _add(dependency, side, defs, decided)
        elif arg == fixturedef.argname:
            pytest.fail(
                f"fixture {arg!r} runs in the ranks and requests the fixture of the same name "
                "that it overrides, which runs in the controller; give one of them another "
                "name",
                pytrace=False,
            )
    reference = _reference(fixturedef)
    if reference is None and not _builtin(fixturedef):
        pytest.fail(
            f"fixture {fixturedef.argname!r} must run in the ranks "
            f"({_why(fixturedef, defs, decided)}), but a rank cannot import it: it is defined "
            f"inside a function ({fixturedef.func.__qualname__}); define it at module or "
            "class level",
            pytrace=False,
        )
    side.keys[id(fixturedef)] = f"{fixturedef.argname}@{fixturedef.baseid}#{len(side.fixtures)}"
    side.fixtures.append(fixturedef)


def _shared_factory(fixturedef: Any) -> bool:
    """Whether this is pytest's own ``tmp_path_factory``: never a reason to move a fixture
    into the ranks, but a rank-side consumer gets it there (see the module's docstring)."""
    module = getattr(fixturedef.func, "__module__", "") or ""
    return fixturedef.argname == _SHARED_FACTORY and module.startswith("_pytest.")


def _builtin(fixturedef: Any) -> bool:
    module = getattr(fixturedef.func, "__module__", "") or ""
    return module == _PLUGIN_MODULE or module.startswith("_pytest.")


def _why(fixturedef: Any, defs: Mapping[str, Sequence[Any]], decided: dict[int, bool]) -> str:
    if getattr(fixturedef.func, IN_RANKS_ATTR, False):
        return "declared with harness.fixture"
    for arg in fixturedef.argnames:
        dependency = _dependency(fixturedef, arg, defs) if arg != "request" else None
        if dependency is not None and _in_ranks(dependency, defs, decided):
            return f"it requests {arg!r}"
    return "it is a per-process fixture"


def _reference(fixturedef: Any) -> FunctionRef | None:
    """Where a rank finds a user's fixture function; None for the built-ins (and for a
    function a rank cannot import)."""
    if _builtin(fixturedef):
        return None
    function = fixturedef.func
    qualname = getattr(function, "__qualname__", "")
    module_name = getattr(function, "__module__", None)
    if not module_name or "<locals>" in qualname:
        return None
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if module is None or path is None:
        return None
    return FunctionRef(module_name, path, qualname, compat.asserts_rewritten(module))


def reference(
    item: pytest.Function, function: str, instance_state: dict[str, Any] | None = None
) -> TestRef:
    """Where a rank finds a test: its module, the attribute path to its class there
    (``__qualname__``, or the name pytest collected it under: classes made by torch's
    ``instantiate_device_type_tests`` are module attributes under another name) and the
    name of its function.

    Args:
        item: The test.
        function: The function's (or method's) name in its module or class.
        instance_state: The test class instance's ``__dict__`` to give the rank's instance.
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
    return TestRef(
        module=module.__name__,
        path=module.__file__,
        cls=path,
        function=function,
        sys_path=tuple(sys.path),
        rewrite=compat.asserts_rewritten(module),
        instance_state=instance_state,
    )


def check_picklable(value: Any, what: str) -> None:
    """Fail the test, naming ``what``, when ``value`` does not pickle."""
    problem = pickle_problem(value)
    if problem is None:
        return
    pytest.fail(
        f"{what} cannot be sent to the ranks: its value {short_repr(value)} does not pickle "
        f"({problem})",
        pytrace=False,
    )
