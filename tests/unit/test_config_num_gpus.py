"""``extract.num_gpus`` / ``train.num_gpus`` above the CUDA devices present, with the section's
device on CUDA, fail before any work starts, naming the key and both numbers. On the CPU they
count worker processes (CPU extraction workers; torchrun ranks over gloo), so any number is
taken there."""

from __future__ import annotations

import pytest

from eagle3.config import load_config
from eagle3.device_checks import check_devices, device_problems
from eagle3.errors import ConfigError


@pytest.mark.parametrize("section", ["extract", "train"])
@pytest.mark.parametrize("device", ["cuda", "auto", "cuda:0"])
def test_more_gpus_than_present_on_cuda(section, device):
    cfg = load_config(None, [f"{section}.device={device}", f"{section}.num_gpus=3"])
    got = device_problems(cfg, cuda_count=2)
    assert got == [
        f"{section}.num_gpus: expected at most 2 (the CUDA devices torch sees, "
        f"{section}.device {device!r}), got 3; fix: -o {section}.num_gpus=2, or run it "
        f"on a machine with 3 GPUs"
    ]
    with pytest.raises(
        ConfigError,
        match=rf"^DEVICE_MISSING: {section}.num_gpus: expected at "
        r"most 2 .* got 3;",
    ):
        check_devices(cfg, cuda_count=2)
    ok = load_config(None, [f"{section}.device={device}", f"{section}.num_gpus=2"])
    assert device_problems(ok, cuda_count=2) == []


@pytest.mark.parametrize("section", ["extract", "train"])
@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_cpu_workers_are_taken(section, device):
    cfg = load_config(None, [f"{section}.device={device}", f"{section}.num_gpus=2"])
    assert device_problems(cfg, cuda_count=0) == []


def test_a_missing_device_is_named_once_not_again_for_num_gpus():
    cfg = load_config(None, ["extract.device=cuda", "extract.num_gpus=2"])
    got = device_problems(cfg, cuda_count=0)
    assert len(got) == 1 and got[0].startswith("extract.device: ")
