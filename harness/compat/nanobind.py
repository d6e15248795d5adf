"""Whether an extension module built with nanobind is loaded (triton's is, from 3.9).

nanobind reports, at the interpreter's exit, every object of its modules still alive
("nanobind: leaked 12 instances!"), a check that ``gc.freeze()`` defeats: what is frozen is
never collected. The harness freezes to spare a torch process its final collections, and
does not where nanobind would then print dozens of false reports on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["nanobind_loaded"]

_METACLASS_PREFIXES = ("nb_type", "nb_meta")
"""The names of nanobind's metaclass (``nb_type_0`` in nanobind 1, ``nb_meta`` in 2): it has
no public marker of its modules."""


def nanobind_loaded() -> bool:
    """Whether a loaded extension module defines a class of nanobind's metaclass."""
    for module in list(sys.modules.values()):
        # Python modules are passed over; an extension's submodules (``libtriton.ir``)
        # have no file.
        if str(getattr(module, "__file__", None) or "").endswith(".py"):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and type(value).__name__.startswith(_METACLASS_PREFIXES):
                return True
    return False


PROBES: dict[str, Callable[[], object]] = {
    "nanobind's metaclass name (nb_type_*, nb_meta), where a nanobind module is loaded": (
        nanobind_loaded
    ),
}
