"""The EAGLE-3 draft exactly as SGLang 0.5.23 runs it (``LlamaForCausalLMEagle3``), in plain PyTorch.

Source of every rule below: ``sglang/srt/models/llama_eagle3.py`` (model and ``load_weights``),
``sglang/srt/models/llama.py`` (``LlamaAttention``, ``set_embed``), ``sglang/srt/layers/layernorm.py``
(``RMSNorm.forward_native``: with a residual it returns ``(norm(x + residual), x + residual)``, computed in
float32 and cast back) and ``sglang/srt/speculative/eagle_worker_v2.py`` (``init_lm_head``: the draft's
``embed_tokens`` is replaced by the target's unless ``target_hidden_size != hidden_size``).

Parameter names mirror SGLang's module tree (``model.fc.weight``, ``model.layers.0.self_attn.qkv_proj.weight``,
``model.layers.0.mlp.gate_up_proj.weight``, ``lm_head.weight`` …) so a state dict can be compared one to one.

Forward semantics (EXTEND over T positions, causal, optionally after a cached prefix):

1. ``embeds = embed_tokens(input_ids)``;
2. ``fc`` (with the optional ``input_norm`` / ``fc_norm``) is applied **only if** the incoming hidden width
   differs from the embedding width — SGLang's condition; an engine that feeds one layer's state of width H
   silently bypasses ``fc`` (failure class 11, reproduced on purpose);
3. layer 0: ``residual = h``; ``x = cat([input_layernorm(embeds), hidden_norm(h)])`` (2H wide) → attention;
   later layers: ``x, residual = hidden_norm(h, residual)``; then ``post_attention_layernorm(x, residual)`` → MLP;
4. ``normed, prenorm = norm(h, residual)``; logits = ``lm_head(normed)`` over the draft vocabulary; the
   hidden state handed to the next draft step is ``prenorm`` (``normed`` when ``norm_output`` is set).

Draft token ids map to target ids through ``hot_token_id = d2t + arange(draft_vocab)`` (``t2d`` is ignored).
Incremental steps use :class:`DraftKVCache` (the same attention over cached keys/values that SGLang's paged KV
cache gives); :meth:`DraftKVCache.crop` drops rejected positions.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from eagle3.engines.sglang.draft_load import LEGACY_NAMES, STACKED, rope_parameters
from eagle3.engines.sglang.draft_load import check_config as _check_config
from eagle3.engines.sglang.draft_load import copy_param as _copy
from eagle3.engines.sglang.draft_load import load_shard as _load_shard
from eagle3.engines.sglang.draft_load import unfilled as _unfilled
from eagle3.errors import CheckpointInvalid, ConfigError

log = logging.getLogger(__name__)




class RMSNorm(nn.Module):
    """SGLang's RMSNorm: ``forward(x)`` → normed; ``forward(x, residual)`` → ``(norm(x+residual), x+residual)``.

    Computed in float32, the weight multiplied before the cast back (``layernorm.py`` ``forward_native``).
    """

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        dtype = x.dtype
        x = x.float()
        if residual is not None:
            x = x + residual.float()
            residual = x.to(dtype)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = (x * self.weight.float()).to(dtype)
        return x if residual is None else (x, residual)


class DraftKVCache:
    """Per-layer keys/values of the draft, ``[n_kv_heads, S, head_dim]`` each; ``length`` = S positions."""

    def __init__(self, num_layers: int):
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    @property
    def length(self) -> int:
        """Cached positions (of the last layer, the one written last in a forward)."""
        return self.layer_length(len(self.kv) - 1)

    def layer_length(self, layer: int) -> int:
        return 0 if self.kv[layer] is None else int(self.kv[layer][0].shape[1])

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new ``k, v`` ``[n_kv, T, d]``; returns the full ``[n_kv, S+T, d]`` pair."""
        old = self.kv[layer]
        if old is not None:
            k, v = torch.cat([old[0], k], 1), torch.cat([old[1], v], 1)
        self.kv[layer] = (k, v)
        return k, v

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (rejected / speculative positions dropped)."""
        if length < 0 or length > self.length:
            raise ValueError(f"DraftKVCache.crop: expected 0 <= length <= {self.length}, got {length}")
        self.kv = [None if e is None or length == 0 else (e[0][:, :length], e[1][:, :length]) for e in self.kv]


class _Attention(nn.Module):
    def __init__(self, cfg: dict, in_width: int, rotary: nn.Module):
        super().__init__()
        h, self.nh, self.nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or h // self.nh
        bias = bool(cfg.get("attention_bias", False) or cfg.get("bias", False))
        self.qkv_proj = nn.Linear(in_width, (self.nh + 2 * self.nkv) * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=bias)
        self.rotary = [rotary]  # shared, not a registered submodule (no parameters)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: DraftKVCache | None, layer: int):
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        q = q.view(t, self.nh, self.hd).transpose(0, 1)    # [nh, T, d]
        k = k.view(t, self.nkv, self.hd).transpose(0, 1)   # [nkv, T, d]
        v = v.view(t, self.nkv, self.hd).transpose(0, 1)
        cos, sin = self.rotary[0](x, positions[None])       # [1, T, d]
        q, k = _apply_rope(q, cos[0], sin[0]), _apply_rope(k, cos[0], sin[0])
        past = 0
        if cache is not None:
            past = cache.layer_length(layer)
            k, v = cache.append(layer, k, v)
        s = k.shape[1]
        mask = torch.ones(t, s, dtype=torch.bool, device=x.device).tril(diagonal=past)  # causal over prefix+T
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.hd ** -0.5)
        return self.o_proj(out.transpose(0, 1).reshape(t, self.nh * self.hd))


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary (SGLang's default ``rope_is_neox_style=True``, HF's ``rotate_half``)."""
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class _MLP(nn.Module):
    def __init__(self, h: int, inter: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(h, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        return self.down_proj(F.silu(gate) * up)


class _DecoderLayer(nn.Module):
    def __init__(self, cfg: dict, layer_id: int, rotary: nn.Module):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.layer_id = layer_id
        self.is_input_layer = layer_id == 0
        self.self_attn = _Attention(cfg, 2 * h if self.is_input_layer else h, rotary)
        self.mlp = _MLP(h, cfg["intermediate_size"])
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)

    def forward(self, positions, embeds, h, residual, cache):
        if self.is_input_layer:
            residual = h                                                      # un-normalised incoming state
            h = torch.cat([self.input_layernorm(embeds), self.hidden_norm(h)], -1)  # [T, 2H]
        else:
            h, residual = self.hidden_norm(h, residual)
        h = self.self_attn(h, positions, cache, self.layer_id)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class _Model(nn.Module):
    def __init__(self, cfg: dict, rotary: nn.Module):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        eagle = cfg.get("eagle_config") or {}
        self.hidden_size_in = cfg.get("target_hidden_size") or h
        n_aux = cfg.get("num_aux_hidden_states")
        if n_aux is None:
            ids = eagle.get("eagle_aux_hidden_state_layer_ids")
            n_aux = len(ids) if ids else 3
        self.num_aux_hidden_states = int(n_aux)
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], h)
        self.fc = nn.Linear(self.hidden_size_in * self.num_aux_hidden_states, h, bias=bool(cfg.get("bias", False)))
        norm_before_fc = bool(eagle.get("norm_before_fc", cfg.get("norm_before_fc", False)))
        self.input_norm = RMSNorm(self.hidden_size_in * self.num_aux_hidden_states, eps) if norm_before_fc else None
        use_fc_norm = cfg.get("fc_norm") or cfg.get("use_aux_norm", False)
        self.fc_norm = (nn.ModuleList([RMSNorm(self.hidden_size_in, eps) for _ in range(self.num_aux_hidden_states)])
                        if use_fc_norm else None)
        self.layers = nn.ModuleList([_DecoderLayer(cfg, i, rotary) for i in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(h, eps)
        self.norm_output = bool(cfg.get("norm_output", False))

    def forward(self, input_ids, positions, hidden_states, cache):
        embeds = self.embed_tokens(input_ids)                                  # [T, H]
        h = hidden_states
        if h.shape[-1] != embeds.shape[-1]:                                     # SGLang's exact condition
            if self.input_norm is not None:
                h = self.input_norm(h)
            if self.fc_norm is not None:
                chunks = h.chunk(self.num_aux_hidden_states, -1)
                h = torch.cat([n(c) for n, c in zip(self.fc_norm, chunks)], -1)
            h = self.fc(h)                                                       # [T, n_aux*W] -> [T, H]
        residual = None
        for layer in self.layers:
            h, residual = layer(positions, embeds, h, residual, cache)
        normed, prenorm = self.norm(h, residual)
        return normed, (normed if self.norm_output else prenorm)


class SGLangEagle3Draft(nn.Module):
    """SGLang 0.5.23's ``LlamaForCausalLMEagle3`` (see module docstring for the exact semantics).

    Attributes: ``config`` (the serving ``config.json`` as a dict), ``hot_token_id`` (int64 ``[draft_vocab]``
    draft id → target id, or None when the checkpoint has no ``d2t``: identity, as SGLang), ``aux_layer_ids``
    (SGLang "output of layer k" ids from ``eagle_config``, or None = SGLang's default capture),
    ``load_report`` (``{"skipped": [...], "unfilled": [...], "embed_source": ..., "lm_head_source": ...}``).
    """

    def __init__(self, config: dict):
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.config = dict(config)
        _check_config(self.config)
        rotary = LlamaRotaryEmbedding(LlamaConfig(
            hidden_size=config["hidden_size"], num_attention_heads=config["num_attention_heads"],
            head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
            max_position_embeddings=config.get("max_position_embeddings", 8192),
            rope_parameters=rope_parameters(config)))
        # Kept out of the module tree so ``.to(dtype)`` never rounds ``inv_freq`` (cos/sin computed in float32).
        self._rotary = [rotary]
        self.model = _Model(self.config, rotary)
        self.draft_vocab_size = int(config.get("draft_vocab_size") or config["vocab_size"])
        self.lm_head = nn.Linear(config["hidden_size"], self.draft_vocab_size, bias=False)
        self.hot_token_id: torch.Tensor | None = None
        eagle = config.get("eagle_config") or {}
        self.aux_layer_ids: list[int] | None = eagle.get("eagle_aux_hidden_state_layer_ids")
        self.use_aux_hidden_state = bool(eagle.get("use_aux_hidden_state", True))
        self.load_report: dict = {}

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    def new_cache(self) -> DraftKVCache:
        """An empty KV cache for incremental draft steps."""
        return DraftKVCache(len(self.model.layers))

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                cache: DraftKVCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """EXTEND forward over T positions (causal; after the cached prefix when ``cache`` is given).

        ``input_ids`` int64 ``[T]`` (target vocabulary), ``positions`` int64 ``[T]``, ``hidden_states``
        ``[T, W]``: W = ``n_aux * target_hidden_size`` (target aux states, ``fc`` applied) or W = embedding width
        (the draft's own previous output, or a broken integration: ``fc`` bypassed). Returns
        ``(logits [T, draft_vocab] float32, hidden [T, H])`` where hidden is the pre-norm sum for the next step
        (the normed state when ``norm_output``). The cache, when given, gains T positions.
        """
        if not (input_ids.dim() == positions.dim() == 1 and hidden_states.dim() == 2
                and input_ids.shape[0] == positions.shape[0] == hidden_states.shape[0]):
            raise ValueError(f"SGLangEagle3Draft.forward: expected input_ids [T], positions [T], hidden_states "
                             f"[T, W]; got {tuple(input_ids.shape)}, {tuple(positions.shape)}, "
                             f"{tuple(hidden_states.shape)}")
        normed, hidden = self.model(input_ids, positions, hidden_states.to(self.lm_head.weight.dtype), cache)
        return self.lm_head(normed).float(), hidden

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids → target ids via ``hot_token_id`` (identity when there is no ``d2t``)."""
        return draft_ids if self.hot_token_id is None else self.hot_token_id[draft_ids]

    @classmethod
    def from_dir(cls, serving_dir: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu",
                 target_embed: torch.Tensor | None = None, target_head: torch.Tensor | None = None,
                 on_mismatch: Literal["raise", "sglang"] = "raise") -> "SGLangEagle3Draft":
        """Load an SGLang-format draft folder (``config.json`` + ``*.safetensors``) the way SGLang 0.5.23 does.

        ``target_embed`` ``[vocab, H]``: the target's input embedding; it replaces the draft's unless
        ``target_hidden_size != hidden_size`` (SGLang ``set_embed``). ``target_head``: the target's LM head,
        used only when the config has no ``draft_vocab_size`` and untied embeddings (``load_lm_head_from_target``).
        ``on_mismatch="raise"`` (default) raises CheckpointInvalid naming every tensor SGLang would skip
        silently and every parameter no tensor fills; ``"sglang"`` reproduces SGLang (skip / keep random init)
        and records the names in ``load_report`` with a warning. Shape mismatches always raise (SGLang's
        loader asserts too). Raises ConfigError for an unreadable folder, EngineUnsupported for an
        architecture or activation this class does not run.
        """
        from safetensors.torch import load_file

        serving_dir = Path(serving_dir)
        cfg_path = serving_dir / "config.json"
        if not cfg_path.is_file():
            raise ConfigError(f"{serving_dir}: expected an SGLang draft folder with config.json, found none")
        config = json.loads(cfg_path.read_text())
        files = sorted(serving_dir.glob("*.safetensors"))
        if not files:
            raise ConfigError(f"{serving_dir}: expected model.safetensors (or shards), found no *.safetensors")
        torch.manual_seed(0)  # parameters no tensor fills keep a deterministic "random init" in sglang mode
        draft = cls(config)   # config checks first: a wrong architecture is named before any tensor is read
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(load_file(str(f)))
        draft._load(tensors, target_embed, target_head, on_mismatch, serving_dir)
        return draft.to(device=device, dtype=dtype).eval()

    def _load(self, tensors, target_embed, target_head, on_mismatch, where) -> None:
        params = dict(self.named_parameters())
        filled: set[str] = set()
        skipped: list[str] = []
        for name, w in tensors.items():
            orig = name
            for legacy, new in LEGACY_NAMES.items():
                if legacy in name:
                    name = name.replace(legacy, new)
            if "d2t" in name:
                self.hot_token_id = w.long() + torch.arange(w.shape[0])
                continue
            if "t2d" in name:
                continue
            for pname, wname, shard in STACKED:
                if wname in name:
                    name = name.replace(wname, pname)
                    key = name if name in params else f"model.{name}"
                    if key in params:
                        _load_shard(params[key], w, shard, self.config, key, orig, where)
                        filled.add(f"{key}#{shard}")
                    else:
                        skipped.append(orig)
                    break
            else:
                key = name if name in params else f"model.{name}"
                if key not in params:
                    skipped.append(orig)
                    continue
                _copy(params[key], w, key, orig, where)
                filled.add(key)
        self._bind_target(params, filled, target_embed, target_head, where)
        unfilled = _unfilled(params, filled)
        self.load_report.update(skipped=sorted(skipped), unfilled=unfilled)
        if skipped or unfilled:
            msg = (f"{where}: SGLang 0.5.23 would silently skip tensors {sorted(skipped)} (no such parameter) and "
                   f"keep random init for parameters {unfilled}")
            if on_mismatch == "raise":
                raise CheckpointInvalid(msg)
            log.warning(msg)
        if self.hot_token_id is None and self.draft_vocab_size != self.config["vocab_size"]:
            log.warning("%s: no d2t although draft_vocab_size %d != vocab_size %d: draft ids are used as target "
                        "ids (SGLang does the same)", where, self.draft_vocab_size, self.config["vocab_size"])

    def _bind_target(self, params, filled, target_embed, target_head, where) -> None:
        """SGLang ``init_lm_head``: share the target's embedding (and head when loaded from the target)."""
        h = self.config["hidden_size"]
        tgt_h = self.config.get("target_hidden_size")
        self.load_report["embed_source"] = "draft checkpoint"
        if target_embed is not None and not (tgt_h is not None and tgt_h != h):
            if tuple(target_embed.shape) != tuple(self.model.embed_tokens.weight.shape):
                raise CheckpointInvalid(f"{where}: target embedding shape {tuple(target_embed.shape)} != draft "
                                        f"embed_tokens [vocab_size, hidden_size] "
                                        f"{tuple(self.model.embed_tokens.weight.shape)}")
            self.model.embed_tokens.weight.data.copy_(target_embed)
            filled.add("model.embed_tokens.weight")
            self.load_report["embed_source"] = "target"
        self.load_report["lm_head_source"] = "draft checkpoint"
        if not self.config.get("draft_vocab_size"):
            if target_head is None:
                raise ConfigError(f"{where}/config.json: draft_vocab_size missing, so SGLang loads lm_head from "
                                  "the target; pass target_head (the target's LM head weight)")
            _copy(params["lm_head.weight"], target_head, "lm_head.weight", "target lm_head", where)
            filled.add("lm_head.weight")
            self.load_report["lm_head_source"] = "target"
