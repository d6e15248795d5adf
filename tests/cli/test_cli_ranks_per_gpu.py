"""``python -m harness check --ranks-per-gpu``: its usage errors, and what it says where it
cannot lease GPUs (this machine's CPU build shows none). The runs on GPUs are
``benchmarks/gpu_acceptance.py``'s."""

from __future__ import annotations

import pytest
import torch

from harness import cli


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = cli.main(["check", *argv])
    except SystemExit as exc:  # argparse's usage error
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--ranks-per-gpu", "0"), "argument --ranks-per-gpu: --ranks-per-gpu must be >= 1, got 0"),
        (("--ranks-per-gpu", "two"), "--ranks-per-gpu must be an int >= 1, not 'two'"),
        (
            ("--ranks-per-gpu", "2", "--backend", "gloo"),
            "--ranks-per-gpu 2 shares GPUs between NCCL ranks, but the backend is 'gloo': use "
            "--backend nccl, or --ranks-per-gpu 1",
        ),
    ],
)
def test_a_bad_ranks_per_gpu_is_a_usage_error_naming_it(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, err = _main(capsys, *argv)
    assert code == 2
    assert message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA shows GPUs here")
@pytest.mark.parametrize(
    ("backend", "message"),
    [
        ("auto", "--ranks-per-gpu needs the NCCL backend, and CUDA shows no GPU here"),
        ("nccl", "4 ranks, 2 per GPU, need 2 GPUs; CUDA shows 0"),
    ],
)
def test_without_gpus_it_says_what_it_would_need(
    capsys: pytest.CaptureFixture[str], backend: str, message: str
) -> None:
    code, err = _main(capsys, "--world-size", "4", "--ranks-per-gpu", "2", "--backend", backend)
    assert code == 2
    assert f"harness check: {message}" in err
