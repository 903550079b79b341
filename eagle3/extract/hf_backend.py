"""The ``hf`` extraction backend: transformers forward passes with aux capture, one process per
device. Each shard's samples run in batches of ``extract.batch_size`` (length-sorted,
right-padded), capturing HF ``hidden_states`` indices ``aux_layer_ids + [L]``
(:func:`eagle3.target_model.capture_hidden_states`; L = last layer output before the final norm),
decoder body only; a writer thread overlaps file writes with the next forward. Shards go
round-robin (:func:`eagle3.extract.store.assign_shards`) to workers (:mod:`eagle3.extract.workers`).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from eagle3.errors import ConfigError
from eagle3.extract.store import (HS_DIR, ShardSpec, check_sample, commit_shard, hs_name,
                                  write_sample)

WRITER_THREADS = 4  # sample files written in parallel (encode + fsync overlap; GIL released in I/O)


@dataclass
class WorkerJob:
    """Everything a worker needs (picklable for spawned processes)."""

    target_dir: str
    model_dtype: str
    device: str
    capture_ids: list[int]          # HF hidden_states indices, last = L
    store_dtype: str
    batch_size: int
    out_dir: str
    sample_ids: list[str]
    input_ids: list[list[int]]
    loss_masks: list[list[int]]
    shards: list[ShardSpec]
    num_threads: int | None = None
    trust_remote_code: bool = False


def resolve_devices(device: str, num_gpus: int) -> list[str]:
    """Devices of the data-parallel workers: ``num_gpus`` CUDA devices, or CPU workers (``device``
    'auto': cuda when available). ConfigError when more GPUs are asked for than exist."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        have = torch.cuda.device_count()
        if num_gpus == 1:
            return [device]
        if num_gpus > have:
            raise ConfigError(f"extract.num_gpus: {num_gpus} requested, {have} CUDA devices "
                              "visible")
        return [f"cuda:{i}" for i in range(num_gpus)]
    return ["cpu"] * num_gpus


def forward_capture(model, capture_ids: list[int], batch: list[list[int]],
                    pad_id: int) -> list[torch.Tensor]:
    """Run the decoder on a right-padded batch; returns per sample ``[T_i, len(capture_ids), H]``
    (model dtype). Padding changes real tokens' states only by kernel rounding."""
    from eagle3.target_model import capture_hidden_states

    dev = next(model.parameters()).device
    lens = [len(x) for x in batch]
    t_max = max(lens)
    ids = torch.full((len(batch), t_max), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), t_max), dtype=torch.long)
    for b, x in enumerate(batch):
        ids[b, : len(x)] = torch.tensor(x)
        mask[b, : len(x)] = 1
    with torch.inference_mode(), capture_hidden_states(model, capture_ids) as cap:
        getattr(model, "model", model)(
            input_ids=ids.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else ids,
            attention_mask=(mask.to(dev) if min(lens) < t_max else None), use_cache=False)
        stacked = torch.stack([cap[i] for i in capture_ids], dim=2)  # [B, T, S, H]
    return [stacked[b, :n] for b, n in enumerate(lens)]


class _HostCopier:
    """Device → host copies of a batch's states into pinned memory on a side stream (CUDA only):
    ``submit(states)`` returns host views, per-sample all-finite flags computed on the device and
    an event the writer waits on, while the next forward runs; on the CPU the states as they are."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def submit(self, states: list[torch.Tensor]
               ) -> tuple[list[torch.Tensor], list[bool | None], object]:
        if not self.cuda:
            return states, [None] * len(states), None
        main = torch.cuda.current_stream(states[0].device)
        with torch.inference_mode():
            finite = torch.stack([torch.isfinite(s).all() for s in states]).to("cpu",
                                                                                non_blocking=True)
            rows = [s.shape[0] for s in states]
            host = torch.empty((sum(rows), *states[0].shape[1:]), dtype=states[0].dtype,
                               pin_memory=True)
            self.stream.wait_stream(main)
            with torch.cuda.stream(self.stream):
                views, start = [], 0
                for s, n in zip(states, rows):
                    views.append(host[start:start + n])
                    views[-1].copy_(s, non_blocking=True)
                    s.record_stream(self.stream)
                    start += n
                done = torch.cuda.Event()
                done.record(self.stream)
        return views, finite, done


def run_shards(job: WorkerJob, model=None, on_progress: Callable[[int], None] | None = None,
               on_ready: Callable[[], None] | None = None) -> dict[int, int]:
    """Extract and commit every shard of ``job``; returns {shard index: bytes written}.
    ``on_ready()`` is called once the target is loaded, ``on_progress(tokens)`` after each batch.
    DataError from the integrity checks (NaN/Inf, row counts) or a full disk; the failing shard is
    not committed. ``job.num_threads`` holds inside the call only (float32 CPU forwards give other
    bits with another thread count, so a later extraction here must see the caller's count)."""
    from eagle3.precision import torch_threads

    with torch_threads(job.num_threads or None):
        return _run_shards(job, model, on_progress, on_ready)


def _run_shards(job: WorkerJob, model, on_progress, on_ready) -> dict[int, int]:
    from eagle3.target_model import load_target

    tok = None
    if model is None:
        model, tok = load_target(job.target_dir, job.model_dtype, job.device, job.trust_remote_code)
    if on_ready is not None:
        on_ready()
    pad_id = pad_id_of(model, tok)
    out = Path(job.out_dir)
    written: dict[int, int] = {}
    copier = _HostCopier(next(model.parameters()).device)
    with ThreadPoolExecutor(max_workers=WRITER_THREADS, thread_name_prefix="hs-writer") as pool:
        for spec in job.shards:
            rows = sorted(range(spec.start, spec.stop), key=lambda i: (len(job.input_ids[i]), i))
            pending: list[Future] = []
            for b in range(0, len(rows), job.batch_size):
                chunk = rows[b: b + job.batch_size]
                states, finite, done = copier.submit(forward_capture(
                    model, job.capture_ids, [job.input_ids[i] for i in chunk], pad_id))
                for i, hs, ok in zip(chunk, states, finite):
                    pending.append(pool.submit(_check_and_write, job, out, i, hs, ok, done))
                for f in pending[: -2 * job.batch_size]:  # bound the memory held by queued writes
                    f.result()
                if on_progress:
                    on_progress(sum(len(job.input_ids[i]) for i in chunk))
            commit_shard(out, spec, sizes := dict(f.result() for f in pending))
            written[spec.index] = sum(sizes.values())
    return written


def _check_and_write(job: WorkerJob, out: Path, i: int, hs: torch.Tensor, finite=None,
                     done=None) -> tuple[str, int]:
    if done is not None:
        done.synchronize()  # the device → host copy of this batch (and its flags) has landed
    path = out / HS_DIR / hs_name(i)
    check_sample(job.sample_ids[i], path, job.input_ids[i], job.loss_masks[i], hs,
                 all_finite=None if finite is None else bool(finite))
    return path.name, write_sample(path, job.input_ids[i], hs, job.store_dtype)


def pad_id_of(model, tok) -> int:
    """The id that right-pads a batch: the tokenizer's ``pad_token_id``, else the model config's,
    else 0 (padded positions are masked out; their id changes no real token's states)."""
    for src in (tok, getattr(model, "config", None)):
        pid = getattr(src, "pad_token_id", None) if src is not None else None
        if pid is not None:
            return int(pid)
    return 0
