"""Access to pytest's (and pytest-timeout's) private names.

They cover skips located at the test, a test's fixture definitions and argument names, ini
names, ``xfail(raises=...)``, pytest-timeout's settings, and the assertion rewriter.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, NoReturn

__all__ = [
    "ASSERT_REWRITER_MODULE",
    "asserts_rewritten",
    "exempt_from_assert_rewriting",
    "fixture_defs",
    "ini_names",
    "monkeypatch",
    "pytest_timeout_settings",
    "rewrite_asserts",
    "skip_at_test",
    "test_argnames",
    "xfail_raises",
]

ASSERT_REWRITER_MODULE = "_pytest.assertion.rewrite"
"""The module of pytest's assertion rewriter (the forkserver preloads it under pytest)."""


def skip_at_test(reason: str) -> NoReturn:
    """Raise pytest's skip, located at the test.

    The report points at the test, not at the harness.

    ``pytest.skip()`` raised from a hook is reported at the hook's line; pytest's own
    ``skipif`` marks use the private ``_use_item_location=True`` to place it at the test
    item, and there is no public equivalent.
    """
    import pytest

    raise pytest.skip.Exception(reason, _use_item_location=True)


def test_argnames(item: Any) -> tuple[str, ...]:
    """The names of the arguments a test function takes.

    Not the fixtures pulled in only by other fixtures or ``autouse``. pytest's own
    ``pytest_pyfunc_call`` reads the private ``item._fixtureinfo.argnames``; the public
    ``item.fixturenames`` holds those too.
    """
    return tuple(item._fixtureinfo.argnames)


def fixture_defs(item: Any) -> Mapping[str, Sequence[Any]]:
    """Every fixture definition a test can see, by name.

    Each is a list of ``pytest.FixtureDef``, the one the test uses last (earlier ones are what
    an overriding fixture of the same name gets).

    pytest keeps this closure, computed at collection, in the private
    ``item._fixtureinfo.name2fixturedefs``; no public API gives the definitions behind
    ``item.fixturenames``, and the plugin must know, before pytest sets any fixture up,
    which of them run in the ranks.
    """
    defs: Mapping[str, Sequence[Any]] = item._fixtureinfo.name2fixturedefs
    return defs


def ini_names(config: Any) -> list[str]:
    """The names of every registered ini option.

    They are for ``request.config.getini`` in a rank: pytest has no public list of them
    (``config._parser._inidict``).
    """
    return list(config._parser._inidict)


def monkeypatch() -> Any:
    """A new ``pytest.MonkeyPatch``.

    It is public; here because the rank side reaches pytest only through this package, and
    imports it only when a test asks for ``monkeypatch``.
    """
    import pytest

    return pytest.MonkeyPatch()


def xfail_raises(item: Any) -> tuple[tuple[Any, ...], str] | None:
    """``(raises, reason)`` of the item's ``xfail`` mark, or None.

    None also when the mark has no ``raises``.

    pytest evaluates xfail conditions once and keeps the result in
    ``item.stash[_pytest.skipping.xfailed_key]``; reading the mark ourselves would mean
    evaluating its conditions a second time.
    """
    from _pytest.skipping import xfailed_key

    xfailed = item.stash.get(xfailed_key, None)
    if xfailed is None or xfailed.raises is None:
        return None
    raises = xfailed.raises if isinstance(xfailed.raises, tuple) else (xfailed.raises,)
    return tuple(raises), str(xfailed.reason or "")


def pytest_timeout_settings(item: Any) -> Any:
    """pytest-timeout's settings for a test, or None.

    The settings are ``timeout``, ``method``, ``func_only``, ...; None when pytest-timeout is
    not active.

    pytest-timeout resolves the marker, ``--timeout``, ``PYTEST_TIMEOUT`` and ini ``timeout``
    in its private ``_get_item_settings``. Its public hook ``pytest_timeout_set_timer`` hands
    them over when it arms its timer, but under ``func_only`` it does so only in the call
    phase, after the harness ran the ranks (in the setup phase).
    """
    plugin = item.config.pluginmanager.get_plugin("timeout")
    return None if plugin is None else plugin._get_item_settings(item)


def rewrite_asserts(tree: Any, source: bytes, path: str) -> None:
    """Apply pytest's assertion rewriting to a parsed module, in place.

    A rank imports a test module itself, and pytest exposes its rewriter only through its
    import hook.
    """
    import importlib

    importlib.import_module(ASSERT_REWRITER_MODULE).rewrite_asserts(tree, source, path)


