"""A rank's memory between calls: measured, freed memory given back, growth that stays named.

After every call that a rank answers (``Done`` or ``Skipped``), :meth:`Memory.after_call`
runs before the answer goes out, so that the answer carries the rank's memory
(:class:`~harness.protocol.messages.MemoryUse`) and the controller learns it without another
round trip:

* **measured**: the resident set size, from ``/proc/self/statm`` (kept open: one ``pread``),
  its high-water mark (``getrusage``), and where CUDA is in use, what torch's caching
  allocator holds (``torch.cuda.memory_allocated`` / ``memory_reserved``);
* **given back**: glibc keeps the pages of freed memory when a small object allocated
  after them lives on (a test's tensors are freed, but the heap cannot shrink past what the
  rank allocated meanwhile), so a reused rank grows by what each test allocated at most.
  ``malloc_trim(0)`` hands those pages back; it runs only when the resident size grew since
  the last give-back by more than :data:`GIVE_BACK_AFTER`, since a trim also makes the next
  test fault its pages in again. Where the C library has no ``malloc_trim`` (musl, macOS)
  nothing is given back. CUDA's cache is emptied when it holds more than
  :data:`CUDA_CACHE_KEPT` that no tensor uses;
* **growth that stays** (where the call looks for leaks): over the rank's last
  :data:`WINDOW` calls, its resident size grew by more than the world's ``memory_growth``
  even without the :data:`ONE_TIME` largest single-call increases, and still after a garbage
  collection and a give-back. Leaving out the largest increases is what tells a leak from
  what a process does once (an import, a cache filled on first use, glibc's arena for a new
  thread): a leak adds a little at every test, one-time growth a lot at a few. Objects are
  counted by type (``gc.get_objects``) only once the growth passes half the threshold, and
  the finding names the types that grew since.

Elsewhere than on Linux nothing is measured (``MemoryUse`` is None): no finding, no limit.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import os
import resource
import sys
from collections import Counter, deque
from collections.abc import Callable

from harness.protocol.messages import MemoryUse, megabytes

GIVE_BACK_AFTER = 4 * 2**20
"""Bytes the resident size may grow past its size after the last give-back before freed
memory is given back again."""

CUDA_CACHE_KEPT = 1 * 2**30
"""Bytes of CUDA memory torch's caching allocator may keep reserved beyond what tensors use
before it is told to give them back (``torch.cuda.empty_cache``)."""

WINDOW = 100
"""How many of the rank's latest calls the growth that stays is looked for over."""

ONE_TIME = 10
"""How many of the largest single-call increases in that window are left out as one-time."""

_SHOWN_TYPES = 5  # object types named in a finding, those that grew most


