"""The controller's account of its ranks' memory, on plain replies: what is kept per rank,
when a limit is passed or cannot be kept, and the plugin's summary of every world, also as
pytest-xdist's workers send it; sizes as users give them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness import validate
from harness.controller.memory import Memories, RankMemory
from harness.plugin.memory_report import Worlds
from harness.protocol.messages import Done, Failed, MemoryUse, Ready, Skipped

MiB = 2**20


def _ready(resident: int, peak: int | None = None) -> Ready:
    return Ready(1, 2, "/", MemoryUse(resident, peak or resident))


def _done(resident: int, peak: int | None = None, **cuda: int) -> Done:
    return Done(b"", memory=MemoryUse(resident, peak or resident, **cuda))


@pytest.mark.parametrize(
    ("given", "size"),
    [
        ("2GiB", 2 * 2**30),
        ("2GB", 2 * 10**9),
        ("512MiB", 512 * 2**20),
        ("512 mib", 512 * 2**20),
        ("1.5GiB", 3 * 2**29),
        ("64KiB", 65536),
        ("1234", 1234),
        (1234, 1234),
        (0, 0),
    ],
)
def test_a_size_is_bytes_or_a_number_and_a_unit(given: object, size: int) -> None:
    assert validate.size(given, "limit") == size


@pytest.mark.parametrize(
    "given", ["lots", "2XB", "-1", "", "GiB", "2 Gi B", "2g", "512M", 1.5, True, None]
)
def test_what_is_no_size_is_named_with_what_would_be(given: object) -> None:
    with pytest.raises((TypeError, ValueError)) as raised:
        validate.size(given, "--dist-max-rank-memory")
    assert str(raised.value).startswith(
        "--dist-max-rank-memory must be a size: bytes (an int), or a number and a unit such as "
        "2GiB, 512MiB, 2GB"
    )
    assert repr(given) in str(raised.value)


def test_a_negative_size_is_named() -> None:
    with pytest.raises(ValueError, match=r"^limit must be a size >= 0, got -3$"):
        validate.size(-3, "limit")


def test_each_rank_is_kept_from_its_start_through_its_calls() -> None:
    memories = Memories(None)
    memories.started({0: _ready(100 * MiB), 1: _ready(101 * MiB)})
    memories.answered({0: _done(110 * MiB, 130 * MiB), 1: Skipped("why", "pytest", 0.0)})
    memories.answered({0: _done(120 * MiB, 125 * MiB, cuda_allocated=5, cuda_reserved=9)})
    assert memories.ranks[0] == RankMemory(100 * MiB, 120 * MiB, 130 * MiB, 2, 5, 9)
    assert memories.ranks[0].growth_per_call == 10 * MiB
    assert memories.ranks[1] == RankMemory(101 * MiB, 101 * MiB, 101 * MiB)  # said nothing
    assert memories.ranks[1].growth_per_call == 0.0


def test_a_new_process_starts_its_rank_afresh_and_keeps_the_worlds_peak() -> None:
    memories = Memories(None)
    memories.started({0: _ready(100 * MiB)})
    memories.answered({0: _done(300 * MiB)})
    memories.started({0: _ready(102 * MiB)})
    assert memories.ranks[0] == RankMemory(102 * MiB, 102 * MiB, 300 * MiB)


def test_replies_that_say_no_memory_leave_the_account_as_it_was() -> None:
    memories = Memories(500 * MiB)
    memories.started({0: Ready(1, 2, "/"), 1: _ready(100 * MiB)})
    memories.answered({0: Done(b""), 1: Failed(SimpleNamespace(), 0.0)})  # type: ignore[arg-type]
    assert list(memories.ranks) == [1]
    assert memories.ranks[1].calls == 0


def test_the_limit_names_each_rank_above_it_after_a_call() -> None:
    memories = Memories(400 * MiB)
    memories.started({0: _ready(100 * MiB), 1: _ready(100 * MiB)})
    memories.answered({0: _done(400 * MiB), 1: _done(300 * MiB, 900 * MiB)})
    assert memories.over_limit() == ""  # at the limit, and a peak within the call, are not
    memories.answered({0: _done(401 * MiB), 1: _done(450 * MiB)})
    assert memories.over_limit() == "rank 0 holds 401.0 MiB, rank 1 holds 450.0 MiB"
    assert Memories(None).over_limit() == ""


def test_a_limit_below_what_a_rank_starts_with_says_both() -> None:
    memories = Memories(150 * MiB)
    memories.started({0: _ready(100 * MiB), 1: _ready(160 * MiB)})
    assert memories.below_start() == (
        "max_rank_memory 150.0 MiB (157286400 bytes) is below what this world's ranks hold as "
        "they start (rank 1 starts with 160.0 MiB): every call would replace them; give a "
        "limit above their start"
    )
    memories.started({1: _ready(140 * MiB)})
    assert memories.below_start() == ""


class FakeWorld:
    """A World as the summary reads it."""

    def __init__(self, size: int, peaks: list[int], replaced: int = 0, init: bool = True):
        self.world_size, self.backend, self.init = size, "gloo", init
        self.memory = {rank: RankMemory(0, 0, peak) for rank, peak in enumerate(peaks)}
        self.replaced_for_memory = replaced
        self.closed = False


def test_the_summary_gives_each_kind_of_worlds_peak_per_rank_and_its_replacements() -> None:
    worlds = Worlds()
    first = FakeWorld(2, [100 * MiB, 120 * MiB], replaced=2)
    worlds.add(first)  # type: ignore[arg-type]
    first.closed = True
    worlds.add(FakeWorld(2, [150 * MiB, 90 * MiB]))  # type: ignore[arg-type]
    worlds.add(FakeWorld(1, [80 * MiB], init=False))  # type: ignore[arg-type]
    worlds.add(FakeWorld(3, []))  # type: ignore[arg-type]  # said nothing: no line
    config = SimpleNamespace(workeroutput={})
    worlds.close(config)  # type: ignore[arg-type]
    assert worlds.lines() == [
        "harness: worlds of 1 rank (gloo, no default group), peak resident memory per rank: "
        "80.0 MiB (rank 0); 1 world, 0 replaced for memory",
        "harness: worlds of 2 ranks (gloo), peak resident memory per rank: 150.0 MiB (rank 0), "
        "120.0 MiB (rank 1); 2 worlds, 2 replaced for memory",
    ]
    # The controller of pytest-xdist adds up what its workers send.
    controller = Worlds()
    controller.merge(config.workeroutput["harness_memory"])
    controller.merge(config.workeroutput["harness_memory"])
    assert controller.lines()[1] == (
        "harness: worlds of 2 ranks (gloo), peak resident memory per rank: 150.0 MiB (rank 0), "
        "120.0 MiB (rank 1); 4 worlds, 4 replaced for memory"
    )
