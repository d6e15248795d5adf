"""The documentation site builds, strictly, and what it says about the tree stays true.

* ``mkdocs build --strict`` (as ``tox -e docs`` and CI's docs job run it) exits 0 and prints
  no warning: a broken link or anchor, a page missing from the nav, a docstring the API
  reference cannot read. It needs the ``docs`` extra, which the README's test command
  installs; without it the test is skipped and says so.
* The docs requirements are bounded, and tox's ``docs`` environment lists the same ones as
  the ``docs`` extra.
* The module map of ``docs/contributing.md`` names every module under ``harness/``, and
  none that is gone.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The import names of the docs extra's packages the build uses.
_DOCS_MODULES = {
    "mkdocs": "mkdocs",
    "mkdocs-material": "material",
    "mkdocstrings": "mkdocstrings",
    "mkdocstrings-python": "mkdocstrings_handlers.python",
    "griffelib": "griffe",
    "mkdocs-autorefs": "mkdocs_autorefs",
}


def _missing_docs_packages() -> list[str]:
    missing = []
    for package, module in _DOCS_MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a dotted name whose parent is absent
            found = False
        if not found:
            missing.append(package)
    return missing


def test_site_builds_strict(tmp_path: Path) -> None:
    if sys.version_info < (3, 11):
        pytest.skip("the docs extra installs nothing on Python 3.10: griffelib 2.4 needs 3.11")
    missing = _missing_docs_packages()
    if missing:
        pytest.skip(
            f"the docs extra is not installed ({', '.join(missing)} missing): "
            "pip install -e '.[test,docs]' to build the site here"
        )
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        # Material's end-of-life notice is printed on every build; it is not a warning
        # about this site (see docs/contributing.md, "The documentation stack").
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert not warnings, output
    assert (tmp_path / "reference" / "api" / "index.html").is_file(), output


def _docs_extra() -> list[str]:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    with open(ROOT / "pyproject.toml", "rb") as handle:
        project = tomllib.load(handle)["project"]
    docs: list[str] = project["optional-dependencies"]["docs"]
    return docs


def test_docs_requirements_are_bounded() -> None:
    """Each docs requirement has an upper bound, so a new release cannot change the build
    unseen; and every package the build imports is among them."""
    docs = _docs_extra()
    for requirement in docs:
        assert "<" in requirement, f"{requirement!r} has no upper bound"
    names = {re.split(r"[<>=!~ ]", requirement, maxsplit=1)[0] for requirement in docs}
    assert names == set(_DOCS_MODULES)


def test_tox_docs_env_installs_the_docs_extra() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini", encoding="utf-8")
    deps = [line.strip() for line in tox["testenv:docs"]["deps"].splitlines() if line.strip()]
    assert deps == _docs_extra()


def _map_sections(text: str) -> dict[str, set[str]]:
    """The modules the map names, per package: ``### `harness/rank/` ...`` headings, then
    ```module.py``` in the first column of the table below each."""
    sections: dict[str, set[str]] = {}
    package = None
    for line in text.splitlines():
        heading = re.match(r"### `(harness/(?:\w+/)*)`", line)
        if heading:
            package = heading[1]
            sections[package] = set()
        elif line.startswith("## "):
            package = None
        elif package is not None:
            row = re.match(r"\| `(\w+\.py)` \|", line)
            if row:
                sections[package].add(row[1])
    return sections


def test_module_map_names_every_module() -> None:
    text = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    named = _map_sections(text)
    on_disk: dict[str, set[str]] = {}
    for path in (ROOT / "harness").rglob("*.py"):
        package = path.parent.relative_to(ROOT).as_posix() + "/"
        on_disk.setdefault(package, set()).add(path.name)
    assert named == on_disk


def test_package_docstrings_list_the_modules_of_the_map() -> None:
    # A package's docstring that lists its modules (``:mod:`~harness.rank.loop```) lists
    # exactly those on disk, which the module map above names too.
    named = _map_sections((ROOT / "docs" / "contributing.md").read_text(encoding="utf-8"))
    for init in sorted((ROOT / "harness").glob("*/**/__init__.py")):
        package = init.parent.relative_to(ROOT).as_posix()
        dotted = package.replace("/", ".")
        listed = set(re.findall(rf":mod:`~{re.escape(dotted)}\.(\w+)`", init.read_text()))
        if not listed:
            continue
        in_map = {name.removesuffix(".py") for name in named[package + "/"]} - {"__init__"}
        # A subpackage is listed by its name, its modules by its own docstring.
        in_map |= {
            sub.split("/")[-2]
            for sub in named
            if sub.startswith(package + "/") and sub.count("/") == package.count("/") + 2
        }
        assert listed == in_map, f"{init}: {sorted(listed ^ in_map)} differ from the map"
