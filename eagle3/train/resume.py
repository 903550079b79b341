"""What may change between a checkpoint and the run that continues from it (resume or fine-tuning).

Refused (each a ConfigError/DataError naming the field, the saved and the new value):

- a different draft vocabulary map (its hash) unless ``train.allow_vocab_map_change`` — the ``lm_head``
  rows would silently mean other tokens (docs/FAILURE_CLASSES.md 9);
- other hidden-states data (:func:`eagle3.train.data.data_identity`: target, aux ids, splits, token ids and
  loss masks): the saved data position would point into another plan;
- fields that change the model or the data order: ttt_steps, num_layers, draft_vocab_size, seed,
  max_tokens_per_batch, grad_accum, the layer flags, the number of processes, ``train.distributed`` (ddp and fsdp
  lay out the optimizer state differently).

Such a checkpoint belongs to another training (e.g. the pipeline re-run on other data writes to the same
``<out_dir>``): with ``train.on_other_checkpoint=restart`` (the default) training starts from step 0 with a
warning naming the difference, with ``refuse`` the difference is the error.

Allowed: lr, schedule, warm-up, epochs, max_steps, eval/log/checkpoint cadence, keep_last — a long
constant-LR continuation of a finished run is a resume with a larger ``max_steps``. The LR of every later
step is then the new schedule's value at that step.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eagle3.errors import ConfigError, DataError

FROZEN_FIELDS = ("ttt_steps", "num_layers", "draft_vocab_size", "seed", "max_tokens_per_batch", "grad_accum")


def check_resume(info: dict, identity: dict, cfg, ckpt: Path) -> None:
    """Compare a checkpoint's ``state.json`` (``info``) with the new run. Raises on a refused change."""
    problem = resume_conflict(info, identity, cfg, ckpt)
    if problem is not None:
        raise problem


def resume_conflict(info: dict, identity: dict, cfg, ckpt: Path) -> ConfigError | DataError | None:
    """The refused change between a checkpoint's ``state.json`` (``info``) and the new run, as the error to
    raise (DataError for other data or vocabulary, ConfigError for other settings), or None when it may resume.
    ``identity``: ``vocab_map_hash``, ``data_content_hash``, ``flags``, ``world_size``, ``distributed``."""
    try:
        _compare(info, identity, cfg, ckpt)
    except (ConfigError, DataError) as e:
        return e
    return None


def _compare(info: dict, identity: dict, cfg, ckpt: Path) -> None:
    t = cfg.train
    hint = (f"(checkpoint {ckpt}; train.on_other_checkpoint=restart starts over from step 0, train.resume=false "
            f"always does)")
    if info.get("vocab_map_hash") != identity["vocab_map_hash"] and not t.allow_vocab_map_change:
        raise DataError(f"resume: draft vocab map hash {identity['vocab_map_hash'][:16]} differs from the "
                        f"checkpoint's {str(info.get('vocab_map_hash'))[:16]}; lm_head rows would mean other "
                        f"tokens. Set train.allow_vocab_map_change=true to re-map explicitly {hint}")
    if info.get("data_content_hash") != identity["data_content_hash"]:
        raise DataError(f"resume: hidden-states data identity {identity['data_content_hash']} differs from the "
                        f"checkpoint's {info.get('data_content_hash')} {hint}")
    saved = info.get("train_config") or {}
    new = t.model_dump(mode="json")
    for name in FROZEN_FIELDS:
        if name in saved and saved[name] != new[name]:
            raise ConfigError(f"resume: train.{name} is {new[name]!r}, the checkpoint was trained with "
                              f"{saved[name]!r} {hint}")
    if info.get("flags") != identity["flags"]:
        raise ConfigError(f"resume: layer flags {identity['flags']} differ from the checkpoint's {info.get('flags')} {hint}")
    if info.get("world_size") != identity["world_size"]:
        raise ConfigError(f"resume: {identity['world_size']} processes, the checkpoint was written by "
                          f"{info.get('world_size')} (the data position depends on it) {hint}")
    saved_mode = info.get("distributed", "ddp" if int(info.get("world_size") or 1) > 1 else "none")
    if saved_mode != identity.get("distributed", saved_mode):
        raise ConfigError(f"resume: train.distributed={identity['distributed']!r}, the checkpoint was written "
                          f"under {saved_mode!r} (its optimizer state is laid out for that mode) {hint}")


def load_init_from(model, src: Path, vmap, *, allow_change: bool) -> None:
    """Start from the weights of the speculators draft in ``src`` (fine-tuning; optimizer starts fresh).

    Raises DataError when ``src`` has no ``model.safetensors``, a tensor shape differs, or its d2t/t2d
    differ from ``vmap`` and ``allow_change`` is False. With ``allow_change`` the new map is kept and
    ``lm_head`` rows come from the verifier for the new map.
    """
    from safetensors.torch import load_file

    from eagle3.train.vocab import vocab_map_hash

    path = Path(src) / "model.safetensors"
    if not path.is_file():
        raise DataError(f"train.init_from: {path} not found")
    sd = load_file(str(path))
    if "d2t" not in sd or "t2d" not in sd:
        raise DataError(f"train.init_from: {path} has no d2t/t2d (tensors: {sorted(sd)[:8]})")
    same_map = vocab_map_hash(sd["d2t"], sd["t2d"]) == vmap.hash()
    if not same_map and not allow_change:
        raise DataError(f"train.init_from: {path} was trained with another draft vocab map (hash "
                        f"{vocab_map_hash(sd['d2t'], sd['t2d'])[:16]} vs {vmap.hash()[:16]}); set "
                        f"train.allow_vocab_map_change=true to re-map")
    own = model.state_dict()
    skip = {"d2t", "t2d", "lm_head.weight"} if not same_map else {"d2t", "t2d"}
    for name, tensor in sd.items():
        if name in skip or name not in own:
            continue
        if tuple(own[name].shape) != tuple(tensor.shape):
            raise DataError(f"train.init_from: {path} tensor {name} shape {list(tensor.shape)}, draft expects "
                            f"{list(own[name].shape)}")
        with torch.no_grad():
            own[name].copy_(tensor)
    unknown = [n for n in sd if n not in own]
    if unknown:
        raise DataError(f"train.init_from: {path} has tensors the draft does not: {unknown[:5]}")
