"""A reused world behaves like a fresh one: what a test changes in its ranks is put back
before the next test, and a test draws the same random numbers wherever it runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DIRTY_THEN_CHECK = """
import logging
import os
import sys
import warnings

import pytest
import torch

@pytest.mark.distributed(world_size=2)
def test_a_changes_everything(rank, tmp_path):
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(3)
    sys.path.insert(0, "/nonexistent/leaked")
    warnings.simplefilter("error")
    logging.getLogger().setLevel(logging.DEBUG)
    logging.getLogger().addHandler(logging.NullHandler())
    os.chdir(tmp_path)
    os.environ["HARNESS_LEAKED_VAR"] = "1"

@pytest.mark.distributed(world_size=2)
def test_b_sees_a_fresh_rank(rank, tmp_path):
    assert torch.get_default_dtype() == torch.float32
    assert torch.is_grad_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.get_num_threads() != 3
    assert "/nonexistent/leaked" not in sys.path
    assert not any(f[0] == "error" and f[2] is Warning for f in warnings.filters)
    assert logging.getLogger().level == logging.WARNING
    assert not any(isinstance(h, logging.NullHandler) for h in logging.getLogger().handlers)
    assert os.getcwd() != str(tmp_path.parent / "test_a_changes_everything0")
    assert "HARNESS_LEAKED_VAR" not in os.environ
"""


def test_what_a_test_changes_in_its_ranks_is_put_back(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(DIRTY_THEN_CHECK)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2)


DRAWS = """
import json
import os
import random

import numpy
import pytest
import torch

def record(name, rank):
    drawn = [torch.rand(3).tolist(), random.random(), numpy.random.rand(2).tolist()]
    path = os.path.join(os.environ["DRAWS_DIR"], f"{os.environ['DRAWS_RUN']}-{name}-{rank}")
    with open(path, "w") as handle:
        json.dump(drawn, handle)

@pytest.mark.distributed(world_size=2)
def test_a_draws_first(rank):
    torch.rand(5), random.random(), numpy.random.rand(3)

@pytest.mark.distributed(world_size=2)
def test_draws(rank):
    record("draws", rank)

@pytest.mark.distributed(world_size=2)
def test_other(rank):
    record("other", rank)
"""


def test_a_test_draws_the_same_numbers_alone_or_after_others(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytester.makepyfile(test_draws=DRAWS)
    monkeypatch.setenv("DRAWS_DIR", str(tmp_path))
    runs = {"alone": ["-k", "test_draws"], "after": [], "isolated": ["--dist-isolate"]}
    for run, args in runs.items():
        monkeypatch.setenv("DRAWS_RUN", run)
        assert pytester.runpytest("-p", "no:randomly", *args).ret == 0

    def drawn(run: str, name: str, rank: int) -> object:
        return json.loads((tmp_path / f"{run}-{name}-{rank}").read_text())

    for rank in (0, 1):
        assert drawn("alone", "draws", rank) == drawn("after", "draws", rank)
        assert drawn("alone", "draws", rank) == drawn("isolated", "draws", rank)
        # Seeded per test: another test draws other numbers.
        assert drawn("after", "other", rank) != drawn("after", "draws", rank)
