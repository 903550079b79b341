"""Per-step profiling for the training benchmarks: torch.profiler tables, the GPU-busy fraction,
kernels per step (:class:`StepProfiler`), and the FLOPs of one trained token
(:func:`flops_per_token`, for MFU)."""

from __future__ import annotations

import time
from pathlib import Path


class StepProfiler:
    """``torch.profiler`` over optimizer steps ``start+1 .. start+n`` of one trainer (``step(i)`` is
    called after step i ends). Writes the kernel table to ``<out>/profile-<name>.txt`` and returns,
    per step, the wall time and the summed device (kernel) time: their ratio is how busy the GPU was
    (< 1 = launch/host bound)."""

    def __init__(self, name: str, start: int, n: int, out: Path | None, per_call: int = 1):
        self.name, self.start, self.n, self.out, self.prof, self.result = (
            name,
            start,
            n,
            out,
            None,
            None,
        )
        self.per_call = (
            per_call  # optimizer steps between two step() calls (our loop reports per log window)
        )

    def step(self, i: int) -> None:
        import torch

        if self.n <= 0 or self.out is None:
            return
        cuda = torch.cuda.is_available()
        if i == self.start:
            if cuda:
                torch.cuda.synchronize()
            acts = [torch.profiler.ProfilerActivity.CPU] + (
                [torch.profiler.ProfilerActivity.CUDA] if cuda else []
            )
            self.prof = torch.profiler.profile(activities=acts)
            self.prof.__enter__()
            self.t0 = time.perf_counter()
        elif i == self.start + self.n and self.prof is not None:
            if cuda:
                torch.cuda.synchronize()
            steps = self.n * self.per_call
            wall = (time.perf_counter() - self.t0) / steps
            self.prof.__exit__(None, None, None)
            ka = self.prof.key_averages()
            gpu = [
                e for e in ka if e.device_type == torch.autograd.DeviceType.CUDA
            ]  # kernels and copies only
            busy = sum(e.self_device_time_total for e in gpu) / 1e6 / steps
            kernels = sum(e.count for e in gpu) / steps
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / f"profile-{self.name}.txt").write_text(
                ka.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=70)
            )
            self.result = {
                "wall_ms": wall * 1e3,
                "kernel_ms": busy * 1e3,
                "gpu_busy": busy / wall,
                "kernels_per_step": kernels,
            }
            self.prof = None


def flops_per_token(model, ttt: int, seq: int) -> float:
    """Model FLOPs per trained position (forward + backward), see the module docstring."""
    train = sum(
        p.numel()
        for n, p in model.named_parameters()
        if p.requires_grad and p.dim() == 2 and "embed" not in n
    )
    head = model.lm_head.weight.numel()
    conf = model.config.transformer_layer_config
    layers, hid = conf.num_hidden_layers, conf.num_attention_heads * conf.head_dim
    attn = (
        sum(12 * layers * hid * (seq * (k + 1) / 2 + seq * k) / seq * seq for k in range(ttt)) / seq
    )
    return ttt * (6 * train + 4 * head) + attn
