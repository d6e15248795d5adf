"""The package's shape is a contract: which side imports which, and every private API we use.

The import contracts live in ``pyproject.toml`` (``[tool.importlinter]``) and are checked by
``lint-imports``, as ``tox -e lint`` and CI do; here they are checked on the real tree, and
shown to fail on a copy of it with one violating import. The private APIs of other projects
go through :mod:`harness.compat`; each has a probe that fails, by name, once an upgrade
removes it.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import compat

ROOT = Path(__file__).resolve().parent.parent


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    script = shutil.which("lint-imports", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [script, "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_contracts_hold() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "violation", "expected"),
    [
        pytest.param(
            "harness/rank/loop.py",
            "from harness.controller import spawn",
            "harness.rank.loop -> harness.controller.spawn",
            id="rank-imports-controller",
        ),
        pytest.param(
            "harness/protocol/failures.py",
            "import torch",
            "harness.protocol.failures -> torch",
            id="protocol-imports-torch",
        ),
        pytest.param(
            "harness/controller/outcome.py",
            "import pytest",
            "harness.controller.outcome -> pytest",
            id="controller-imports-pytest",
        ),
        pytest.param(
            "harness/controller/verdicts.py",
            "from harness.timeline import model",
            "harness.controller.verdicts -> harness.timeline.model",
            id="controller-imports-timeline",
        ),
        pytest.param(
            "harness/timeline/folder.py",
            "from harness.controller import outcome",
            "harness.timeline.folder -> harness.controller.outcome",
            id="timeline-imports-call-machinery",
        ),
        pytest.param(
            "harness/plugin/report.py",
            "from _pytest._io import TerminalWriter",
            "harness.plugin.report -> _pytest",
            id="plugin-imports-private-pytest",
        ),
    ],
)
def test_a_violating_import_breaks_a_contract(
    tmp_path: Path, module: str, violation: str, expected: str
) -> None:
    for package in ("harness", "fhelium"):
        shutil.copytree(ROOT / package, tmp_path / package)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{violation}\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    assert expected in result.stdout, result.stdout


def _import_cycles(cwd: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("grimp", reason="grimp comes with import-linter (pip install -e '.[test]')")
    return subprocess.run(
        [sys.executable, str(ROOT / "tests" / "import_cycles.py")],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(cwd)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_no_module_imports_itself_back() -> None:
    result = _import_cycles(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_type_checking_import_that_closes_a_cycle_is_found(tmp_path: Path) -> None:
    for package in ("harness", "fhelium"):
        shutil.copytree(ROOT / package, tmp_path / package)
    # harness.plugin.runner imports harness.plugin.order: a type named back is a circle.
    order = tmp_path / "harness" / "plugin" / "order.py"
    order.write_text(
        order.read_text()
        + "\n\nif TYPE_CHECKING:\n    from harness.plugin.runner import Runner  # noqa: F401\n"
    )
    result = _import_cycles(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "counting TYPE_CHECKING imports" in result.stdout, result.stdout
    assert "harness.plugin.runner" in result.stdout, result.stdout


def test_a_deferred_import_that_closes_a_cycle_is_found(tmp_path: Path) -> None:
    for package in ("harness", "fhelium"):
        shutil.copytree(ROOT / package, tmp_path / package)
    errors = tmp_path / "harness" / "errors.py"
    # harness.controller.world imports harness.errors: this import inside a function is
    # one that would only work because of when it runs.
    errors.write_text(
        errors.read_text() + "\n\ndef _late():\n    from harness.controller import world\n"
    )
    result = _import_cycles(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "harness.controller.world" in result.stdout, result.stdout
    assert "harness.errors" in result.stdout, result.stdout


@pytest.mark.parametrize("name", list(compat.PRIVATE_APIS))
def test_private_api_is_still_there(name: str) -> None:
    probe: Callable[[], object] = compat.PRIVATE_APIS[name]
    try:
        probe()
    except Exception as exc:
        pytest.fail(
            f"private API {name} is gone or changed ({type(exc).__name__}: {exc}); "
            "update harness/compat/",
            pytrace=False,
        )


def _private_module(name: str) -> bool:
    """A private module, or one inside a private package (``torch.testing._internal.x``:
    import-linter cannot forbid a subpackage of another project, so this test does); this
    project's own private modules are not another project's."""
    parts = name.split(".")
    return parts[0] not in ("harness", "fhelium") and any(p.startswith("_") for p in parts)


def _private_names(tree: ast.AST) -> list[str]:
    """Imports of other projects' private modules, and attribute reads of private names."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and _private_module(node.module or "")
            and node.module != "__future__"
        ):
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if _private_module(a.name)]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            # os._exit is public, and so are a namedtuple's _replace (pytest-timeout's
            # Settings) and _asdict: the underscore only keeps them apart from field names.
            and node.attr not in ("_exit", "_replace", "_asdict")
        ):
            found.append(f".{node.attr}")
    return found


def test_a_private_subpackage_import_is_found() -> None:
    tree = ast.parse("from torch.testing._internal.common_distributed import TEST_SKIPS\n")
    assert _private_names(tree) == ["from torch.testing._internal.common_distributed import ..."]


def test_private_names_of_other_projects_are_used_in_compat_alone() -> None:
    offenders = {}
    for path in sorted((ROOT / "harness").rglob("*.py")):
        if path.parent.name == "compat":
            continue
        names = _private_names(ast.parse(path.read_text(), str(path)))
        if names:
            offenders[str(path.relative_to(ROOT))] = names
    assert offenders == {}, "private names outside harness/compat/"
