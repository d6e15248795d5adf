"""The torch releases the harness supports, checked before anything imports torch, and what
differs between them: the one place the code asks "does this torch have X".

Older torch lacks what the harness and the tests written with it rely on (the lines of
``docs/limitations.md`` that name a torch version say what), so an older one is refused at
import, in one line, instead of failing later inside the harness. The check reads the
installed version from the package metadata: the plugin is imported by every pytest run of
the environment and must not import torch.

Each behaviour that differs between supported releases is a :class:`Behaviour` here, named
by the first release that has it, and asked for with :func:`has`; the table of
``docs/reference/torch-versions.md`` says the same, row by row (a test holds one against the
other).
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import sys
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Behaviour:
    """Something torch does from one release on.

    Attributes:
        row: How its row of the table in ``docs/reference/torch-versions.md`` begins.
        since: The first release that does it, as (major, minor).
    """

    row: str
    since: tuple[int, int]


GLOO_ALL_TO_ALL = Behaviour("Gloo `all_to_all`", (2, 11))
"""Gloo implements ``all_to_all`` (before: ``harness check``'s row is ``unsupported``)."""
GLOO_QUIET_CONNECT = Behaviour("Gloo prints `[Gloo] Rank N is connected", (2, 13))
"""Gloo no longer prints a line on stdout for each group it connects."""
FR_ANALYZER_READS_GLOO = Behaviour("Flight Recorder analyzer", (2, 13))
"""torch's Flight Recorder analyzer (``fr_trace``) reads a Gloo world's dumps."""
FR_ON_BY_DEFAULT = Behaviour("Flight Recorder |", (2, 13))
"""torch's flight recorder records without ``TORCH_FR_BUFFER_SIZE`` set."""
COLLECTIVE_HOOKS = Behaviour("Process-group hooks", (2, 14))
"""A process group calls hooks around every collective it issues, from Python or C++."""
NCCL2 = Behaviour('`backend="nccl"`', (2, 15))
"""``"nccl"`` is nccl2, which binds a device as the group is made."""
RANKS_SHARE_A_GPU = Behaviour("Several ranks on one GPU", (2, 15))
"""The bundled NCCL lets several ranks share a GPU (``ranks_per_gpu``)."""
DTENSOR_EMPTY_SHARD = Behaviour("DTensor gathers a shard of size zero", (2, 10))
"""DTensor gathers a tensor one of whose shards is empty."""
MPTC_MIN_GPUS = Behaviour("`MultiProcessTestCase` GPU skips", (2, 15))
"""torch's GPU decorators record their minimum on the test (``_min_gpus_required``)."""

BEHAVIOURS = (
    GLOO_ALL_TO_ALL,
    GLOO_QUIET_CONNECT,
    FR_ANALYZER_READS_GLOO,
    FR_ON_BY_DEFAULT,
    COLLECTIVE_HOOKS,
    NCCL2,
    RANKS_SHARE_A_GPU,
    DTENSOR_EMPTY_SHARD,
    MPTC_MIN_GPUS,
)
"""Every behaviour that differs between the supported releases."""


def has(behaviour: Behaviour, version: str | None = None) -> bool:
    """Whether torch ``version`` (None: the one this process runs) does ``behaviour``."""
    release = torch_release(version if version is not None else _running_torch())
    return release is not None and release >= behaviour.since


@functools.cache
def _running_torch() -> str:
    """The version of the torch this process runs: the imported one's, else the installed
    one's ('' where torch is not installed)."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "__version__", None) if torch is not None else None
    return str(version or installed_torch() or "")
