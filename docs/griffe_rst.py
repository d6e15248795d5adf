"""A griffe extension for the API reference: the harness's docstrings use Sphinx's roles
(``:class:`~harness.World```) and reStructuredText's double backticks, which mkdocstrings
renders as Markdown. This turns the roles into code spans, and keeps a wrapped line that
starts with ``#`` (``#2 on the default group``) from reading as a Markdown heading. The
docstrings themselves are left as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")
_HASH_LINE = re.compile(r"\n[ \t]*(?=#)")


def _role(match: re.Match[str]) -> str:
    target = match[2]
    return f"`{target.rsplit('.', 1)[-1] if match[1] else target}`"


def clean(text: str) -> str:
    """The docstring ``text`` as Markdown reads it right."""
    return _HASH_LINE.sub(" ", _ROLE.sub(_role, text))


class RestToMarkdown(griffe.Extension):
    """Applies :func:`clean` to every docstring griffe loads."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = clean(obj.docstring.value)
