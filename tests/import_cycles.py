"""Print the import cycles between the modules of harness and fhelium; exit 1 if any.

Every import counts, also one inside a function (a deferred import is still a dependency
that only works because of its timing). A package's ``__init__`` is a module like the
others: ``harness.plugin`` importing ``harness.plugin.mptc``, which imports
``harness.plugin`` back, is a cycle. Imports under ``if TYPE_CHECKING:`` count too, in a
second pass: a record that names the types of the modules that write it is a circle all the
same, for a reader. The one allowed there is the rank context's (:data:`SANCTIONED`): the
rank side's one module-level state, which the modules it holds name as their run context.

Run by ``tests/test_structure.py``, in a subprocess where it checks a copy of the tree.
"""

from __future__ import annotations

import sys

import grimp

SANCTIONED = "harness.rank.current"
"""The rank context (:mod:`harness.rank.current`): a circle through it, of imports under
``TYPE_CHECKING``, is allowed."""


def cycles(*packages: str, type_checking: bool = False) -> list[list[str]]:
    """The groups of modules that import one another, directly or not (each sorted);
    ``type_checking``: counting the imports under ``if TYPE_CHECKING:``."""
    graph = grimp.build_graph(
        *packages, exclude_type_checking_imports=not type_checking, cache_dir=None
    )
    edges = {
        module: sorted(graph.find_modules_directly_imported_by(module) & graph.modules)
        for module in sorted(graph.modules)
    }
    # Tarjan's strongly connected components, iteratively (no recursion limit to meet).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            module, pending = work[-1]
            step = next(pending, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    work.append((step, iter(edges[step])))
                elif step in stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return sorted(found)


if __name__ == "__main__":
    groups = cycles("harness", "fhelium")
    for group in groups:
        print("import cycle: " + " <-> ".join(group))
    typed = [g for g in cycles("harness", "fhelium", type_checking=True) if SANCTIONED not in g]
    for group in typed:
        print("import cycle, counting TYPE_CHECKING imports: " + " <-> ".join(group))
    sys.exit(1 if groups or typed else 0)