def exempt_from_assert_rewriting(*packages: str) -> None:
    """Exempt these packages from pytest's assertion rewriting.

    pytest's import hook leaves the modules of these packages imported from now on.

    pytest rewrites the asserts of every module of a distribution that registers a pytest
    plugin, fhelium's included, and caches the result beside the module; where it cannot
    write there (a read-only install, ``PYTHONDONTWRITEBYTECODE``) it does so again in every
    run, before the first distributed test. The harness's asserts state invariants, not
    test outcomes. pytest can mark names (``register_assert_rewrite``), not unmark them: the
    hook keeps them in ``_must_rewrite`` and caches lookups in ``_marked_for_rewrite_cache``.
    """
    hooks: list[Any] = [f for f in sys.meta_path if type(f).__module__ == ASSERT_REWRITER_MODULE]
    for hook in hooks:  # pytest's import hooks, one per pytest config
        marked = hook._must_rewrite
        marked.difference_update([name for name in marked if name.split(".")[0] in packages])
        hook._marked_for_rewrite_cache.clear()


def asserts_rewritten(module: ModuleType) -> bool:
    """Whether pytest rewrote the asserts of an imported module.

    The rewriter adds ``@py_builtins`` to the module's globals; pytest has no public flag.
    """
    return hasattr(module, "@py_builtins")


# -- probes: each raises once an upgrade has removed what it checks --------------------------


def _probe_use_item_location() -> object:
    import pytest

    return pytest.skip.Exception("probe", _use_item_location=True)


def _probe_xfailed_key() -> object:
    from _pytest.skipping import xfailed_key

    return xfailed_key


def _probe_fixtureinfo() -> object:
    from _pytest.fixtures import FuncFixtureInfo

    fields = FuncFixtureInfo.__dataclass_fields__
    return fields["argnames"], fields["name2fixturedefs"]


def _probe_inidict() -> object:
    import pytest

    parser = pytest.Parser(_ispytest=True)
    parser.addini("harness_probe", "probe")
    return parser._inidict["harness_probe"]


def _probe_rewrite() -> object:
    import ast

    tree = ast.parse("assert 1")
    rewrite_asserts(tree, b"assert 1", "<probe>")
    names = {
        a.asname for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names
    }
    if "@py_builtins" not in names:
        raise AttributeError("pytest's rewriter no longer binds '@py_builtins'")
    return names


def _probe_rewrite_hook() -> object:
    from _pytest.assertion.rewrite import AssertionRewritingHook

    class Config:
        def getini(self, name: str) -> object:
            raise ValueError(name)

    hook: Any = AssertionRewritingHook(Config())  # type: ignore[arg-type]
    if type(hook).__module__ != ASSERT_REWRITER_MODULE:
        raise AttributeError(f"pytest's import hook moved to {type(hook).__module__}")
    hook.mark_rewrite("harness_probe")
    marked, cache = hook._must_rewrite, hook._marked_for_rewrite_cache
    if "harness_probe" not in marked or not isinstance(cache, dict):
        raise AttributeError("pytest's import hook keeps its marked names elsewhere")
    return marked, cache


def _probe_pytest_timeout() -> object:
    import importlib

    getter = importlib.import_module("pytest_timeout")._get_item_settings
    if not callable(getter):
        raise TypeError("pytest_timeout._get_item_settings is no longer a function")
    return getter


PROBES: dict[str, Callable[[], object]] = {
    "pytest.skip.Exception(_use_item_location=True)": _probe_use_item_location,
    "_pytest.skipping.xfailed_key": _probe_xfailed_key,
    "_pytest.fixtures.FuncFixtureInfo.argnames, .name2fixturedefs (item._fixtureinfo)": (
        _probe_fixtureinfo
    ),
    "pytest.Config._parser._inidict": _probe_inidict,
    "_pytest.assertion.rewrite.rewrite_asserts, binding '@py_builtins'": _probe_rewrite,
    "_pytest.assertion.rewrite.AssertionRewritingHook (._must_rewrite, "
    "._marked_for_rewrite_cache)": _probe_rewrite_hook,
    "pytest_timeout._get_item_settings (pytest-timeout)": _probe_pytest_timeout,
}
