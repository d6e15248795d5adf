"""Where a distributed test's fixtures run, and the plan its ranks get (controller side).

A fixture runs in the controller unless it runs inside each rank: one of the plugin's
(``rank``, ``world_size``, ``local_rank``, ``local_device``), one of pytest's per-process
built-ins (``PER_PROCESS_FIXTURES``: ``monkeypatch``, ``capsys``, ...), one declared with
:func:`harness.fixture`, or one that requests such a fixture, directly or through others.
pytest's other fixtures stay where pytest runs them, whatever they request: ``tmp_path`` is
one directory of the controller, shared by every rank. Asking for ``request`` moves nothing
(a rank gets a view of it), nor does asking for ``tmp_path_factory``: it is the session's,
the same for every rank, so a controller fixture built on it stays in the controller; a
rank-side consumer gets a twin over its base directory.

:func:`split` decides before pytest sets anything up, and takes the rank-side fixtures out of
the item's ``fixturenames``; :func:`plan` then builds the ranks'
:class:`~harness.protocol.pytest_calls.FixturePlan` (run in :mod:`harness.rank.fixtures`).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

import pytest

from harness import compat
from harness.controller.pickling import picklable
from harness.plugin import refs
from harness.protocol.pytest_calls import (
    ARG_FIXTURE,
    ARG_REQUEST,
    ARG_VALUE,
    IN_RANKS_ATTR,
    PER_PROCESS_FIXTURES,
    PLUGIN_FIXTURES,
    Arg,
    FixturePlan,
    FunctionRef,
    LogSettings,
    RankFixture,
    RequestInfo,
)

F = TypeVar("F", bound=Callable[..., Any])

_SCOPES = ("function", "class", "module", "package", "session")
_PLUGIN_MODULE = "harness.plugin.fixtures"  # where the plugin's own fixtures are defined
_SHARED_FACTORY = "tmp_path_factory"
_CONFIG_VIEW = pytest.StashKey[bytes]()


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


class RankSide:
    """A distributed test's fixtures that run in the ranks, as :func:`split` finds them.

    Attributes:
        fixtures: Their definitions (``pytest.FixtureDef``), each after those it requests.
        keys: Each one's key in the plan, by ``id()`` of its definition.
        wants_request: Whether the test or one of them asks for ``request``.
    """

    def __init__(self, defs: Mapping[str, Sequence[Any]]) -> None:
        self.fixtures: list[Any] = []
        self.keys: dict[int, str] = {}
        self.wants_request = False
        self._defs = defs
        self._why: dict[int, str] = {}

    def why(self, fixturedef: Any) -> str:
        """Why the fixture runs in the ranks ('' when it does not)."""
        known = self._why.get(id(fixturedef))
        if known is not None:
            return known
        self._why[id(fixturedef)] = ""  # a cycle (pytest reports it) decides nothing
        module = _module(fixturedef)
        name = fixturedef.argname
        if module == _PLUGIN_MODULE and name in PLUGIN_FIXTURES:
            why = "it is the plugin's"
        elif module.startswith("_pytest."):
            why = "it is a per-process fixture" if name in PER_PROCESS_FIXTURES else ""
        elif getattr(fixturedef.func, IN_RANKS_ATTR, False):
            why = "declared with harness.fixture"
        else:
            requests = self._requests(fixturedef)
            why = next((f"it requests {arg!r}" for arg, dep in requests if self.why(dep)), "")
        self._why[id(fixturedef)] = why
        return why

    def add(self, fixturedef: Any) -> None:
        """Add a rank-side fixture after the rank-side fixtures it requests."""
        if id(fixturedef) in self.keys:
            return
        self.keys[id(fixturedef)] = ""  # in progress: a cycle stops here
        for arg, dependency in self._requests(fixturedef):
            if self.why(dependency) or _shared_factory(dependency):
                self.add(dependency)
            elif arg == fixturedef.argname:
                pytest.fail(
                    f"fixture {arg!r} runs in the ranks and requests the fixture of the same "
                    "name that it overrides, which runs in the controller; give one of them "
                    "another name",
                    pytrace=False,
                )
        if _function_ref(fixturedef) is None and not _builtin(fixturedef):
            pytest.fail(
                f"fixture {fixturedef.argname!r} must run in the ranks "
                f"({self.why(fixturedef)}), but a rank cannot import it: it is defined "
                f"inside a function ({fixturedef.func.__qualname__}); define it at module or "
                "class level",
                pytrace=False,
            )
        self.keys[id(fixturedef)] = f"{fixturedef.argname}@{fixturedef.baseid}#{len(self.fixtures)}"
        self.fixtures.append(fixturedef)

    def dependency(self, requester: Any | None, name: str) -> Any | None:
        """The definition ``requester`` (None: the test) gets for ``name``: the one before
        it for its own name (an overriding fixture requesting the one it overrides), else
        the test's."""
        chain = self._defs.get(name)
        if not chain or requester is None or name != requester.argname:
            return chain[-1] if chain else None
        index = list(chain).index(requester) if requester in chain else 0
        return chain[index - 1] if index > 0 else None

    def _requests(self, fixturedef: Any) -> Iterator[tuple[str, Any]]:
        """The fixtures ``fixturedef`` requests (not ``request``), by argument."""
        for arg in fixturedef.argnames:
            dependency = self.dependency(fixturedef, arg) if arg != "request" else None
            if dependency is not None:
                yield arg, dependency


