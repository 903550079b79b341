"""LR schedules and the training state on disk: atomic checkpoints, keep-last-k, best, exact resume.

``<out_dir>/state/``::

    ckpt-00000040/   model.safetensors (the draft's full state dict), optimizer.pt, trainer.pt
                     (scheduler, RNG states), state.json (step, epoch, micro-batch position,
                     tokens seen, vocab-map hash, data content hash, train section, last metrics)
    best/            model.safetensors + state.json of the evaluation with the highest
                     acceptance length by ``train.select_best_by`` (:data:`eagle3.train.loop.
                     SELECT_KEYS`: ``simulated`` on the validation split, or ``measured`` by
                     replay, :mod:`eagle3.measure.dev_acceptance`); not by loss
                     (FAILURE_CLASSES.md 18)

Directories are written through :func:`eagle3.artifacts.atomic_directory` (a SIGKILL leaves the
previous or the new complete checkpoint). A checkpoint of another vocabulary map
(docs/FAILURE_CLASSES.md 9), other data or other :data:`FROZEN_FIELDS` / flags / process count /
``train.distributed`` belongs to another training (:func:`resume_conflict`). Allowed to change:
lr, schedule, warm-up, epochs, max_steps, cadences, keep_last; later steps take the new LR.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import random
import re
import shutil
import tempfile
from pathlib import Path

import torch

from eagle3.artifacts import atomic_directory
from eagle3.errors import ConfigError, DataError, Eagle3Error

_CKPT = re.compile(r"^ckpt-(\d{8})$")


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total_steps: int,
              min_ratio: float = 0.0) -> float:
    """Multiplier of the base LR for optimizer step ``step`` (0-based): warm-up ``(step + 1) /
    warmup_steps`` for ``step < warmup_steps``; then ``constant`` 1, or ``epochs`` a cosine from 1
    to ``min_ratio`` over ``[warmup_steps, total_steps)`` (progress clipped to [0, 1]). A function
    of the step only, so a resumed run gets the same LR."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(optimizer, *, schedule: str, warmup_steps: int, total_steps: int,
                   min_ratio: float):
    """A ``LambdaLR`` over :func:`lr_factor`."""
    fn = functools.partial(lr_factor, schedule=schedule, warmup_steps=warmup_steps,
                           total_steps=total_steps, min_ratio=min_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def rng_state() -> dict:
    """Python, NumPy, torch CPU and CUDA RNG states."""
    import numpy as np

    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            **({"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {})}


def set_rng_state(st: dict) -> None:
    import numpy as np

    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available() and len(st["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(st["cuda"])


CHECKPOINT_FILES = ("model.safetensors", "optimizer.pt", "trainer.pt", "state.json")


def check_complete(ckpt: Path, state_dir: Path | None = None) -> None:
    """DataError naming the missing :data:`CHECKPOINT_FILES` and the previous complete one."""
    missing = [f for f in CHECKPOINT_FILES if not (ckpt / f).is_file()]
    if not missing:
        return
    older = [c for c in list_checkpoints(state_dir or ckpt.parent) if c != ckpt
             and all((c / f).is_file() for f in CHECKPOINT_FILES)]
    way = (f"remove {ckpt} to resume from the previous complete checkpoint {older[-1].name}"
           if older else "no earlier complete checkpoint exists")
    raise DataError(f"resume: checkpoint {ckpt} is incomplete: expected {list(CHECKPOINT_FILES)}, "
                    f"missing {missing}; {way}, or set train.resume=false to start over")


def list_checkpoints(state_dir: Path) -> list[Path]:
    """Complete ``ckpt-*`` directories under ``state_dir``, oldest first."""
    if not state_dir.is_dir():
        return []
    found = [p for p in state_dir.iterdir()
             if p.is_dir() and _CKPT.match(p.name) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(_CKPT.match(p.name).group(1)))


@contextlib.contextmanager
def _written(final: Path, what: str):
    """A failed write of ``final`` (OSError, safetensors' or torch.save's errors) as a DataError
    naming the folder, the cause and the free space."""
    try:
        yield
    except Eagle3Error:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised with the path and free space
        try:
            free = f"{shutil.disk_usage(final.parent).free / 2**30:.2f} GiB free there"
        except OSError:
            free = "free space unknown"
        why = (e.strerror if isinstance(e, OSError) and e.strerror
               else f"{type(e).__name__}: {str(e)[:200]}")
        older = list_checkpoints(final.parent) if final.parent.is_dir() else []
        kept = (f"the newest complete checkpoint, {older[-1].name}, is kept and a re-run resumes "
                "from it" if older
                else "no complete checkpoint exists yet, so a re-run starts from step 0")
        raise DataError(f"{final}: could not write the {what} ({why}; {free}); {kept}. If the disk "
                        "is full, free space or write fewer checkpoints (train.keep_last, "
                        "train.checkpoint_every)") from e


def check_checkpoint_space(state_dir: Path, model, *, keep_last: int, trains: bool = True,
                           window_bytes: int = 0) -> int:
    """Bytes the run will write under ``state_dir``: ``keep_last + 1`` checkpoints (weights plus
    two float32 AdamW moments per trainable parameter), ``best/`` and the exported draft, plus
    ``window_bytes`` still to come into the cached window of states; existing checkpoints count as
    free. DataError with the folder, bytes needed and free."""
    weights = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    moments = sum(2 * 4 * p.numel() for p in model.parameters() if p.requires_grad)
    need = ((keep_last + 1) * (weights + moments) if trains else 0) + 2 * weights + window_bytes
    held = sum(f.stat().st_size for d in [*list_checkpoints(state_dir), state_dir / "best"]
               if d.is_dir() for f in d.iterdir() if f.is_file())
    free = shutil.disk_usage(state_dir).free
    if free + held < need:
        raise DataError(f"{state_dir}: the run needs about {need / 2**20:.1f} MiB for checkpoints "
                        f"(train.keep_last={keep_last}: {keep_last + 1} x "
                        f"{(weights + moments) / 2**20:.1f} MiB while one is written, plus best/ "
                        "and the exported draft"
                        + (f", plus {window_bytes / 2**20:.1f} MiB for the window of states, "
                           "extract.cache_max_gb" if window_bytes else "")
                        + f"), but only {free / 2**20:.1f} MiB are free there "
                        f"(+ {held / 2**20:.1f} MiB of older checkpoints); free space or lower "
                        "train.keep_last" + (" or extract.cache_max_gb" if window_bytes else ""))
    return need


def save_checkpoint(state_dir: Path, *, model, optimizer, scheduler, info: dict, keep_last: int,
                    model_state: dict | None = None, optimizer_state: dict | None = None) -> Path:
    """Write ``ckpt-<step>`` atomically (``info``, holding ``step``, as ``state.json``), then delete
    all but the newest ``keep_last``; returns its directory. ``model_state`` / ``optimizer_state``:
    full state dicts gathered from shards (None: the objects' own). DataError (path, cause, free
    space) when the write fails."""
    final = state_dir / f"ckpt-{int(info['step']):08d}"
    with _written(final, "training checkpoint"), atomic_directory(final) as tmp:
        _write_weights(tmp, model, model_state, info)
        torch.save(optimizer.state_dict() if optimizer_state is None else optimizer_state,
                   tmp / "optimizer.pt")
        torch.save({"scheduler": scheduler.state_dict(), "rng": rng_state()}, tmp / "trainer.pt")
    for old in list_checkpoints(state_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_best(state_dir: Path, *, model, info: dict, model_state: dict | None = None) -> Path:
    """Write ``state/best`` (weights + ``state.json``) atomically, as :func:`save_checkpoint`."""
    final = state_dir / "best"
    with _written(final, "best draft"), atomic_directory(final) as tmp:
        _write_weights(tmp, model, model_state, info)
    return final


def _write_weights(tmp: Path, model, model_state: dict | None, info: dict) -> None:
    from safetensors.torch import save_file

    weights = model.state_dict() if model_state is None else model_state
    save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()},
              str(tmp / "model.safetensors"))
    (tmp / "state.json").write_text(json.dumps(info, indent=2, sort_keys=True, default=float))


def read_info(ckpt: Path) -> dict:
    """``state.json`` of a checkpoint or of ``best``. Raises DataError when missing or not JSON."""
    path = ckpt / "state.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: unreadable training state ({e})") from e


def load_weights(model, ckpt: Path) -> None:
    """Load ``ckpt/model.safetensors`` into ``model``; every key must match, else DataError."""
    from safetensors.torch import load_file

    sd = load_file(str(ckpt / "model.safetensors"))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise DataError(f"{ckpt}/model.safetensors: does not match the draft (missing "
                        f"{missing[:5]}, unexpected {unexpected[:5]})")


def load_checkpoint(ckpt: Path, *, model, optimizer, scheduler, load_optimizer=None) -> dict:
    """Restore weights (unless ``model`` is None), optimizer (``load_optimizer(state)`` if given,
    for sharded ones), scheduler and RNG states from ``ckpt``; returns its ``state.json``.
    DataError naming a missing or unloadable file."""
    check_complete(ckpt)
    if model is not None:
        load_weights(model, ckpt)
    try:
        moments = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True)
        (optimizer.load_state_dict if load_optimizer is None else load_optimizer)(moments)
        extra = torch.load(ckpt / "trainer.pt", map_location="cpu", weights_only=False)  # RNG
        scheduler.load_state_dict(extra["scheduler"])
    except Exception as e:  # torch.load / load_state_dict raise many types on corrupt files
        raise DataError(f"resume: {ckpt}/optimizer.pt or trainer.pt does not load "
                        f"({type(e).__name__}: {str(e)[:200]}); remove {ckpt} to resume from an "
                        f"earlier checkpoint, or set train.resume=false to start over") from e
    set_rng_state(extra["rng"])
    return read_info(ckpt)


def truncate_metrics(path: Path, max_step: int) -> None:
    """Drop ``metrics.jsonl`` lines logged after ``max_step`` (logged again after a resume)."""
    from eagle3.artifacts import atomic_write_bytes

    if not path.is_file():
        return

    def kept(line: str) -> bool:
        try:
            return json.loads(line).get("step", 0) <= max_step
        except json.JSONDecodeError:
            return False  # a line cut by a kill mid-write: the run logs that step again

    keep = [line for line in path.read_text().splitlines() if kept(line)]
    atomic_write_bytes(path, ("\n".join(keep) + "\n" if keep else "").encode())


def ensure_writable(out_dir: Path) -> None:
    """Create ``out_dir`` and ``out_dir/state`` and write a probe file in each; ConfigError naming
    the directory and the OS error."""
    for d, what in ((out_dir, "train output dir"), (out_dir / "state", "checkpoint dir")):
        if d.exists() and not d.is_dir():
            raise ConfigError(f"{what} {d}: expected a directory, found a file; move it away "
                              "and re-run")
        try:
            d.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=d, prefix=".write-probe.", suffix=".tmp"):
                pass
        except OSError as e:
            raise ConfigError(f"{what} {d}: not writable ({type(e).__name__}: {e})") from e


FROZEN_FIELDS = ("ttt_steps", "num_layers", "draft_vocab_size", "seed", "max_tokens_per_batch",
                 "grad_accum")


def resume_conflict(info: dict, identity: dict, cfg, ckpt: Path) -> ConfigError | DataError | None:
    """The refused change between a checkpoint's ``state.json`` (``info``) and the new run as the
    error to raise (DataError: data or vocabulary; ConfigError: settings), or None. ``identity``:
    ``vocab_map_hash``, ``data_content_hash``, ``flags``, ``world_size``, ``distributed``."""
    t = cfg.train
    hint = (f"(checkpoint {ckpt}; train.on_other_checkpoint=restart starts over from step 0, "
            "train.resume=false always does)")
    if info.get("vocab_map_hash") != identity["vocab_map_hash"] and not t.allow_vocab_map_change:
        return DataError(f"resume: draft vocab map hash {identity['vocab_map_hash'][:16]} differs "
                         f"from the checkpoint's {str(info.get('vocab_map_hash'))[:16]}; lm_head "
                         "rows would mean other tokens. Set train.allow_vocab_map_change=true to "
                         f"re-map explicitly {hint}")
    if info.get("data_content_hash") != identity["data_content_hash"]:
        return DataError(f"resume: hidden-states data identity {identity['data_content_hash']} "
                         f"differs from the checkpoint's {info.get('data_content_hash')} {hint}")
    saved, new = info.get("train_config") or {}, t.model_dump(mode="json")
    for name in FROZEN_FIELDS:
        if name in saved and saved[name] != new[name]:
            return ConfigError(f"resume: train.{name} is {new[name]!r}, the checkpoint was "
                               f"trained with {saved[name]!r} {hint}")
    if info.get("flags") != identity["flags"]:
        return ConfigError(f"resume: layer flags {identity['flags']} differ from the checkpoint's "
                           f"{info.get('flags')} {hint}")
    if info.get("world_size") != identity["world_size"]:
        return ConfigError(f"resume: {identity['world_size']} processes, the checkpoint was "
                           f"written by {info.get('world_size')} (the data position depends on "
                           f"it) {hint}")
    saved_mode = info.get("distributed", "ddp" if int(info.get("world_size") or 1) > 1 else "none")
    if saved_mode != identity.get("distributed", saved_mode):
        return ConfigError(f"resume: train.distributed={identity['distributed']!r}, the checkpoint "
                           f"was written under {saved_mode!r} (its optimizer state is laid out "
                           f"for that mode) {hint}")
    return None


def load_init_from(model, src: Path, vmap, *, allow_change: bool) -> None:
    """Start from the speculators draft weights in ``src`` (fine-tuning; fresh optimizer).
    DataError when ``src`` has no ``model.safetensors``, a shape differs, or its d2t/t2d differ from
    ``vmap`` and not ``allow_change`` (if set: new map kept, ``lm_head`` rows from the verifier)."""
    from safetensors.torch import load_file

    from eagle3.train.vocab import vocab_map_hash

    path = Path(src) / "model.safetensors"
    if not path.is_file():
        raise DataError(f"train.init_from: {path} not found")
    sd = load_file(str(path))
    if "d2t" not in sd or "t2d" not in sd:
        raise DataError(f"train.init_from: {path} has no d2t/t2d (tensors: {sorted(sd)[:8]})")
    theirs = vocab_map_hash(sd["d2t"], sd["t2d"])
    same_map = theirs == vmap.hash()
    if not same_map and not allow_change:
        raise DataError(f"train.init_from: {path} was trained with another draft vocab map (hash "
                        f"{theirs[:16]} vs {vmap.hash()[:16]}); set "
                        f"train.allow_vocab_map_change=true to re-map")
    own = model.state_dict()
    unknown = [n for n in sd if n not in own]
    if unknown:
        raise DataError(f"train.init_from: {path} has tensors the draft does not: {unknown[:5]}")
    skip = {"d2t", "t2d"} | (set() if same_map else {"lm_head.weight"})
    for name, tensor in ((n, x) for n, x in sd.items() if n not in skip):
        if own[name].shape != tensor.shape:
            raise DataError(f"train.init_from: {path} tensor {name} shape {list(tensor.shape)}, "
                            f"draft expects {list(own[name].shape)}")
        with torch.no_grad():
            own[name].copy_(tensor)
