"""A config naming CUDA on a machine without it fails before any work starts
(eagle3.device_checks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from eagle3.config import load_config
from eagle3.device_checks import check_devices, device_problems
from eagle3.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "configs" / "smollm2-gpu.yaml"


def test_every_cuda_key_is_named_when_there_is_no_cuda():
    probs = device_problems(load_config(GPU), cuda_count=0)
    assert [p.split(":")[0] for p in probs] == ["extract.device", "train.device", "serve.device"]
    assert (
        "got 'cuda' and torch sees no CUDA device" in probs[0]
        and "-o extract.device=cpu" in probs[0]
    )


def test_an_index_past_the_visible_gpus_fails_and_cpu_or_auto_never_does():
    cfg = load_config(GPU, ["extract.device=cuda:1", "train.device=auto", "serve.device=cpu"])
    assert device_problems(cfg, cuda_count=2) == []
    probs = device_problems(cfg, cuda_count=1)
    assert (
        len(probs) == 1
        and "extract.device" in probs[0]
        and "'cuda:1'" in probs[0]
        and "1 CUDA device(s)" in probs[0]
    )
    with pytest.raises(ConfigError, match="extract.device"):
        check_devices(cfg, cuda_count=1)


# `eagle3 preflight` lists its checks instead, the device ones failed
# (tests/unit/test_fresh_clone_runs.py)
@pytest.mark.parametrize("command", ["run"])
def test_cli_refuses_a_gpu_config_here_before_prefect_starts(command):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = subprocess.run(
        [sys.executable, "-m", "cli.main", command, str(GPU)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "train.device: expected a device this machine has, got 'cuda'" in r.stderr
    assert "Prefect" not in r.stdout + r.stderr and "retry" not in r.stderr