_SIDE = pytest.StashKey[RankSide]()
"""An item's :class:`RankSide`, kept by :func:`split` for :func:`plan`."""


def split(item: pytest.Function) -> None:
    """Decide which of the test's fixtures run in the ranks (once: a rerun finds pytest's
    part already trimmed); leave only the others in ``item.fixturenames`` for pytest to set
    up in the controller.

    Raises:
        pytest.fail.Exception: A fixture that must run in the ranks cannot (defined inside a
            function, where a rank cannot import it).
    """
    if _SIDE in item.stash:
        return
    defs = compat.fixture_defs(item)
    side = RankSide(defs)
    for name in item.fixturenames:
        chain = defs.get(name)
        if chain and side.why(chain[-1]):
            side.add(chain[-1])
    argnames = compat.test_argnames(item)
    factory = defs.get(_SHARED_FACTORY)
    if factory and _shared_factory(factory[-1]) and _SHARED_FACTORY in argnames:
        side.add(factory[-1])
    rank_names = {fixturedef.argname for fixturedef in side.fixtures}
    # The controller's tmp_path_factory is still set up: the ranks share its base directory.
    item.fixturenames = [
        n for n in item.fixturenames if n not in rank_names or n == _SHARED_FACTORY
    ]
    # A built-in's arguments are pytest's, not the rank's (builtin_fixtures makes its value):
    # `rank` alone asks for no request, nor the ranks' view of the config it carries.
    side.wants_request = "request" in argnames or any(
        "request" in fixturedef.argnames for fixturedef in side.fixtures if not _builtin(fixturedef)
    )
    item.stash[_SIDE] = side


def plan(item: pytest.Function, logs: LogSettings | None = None) -> FixturePlan:
    """The plan the ranks get for a test (after :func:`split`), once pytest has set up the
    controller's fixtures; ``logs``: how the ranks capture its log records.

    Raises:
        pytest.fail.Exception: A controller fixture's value does not pickle (naming it).
    """
    side = item.stash[_SIDE]
    values: dict[str, Any] = {}

    def source(name: str, requester: Any | None) -> Arg:
        if name == "request":
            return Arg(ARG_REQUEST)
        fixturedef = side.dependency(requester, name)
        if fixturedef is not None and id(fixturedef) in side.keys:
            return Arg(ARG_FIXTURE, side.keys[id(fixturedef)])
        if name not in values:
            value = item.funcargs[name]
            by = f" (requested by {requester.argname!r})" if requester is not None else ""
            fix = (
                "declare it with @harness.fixture instead of @pytest.fixture, so that each "
                "rank builds its own value, or make its value picklable"
            )
            refs.check_picklable(value, f"fixture {name!r}{by}", fix)
            values[name] = value
        return Arg(ARG_VALUE, name)

    params = getattr(item, "callspec", None)
    params = params.params if params is not None else {}
    fixtures = tuple(
        RankFixture(
            key=side.keys[id(fixturedef)],
            name=fixturedef.argname,
            scope=str(fixturedef.scope),
            scope_key=scope_node(item, str(fixturedef.scope))[0],
            function=_function_ref(fixturedef),
            builtin=None if _function_ref(fixturedef) is not None else fixturedef.argname,
            args=()
            if _builtin(fixturedef)
            else tuple((arg, source(arg, fixturedef)) for arg in fixturedef.argnames),
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
        request=_request_info(item) if side.wants_request else None,
        basetemp=basetemp,
        logs=logs,
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


def _request_info(item: pytest.Function) -> RequestInfo:
    """What the ranks' view of ``request`` answers: of the config, the values that pickle
    (found once per session)."""
    config = item.config
    view = config.stash.get(_CONFIG_VIEW, None)
    if view is None:
        options = {k: v for k, v in vars(config.option).items() if picklable(v)}
        ini: dict[str, Any] = {}
        for name in compat.ini_names(config):
            try:
                value = config.getini(name)
            except Exception:
                continue
            if picklable(value):
                ini[name] = value
        view = config.stash[_CONFIG_VIEW] = pickle.dumps((options, ini))
    marks = tuple(mark for mark in item.iter_markers() if picklable(mark))
    return RequestInfo(item.name, item.nodeid, marks, view)


def _module(fixturedef: Any) -> str:
    return getattr(fixturedef.func, "__module__", "") or ""


def _shared_factory(fixturedef: Any) -> bool:
    """Whether this is pytest's own ``tmp_path_factory``: never a reason to move a fixture
    into the ranks, but a rank-side consumer gets it there (see the module's docstring)."""
    return fixturedef.argname == _SHARED_FACTORY and _module(fixturedef).startswith("_pytest.")


def _builtin(fixturedef: Any) -> bool:
    return _module(fixturedef) == _PLUGIN_MODULE or _module(fixturedef).startswith("_pytest.")


def _function_ref(fixturedef: Any) -> FunctionRef | None:
    """Where a rank finds a user's fixture function (None for the built-ins)."""
    return None if _builtin(fixturedef) else refs.function_ref(fixturedef.func)