class Memory:
    """One rank process's memory, kept across its calls (made once, as the rank starts)."""

    def __init__(self) -> None:
        # Opened in the rank itself: /proc/self is the process that opens it.
        self._statm = _open_statm()
        self._page = os.sysconf("SC_PAGE_SIZE") if self._statm is not None else 0
        self._trim = _malloc_trim()
        # The resident size after the last give-back, or lower since.
        self._kept = self._resident() or 0
        # The resident size after each of the latest calls (oldest first), and before them.
        self._sizes: deque[int] = deque([self._kept], maxlen=WINDOW + 1)
        # Object counts by type once the growth passed half the threshold, with the call count:
        # a plain dict of str and int, which the collector stops tracking, so that keeping it
        # does not count as an object that grew.
        self._counted: tuple[dict[str, int], int] | None = None
        self._calls = 0

    def now(self) -> MemoryUse | None:
        """The rank's memory now (None where the platform does not say)."""
        resident = self._resident()
        return None if resident is None else self._use(resident)

    def after_call(self, growth: int, transient: int = 0) -> tuple[MemoryUse | None, str]:
        """Give freed memory back where it grew; the rank's memory, and the finding line
        where more than ``growth`` bytes stayed ('' when not, or ``growth`` is 0: no look).

        Args:
            growth: The world's ``memory_growth``.
            transient: Bytes the rank holds now only for the answer (its pickled value).
        """
        resident = self._resident()
        if resident is None:
            return None, ""
        if resident > self._kept + GIVE_BACK_AFTER:
            resident = self._give_back()
        else:
            self._kept = min(self._kept, resident)
        self._calls += 1
        found = ""
        if growth:
            sizes = self._sizes
            sizes.append(resident - transient)
            # Cheap first: no growth past half the threshold, so none without one-time ones.
            if sizes[-1] - min(sizes) > growth // 2:
                found = self._look(growth, transient)
                resident = self._resident() or 0
        self._give_back_cuda()
        return self._use(resident), found

    def _look(self, growth: int, transient: int) -> str:
        """The finding line where the window's growth stays (see the module); ''."""
        sizes = self._sizes
        if self._counted is None:
            if _spread(sizes) <= growth // 2:
                return ""
            self._counted = (dict(_collected_counts(self._give_back)), self._calls)
            sizes[-1] = self._kept - transient
        if _spread(sizes) <= growth:
            return ""
        gc.collect()  # what only reference cycles hold is no leak
        sizes[-1] = self._give_back() - transient
        spread = _spread(sizes)
        if spread <= growth:
            return ""
        line = (
            f"resident memory grew by {megabytes(spread)} over its last {len(sizes) - 1} "
            "calls and stayed after a garbage collection and giving freed memory back (its "
            f"{ONE_TIME} largest single-call increases not counted)"
        )
        before, at = self._counted
        grew = _grew(before, _counts())
        if grew:
            line += f"; objects that grew over its last {self._calls - at} calls: {grew}"
        # The next finding needs as much growth again.
        sizes.clear()
        sizes.append(self._kept - transient)
        self._counted = None
        return line

    def _resident(self) -> int | None:
        """The resident set size now, in bytes (None where the platform does not say)."""
        for _ in range(2):
            if self._statm is None:
                return None
            try:
                return int(os.pread(self._statm, 64, 0).split()[1]) * self._page
            except (OSError, ValueError, IndexError):
                # A call closed it (os.closerange), maybe opening another file under its number.
                self._statm = _open_statm()
        return None

    def _give_back(self) -> int:
        """Hand freed heap pages back to the system; the resident size after it."""
        if self._trim is not None:
            self._trim(0)
        self._kept = self._resident() or 0
        return self._kept

    def _give_back_cuda(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return
        if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > CUDA_CACHE_KEPT:
            torch.cuda.empty_cache()

    def _use(self, resident: int) -> MemoryUse:
        # ru_maxrss is in KiB on Linux (the one platform measured).
        peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, resident)
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return MemoryUse(resident, peak)
        cuda = torch.cuda
        return MemoryUse(resident, peak, cuda.memory_allocated(), cuda.memory_reserved())


def _open_statm() -> int | None:
    """A descriptor of ``/proc/self/statm`` (None where there is none: not Linux)."""
    try:
        return os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None where the C library has none (musl, macOS)."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def _increases(sizes: deque[int]) -> list[int]:
    """How much each call of the window grew the resident size (its shrinking left out)."""
    return [max(after - before, 0) for before, after in itertools.pairwise(sizes)]


def _spread(sizes: deque[int]) -> int:
    """The window's growth without its largest single-call increases, the one-time ones."""
    return sizes[-1] - sizes[0] - sum(sorted(_increases(sizes))[-ONE_TIME:])


def _counts() -> Counter[str]:
    """Live objects by type name (those the garbage collector tracks)."""
    return Counter(type(obj).__qualname__ for obj in gc.get_objects())


def _collected_counts(give_back: Callable[[], int]) -> Counter[str]:
    """Object counts after a garbage collection, with freed memory given back after it."""
    gc.collect()
    give_back()
    return _counts()


def _grew(before: dict[str, int], after: Counter[str]) -> str:
    """The types whose objects grew most, with how many more there are (``Tensor +32``)."""
    grown = after - Counter(before)
    return ", ".join(f"{name} +{count}" for name, count in grown.most_common(_SHOWN_TYPES))
