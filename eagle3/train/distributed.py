"""Multi-GPU training, rank side: this rank's device and, under torchrun (``LOCAL_RANK`` set), the
process group (NCCL on CUDA, gloo on CPU) with status marks for the launcher's deadlines."""

from __future__ import annotations

import os

import torch

from eagle3.errors import ConfigError


def device_for(t, local_rank: int) -> torch.device:
    """The training device of local rank ``local_rank`` for a TrainConfig ``t`` (``train.device``
    ``auto``: cuda when available, else cpu). ConfigError when CUDA is asked for and missing."""
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(auto if t.device == "auto" else t.device)
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise ConfigError(f"train.device={t.device!r}: CUDA is not available on this machine")
    return torch.device("cuda", local_rank if dev.index is None else dev.index)


def setup_distributed(t) -> tuple[int, int, torch.device]:
    """``(rank, world_size, device)``; initialises the process group when run under torchrun. The
    rank's status (:func:`eagle3.workers.rank_status`) says ``arriving`` before the rendezvous and
    ``ready`` after it. The group's timeout is the largest of ``train.startup_timeout_s``,
    ``first_step_timeout_s`` and ``stall_timeout_s`` (a backstop for a hand-started torchrun; the
    launcher enforces each deadline)."""
    if "LOCAL_RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1, device_for(t, 0)
    from datetime import timedelta

    import torch.distributed as dist

    from eagle3.workers import rank_status

    local = int(os.environ["LOCAL_RANK"])
    device = device_for(t, local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        status = rank_status()
        status.mark("arriving")
        timeout = max(t.startup_timeout_s, t.first_step_timeout_s, t.stall_timeout_s)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=timeout))
        status.mark("ready", world=dist.get_world_size(), device=str(device))
    return dist.get_rank(), dist.get_world_size(), device


def teardown_distributed() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
