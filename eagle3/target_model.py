"""The target (verifier) model: loading, the default aux-layer rule, and aux hidden-state capture.

Layer ids here are **HF ``hidden_states`` indices**: i = the *input* of decoder layer i (0 =
embeddings, L = last layer's output *before* the final norm), as speculators and vLLM
(docs/ENGINE_FACTS.md §3). SGLang's "output of layer k" = HF index k+1; conversion translates.

Capture uses forward pre-hooks (on the final norm for index L): works for full sequences and
KV-cached decoding, without ``output_hidden_states`` (post-norm last state in transformers 5.x, all
layers kept alive)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from eagle3.errors import ConfigError
from eagle3.target_config import text_config

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` → ``torch.bfloat16``; raises ConfigError for an unknown name."""
    if name not in _DTYPES:
        raise ConfigError(f"dtype: expected one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def resolve_device(name: str = "auto") -> torch.device:
    """``"auto"`` → ``cuda`` if available else ``cpu``; else ``torch.device(value)``. ConfigError
    naming an unknown device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"device: expected auto, cpu, cuda or cuda:N, got {name!r}") from e


def load_target(target_dir: str | Path, dtype: str = "bfloat16", device: str = "auto",
                trust_remote_code: bool = False):
    """``(model, tokenizer)`` from an HF folder: eval mode, safetensors only, ``sdpa`` attention.
    ConfigError when the folder has no ``config.json``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir = Path(target_dir)
    if not (target_dir / "config.json").is_file():
        raise ConfigError(f"target {target_dir}: expected an HF model folder with config.json, "
                          "found none")
    model = AutoModelForCausalLM.from_pretrained(
        target_dir, dtype=torch_dtype(dtype), attn_implementation="sdpa", use_safetensors=True,
        trust_remote_code=trust_remote_code)
    model.to(resolve_device(device)).eval()
    tok = AutoTokenizer.from_pretrained(target_dir, trust_remote_code=trust_remote_code)
    return model, tok


def num_layers(model_or_config) -> int:
    """Number of decoder layers of a model or config (``num_hidden_layers``)."""
    cfg = getattr(model_or_config, "config", model_or_config)
    return int(text_config(cfg).num_hidden_layers)


def default_aux_layer_ids(n_layers: int) -> list[int]:
    """EAGLE-3's ``[2, L//2, L-3]`` as HF hidden_states indices (EAGLE-3 reference, SGLang's default
    capture). ConfigError unless three distinct in-range ids (L < 7)."""
    ids = [2, n_layers // 2, n_layers - 3]
    validate_aux_layer_ids(ids, n_layers, rule="the default EAGLE-3 rule [2, L//2, L-3]")
    return ids


def validate_aux_layer_ids(ids: list[int], n_layers: int,
                           rule: str = "extract.aux_layer_ids") -> None:
    """Check HF-index aux ids: strictly increasing, each in ``[1, L-1]``. 0 (embeddings) is no layer
    output; L is not a layer's input, which is what engines capture (SGLang adds 1 to each id;
    ``eagle3.convert.validate`` refuses it as AUX_IDS_RANGE). ConfigError names field, ids, layer
    count and allowed range."""
    if not ids:
        raise ConfigError(f"{rule}: expected at least one layer id, got []")
    if bad := [i for i in ids if not 1 <= i <= n_layers - 1]:
        raise ConfigError(f"{rule}: ids {bad} out of range for a target with {n_layers} layers "
                          f"(expected HF hidden_states indices in [1, {n_layers - 1}]: 0 is the "
                          f"embeddings, {n_layers} the last layer's output, which is stored anyway "
                          f"and which engines cannot capture as an aux state; got {ids})")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ConfigError(f"{rule}: expected strictly increasing, distinct ids, got {ids} (target "
                          f"has {n_layers} layers)")


def _decoder(model):
    inner = getattr(model, "model", model)
    inner = getattr(inner, "language_model", inner)
    if not hasattr(inner, "layers") or not hasattr(inner, "norm"):
        raise ConfigError(f"target {type(model).__name__}: expected .model.layers and .model.norm "
                          "(a Llama-style decoder), found neither")
    return inner


@contextmanager
def capture_hidden_states(model, indices: list[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Capture HF ``hidden_states[i]`` for ``i in indices`` in forward passes inside the block:
    yields a dict index → ``[B, T, H]`` (model dtype), overwritten each pass; L = last layer output
    before the final norm. ConfigError for an index outside ``[0, L]``."""
    dec, captured, handles = _decoder(model), {}, []
    n = len(dec.layers)

    def hook_for(i):
        def hook(_module, args, kwargs):
            captured[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    try:
        for i in indices:
            if not 0 <= i <= n:
                raise ConfigError(f"capture index {i}: expected 0..{n} for a target of {n} layers")
            module = dec.norm if i == n else dec.layers[i]
            handles.append(module.register_forward_pre_hook(hook_for(i), with_kwargs=True))
        yield captured
    finally:
        for h in handles:
            h.remove()
