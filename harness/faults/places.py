"""A collective named by what it is, for a fault's ``at``: :class:`Collective`.

A fault's ``at`` is a number (collective ``#at`` of its group, as a report numbers them) or
a :class:`Collective`: the ``nth`` collective the rank issues on the fault's group that is
an ``op`` issued at a ``site``. Numbers shift between torch releases (torch >= 2.14 also
records the collectives that DDP, DTensor and compiled code issue below
``torch.distributed``'s functions); a collective named by its op and call site does not.

Public as ``harness.faults.Collective``. This module imports neither torch nor pytest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OPS = (
    "all_reduce",
    "all_reduce_coalesced",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_coalesced",
    "all_gather_into_tensor_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "collective",
)
"""The ops a :class:`Collective` may name: every collective as reports name it
(``"collective"``: one torch's hooks gave no name for)."""

P2P = (
    "send",
    "recv",
    "isend",
    "irecv",
    "send_object_list",
    "recv_object_list",
    "batch_isend_irecv",
)
"""Point-to-point ops: they have no number among a group's collectives, and carry no fault."""

_SITE = re.compile(r"^(?P<file>[^:]+?)(?::(?P<line>\d+))?$")


@dataclass(frozen=True)
class Collective:
    """The ``nth`` of the rank's collectives on the fault's group that is an ``op`` issued
    at ``site``; ``op`` or ``site`` left out matches any.

    ``faults.kill(rank=1, at=faults.Collective("all_reduce", 2, site="train.py:34"))``
    kills rank 1 before the 2nd ``all_reduce`` it issues at ``train.py:34``. Made freely: its
    values are checked when a run uses its fault, as every fault argument is.

    Attributes:
        op: The collective's function as reports name it (one of :data:`OPS`:
            ``"all_reduce"``, ``"broadcast"``, ...); None: any.
        nth: Which of the collectives that match, from 1.
        site: Its call site as reports show it: a file and line (``"train.py:34"``), or a
            file alone (``"train.py"``: any line of it); the file is its name or the end of
            its path (``"mylib/train.py:34"``). None: any. A collective that torch issues
            below ``torch.distributed``'s functions is at the line of yours that made it
            (DDP's all-reduces: the line that called ``backward()``).
    """

    op: str | None = None
    nth: int = 1
    site: str | None = None

    def problem(self) -> str:
        """What is wrong with its values ('' when nothing), naming the bad value and what
        would be valid."""
        op, nth, site = self.op, self.nth, self.site
        if op is None and site is None:
            return "a Collective needs op or site (a collective by its number alone is at=N)"
        if op is not None and op in P2P:
            return f"op {op!r} is a point-to-point op: it has no number and carries no fault"
        if op is not None and op not in OPS:
            return f"op must be a collective's name, one of {', '.join(OPS)}; not {op!r}"
        if not isinstance(nth, int) or isinstance(nth, bool) or nth < 1:
            return f"nth must be an int >= 1 (the first match is 1), not {nth!r}"
        if site is not None and (not isinstance(site, str) or self._site() is None):
            return (
                "site must be a call site as reports show it, 'train.py:34' (or 'train.py' "
                f"for any line of the file), not {site!r}"
            )
        return ""

    def _site(self) -> tuple[str, int] | None:
        """``site`` as its file and line (0: any line); None where it is not one."""
        found = _SITE.match(self.site or "")
        if found is None or not found["file"].strip() or found["line"] == "0":
            return None
        return found["file"], int(found["line"] or 0)

    def matches(self, op: str, file: str, line: int) -> bool:
        """Whether a collective ``op`` issued at ``file`` (its path), ``line`` is one of those
        it counts (its values valid: see :meth:`problem`)."""
        if self.op is not None and op != self.op:
            return False
        if self.site is None:
            return True
        wanted = self._site()
        assert wanted is not None
        name, at = wanted
        path = file.replace("\\", "/")
        return (at == 0 or at == line) and (path == name or path.endswith("/" + name))

    @property
    def text(self) -> str:
        """How a report names it: ``the 2nd all_reduce at train.py:34``."""
        where = f" at {self.site}" if self.site is not None else ""
        return f"the {ordinal(self.nth)} {self.op or 'collective'}{where}"

    @property
    def id(self) -> str:
        """How a sweep's test id names it: ``all_reduce2-at-train.py-34``."""
        where = "" if self.site is None else "-at-" + str(self.site).replace(":", "-")
        return f"{self.op or 'any'}{self.nth}{where}"

    def __str__(self) -> str:
        args = [repr(self.op)] if self.op is not None else []
        if self.nth != 1:
            args.append(repr(self.nth) if args else f"nth={self.nth!r}")
        if self.site is not None:
            args.append(f"site={self.site!r}")
        return f"Collective({', '.join(args)})"

    def __repr__(self) -> str:
        return f"faults.{self}"


def ordinal(number: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``21st``..."""
    suffix = "th" if number % 100 in (11, 12, 13) else _SUFFIXES.get(number % 10, "th")
    return f"{number}{suffix}"


_SUFFIXES = {1: "st", 2: "nd", 3: "rd"}
