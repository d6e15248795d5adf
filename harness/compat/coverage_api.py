"""coverage.py's private name the harness relies on.

It gives the configuration file in use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["coverage_config_file"]


def coverage_config_file(cov: Any) -> str | bool:
    """The configuration file a ``coverage.Coverage`` read.

    False when it read none.

    ``Coverage.get_option`` reads every setting but not which file they came from; ranks
    read the same file so that settings we do not copy (plugins, ``[paths]``) still apply.
    """
    path = cov.config.config_file
    return path if isinstance(path, str) and path else False


# -- probes: each raises once an upgrade has removed what it checks --------------------------


def _probe_coverage_config() -> object:
    import coverage

    return coverage_config_file(coverage.Coverage(config_file=False))


PROBES: dict[str, Callable[[], object]] = {
    "coverage.Coverage.config.config_file": _probe_coverage_config,
}
