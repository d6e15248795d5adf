"""Fixtures that run inside the ranks: set up, cached by scope, torn down. Runs INSIDE a rank.

The controller decides which of a test's fixtures run in the ranks and sends them as
:class:`~harness.protocol.messages.RankFixture` entries of a
:class:`~harness.protocol.messages.FixturePlan`, each after the fixtures it requests. Here
each one is set up from its arguments (controller values, other rank-side fixtures, the
``request`` view), as pytest would: a plain function's return value, or a generator's first
``yield`` with the rest run at teardown.

Function-scoped fixtures end with the call that runs the test. Wider ones (class, module,
package, session) stay alive in this process, keyed by the node id of their scope, until the
controller ends that scope (:func:`end_scopes`, its own call) — or until the process ends,
since a rebuilt world starts with none.

A fixture that raises marks the exception with the phase it belongs to
(:data:`~harness.protocol.failures.PHASE_ATTR`), so the controller reports it as the test's
setup or teardown error.

What it may import: see :mod:`harness.rank`.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, cast

from harness import compat
from harness.protocol.failures import PHASE_ATTR
from harness.protocol.messages import (
    ARG_FIXTURE,
    ARG_REQUEST,
    ARG_VALUE,
    Arg,
    FixturePlan,
    FunctionRef,
    RankFixture,
)
from harness.rank import builtin_fixtures, leaks


@dataclass
class _Live:
    """A fixture set up in this rank, with what ends it."""

    fixture: RankFixture
    value: Any
    finalizers: list[Callable[[], object]] = field(default_factory=list)
    groups: set[Any] = field(default_factory=set)


# Wider-than-function fixtures alive in this process, in setup order, by (key, scope_key).
_wide: dict[tuple[str, str], _Live] = {}


class Setup:
    """The fixtures of one test call in this rank.

    Args:
        plan: What the controller sent.
        test: What a ``request`` view says about the test (``module``, ``cls``,
            ``instance``, ``function``).
        load: Finds a fixture function from its reference (the test module's importer).
        failing: Called with a setup error (marked) before the fixtures already set up are
            torn down: their teardown may take long, the controller hears of the error first.
    """

    def __init__(
        self,
        plan: FixturePlan,
        test: dict[str, Any],
        load: Callable[[FunctionRef], Callable[..., Any]],
        failing: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._plan = plan
        self._test = test
        self._load = load
        self._failing = failing
        self._values: dict[str, Any] = {}
        self._function_scoped: list[_Live] = []

    def arguments(self) -> dict[str, Any]:
        """Set up every rank-side fixture and return the test function's arguments.

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
            if self._failing is not None:
                self._failing(exc)
            self.teardown(quiet=True)
            raise

    def teardown(self, *, quiet: bool = False) -> None:
        """End the function-scoped fixtures, last set up first.

        Args:
            quiet: Write teardown errors to stderr instead of raising (the test already
                failed; its own error is the one to report).

        Raises:
            BaseException: The first error a teardown raised, marked as a teardown error
                (the others are written to stderr).
        """
        live, self._function_scoped = self._function_scoped, []
        _finish(reversed(live), quiet=quiet)

    def _value(self, fixture: RankFixture) -> Any:
        if fixture.scope != "function":
            identity = (fixture.key, fixture.scope_key)
            cached = _wide.get(identity)
            if cached is not None and (
                not fixture.has_param or _same(cached.fixture.param, fixture.param)
            ):
                return cached.value
            if cached is not None:  # another parameter: pytest ends the old value first
                _finish([_wide.pop(identity)], quiet=False)
        live = _Live(fixture, None)
        # Registered before the setup runs: a request.addfinalizer call made by a fixture that
        # then raises still runs, as in pytest.
        if fixture.scope == "function":
            self._function_scoped.append(live)
            return self._set_up(fixture, live)
        identity = (fixture.key, fixture.scope_key)
        _wide[identity] = live
        before = compat.live_process_groups()
        try:
            # What it starts or opens ends with its scope, not with this test: no leak.
            with leaks.lasting():
                value = self._set_up(fixture, live)
        except BaseException:
            # Not cached: the next test sets it up again (after a skip the rank lives on).
            _finish([_wide.pop(identity)], quiet=True)
            raise
        # Process groups it made (a mesh's, a subgroup) live as long as it does, instead of
        # being destroyed with the groups a test leaves behind.
        live.groups = compat.live_process_groups() - before
        return value

    def _set_up(self, fixture: RankFixture, live: _Live) -> Any:
        kwargs = {name: self._resolve(arg, fixture) for name, arg in fixture.args}
        if fixture.function is None:
            assert fixture.builtin is not None
            generator: Generator[Any, None, None] = builtin_fixtures.builtin(
                fixture.builtin, self._plan.basetemp
            )
        else:
            function = self._load(fixture.function)
            if ".<locals>" not in fixture.function.qualname and "." in fixture.function.qualname:
                # A fixture defined in a test class is a method of the test's instance.
                instance = self._test.get("instance")
                if instance is not None:
                    function = function.__get__(instance)
            result: Any = function(**kwargs)
            if not inspect.isgenerator(result):
                live.value = result
                return result
            generator = cast(Generator[Any, None, None], result)
        live.value = next(generator)
        live.finalizers.append(lambda: _resume(generator, fixture.name))
        return live.value

    def _resolve(self, arg: Arg, fixture: RankFixture | None) -> Any:
        if arg.kind == ARG_VALUE:
            return self._plan.values[arg.key]
        if arg.kind == ARG_FIXTURE:
            return self._values[arg.key]
        assert arg.kind == ARG_REQUEST
        finalizers = self._finalizers_of(fixture)
        return builtin_fixtures.RankRequest(
            self._plan.request,
            self._test,
            fixturename=fixture.name if fixture is not None else None,
            scope=fixture.scope if fixture is not None else "function",
            param=fixture.param if fixture is not None else None,
            has_param=fixture is not None and fixture.has_param,
            finalizers=finalizers,
        )

    def _finalizers_of(self, fixture: RankFixture | None) -> list[Callable[[], object]]:
        if fixture is None:  # the test's own request: its finalizers end with the call
            live = _Live(RankFixture("", "request", "function", "", None, "request", ()), None)
            self._function_scoped.insert(0, live)
            return live.finalizers
        if fixture.scope == "function":
            return self._function_scoped[-1].finalizers
        return _wide[(fixture.key, fixture.scope_key)].finalizers


def lasting_groups() -> set[Any]:
    """The process groups that wider-scoped fixtures alive in this rank made: they outlive
    the call that made them (see :mod:`harness.rank.loop`)."""
    return set().union(*(live.groups for live in _wide.values()))


def end_scopes(scope_keys: list[str] | None) -> None:
    """End the wider-scoped fixtures of these scopes (all of them for None), newest first.

    Called by the controller, as a call of its own, when pytest finishes a module, class,
    package or the session.

    Raises:
        BaseException: The first error a teardown raised, marked as a teardown error.
    """
    ending = [identity for identity in _wide if scope_keys is None or identity[1] in scope_keys]
    _finish(reversed([_wide.pop(identity) for identity in ending]), quiet=False)


def _finish(live: Any, *, quiet: bool) -> None:
    first: BaseException | None = None
    for entry in live:
        for finalizer in reversed(entry.finalizers):
            try:
                finalizer()
            except BaseException as exc:
                if first is None and not quiet:
                    first = exc
                else:
                    _report(exc, entry.fixture.name)
    if first is not None:
        _mark(first, "teardown")
        raise first


def _resume(generator: Generator[Any, None, None], name: str) -> None:
    try:
        next(generator)
    except StopIteration:
        return
    raise ValueError(f"fixture function {name!r} has more than one 'yield'")


def _report(exc: BaseException, name: str) -> None:
    print(
        f"teardown of fixture {name!r} also failed: {type(exc).__qualname__}: {exc}",
        file=sys.stderr,
    )


def _mark(exc: BaseException, phase: str) -> None:
    if not hasattr(exc, PHASE_ATTR):
        try:
            setattr(exc, PHASE_ATTR, phase)
        except (AttributeError, TypeError):
            pass  # an exception type with __slots__: reported as a failure of the call


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a is b or a == b)
    except Exception:
        return False
