"""The smallest shadow size that shows a difference: which size to try next (pure logic).

Between a size whose ranks agree and one whose ranks do not, :class:`Search` first tries
the size the difference hints at (where rank ``r`` is the lowest that differs from rank 0,
``r + 1``, then ``r``: a rank that holds no data, a rank index in a condition), then doubles
the size that agrees (a size that agrees costs a run of every rank; doubling keeps those
runs small), then halves the gap. A size at which the shadow cannot run (the body raises
there: a mesh that does not divide it) is unusable; the next try is then the size in the gap
with the most factors of two, nearest the middle (the sizes a mesh divides). The search
assumes that above a size that shows the difference, every size shows it, and it stops once
it has run ``budget`` simulated ranks, saying which sizes it left.
"""

from __future__ import annotations

AGREES, DIFFERS, UNUSABLE = "agrees", "differs", "unusable"
"""What a size's run showed (:meth:`Search.tell`)."""


class Search:
    """The search between ``agrees`` and ``differs``.

    Args:
        agrees: A size whose ranks agree.
        differs: A larger one whose ranks do not.
        budget: How many simulated ranks the search may run.
        hint: A size to try first (None: none).

    Attributes:
        agrees: The largest size known to agree.
        differs: The smallest size known to show the difference.
        unusable: The sizes at which the shadow could not run.
        spent: The simulated ranks run so far.
    """

    def __init__(self, agrees: int, differs: int, budget: int, hint: int | None = None) -> None:
        self.agrees, self.differs, self.budget = agrees, differs, budget
        self.unusable: set[int] = set()
        self.spent = 0
        self._doubling = True
        self._hint = hint

    def next(self) -> int | None:
        """The size to try next; None once the gap is closed or the budget spent."""
        if self.spent >= self.budget:
            return None
        low, high = self.agrees, self.differs
        hint, self._hint = self._hint, None
        if hint is not None and low < hint < high and hint not in self.unusable:
            self._hint = hint - 1  # tried next where the hint shows the difference
            return hint
        if self._doubling and low * 2 < high and low * 2 not in self.unusable:
            return low * 2
        left = [size for size in range(low + 1, high) if size not in self.unusable]
        if not left:
            return None
        middle = (low + high) // 2
        return min(left, key=lambda size: (-_twos(size), abs(size - middle)))

    def tell(self, size: int, shown: str, ranks: int) -> None:
        """Note what the run of ``size`` showed (``AGREES``, ``DIFFERS`` or ``UNUSABLE``),
        having run ``ranks`` simulated ranks."""
        self.spent += ranks
        if shown != DIFFERS:
            self._hint = None
        if shown == AGREES:
            self.agrees = max(self.agrees, size)
            return
        self._doubling = False
        if shown == DIFFERS:
            self.differs = min(self.differs, size)
        else:
            self.unusable.add(size)

    @property
    def closed(self) -> bool:
        """Whether every size between the two bounds was tried (or is unusable)."""
        return all(size in self.unusable for size in range(self.agrees + 1, self.differs))


def _twos(size: int) -> int:
    """How many times 2 divides ``size``."""
    return (size & -size).bit_length() - 1
