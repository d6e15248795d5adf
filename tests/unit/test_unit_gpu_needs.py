"""What a test needs of the run's GPUs (``gpus_per_rank``, ``ranks_per_gpu``, a
``--dist-mptc`` test's own minimum), its skips and its usage errors: pure logic."""

from __future__ import annotations

import types
from typing import Any

import pytest
from test_unit_settings import FakeConfig, FakeItem

from harness import compat
from harness.controller import backends
from harness.plugin import gpu_needs, item_settings, settings
from harness.plugin.gpu_needs import GpuNeed
from harness.plugin.settings import Settings


def _test(session: Settings | None = None, **kwargs: Any) -> item_settings.TestSettings:
    mark = pytest.mark.distributed(**kwargs).mark
    return item_settings.for_test(session or Settings(), FakeItem(mark))


def _fails(**kwargs: Any) -> str:
    with pytest.raises(pytest.fail.Exception) as info:
        _test(**kwargs)
    return info.value.msg


@pytest.mark.parametrize(
    ("need", "world_size", "count", "shares"),
    [
        (GpuNeed(), 4, 0, False),
        (GpuNeed(per_rank=1), 4, 4, False),
        (GpuNeed(per_rank=2), 4, 8, False),
        (GpuNeed(per_rank=1, ranks_per_gpu=2), 4, 2, True),
        (GpuNeed(per_rank=1, ranks_per_gpu=2), 3, 2, True),
        (GpuNeed(per_rank=1, ranks_per_gpu=4), 4, 1, True),
        (GpuNeed(per_rank=1, ranks_per_gpu=4), 1, 1, False),
        (GpuNeed(fixed=3), 2, 3, False),
    ],
)
def test_a_needs_gpu_count(need: GpuNeed, world_size: int, count: int, shares: bool) -> None:
    assert need.count(world_size) == count
    assert need.shares(world_size) is shares
    assert bool(need) is bool(count)


@pytest.mark.parametrize(
    ("need", "world_size", "have", "message"),
    [
        (GpuNeed(per_rank=1), 4, 2, "needs 4 GPUs (4 x 1), this run has 2"),
        (GpuNeed(per_rank=1), 1, 0, "needs 1 GPU (1 x 1), this run has 0"),
        (GpuNeed(per_rank=1, ranks_per_gpu=2), 4, 1, "needs 2 GPUs (4 ranks, 2 per GPU), this "),
        (GpuNeed(fixed=8), 2, 0, "needs 8 GPUs (the test's _min_gpus_required), this run has 0"),
        (GpuNeed(per_rank=1, ranks_per_gpu=2), 4, 2, None),
    ],
)
def test_a_shortfall_reads_as_the_harnesss_skip(
    need: GpuNeed, world_size: int, have: int, message: str | None
) -> None:
    found = need.shortfall(world_size, have)
    assert found == message if message is None else str(found).startswith(message)


@pytest.mark.parametrize(
    ("backend", "per_rank", "shared", "need"),
    [
        ("nccl", None, 1, GpuNeed(per_rank=1)),
        ("nccl", None, 2, GpuNeed(per_rank=1, ranks_per_gpu=2)),
        ("nccl", 1, 2, GpuNeed(per_rank=1, ranks_per_gpu=2)),
        ("nccl", 0, 2, GpuNeed()),
        ("gloo", None, 2, GpuNeed()),  # "auto" on a CPU machine: nothing to share
        ("gloo", 1, 1, GpuNeed(per_rank=1)),
    ],
)
def test_the_need_once_the_backend_is_resolved(
    backend: str, per_rank: int | None, shared: int, need: GpuNeed
) -> None:
    assert gpu_needs.need(backend, per_rank, shared) == need


def test_the_marker_wins_over_the_ini_and_the_ini_over_the_default() -> None:
    assert _test(backend="nccl").ranks_per_gpu == 1
    assert _test(Settings(ranks_per_gpu=2), backend="nccl").ranks_per_gpu == 2
    assert _test(Settings(ranks_per_gpu=2), ranks_per_gpu=4).ranks_per_gpu == 4
    assert _test(Settings(ranks_per_gpu=2), ranks_per_gpu=1).ranks_per_gpu == 1


