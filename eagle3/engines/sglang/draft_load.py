"""Loader rules of the pinned SGLang's ``LlamaForCausalLMEagle3.load_weights``
(``sglang/srt/models/llama_eagle3.py``) and the config checks of
:class:`eagle3.engines.sglang.draft.SGLangEagle3Draft`.

Names: legacy ``midlayer`` → ``layers.0`` and ``aux_norm_{low,mid,high}`` → ``fc_norm.{0,1,2}``;
q/k/v are stacked into ``qkv_proj`` (rows q, then k, then v) and gate/up into ``gate_up_proj``; each
name is tried as-is and with a ``model.`` prefix.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from eagle3.engines.bounds import LIMITS, bounded_int
from eagle3.errors import CheckpointInvalid, ConfigError, EngineUnsupported

ARCHITECTURE = "LlamaForCausalLMEagle3"
# llama_eagle3.py load_weights: legacy names, then q/k/v and gate/up stacking.
LEGACY_NAMES = {"midlayer": "layers.0", "aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1",
                "aux_norm_high": "fc_norm.2"}
STACKED = [(".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"),
           (".qkv_proj", ".v_proj", "v"),
           (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1)]


def copy_param(param: nn.Parameter, w: torch.Tensor, key: str, orig: str, where) -> None:
    """Copy tensor ``w`` (named ``orig``) into ``param``; CheckpointInvalid on a shape mismatch."""
    if tuple(param.shape) != tuple(w.shape):
        raise CheckpointInvalid(f"{where}: tensor {orig} has shape {tuple(w.shape)}, parameter "
                                f"{key} expects {tuple(param.shape)}")
    param.data.copy_(w.to(param.dtype))


def load_shard(param: nn.Parameter, w: torch.Tensor, shard, cfg: dict, key: str, orig: str,
               where) -> None:
    """Write one of q/k/v (rows of qkv_proj) or gate/up (halves of gate_up_proj)."""
    if shard in ("q", "k", "v"):
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
        start, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard]
    else:
        size = param.shape[0] // 2
        start = shard * size
    target = param.data[start:start + size]
    if tuple(target.shape) != tuple(w.shape):
        raise CheckpointInvalid(f"{where}: tensor {orig} has shape {tuple(w.shape)}, shard "
                                f"{shard!r} of {key} expects {tuple(target.shape)}")
    target.copy_(w.to(param.dtype))


def unfilled(params: dict, filled: set[str]) -> list[str]:
    """Parameter names (``key#shard`` for stacked ones) that no checkpoint tensor filled."""
    out = []
    for key, p in params.items():
        if key.endswith("qkv_proj.weight"):
            out += [f"{key}#{s}" for s in ("q", "k", "v") if f"{key}#{s}" not in filled]
        elif key.endswith("gate_up_proj.weight"):
            out += [f"{key}#{s}" for s in (0, 1) if f"{key}#{s}" not in filled]
        elif key not in filled:
            out.append(key)
    return out


DEFAULT_THETA = 10000.0  # transformers' LlamaConfig and SGLang's llama.py default


def rope_base_key(scope: Mapping) -> str:
    """The RoPE dict transformers 5 keeps: ``rope_scaling`` when it is a non-empty object (it
    replaces ``rope_parameters`` whole: ``convert_rope_params_to_dict``), else
    ``rope_parameters``."""
    rs = scope.get("rope_scaling")
    return "rope_scaling" if isinstance(rs, Mapping) and rs else "rope_parameters"


def rope_parameters(scope: Mapping) -> dict:
    """The ``rope_parameters`` transformers 5 builds from a config level ``scope``, which the pinned
    SGLang then reads (it loads config.json through transformers 5): the kept RoPE dict
    (:func:`rope_base_key`) with ``rope_theta`` defaulted from the top-level ``rope_theta`` (else
    10000) and ``rope_type`` from a legacy ``type`` (else ``"default"``). The one reader of RoPE
    keys for both the reference draft and the convert/validate checks."""
    base = scope.get(rope_base_key(scope))
    out = dict(base) if isinstance(base, Mapping) else {}
    theta = scope.get("rope_theta")
    out.setdefault("rope_theta", DEFAULT_THETA if theta is None else theta)
    out.setdefault("rope_type", out.get("type", "default"))
    return out


def check_config(cfg: dict) -> None:
    """Refuse a config this implementation cannot run faithfully (EngineUnsupported / ConfigError,
    naming the key)."""
    archs = cfg.get("architectures") or []
    # SGLang builds the first registered entry (models/registry.py)
    if not archs or archs[0] != ARCHITECTURE:
        raise EngineUnsupported(f"draft config.json architectures: expected [{ARCHITECTURE!r}] "
                                "first (the class the pinned SGLang loads for EAGLE-3; it builds "
                                f"the first registered entry), got {archs}")
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "num_hidden_layers", "vocab_size", "rms_norm_eps"):
        if key not in cfg:
            raise ConfigError(f"draft config.json: required key {key!r} missing")
    for key in LIMITS:  # before any layer or tensor is built from them
        if cfg.get(key) is not None:
            bounded_int(cfg, key, where="draft config.json")
    if cfg.get("hidden_act", "silu") != "silu":
        raise EngineUnsupported("draft config.json hidden_act: expected 'silu', got "
                                f"{cfg['hidden_act']!r}")
    if cfg.get("tie_word_embeddings", False):
        raise EngineUnsupported("draft config.json tie_word_embeddings: true makes the pinned "
                                "SGLang use the (target) embedding as a full-vocabulary lm_head; "
                                "this reference draft runs untied heads only (expected false)")
    if rope_parameters(cfg).get("mrope_section") is not None:
        raise EngineUnsupported("draft config.json rope_scaling: mrope is not implemented here")
