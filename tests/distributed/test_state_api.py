"""Public names and exact signatures of fhelium.distributed (no process group needed)."""

from __future__ import annotations

import inspect
import typing
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

import fhelium.distributed
import fhelium.distributed._state as state

KW = inspect.Parameter.KEYWORD_ONLY
POS_OR_KW = inspect.Parameter.POSITIONAL_OR_KEYWORD


def test_public_names_are_reexported() -> None:
    assert sorted(fhelium.distributed.__all__) == ["init", "local_device", "shutdown"]
    assert sorted(state.__all__) == ["init", "local_device", "shutdown"]
    for name in ("init", "local_device", "shutdown"):
        assert getattr(fhelium.distributed, name) is getattr(state, name)
        assert callable(getattr(fhelium.distributed, name))


def test_init_signature() -> None:
    signature = inspect.signature(fhelium.distributed.init)
    expected = [
        ("backend", None),
        ("init_method", None),
        ("timeout", None),
        ("world_size", -1),
        ("rank", -1),
        ("store", None),
        ("pg_options", None),
        ("device_id", None),
    ]
    assert [(p.name, p.default) for p in signature.parameters.values()] == expected
    assert all(p.kind is KW for p in signature.parameters.values())


def test_init_annotations() -> None:
    hints = typing.get_type_hints(fhelium.distributed.init)
    assert hints == {
        "backend": str | None,
        "init_method": str | None,
        "timeout": timedelta | None,
        "world_size": int,
        "rank": int,
        "store": Any | None,
        "pg_options": Any | None,
        "device_id": torch.device | int | None,
        "return": type(None),
    }


def test_init_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        fhelium.distributed.init("gloo")  # type: ignore[misc]


def test_shutdown_signature() -> None:
    signature = inspect.signature(fhelium.distributed.shutdown)
    (param,) = signature.parameters.values()
    assert (param.name, param.kind, param.default) == ("group", POS_OR_KW, None)
    hints = typing.get_type_hints(fhelium.distributed.shutdown)
    assert hints == {"group": dist.ProcessGroup | None, "return": type(None)}
    assert dist.ProcessGroup is torch.distributed.ProcessGroup


def test_local_device_signature() -> None:
    signature = inspect.signature(fhelium.distributed.local_device)
    assert signature.parameters == {}
    assert typing.get_type_hints(fhelium.distributed.local_device) == {"return": torch.device}


def test_module_docstrings() -> None:
    assert state.__doc__ is not None
    assert state.__doc__.startswith("Process-group initialization and rank-local device helpers.")
    assert fhelium.distributed.init.__doc__ is not None
    assert fhelium.distributed.init.__doc__.startswith(
        "Initialize the PyTorch default process group and local CUDA device."
    )
    assert fhelium.distributed.shutdown.__doc__ is not None
    assert fhelium.distributed.shutdown.__doc__.startswith("Destroy an initialized process group.")
    assert fhelium.distributed.local_device.__doc__ is not None
    assert fhelium.distributed.local_device.__doc__.startswith(
        "Return rank-local device metadata selected for the current process."
    )