def test_the_ini_value_applies_only_where_the_test_can_share() -> None:
    session = Settings(ranks_per_gpu=2)
    assert _test(session, backend="gloo").ranks_per_gpu == 1
    assert _test(session, backend="nccl", gpus_per_rank=2).ranks_per_gpu == 1
    assert _test(session, backend="auto", gpus_per_rank=1).ranks_per_gpu == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ranks_per_gpu": True}, "ranks_per_gpu must be an int >= 1, not True"),
        ({"ranks_per_gpu": 0}, "ranks_per_gpu must be >= 1, got 0"),
        ({"ranks_per_gpu": 2.0}, "ranks_per_gpu must be an int >= 1, not 2.0"),
        (
            {"ranks_per_gpu": 2, "backend": "gloo"},
            "ranks_per_gpu=2 shares GPUs between NCCL ranks, but the backend is 'gloo'; use "
            "backend='nccl' (or 'auto'), or ranks_per_gpu=1",
        ),
        (
            {"ranks_per_gpu": 2, "backend": "nccl", "gpus_per_rank": 2},
            "gpus_per_rank=2 and ranks_per_gpu=2 cannot both hold",
        ),
        (
            {"ranks_per_gpu": 2, "gpus_per_rank": 0},
            "gpus_per_rank=0 and ranks_per_gpu=2 cannot both hold",
        ),
    ],
)
def test_a_ranks_per_gpu_that_cannot_be_fails_the_test_naming_it(
    kwargs: dict[str, Any], message: str
) -> None:
    text = _fails(**kwargs)
    assert text.startswith("invalid @pytest.mark.distributed: ")
    assert message in text


def test_ranks_per_gpu_one_is_valid_with_any_backend() -> None:
    assert _test(backend="gloo", ranks_per_gpu=1, gpus_per_rank=2).ranks_per_gpu == 1


def test_the_ini_key_is_read_and_a_bad_value_is_a_usage_error() -> None:
    assert settings.read(FakeConfig(dist_ranks_per_gpu=" 4 ")).ranks_per_gpu == 4
    assert settings.read(FakeConfig()).ranks_per_gpu == 1
    for bad, said in (("0", "got 0"), ("two", "not 'two'"), ("1.5", "not '1.5'")):
        with pytest.raises(pytest.UsageError) as info:
            settings.read(FakeConfig(dist_ranks_per_gpu=bad))
        assert "ini option dist_ranks_per_gpu must be" in str(info.value)
        assert said in str(info.value)


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (None, "several ranks on one GPU (ranks_per_gpu) need NCCL >= 2.30; this torch "),
        ((2, 21, 5), "need NCCL >= 2.30; this torch"),
        ((2, 29, 9), "has NCCL 2.29.9"),
        ((2, 30, 0), None),
        ((3, 0), None),
    ],
)
def test_sharing_gpus_needs_nccl_2_30(version: tuple[int, ...] | None, message: str) -> None:
    found = backends.sharing_unsupported(version)
    assert found is None if message is None else message in str(found)
    if version is not None and message is not None:
        assert ".".join(map(str, version)) in str(found)


def test_an_nccl_world_needs_its_leases_devices() -> None:
    # This machine shows no CUDA device: the count named is the lease's, not the ranks'.
    if backends.torch.cuda.is_available():
        pytest.skip("CUDA shows devices here")
    assert backends.unavailable_reason("nccl", 4, 2) == "needs 2 CUDA devices, found 0"
    assert backends.unavailable_reason("nccl", 4) == "needs 4 CUDA devices, found 0"


# ---------------------------------------------------------------- --dist-mptc


def _case(method: Any) -> Any:
    cls = type("Case", (), {"test_x": method})
    case = cls()
    case._testMethodName = "test_x"
    return case


def test_a_mptc_tests_minimum_is_read_from_its_decorated_method() -> None:
    def marked() -> None: ...

    marked._min_gpus_required = 4  # type: ignore[attr-defined]
    assert compat.mptc_min_gpus(_case(marked)) == 4
    assert compat.mptc_min_gpus(_case(lambda: None)) is None  # older torch: nothing
    for odd in (True, 0, "2"):
        other = types.FunctionType(marked.__code__, {})
        other._min_gpus_required = odd  # type: ignore[attr-defined]
        assert compat.mptc_min_gpus(_case(other)) is None


def test_torchs_own_gpu_decorator_is_read_as_it_records() -> None:
    from torch.testing._internal.common_distributed import skip_if_lt_x_gpu

    decorated = skip_if_lt_x_gpu(3)(lambda self: None)
    expected = getattr(decorated, "_min_gpus_required", None)  # 3 from torch 2.15 on
    assert expected in (None, 3)
    assert compat.mptc_min_gpus(_case(decorated)) == expected
    assert gpu_needs.mptc_need(expected) == (GpuNeed(fixed=3) if expected else GpuNeed())
