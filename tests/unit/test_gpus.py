"""GPU leases: the run's inventory, all-at-once exclusive leases, waiting in turn.

File locks conflict between two open files of one process as between two processes, so
everything but a holder's death is tested here, in-process, on a temporary lease directory.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from harness.controller import gpus
from harness.controller.gpus import Inventory, LeaseTimeout


def _inventory(given: str | None, environ: dict[str, str], count: int = 0) -> Inventory:
    return gpus.inventory(given, environ, lambda: count, "/leases")


@pytest.mark.parametrize(
    ("given", "environ", "count", "ids"),
    [
        (None, {}, 0, ()),
        (None, {}, 2, ("0", "1")),
        ("", {}, 3, ("0", "1", "2")),
        (None, {"CUDA_VISIBLE_DEVICES": "5,7"}, 8, ("5", "7")),
        (None, {"CUDA_VISIBLE_DEVICES": ""}, 8, ()),
        ("7", {"CUDA_VISIBLE_DEVICES": "5,7"}, 8, ("7",)),
        ("0,1,2,3", {}, 0, ("0", "1", "2", "3")),  # no CUDA: leased as given
        (" 1 , 0 ", {}, 2, ("1", "0")),
        ("GPU-8f3a", {}, 1, ("GPU-8f3a",)),
    ],
)
def test_the_runs_gpus(
    given: str | None, environ: dict[str, str], count: int, ids: tuple[str, ...]
) -> None:
    assert _inventory(given, environ, count) == Inventory(ids, "/leases")


@pytest.mark.parametrize(
    ("given", "environ", "count", "message"),
    [
        (
            "5,6",
            {"CUDA_VISIBLE_DEVICES": "5,7"},
            8,
            "--dist-gpus names GPU '6', outside CUDA_VISIBLE_DEVICES='5,7': valid ids are 5, 7",
        ),
        ("0,,1", {}, 0, "--dist-gpus has an empty GPU id in '0,,1': give ids like 0,1,2,3"),
        ("0,1,0", {}, 0, "--dist-gpus names GPU '0' twice in '0,1,0'"),
        ("4", {}, 2, "--dist-gpus names GPU '4', which CUDA does not show: valid ids are 0, 1"),
    ],
)
def test_bad_gpu_ids_are_named(
    given: str, environ: dict[str, str], count: int, message: str
) -> None:
    with pytest.raises(ValueError) as info:
        _inventory(given, environ, count)
    assert str(info.value).startswith(message)


@pytest.fixture
def stock(tmp_path: Path) -> Inventory:
    return Inventory(("0", "1", "2", "3"), str(tmp_path / "leases"))


class _Clock:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds


def _acquire(stock: Inventory, count: int, clock: _Clock, **options: object) -> gpus.Lease:
    return gpus.acquire(
        stock, count, holder="t.py::t", timeout=1.0, clock=clock, sleep=clock.sleep, **options
    )  # type: ignore[arg-type]


def test_leases_are_exclusive_and_taken_whole(stock: Inventory) -> None:
    clock = _Clock()
    first = _acquire(stock, 3, clock)
    assert first.ids == ("0", "1", "2")
    assert first.visible_devices == "0,1,2"
    second = _acquire(stock, 1, clock)
    assert second.ids == ("3",)
    with pytest.raises(LeaseTimeout) as info:
        _acquire(stock, 2, clock)  # one GPU would be free after this: never a part
    pid = os.getpid()
    assert str(info.value) == (
        f"waited 1.0 s for 2 GPUs; held by: GPU 0: pid {pid}, t.py::t; GPU 1: pid {pid}, "
        f"t.py::t; GPU 2: pid {pid}, t.py::t; GPU 3: pid {pid}, t.py::t"
    )
    first.release()
    first.release()  # idempotent
    assert not first.held
    assert _acquire(stock, 2, clock).ids == ("0", "1")


def test_a_waiter_gives_back_its_own_idle_leases_first(stock: Inventory) -> None:
    clock = _Clock()
    idle = _acquire(stock, 4, clock)
    calls = []

    def before_waiting() -> None:
        calls.append(clock.sleeps)
        idle.release()

    lease = _acquire(stock, 2, clock, before_waiting=before_waiting)
    assert lease.ids == ("0", "1")
    assert calls == [0], "given back once, before any sleep"


def _ticket(directory: str, name: str, *, live: bool) -> int | None:
    os.makedirs(directory, exist_ok=True)
    fd = os.open(os.path.join(directory, name), os.O_RDWR | os.O_CREAT)
    if not live:
        os.close(fd)
        return None
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_newcomer_waits_behind_an_earlier_ticket_even_with_gpus_free(stock: Inventory) -> None:
    fd = _ticket(stock.lease_dir, f"{1:020d}-1.ticket", live=True)
    assert fd is not None
    assert gpus.others_waiting(stock)
    clock = _Clock()
    with pytest.raises(LeaseTimeout):
        _acquire(stock, 1, clock)
    assert clock.sleeps > 0
    os.close(fd)  # its process ended: the ticket is stale
    assert not gpus.others_waiting(stock)
    assert _acquire(stock, 1, clock).ids == ("0",)
    assert [n for n in os.listdir(stock.lease_dir) if n.endswith(".ticket")] == []


def test_a_stale_ticket_is_passed_over_and_removed(stock: Inventory) -> None:
    _ticket(stock.lease_dir, f"{1:020d}-1.ticket", live=False)
    assert not gpus.others_waiting(stock)
    assert _acquire(stock, 4, _Clock()).ids == ("0", "1", "2", "3")
    assert [n for n in os.listdir(stock.lease_dir) if n.endswith(".ticket")] == []


def test_a_process_does_not_count_its_own_ticket_as_another_waiting(stock: Inventory) -> None:
    fd = _ticket(stock.lease_dir, f"{1:020d}-{os.getpid()}.ticket", live=True)
    assert fd is not None
    assert not gpus.others_waiting(stock)
    os.close(fd)


@pytest.mark.parametrize("count", [0, 5, -1])
def test_a_count_out_of_range_is_named(stock: Inventory, count: int) -> None:
    with pytest.raises(ValueError, match=f"cannot lease {count} GPUs from 4"):
        _acquire(stock, count, _Clock())


def test_a_lease_directory_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    stock = Inventory(("0",), str(blocker / "leases"))
    with pytest.raises(OSError, match=r"cannot create the GPU lease directory '.*file/leases'"):
        _acquire(stock, 1, _Clock())


def test_the_default_lease_directory_is_per_user() -> None:
    path = gpus.default_lease_dir()
    assert os.path.basename(path).startswith("harness-gpu-leases-")
