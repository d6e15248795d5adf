"""A griffe extension for the API reference: it makes the harness's docstrings and signatures
read right in mkdocstrings' Markdown. The sources themselves are left as they are.

* Sphinx's roles (``:class:`~harness.World```) become code spans.
* reStructuredText's ``Example::`` before an indented block reads ``Example:`` (the
  indented block is a code block in Markdown too).
* A wrapped line that starts with ``#`` (``#2 on the default group``) is kept from reading
  as a Markdown heading.
* An ``Args`` line that documents several parameters at once (``fn, args, kwargs: As
  run.``) becomes one line per parameter, so each gets its own row with its type and
  default instead of a single row marked "required".
* A default that names a module constant (``timeout=validate.DEFAULT_TIMEOUT_S``, a
  dataclass field's ``= OUTPUT_INHERIT``) shows the constant's literal value (``120.0``,
  ``'inherit'``), which is what a reader needs, not its internal name; a module imported
  under a private alias reads by its name (``int(_signal.SIGKILL)`` -> ``int(signal.SIGKILL)``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")
_HASH_LINE = re.compile(r"\n[ \t]*(?=#)")
_LITERAL_MARKER = re.compile(r"(?<=\S)::(?=\n[ \t]*\n[ \t]+\S)")
# The Google-style sections whose items are names (Raises is not one: its "TypeError,
# ValueError:" is one item, a tuple of exceptions).
_NAMED_SECTION = re.compile(
    r"[ \t]*(?:Args|Arguments|Params|Parameters|Keyword Args|Keyword Arguments"
    r"|Other Parameters|Attributes):[ \t]*"
)
_SHARED_ITEM = re.compile(
    r"(?P<indent>[ \t]+)(?P<names>\w+(?:[ \t]*,[ \t]*\w+)+)"
    r"(?P<rest>(?:[ \t]*\([^)]*\))?:(?:[ \t].*)?)"
)


def _role(match: re.Match[str]) -> str:
    target = match[2]
    return f"`{target.rsplit('.', 1)[-1] if match[1] else target}`"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def split_shared_items(text: str) -> str:
    """``text`` with every ``a, b: description`` item of a named section (``Args``,
    ``Attributes``, ...) written out as ``a: description`` and ``b: description``, each
    with the item's continuation lines."""
    lines = text.split("\n")
    out: list[str] = []
    section: int | None = None  # the indentation of the current section's header
    i = 0
    while i < len(lines):
        line = lines[i]
        if _NAMED_SECTION.fullmatch(line):
            section = _indent(line)
            out.append(line)
            i += 1
            continue
        if section is not None and line.strip() and _indent(line) <= section:
            section = None  # a line back at the header's indentation ends the section
        item = _SHARED_ITEM.fullmatch(line) if section is not None else None
        if item is None or section is None or len(item["indent"]) <= section:
            out.append(line)
            i += 1
            continue
        depth = len(item["indent"])
        end = i + 1
        while end < len(lines):
            following = lines[end]
            if following.strip():
                if _indent(following) <= depth:
                    break
            elif end + 1 >= len(lines) or _indent(lines[end + 1]) <= depth:
                break
            end += 1
        for name in re.split(r"[ \t]*,[ \t]*", item["names"]):
            out.append(f"{item['indent']}{name}{item['rest']}")
            out.extend(lines[i + 1 : end])
        i = end
    return "\n".join(out)


def clean(text: str) -> str:
    """The docstring ``text`` as Markdown reads it right."""
    text = _LITERAL_MARKER.sub(":", _ROLE.sub(_role, text))
    return split_shared_items(_HASH_LINE.sub(" ", text))


def _defined(obj: griffe.Object) -> Iterator[griffe.Object]:
    """Every object defined in ``obj``, at any depth (aliases, i.e. imports, left out)."""
    for member in obj.members.values():
        if member.is_alias:
            continue
        yield member
        if isinstance(member, (griffe.Module, griffe.Class)):
            yield from _defined(member)


def _literal_value(default: Any, loader: griffe.GriffeLoader) -> str | None:
    """The literal value of the module constant that ``default`` names, if it names one
    this package defines (``validate.DEFAULT_TIMEOUT_S`` -> ``'120.0'``)."""
    if not isinstance(default, (griffe.ExprName, griffe.ExprAttribute)):
        return None
    try:
        target = loader.modules_collection[default.canonical_path]
        if target.is_alias:
            target = target.final_target
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    value = getattr(target, "value", None) if isinstance(target, griffe.Attribute) else None
    if not isinstance(value, str):
        return None
    try:
        ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return None
    return value


def _public_names(default: Any) -> str | None:
    """``default`` with a module imported under a private alias named as the module
    (``int(_signal.SIGKILL)`` -> ``int(signal.SIGKILL)``); None when it has no such alias."""
    if not isinstance(default, griffe.Expr):
        return None
    parts: list[str] = []
    renamed = False
    for part in default.iterate(flat=True):
        if isinstance(part, griffe.ExprName) and part.name.startswith("_"):
            public = part.canonical_path
            if public != part.name and not any(n.startswith("_") for n in public.split(".")):
                parts.append(public)
                renamed = True
                continue
        parts.append(part if isinstance(part, str) else part.name)
    return "".join(parts) if renamed else None


def readable_default(default: Any, loader: griffe.GriffeLoader) -> str | None:
    """How a default should read in the reference, when not as written in the source."""
    return _literal_value(default, loader) or _public_names(default)


class RestToMarkdown(griffe.Extension):
    """Applies :func:`clean` to every docstring griffe loads, and shows the values of
    defaults that name this package's constants."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = clean(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for obj in _defined(pkg):
            if isinstance(obj, griffe.Function):
                for parameter in obj.parameters:
                    value = readable_default(parameter.default, loader)
                    if value is not None:
                        parameter.default = value
            elif isinstance(obj, griffe.Attribute) and obj.parent and obj.parent.is_class:
                # A dataclass field's default (the class's attribute) reads as the value too.
                value = readable_default(obj.value, loader)
                if value is not None:
                    obj.value = value
