"""A reused world's memory: each rank's measured after every call, freed memory given back,
growth that stays reported as a leak naming the call, and a limit past which the World
replaces its ranks before the next call, the calls' outcomes untouched."""

from __future__ import annotations

import logging
import os
import re
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import memory_rankfns as fns
import pytest
from harness_testutil import BACKEND, SAFETY_TIMEOUT_S, descendants, wait_gone

import harness
from harness.controller.memory import LimitBelowStart
from harness.errors import RankLeak
from harness.rank import memory

MiB = 2**20

glibc = pytest.mark.skipif(
    memory._malloc_trim() is None, reason="needs glibc's malloc_trim (the C library here has none)"
)


def _memory_findings(record: list[warnings.WarningMessage]) -> list[str]:
    """The warnings about memory that grew (the leak check's other findings left aside)."""
    return [str(w.message) for w in record if "resident memory grew" in str(w.message)]


@pytest.fixture
def world() -> Iterator[harness.World]:
    """A world of its own: what these tests keep stays in its ranks until it closes."""
    with harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S) as world:
        yield world


def test_each_rank_says_its_memory_as_it_starts_and_after_each_call(
    world: harness.World,
) -> None:
    started = world.memory
    assert sorted(started) == [0, 1]
    assert all(
        m.calls == 0 and m.start == m.last > 0 and m.peak >= m.start for m in started.values()
    )
    world.run(fns.keep, args=(8,))
    world.run(fns.keep, args=(8,))
    sizes = world.run(fns.resident)
    for rank, after in world.memory.items():
        assert after.calls == 3
        assert after.start == started[rank].start
        assert after.last >= started[rank].start + 16 * MiB  # what it keeps
        assert abs(after.last - sizes[rank]) < 4 * MiB  # as the rank read it itself
        assert after.peak >= after.last
        assert after.growth_per_call == (after.last - after.start) / 3
        assert after.cuda_allocated is None  # no CUDA in use


@glibc
@pytest.mark.parametrize("give_back", [True, False], ids=["given-back", "without"])
def test_memory_a_call_freed_is_given_back_before_the_next(
    world: harness.World, give_back: bool
) -> None:
    # Each call frees one MiB more than the last, at the top of glibc's heap, where glibc
    # keeps it resident: without the give-back the rank grows by a MiB a call.
    if not give_back:
        world.run(fns.no_give_back)
    world.run(fns.free_more, args=(1,))
    first = {rank: m.last for rank, m in world.memory.items()}
    for mib in range(2, 61):
        world.run(fns.free_more, args=(mib,))
    grown = {rank: m.last - first[rank] for rank, m in world.memory.items()}
    if give_back:
        assert all(size < memory.GIVE_BACK_AFTER + 4 * MiB for size in grown.values()), grown
    else:
        assert all(size > 40 * MiB for size in grown.values()), grown


def test_calls_that_each_keep_memory_are_a_leak_finding_naming_the_call_and_what_grew(
    world: harness.World,
) -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for calls in range(1, 101):  # noqa: B007  # how many it took, below
            world.run(fns.keep, args=(2,))
            if _memory_findings(record):
                break
    [text] = _memory_findings(record)  # once: the next finding needs as much growth again
    assert text.startswith("the call of keep left behind in a reused rank: ")
    assert "stayed after a garbage collection and giving freed memory back" in text
    assert "Tensor +" in text  # what grew: the kept tensors
    assert all(w.category is RuntimeWarning for w in record)
    assert calls < 100


def test_a_leak_fails_the_call_with_leaks_error_and_the_next_gets_fresh_ranks() -> None:
    with harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S, leaks="error") as world:
        failed: RankLeak | None = None
        for _ in range(100):
            try:
                world.run(fns.keep, args=(2,))
            except RankLeak as leak:
                failed = leak
                break
        assert failed is not None
        assert re.match(
            r"the call of keep left behind on ranks? [\d, ]+: resident memory grew by ", str(failed)
        ), failed
        pids = world.pids
        world.run(fns.keep, args=(2,))
        assert set(world.pids).isdisjoint(pids)


def test_growth_from_an_ordinary_mix_of_work_is_no_finding(tmp_path: Path) -> None:
    # DDP, DTensor, checkpoints, subgroups: their first use imports modules and fills caches
    # (tens of MiB), which stays; a threshold far below that finds nothing all the same.
    with (
        harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S, memory_growth="8MiB") as world,
        warnings.catch_warnings(record=True) as record,
    ):
        warnings.simplefilter("always")
        for step in range(25):
            world.run(fns.ordinary, args=(step, str(tmp_path)))
        grown = {rank: m.last - m.start for rank, m in world.memory.items()}
    assert all(size > 8 * MiB for size in grown.values()), grown  # more than the threshold
    assert _memory_findings(record) == []


def test_a_leak_is_no_finding_with_leaks_off_or_memory_growth_zero() -> None:
    for options in ({"leaks": "off"}, {"memory_growth": 0}):
        with (
            harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S, **options) as world,
            warnings.catch_warnings(record=True) as record,
        ):
            warnings.simplefilter("always")
            for _ in range(60):
                world.run(fns.keep, args=(2,))
            assert all(m.last - m.start > 100 * MiB for m in world.memory.values())
        assert _memory_findings(record) == []


def test_a_rank_above_max_rank_memory_gets_the_world_replaced_and_every_call_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S) as probe:
        start = max(m.start for m in probe.memory.values())
    limit = start + 48 * MiB
    caplog.set_level(logging.WARNING, logger="harness")
    with (
        harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S, max_rank_memory=limit) as world,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore", RuntimeWarning)  # the leak finding, here on purpose
        for _ in range(60):
            assert world.run(fns.keep, args=(2,)) == [None, None]
            assert all(m.last <= limit for m in world.memory.values())
        replaced = world.replaced_for_memory
        assert replaced >= 2
        assert world.generation == replaced + 1
        peaks = [m.peak for m in world.memory.values()]
    assert all(peak < limit + 16 * MiB for peak in peaks), (limit, peaks)
    lines = [r.getMessage() for r in caplog.records if r.name == "harness"]
    assert len(lines) == replaced
    assert lines[0].startswith("harness: after the call of keep, rank 0 holds ")
    assert lines[0].endswith(
        f"above max_rank_memory ({limit / MiB:.1f} MiB): the world of 2 ranks (gloo) was "
        "replaced by fresh processes"
    )


@pytest.mark.parametrize("limit", ["lots", "2 parsecs", -1, 1.5])
def test_a_limit_that_is_not_a_size_is_an_error_naming_it(limit: object) -> None:
    with pytest.raises((TypeError, ValueError), match=f"max_rank_memory must be .*{limit!r}"):
        harness.World(2, backend=BACKEND, max_rank_memory=limit)  # type: ignore[arg-type]


def test_a_limit_below_the_ranks_start_is_an_error_naming_both_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.run(fns.resident, world_size=1, backend=BACKEND)  # the forkserver is up before
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = descendants(os.getpid())
    with pytest.raises(LimitBelowStart) as raised:
        harness.World(2, backend=BACKEND, max_rank_memory="100MiB")
    text = str(raised.value)
    assert text.startswith("max_rank_memory 100.0 MiB (104857600 bytes) is below what this ")
    assert re.search(r"\(rank 0 starts with \d+\.\d MiB, rank 1 starts with \d+\.\d MiB\)", text)
    assert isinstance(raised.value, ValueError)
    # Never a half-started world: its ranks stopped, its directory removed.
    assert not wait_gone(descendants(os.getpid()) - before)
    assert list(tmp_path.iterdir()) == []
