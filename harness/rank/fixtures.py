"""Fixtures that run inside the ranks, and their ``request`` view.

The controller sends a test's rank-side fixtures (``RankFixture``, each after those it
requests) in a ``FixturePlan``. Each is set up from its arguments as pytest would: a plain
function's return value, or a generator's first ``yield`` with the rest run at teardown.
Function-scoped fixtures end with the call that runs the test; wider ones stay alive in
this process (:class:`Scopes`, on the rank's context), keyed by the node id of their scope,
until the controller ends that scope (:meth:`Scopes.end`, a call of its own) or the process
ends. A fixture that raises marks the exception with its phase (``PHASE_ATTR``): the test's
setup or teardown error.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import pickle
import sys
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from harness import compat
from harness.protocol.failures import PHASE_ATTR
from harness.protocol.pytest_calls import (
    ARG_FIXTURE,
    ARG_VALUE,
    Arg,
    FixturePlan,
    FunctionRef,
    RankFixture,
    RequestInfo,
)
from harness.rank import builtin_fixtures
from harness.rank.leaks import Watch


@dataclass
class _Live:
    """A fixture set up in this rank and its ending."""

    name: str
    param: Any = None
    value: Any = None
    finalizers: list[Callable[[], object]] = field(default_factory=list)
    groups: set[Any] = field(default_factory=set)


class Scopes:
    """The fixtures of a wider scope than a function alive in one rank, until their scope ends.

    Attributes:
        live: Each fixture, by ``(key, scope_key)``, in setup order.
    """

    def __init__(self) -> None:
        self.live: dict[tuple[str, str], _Live] = {}

    def groups(self) -> set[Any]:
        """The process groups that the live fixtures made: they outlive calls."""
        return set().union(*(live.groups for live in self.live.values()))

    def end(self, scope_keys: list[str] | None) -> None:
        """End the fixtures of these scopes (None: all), newest first.

        Raises:
            BaseException: The first error a teardown raised, marked as a teardown error.
        """
        ending = [key for key in self.live if scope_keys is None or key[1] in scope_keys]
        _finish(reversed([self.live.pop(key) for key in ending]), quiet=False)


class Setup:
    """The fixtures of one test call in this rank.

    Args:
        test: What a ``request`` view says about the test (``module``, ``cls``,
            ``instance``, ``function``).
        load: Finds a fixture function from its reference (the test module's importer).
        failing: Called with a setup error (marked) before the fixtures already set up are
            torn down: their teardown may take long, the controller hears of the error first.
        scopes: The rank's fixtures of a wider scope: where they are found and kept.
        watch: The call's leak watch: what a wider-scoped fixture starts or opens is meant
            to outlive the call (None: the call is watched for none).
    """

    def __init__(
        self,
        plan: FixturePlan,
        test: dict[str, Any],
        load: Callable[[FunctionRef], Callable[..., Any]],
        failing: Callable[[BaseException], None],
        scopes: Scopes,
        watch: Watch | None = None,
    ) -> None:
        self._plan, self._test, self._load, self._failing = plan, test, load, failing
        self._scopes, self._watch = scopes, watch
        self._values: dict[str, Any] = {}
        self._function_scoped: list[_Live] = []

    def arguments(self) -> dict[str, Any]:
        """Set up every rank-side fixture; return the test's arguments.

        Raises:
            BaseException: What a fixture raised, marked as a setup error; the fixtures
                already set up for this call are torn down first.
        """
        try:
            for fixture in self._plan.fixtures:
                self._values[fixture.key] = self._value(fixture)
            return {name: self._resolve(arg, None) for name, arg in self._plan.args}
        except BaseException as exc:
            _mark(exc, "setup")
            self._failing(exc)
            self.teardown(quiet=True)
            raise

    def teardown(self, *, quiet: bool = False) -> None:
        """End the function-scoped fixtures, last set up first; with ``quiet`` (the test
        failed) their errors only go to stderr.

        Raises:
            BaseException: The first error a teardown raised, marked as a teardown error
                (the others go to stderr).
        """
        live, self._function_scoped = self._function_scoped, []
        _finish(reversed(live), quiet=quiet)

    def _value(self, fixture: RankFixture) -> Any:
        live = _Live(fixture.name, fixture.param)
        if fixture.scope == "function":
            # Listed before the setup runs: a request.addfinalizer call made by a fixture
            # that then raises still runs, as in pytest.
            self._function_scoped.append(live)
            return self._set_up(fixture, live)
        wide = self._scopes.live
        identity = (fixture.key, fixture.scope_key)
        cached = wide.get(identity)
        if cached is not None:
            if not fixture.has_param or _same(cached.param, fixture.param):
                return cached.value
            _finish([wide.pop(identity)], quiet=False)  # another param: pytest ends the old
        wide[identity] = live
        before = compat.live_process_groups()
        try:
            # What it starts or opens ends with its scope, not with this test: no leak.
            with self._watch.lasting() if self._watch else contextlib.nullcontext():
                value = self._set_up(fixture, live)
        except BaseException:
            # Not cached: the next test sets it up again (after a skip the rank lives on).
            _finish([wide.pop(identity)], quiet=True)
            raise
        # Process groups it made (a mesh's, a subgroup) live as long as it does, instead of
        # being destroyed with the groups a test leaves behind.
        live.groups = compat.live_process_groups() - before
        return value

    def _set_up(self, fixture: RankFixture, live: _Live) -> Any:
        kwargs = {name: self._resolve(arg, fixture, live) for name, arg in fixture.args}
        if fixture.function is None:
            assert fixture.builtin is not None
            generator = builtin_fixtures.builtin(fixture.builtin, self._plan.basetemp)
        else:
            function = self._load(fixture.function)
            qualname = fixture.function.qualname
            instance = self._test.get("instance")
            if ".<locals>" not in qualname and "." in qualname and instance is not None:
                function = function.__get__(instance)  # defined in the test's class: a method
            result: Any = function(**kwargs)
            if not inspect.isgenerator(result):
                live.value = result
                return result
            generator = cast(Generator[Any, None, None], result)
        live.value = next(generator)
        live.finalizers.append(lambda: _resume(generator, fixture.name))
        return live.value

    def _resolve(self, arg: Arg, fixture: RankFixture | None, live: _Live | None = None) -> Any:
        if arg.kind == ARG_VALUE:
            return self._plan.values[arg.key]
        if arg.kind == ARG_FIXTURE:
            return self._values[arg.key]
        if live is None:  # the test's own request: its finalizers end with the call, last
            live = _Live("request")
            self._function_scoped.insert(0, live)
        assert self._plan.request is not None  # sent whenever `request` is asked for
        return RankRequest(self._plan.request, self._test, fixture, live.finalizers)


def _finish(live: Iterable[_Live], *, quiet: bool) -> None:
    first: BaseException | None = None
    for entry in live:
        for finalizer in reversed(entry.finalizers):
            try:
                finalizer()
            except BaseException as exc:
                if first is None and not quiet:
                    first = exc
                else:
                    print(
                        f"teardown of fixture {entry.name!r} also failed: "
                        f"{type(exc).__qualname__}: {exc}",
                        file=sys.stderr,
                    )
    if first is not None:
        _mark(first, "teardown")
        raise first


def _resume(generator: Generator[Any, None, None], name: str) -> None:
    if next(generator, _NOTSET) is not _NOTSET:
        raise ValueError(f"fixture function {name!r} has more than one 'yield'")


def _mark(exc: BaseException, phase: str) -> None:
    if not hasattr(exc, PHASE_ATTR):
        # An exception type with __slots__ takes no attribute: reported as a call's failure.
        with contextlib.suppress(AttributeError, TypeError):
            setattr(exc, PHASE_ATTR, phase)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a is b or a == b)
    except Exception:
        return False


class RankNode:
    """``request.node`` in a rank: the test's ``name``, ``nodeid`` and marks."""

    def __init__(self, info: RequestInfo) -> None:
        self.name, self.nodeid, self._marks = info.name, info.nodeid, info.marks

    def iter_markers(self, name: str | None = None) -> Iterator[Any]:
        return (mark for mark in self._marks if name is None or mark.name == name)

    def get_closest_marker(self, name: str, default: Any = None) -> Any:
        return next(self.iter_markers(name), default)

    def __repr__(self) -> str:
        return f"<RankNode {self.nodeid}>"


_NOTSET = object()
_UNSENT = "(or its value could not be sent to the ranks)"


@functools.lru_cache(maxsize=1)
def _config_view(blob: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """The controller's options and ini values, unpickled once per session's blob."""
    options, ini = pickle.loads(blob)
    return options, ini


class RankConfig:
    """``request.config`` in a rank: the controller's options and ini values."""

    def __init__(self, info: RequestInfo) -> None:
        self._options, self._ini = _config_view(info.config)

    def getoption(self, name: str, default: Any = _NOTSET, skip: bool = False) -> Any:
        """An option's value, by its ``dest`` (or ``--flag`` spelling)."""
        key = name.lstrip("-").replace("-", "_")
        if key in self._options:
            return self._options[key]
        if default is not _NOTSET:
            return default
        raise ValueError(f"no option named {name!r} {_UNSENT}")

    def getini(self, name: str) -> Any:
        if name in self._ini:
            return self._ini[name]
        raise ValueError(f"unknown ini option {name!r} {_UNSENT}")


class RankRequest:
    """``request`` inside a rank: a view of the test and of ``fixture`` (None: the test's own).

    Answers what a fixture usually asks: ``node`` (``name``, ``nodeid``,
    ``get_closest_marker``, ``iter_markers``), ``keywords``, ``param``, ``fixturename``,
    ``scope``, ``config`` (``getoption``, ``getini``), ``function``, ``cls``, ``instance``,
    ``module``, and ``addfinalizer`` (run in this rank when the fixture ends).
    """

    def __init__(
        self,
        info: RequestInfo,
        test: dict[str, Any],
        fixture: RankFixture | None,
        finalizers: list[Callable[[], object]],
    ) -> None:
        self._info = info
        self.fixturename = fixture.name if fixture is not None else None
        self.scope = fixture.scope if fixture is not None else "function"
        if fixture is not None and fixture.has_param:
            self.param = fixture.param
        self.function, self.cls = test.get("function"), test.get("cls")
        self.instance, self.module = test.get("instance"), test.get("module")
        self.addfinalizer = finalizers.append

    @property
    def node(self) -> RankNode:
        return RankNode(self._info)

    @property
    def config(self) -> RankConfig:
        return RankConfig(self._info)

    @property
    def keywords(self) -> dict[str, Any]:
        return {mark.name: mark for mark in reversed(self._info.marks)}

    def getfixturevalue(self, argname: str) -> Any:
        raise RuntimeError(
            f"request.getfixturevalue({argname!r}) is not available inside a rank: "
            "request the fixture as an argument instead"
        )

    def __repr__(self) -> str:
        return f"<RankRequest for {self._info.nodeid} fixture={self.fixturename!r}>"
