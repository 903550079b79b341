"""Tensor copies of the pinned SGLang's ``LlamaForCausalLMEagle3.load_weights``
(``sglang/srt/models/llama_eagle3.py``; q/k/v stacked into ``qkv_proj`` rows q, k, v, gate/up into
``gate_up_proj``; names routed by :func:`eagle3.engines.sglang.profile.route`), its RoPE reading
and the config checks of :class:`eagle3.engines.sglang.draft.SGLangEagle3Draft`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from eagle3.engines.bounds import LIMITS, bounded_int
from eagle3.errors import CheckpointInvalid, ConfigError, EngineUnsupported

ARCHITECTURE = "LlamaForCausalLMEagle3"


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
        start = shard * size  # gate 0, up 1
    target = param.data[start:start + size]
    if tuple(target.shape) != tuple(w.shape):
        raise CheckpointInvalid(f"{where}: tensor {orig} has shape {tuple(w.shape)}, shard "
                                f"{shard!r} of {key} expects {tuple(target.shape)}")
    target.copy_(w.to(param.dtype))


def unfilled(params: dict, filled: set[str]) -> list[str]:
    """Parameter names (``key#shard`` for stacked ones) that no checkpoint tensor filled."""
    def parts(key: str) -> list[str]:
        if key.endswith("qkv_proj.weight"):
            return [f"{key}#{s}" for s in ("q", "k", "v")]
        return [f"{key}#{s}" for s in (0, 1)] if key.endswith("gate_up_proj.weight") else [key]

    return [k for key in params for k in parts(key) if k not in filled]


DEFAULT_THETA = 10000.0  # transformers' LlamaConfig and SGLang's llama.py default


def rope_base_key(scope: Mapping) -> str:
    """The RoPE dict transformers 5 keeps: ``rope_scaling`` when it is a non-empty object (it
    replaces ``rope_parameters`` whole: ``convert_rope_params_to_dict``), else
    ``rope_parameters``."""
    rs = scope.get("rope_scaling")
    return "rope_scaling" if isinstance(rs, Mapping) and rs else "rope_parameters"


def rope_parameters(scope: Mapping) -> dict:
    """The ``rope_parameters`` transformers 5 builds from a config level ``scope`` (as the pinned
    SGLang reads it): the kept RoPE dict (:func:`rope_base_key`) with ``rope_theta`` defaulted from
    the top-level ``rope_theta`` (else 10000) and ``rope_type`` from a legacy ``type`` (else
    ``"default"``). The one RoPE reader of the reference draft and the convert/validate checks."""
    base = scope.get(rope_base_key(scope))
    out = dict(base) if isinstance(base, Mapping) else {}
    out.setdefault("rope_theta", DEFAULT_THETA if scope.get("rope_theta") is None
                   else scope["rope_theta"])
    out.setdefault("rope_type", out.get("type", "default"))
    return out


def check_config(cfg: dict) -> None:
    """Refuse a config this implementation cannot run faithfully (EngineUnsupported / ConfigError,
    naming the key)."""
    archs = cfg.get("architectures") or []
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
