"""A rank's memory between calls, judged as the rank judges it, on a stand-in for the process's
resident size (what the kernel says, what a give-back and a garbage collection leave): when
freed memory is given back, which growth is a finding and which is one-time, what a finding
says; and CUDA's cache, on a stand-in for torch's CUDA API."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from harness.rank import memory

MiB = 2**20
GROWTH = 64 * MiB


class Process:
    """The resident size a rank would read: ``held`` (what lives) plus ``freed`` (what glibc
    keeps until a give-back) plus ``cyclic`` (what only a garbage collection frees)."""

    def __init__(self, held: int = 200 * MiB) -> None:
        self.held, self.freed, self.cyclic = held, 0, 0
        self.trims = self.collections = 0

    def resident(self) -> int:
        return self.held + self.freed + self.cyclic

    def trim(self, pad: int) -> int:
        self.trims += 1
        self.freed = 0
        return 1

    def collect(self) -> int:
        self.collections += 1
        self.cyclic = 0
        return 0


@pytest.fixture
def process(monkeypatch: pytest.MonkeyPatch) -> Process:
    found = Process()
    monkeypatch.setattr(memory.gc, "collect", found.collect)
    return found


def _memory(process: Process, *, trim: bool = True) -> memory.Memory:
    made = memory.Memory()
    made._resident = process.resident  # type: ignore[method-assign]
    made._trim = process.trim if trim else None
    made._kept = process.resident()
    made._sizes.clear()
    made._sizes.append(made._kept)
    return made


def test_freed_memory_is_given_back_once_it_grew_past_the_slack(process: Process) -> None:
    rank = _memory(process)
    process.freed = memory.GIVE_BACK_AFTER  # not more: kept, no trim (it costs the next test)
    use, found = rank.after_call(GROWTH)
    assert (process.trims, found) == (0, "")
    assert use is not None
    assert use.resident == process.held + memory.GIVE_BACK_AFTER
    process.freed += 1
    use, _ = rank.after_call(GROWTH)
    assert process.trims == 1
    assert use is not None
    assert use.resident == process.held


def test_without_malloc_trim_nothing_is_given_back_and_memory_is_still_said(
    process: Process,
) -> None:
    rank = _memory(process, trim=False)
    process.freed = 50 * MiB
    use, _ = rank.after_call(GROWTH)
    assert use is not None
    assert use.resident == process.held + 50 * MiB
    assert use.peak >= use.resident
    assert process.trims == 0


def test_steady_growth_is_a_finding_within_the_window_and_the_next_needs_as_much_again(
    process: Process,
) -> None:
    rank = _memory(process)
    found = []
    for call in range(1, 201):
        process.held += 2 * MiB
        line = rank.after_call(GROWTH)[1]
        if line:
            found.append((call, line))
    first, line = found[0]
    # 64 MiB beyond the 10 largest increases (20 MiB): 42 calls of 2 MiB.
    assert first == 43
    assert line.startswith(
        "resident memory grew by 66.0 MiB over its last 43 calls and stayed after a garbage "
        "collection and giving freed memory back (its 10 largest single-call increases not "
        "counted)"
    )
    assert [call for call, _ in found] == [43, 86, 129, 172]


def test_one_time_jumps_are_no_finding_however_large(process: Process) -> None:
    rank = _memory(process)
    for call in range(300):
        if call % 30 == 0:
            process.held += 200 * MiB  # an import, a cache filled once: ten in any 100 calls
        process.held += 128 * 1024  # and a little more each call: 12.5 MiB per 100 calls
        assert rank.after_call(GROWTH)[1] == ""


def test_growth_that_a_garbage_collection_frees_is_no_finding(process: Process) -> None:
    rank = _memory(process)
    for _ in range(100):
        process.cyclic += 2 * MiB  # garbage in reference cycles, not collected yet
        use, found = rank.after_call(GROWTH)
        assert found == ""
        assert use is not None
        assert use.resident == process.resident()
    assert process.collections >= 1


def test_the_answers_own_bytes_are_not_growth(process: Process) -> None:
    rank = _memory(process)
    for _ in range(100):
        process.freed = 0
        process.held += 2 * MiB  # the answer's pickled value, gone once it is sent
        assert rank.after_call(GROWTH, transient=process.held - 200 * MiB)[1] == ""
        process.held = 200 * MiB


def test_no_look_with_growth_zero(process: Process) -> None:
    rank = _memory(process)
    for _ in range(100):
        process.held += 10 * MiB
        assert rank.after_call(0)[1] == ""
    assert process.collections == 0


class Kept:
    """What a leaking test keeps, as objects the finding counts by type."""


def test_a_finding_names_the_types_that_grew_since_half_the_threshold(process: Process) -> None:
    rank = _memory(process)
    kept: list[Kept] = []
    for _ in range(100):
        process.held += 2 * MiB
        kept.append(Kept())
        line = rank.after_call(GROWTH)[1]
        if line:
            break
    assert "; objects that grew over its last 16 calls: Kept +16" in line, line


class Cuda:
    """torch.cuda as the rank asks it: what tensors use, what the cache holds."""

    def __init__(self, allocated: int, reserved: int, initialized: bool = True) -> None:
        self.allocated, self.reserved, self.initialized = allocated, reserved, initialized
        self.emptied = 0

    def is_initialized(self) -> bool:
        return self.initialized

    def memory_allocated(self) -> int:
        assert self.initialized, "asking would initialise CUDA in a rank that never used it"
        return self.allocated

    def memory_reserved(self) -> int:
        assert self.initialized
        return self.reserved

    def empty_cache(self) -> None:
        self.emptied += 1
        self.reserved = self.allocated


def test_cudas_cache_is_emptied_past_its_limit_and_its_figures_said(
    process: Process, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = Cuda(allocated=10 * MiB, reserved=10 * MiB + memory.CUDA_CACHE_KEPT)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    rank = _memory(process)
    use, _ = rank.after_call(GROWTH)
    assert cuda.emptied == 0  # what the cache keeps up to the limit serves the next test
    assert use is not None
    assert (use.cuda_allocated, use.cuda_reserved) == (
        10 * MiB,
        10 * MiB + memory.CUDA_CACHE_KEPT,
    )
    cuda.reserved += 1
    use, _ = rank.after_call(GROWTH)
    assert cuda.emptied == 1
    assert use is not None
    assert use.cuda_reserved == 10 * MiB
    cuda.initialized = False
    use, _ = rank.after_call(GROWTH)
    assert use is not None
    assert use.cuda_allocated is None


def test_the_resident_size_is_read_again_after_a_call_closed_its_file() -> None:
    rank = memory.Memory()
    first = rank._resident()
    assert first is not None
    assert rank._statm is not None
    os.close(rank._statm)  # as os.closerange(3, ...) in a test would
    again = rank._resident()
    assert again is not None
    assert abs(again - first) < 64 * MiB
