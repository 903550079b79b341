"""On-disk storage of extracted hidden states: sample files, fp8 encoding, shard commits, resume,
integrity. One file per sample, ``<out>/hidden_states/hs_{i}.safetensors`` (i = ``data/`` row), in
the layout speculators' ``FileTransfer`` reads:

    token_ids              [T] int64
    hidden_states          [T, n_aux+1, H]  bfloat16 | float32 | float8_e4m3fn; slot -1 = last
                           layer, pre-norm
    hidden_states_scales   [T, n_aux+1, 1] float32 (fp8 only: value = fp8 * scale; speculators'
                           hs_connectors FP8Transfer)

A shard of ``extract.shard_size`` rows is committed by its marker ``<out>/.progress/shard_{k}.json``
(atomic, deterministic: a resumed run has an uninterrupted one's content hash), written once every
file is written to a temporary name, fsync'd and renamed; a SIGKILL loses at most one shard.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle3.artifacts import atomic_write_json
from eagle3.errors import DataError

HS_DIR = "hidden_states"
PROGRESS_DIR = ".progress"
# extract.mode=online, instead of HS_DIR: {mode, plan_hash, capture_ids, aux_layer_ids, dtype,
# model_dtype, batch_size, target_weights_hash}, in the folder's content hash
ONLINE_FILE = "online.json"
SCALES_KEY = "hidden_states_scales"
STORE_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "fp8": torch.float8_e4m3fn}


def hs_name(index: int) -> str:
    """File name of sample ``index``: ``hs_{index}.safetensors`` (speculators' naming)."""
    return f"hs_{index}.safetensors"


def bytes_per_token(n_slots: int, hidden_size: int, dtype: str) -> int:
    """Bytes one token costs in a sample file: hidden states (+ fp8 scales) + its int64 token id."""
    if dtype not in STORE_DTYPES:
        raise DataError(f"extract.dtype: expected one of {sorted(STORE_DTYPES)}, got {dtype!r}")
    scales = 4 * n_slots if dtype == "fp8" else 0
    return n_slots * hidden_size * STORE_DTYPES[dtype].itemsize + scales + 8


def encode(hidden: torch.Tensor, dtype: str) -> dict[str, torch.Tensor]:
    """``hidden [T, S, H]`` (any float dtype) → its stored tensors (module docstring); fp8 is e4m3
    with a float32 scale per (token, slot), ``scale = amax / 448`` (hs_connectors' rule)."""
    if dtype != "fp8":
        return {"hidden_states": hidden.to(STORE_DTYPES[dtype]).contiguous()}
    from hs_connectors.fp8_utils import quantize_tensor_to_fp8

    t, s, h = hidden.shape
    q, scale = quantize_tensor_to_fp8(hidden.reshape(t * s, h))  # [T*S, H] fp8, [T*S, 1] fp32
    return {"hidden_states": q.reshape(t, s, h).contiguous(),
            SCALES_KEY: scale.reshape(t, s, 1).contiguous()}


def decode(tensors: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Stored tensors → ``hidden_states [T, S, H]`` in ``dtype`` (fp8 dequantized)."""
    hs = tensors["hidden_states"]
    if SCALES_KEY not in tensors:
        return hs.to(dtype)
    return (hs.to(torch.float32) * tensors[SCALES_KEY].to(torch.float32)).to(dtype)


def load_sample(out_dir: str | Path, index: int,
                dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Sample ``index``: ``{"token_ids" [T] int64, "hidden_states" [T, S, H] dtype}`` (fp8
    decoded); DataError when the file is missing."""
    from safetensors.torch import load_file

    path = Path(out_dir) / HS_DIR / hs_name(index)
    if not path.is_file():
        raise DataError(f"{path}: hidden-states file of sample {index} not found")
    t = load_file(path)
    return {"token_ids": t["token_ids"], "hidden_states": decode(t, dtype)}


def check_sample(sample_id: str, path: Path, input_ids: list[int], loss_mask: list[int],
                 hidden: torch.Tensor, all_finite: bool | None = None) -> None:
    """DataError (naming sample, file, expected and actual) unless rows = len(input_ids) =
    len(loss_mask) and all values are finite; ``all_finite`` True (known on the device) skips the
    host scan."""
    rows = hidden.shape[0]
    if not rows == len(input_ids) == len(loss_mask):
        raise DataError(f"sample {sample_id} ({path}): hidden-state rows {rows}, len(input_ids) "
                        f"{len(input_ids)}, len(loss_mask) {len(loss_mask)}; expected all equal")
    if all_finite:
        return
    finite = torch.isfinite(hidden)
    if not bool(finite.all()):
        bad = (~finite).nonzero()[0].tolist()
        raise DataError(f"sample {sample_id} ({path}): hidden states contain NaN/Inf (first at "
                        f"[token, slot, dim] = {bad}); expected all finite")


def write_sample(path: Path, token_ids: list[int], hidden: torch.Tensor, dtype: str) -> int:
    """Write one sample file atomically (temp name, fsync, rename); returns its size in bytes.
    DataError when the disk is full (the temporary file is removed first)."""
    from safetensors.torch import save_file

    tensors = {"token_ids": torch.tensor(token_ids, dtype=torch.int64), **encode(hidden, dtype)}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except Exception as e:  # OSError, or safetensors' SafetensorError ("No space left on device")
        tmp.unlink(missing_ok=True)
        why = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
        raise DataError(f"{path}: could not write hidden states ({why}); nothing was committed for "
                        "its shard; free disk space (or lower data.num_conversations / use "
                        "extract.dtype=fp8) and re-run: committed shards are kept") from e
    return path.stat().st_size


@dataclass(frozen=True)
class ShardSpec:
    """Shard ``index`` = dataset rows ``[start, stop)``."""

    index: int
    start: int
    stop: int


def make_shards(num_samples: int, shard_size: int) -> list[ShardSpec]:
    """Consecutive shards of ``shard_size`` rows (the last may be shorter)."""
    return [ShardSpec(k, s, min(s + shard_size, num_samples))
            for k, s in enumerate(range(0, num_samples, shard_size))]


def assign_shards(shards: list[ShardSpec], world: int) -> list[list[ShardSpec]]:
    """Round-robin shards over ``world`` workers (worker r gets shards k with k % world == r)."""
    if world < 1:
        raise DataError(f"data-parallel world size: expected >= 1, got {world}")
    return [[s for s in shards if s.index % world == r] for r in range(world)]


def marker_path(out_dir: Path, shard: int) -> Path:
    return out_dir / PROGRESS_DIR / f"shard_{shard}.json"


def commit_shard(out_dir: Path, spec: ShardSpec, sizes: dict[str, int]) -> None:
    """Record shard ``spec`` as complete (its files already renamed into place)."""
    atomic_write_json(marker_path(out_dir, spec.index),
                      {"shard": spec.index, "rows": [spec.start, spec.stop],
                       "files": dict(sorted(sizes.items()))})


def completed_shards(out_dir: Path, shards: list[ShardSpec], *,
                     written_before_marker: bool = False) -> set[int]:
    """Indices of shards whose marker exists and whose files all exist with the recorded sizes.
    ``written_before_marker``: also no file newer than its marker (one rewritten in place after
    the commit makes its shard incomplete)."""

    def intact(p: Path, size: int, committed: int) -> bool:
        return p.is_file() and p.stat().st_size == size and not (
            written_before_marker and p.stat().st_mtime_ns > committed)

    done = set()
    for spec in shards:
        m = marker_path(out_dir, spec.index)
        try:
            files = json.loads(m.read_text())["files"]
        except (OSError, json.JSONDecodeError, KeyError):
            continue
        committed = m.stat().st_mtime_ns
        if len(files) == spec.stop - spec.start and all(
                intact(out_dir / HS_DIR / name, size, committed) for name, size in files.items()):
            done.add(spec.index)
    return done


def remove_stale_temporaries(out_dir: Path) -> int:
    """Delete temporary sample files left by a killed run; returns how many were removed."""
    stale = list((out_dir / HS_DIR).glob(".hs_*.tmp"))
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def start_or_resume(out_dir: Path, plan_hash: str, plan_info: dict) -> bool:
    """Prepare ``out_dir`` for the extraction ``plan_hash``; True when resuming. DataError when it
    holds another extraction (another plan hash) or hidden states without a progress record."""
    plan_file = out_dir / PROGRESS_DIR / "plan.json"
    if plan_file.is_file():
        have = json.loads(plan_file.read_text()).get("plan_hash")
        if have != plan_hash:
            raise DataError(f"{out_dir}: holds an extraction with plan hash {have}, this run's is "
                            f"{plan_hash} (different data, target, layers, dtype or shard size); "
                            "use another output directory or delete this one")
        (out_dir / HS_DIR).mkdir(parents=True, exist_ok=True)
        return True
    if (out_dir / HS_DIR).exists() and any((out_dir / HS_DIR).iterdir()):
        raise DataError(f"{out_dir}/{HS_DIR}: has files but no {PROGRESS_DIR}/plan.json; not an "
                        "extraction this code can resume — delete it or choose another directory")
    (out_dir / HS_DIR).mkdir(parents=True, exist_ok=True)
    atomic_write_json(plan_file, {"plan_hash": plan_hash, **plan_info})
    return False
