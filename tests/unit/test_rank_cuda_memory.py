"""CUDA memory a call leaves allocated, judged as the rank judges it, on a stand-in for torch's
CUDA API (this machine may have no GPU): only where CUDA is already in use, never initialising
it, and only memory still allocated after a garbage collection."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from harness.rank import leaks


class _Cuda:
    def __init__(self, initialized: bool, allocated: int) -> None:
        self.initialized, self.allocated, self.asked = initialized, allocated, 0

    def is_initialized(self) -> bool:
        return self.initialized

    def memory_allocated(self) -> int:
        self.asked += 1
        return self.allocated

    def current_device(self) -> int:
        return 1


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> _Cuda:
    fake = _Cuda(initialized=True, allocated=1000)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=fake))
    return fake


def test_memory_still_allocated_after_the_call_is_a_finding(cuda: _Cuda) -> None:
    watch = leaks.Watch()
    cuda.allocated = 1512
    assert watch.findings() == (
        "512 bytes of CUDA memory allocated during the call are still allocated on cuda:1 "
        "(torch.cuda.memory_allocated)",
    )


def test_memory_given_back_is_no_finding(cuda: _Cuda) -> None:
    watch = leaks.Watch()
    cuda.allocated = 800
    assert watch.findings() == ()


def test_a_call_that_first_used_cuda_counts_from_zero(cuda: _Cuda) -> None:
    cuda.initialized = False
    watch = leaks.Watch()
    cuda.initialized, cuda.allocated = True, 64
    assert watch.findings()[0].startswith("64 bytes of CUDA memory")


def test_cuda_never_used_is_never_asked(cuda: _Cuda) -> None:
    cuda.initialized = False
    watch = leaks.Watch()
    assert watch.findings() == ()
    assert cuda.asked == 0, "asking would initialise CUDA in a rank that never used it"


def test_without_the_leak_check_nothing_is_asked(cuda: _Cuda) -> None:
    watch = leaks.Watch(enabled=False)
    cuda.allocated = 5000
    assert watch.findings() == ()
    assert cuda.asked == 0
