"""The torch releases the harness supports, checked before anything imports torch.

Older torch lacks what the harness and the tests written with it rely on (the lines of
``docs/limitations.md`` that name a torch version say what), so an older one is refused at
import, in one line, instead of failing later inside the harness. The check reads the
installed version from the package metadata: the plugin is imported by every pytest run of
the environment and must not import torch.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from typing import Any

TORCH_FLOOR = (2, 8)
"""The oldest torch release the harness supports, as (major, minor); ``pyproject.toml``
requires the same."""


class UnsupportedTorch(ImportError):
    """The installed torch is older than :data:`TORCH_FLOOR`."""


def torch_release(version: str) -> tuple[int, int] | None:
    """The (major, minor) of a torch version string, or None where it has none.

    Args:
        version: As ``torch.__version__`` or the package metadata spell it
            (``"2.13.0+cpu"``, ``"2.15.0a0+git1234"``).
    """
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else None


def check_torch(version: str | None) -> None:
    """Refuse a torch older than the floor.

    Args:
        version: The installed torch's version; None where torch is not installed (its own
            ImportError then comes where torch is imported).

    Raises:
        UnsupportedTorch: ``version`` is older than :data:`TORCH_FLOOR`; the message names
            it, the floor and the command that installs a supported one.
    """
    release = torch_release(version) if version is not None else None
    if release is None or release >= TORCH_FLOOR:
        return
    floor = ".".join(map(str, TORCH_FLOOR))
    message = (
        f"fhelium's harness needs torch {floor} or newer; torch {version} is installed "
        f"(pip install 'torch>={floor}')"
    )
    # Loaded as pytest's plugin, where pytest prints a UsageError as its one line, but any
    # other error of a plugin's import as a traceback. Looked up, not imported: the harness
    # works without pytest.
    pytest: Any = sys.modules.get("pytest")
    if pytest is not None:
        raise type("UnsupportedTorch", (UnsupportedTorch, pytest.UsageError), {})(message)
    raise UnsupportedTorch(message)


def installed_torch() -> str | None:
    """The installed torch's version, from its package metadata; None where it has none."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
