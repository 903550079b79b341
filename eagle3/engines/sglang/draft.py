"""The EAGLE-3 draft as SGLang ``profile.VERSION`` runs it (``LlamaForCausalLMEagle3``), in PyTorch.

Sources: ``sglang/srt/models/llama_eagle3.py`` (model, ``load_weights``), ``models/llama.py``
(``LlamaAttention``, ``set_embed``), ``layers/layernorm.py`` (``RMSNorm.forward_native``: with a
residual it returns ``(norm(x + residual), x + residual)`` in float32, cast back) and
``speculative/eagle_worker_v2.py`` (``init_lm_head``: the draft's ``embed_tokens`` is the target's
unless ``target_hidden_size != hidden_size``). Parameter names mirror SGLang's module tree
(``model.fc.weight``, ``model.layers.0.self_attn.qkv_proj.weight``, ``lm_head.weight`` ...).

The forward (:meth:`SGLangEagle3Draft.states`, EXTEND over T rows):

1. ``embeds = embed_tokens(input_ids)``;
2. ``fc`` (with the optional ``input_norm`` / ``fc_norm``) **only if** the incoming width differs
   from the embedding width (SGLang's condition: an engine feeding one layer's state of width H
   silently bypasses ``fc``, failure class 11);
3. layer 0: ``residual = h``; ``x = cat([input_layernorm(embeds), hidden_norm(h)])`` (2H) →
   attention; later layers ``x, residual = hidden_norm(h, residual)``; then
   ``post_attention_layernorm(x, residual)`` → MLP;
4. ``normed, prenorm = norm(h, residual)``; logits ``lm_head(normed)`` over the draft vocabulary;
   the state for the next draft step is ``prenorm`` (``normed`` with ``norm_output``).

Where keys and values live is a plug (``attend``): :class:`CachedAttention` over a
:class:`DraftKVCache` (incremental decode; with an explicit mask, the batched chain of replay), or
the reference engine's static cache. Draft ids map to target ids through
``hot_token_id = d2t + arange(draft_vocab)`` (``t2d`` ignored).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn

from eagle3.engines.sglang import draft_load as dl
from eagle3.engines.sglang.draft_load import rope_parameters
from eagle3.engines.sglang.profile import VERSION, num_aux_states, route
from eagle3.errors import CheckpointInvalid, ConfigError

log = logging.getLogger(__name__)

# attend(layer, attention module, x [..., T, W], positions [T]) -> attention output [..., T, H]
Attend = Callable[[int, "_Attention", torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    """SGLang's RMSNorm: ``(x)`` -> normed; ``(x, residual)`` -> ``(norm(x+residual), x+residual)``,
    in float32 with the weight multiplied before the cast back (``forward_native``)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        dtype, x = x.dtype, x.float()
        if residual is not None:
            x = x + residual.float()
            residual = x.to(dtype)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = (x * self.weight.float()).to(dtype)
        return x if residual is None else (x, residual)


class DraftKVCache:
    """Per-layer keys/values ``[..., n_kv_heads, S, head_dim]``; ``length`` = S positions."""

    def __init__(self, num_layers: int):
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    @property
    def length(self) -> int:
        """Cached positions (of the last layer, written last in a forward)."""
        return 0 if self.kv[-1] is None else int(self.kv[-1][0].shape[-2])

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Append ``k, v`` ``[..., n_kv, T, d]``; returns the full ``[..., n_kv, S+T, d]`` pair."""
        old = self.kv[layer]
        if old is not None:
            k, v = torch.cat([old[0], k], -2), torch.cat([old[1], v], -2)
        self.kv[layer] = (k, v)
        return k, v


class CachedAttention:
    """``attend`` over a :class:`DraftKVCache` (None: no cache): the rows' keys are appended, then
    the rows attend to every cached key. ``mask`` None: causal after the cached prefix (incremental
    decode, x ``[T, W]``); else a bool ``[T, S]`` mask (True = attend), e.g. replay's chain over
    ``[B, T, W]`` rows."""

    def __init__(self, cache: DraftKVCache | None = None, mask: torch.Tensor | None = None):
        self.cache, self.mask = cache, mask

    def __call__(self, layer: int, attn: "_Attention", x: torch.Tensor, positions: torch.Tensor):
        q, k, v = attn.project(x, positions)
        if self.cache is not None:
            k, v = self.cache.append(layer, k, v)
        mask = self.mask
        if mask is None:  # the T new rows follow the s - T cached positions
            t, s = x.shape[-2], k.shape[-2]
            mask = torch.ones(t, s, dtype=torch.bool, device=x.device).tril(s - t)
        return attn.attend(q, k, v, mask)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary (SGLang's default ``rope_is_neox_style=True``, HF's ``rotate_half``)."""
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class _Attention(nn.Module):
    def __init__(self, cfg: dict, in_width: int, rotary: nn.Module):
        super().__init__()
        h, self.nh = cfg["hidden_size"], cfg["num_attention_heads"]
        self.nkv = cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or h // self.nh
        bias = bool(cfg.get("attention_bias", False) or cfg.get("bias", False))
        self.qkv_proj = nn.Linear(in_width, (self.nh + 2 * self.nkv) * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=bias)
        self.rotary = [rotary]  # shared, not a registered submodule (no parameters)

    def project(self, x: torch.Tensor, positions: torch.Tensor):
        """``x [..., T, W]`` -> ``q [..., nh, T, d]``, ``k, v [..., nkv, T, d]``; RoPE on q, k."""
        *lead, t, _ = x.shape
        sizes = [self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd]
        parts = zip(self.qkv_proj(x).split(sizes, -1), (self.nh, self.nkv, self.nkv))
        q, k, v = (p.view(*lead, t, n, self.hd).transpose(-3, -2) for p, n in parts)
        cos, sin = self.rotary[0](x, positions[None])       # [1, T, d]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q, k, v, mask: torch.Tensor) -> torch.Tensor:
        """SDPA of ``q`` over ``k, v`` (GQA repeat) → ``o_proj`` output ``[..., T, H]``."""
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.hd ** -0.5)
        return self.o_proj(out.transpose(-3, -2).flatten(-2))


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
        self.layer_id, self.is_input_layer = layer_id, layer_id == 0
        self.self_attn = _Attention(cfg, 2 * h if self.is_input_layer else h, rotary)
        self.mlp = _MLP(h, cfg["intermediate_size"])
        self.input_layernorm, self.post_attention_layernorm, self.hidden_norm = (
            RMSNorm(h, eps), RMSNorm(h, eps), RMSNorm(h, eps))

    def forward(self, positions, embeds, h, residual, attend: Attend):
        if self.is_input_layer:
            residual = h                                          # the un-normalised incoming state
            h = torch.cat([self.input_layernorm(embeds), self.hidden_norm(h)], -1)  # [..., T, 2H]
        else:
            h, residual = self.hidden_norm(h, residual)
        h = attend(self.layer_id, self.self_attn, h, positions)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class _Model(nn.Module):
    def __init__(self, cfg: dict, rotary: nn.Module):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        eagle, w = cfg.get("eagle_config") or {}, cfg.get("target_hidden_size") or h
        n = num_aux_states(cfg)
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], h)
        self.fc = nn.Linear(w * n, h, bias=bool(cfg.get("bias", False)))
        norm_before_fc = bool(eagle.get("norm_before_fc", cfg.get("norm_before_fc", False)))
        self.input_norm = RMSNorm(w * n, eps) if norm_before_fc else None
        use_fc_norm = cfg.get("fc_norm") or cfg.get("use_aux_norm", False)
        self.fc_norm = nn.ModuleList([RMSNorm(w, eps) for _ in range(n)]) if use_fc_norm else None
        self.layers = nn.ModuleList([_DecoderLayer(cfg, i, rotary)
                                     for i in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(h, eps)
        self.norm_output = bool(cfg.get("norm_output", False))

    def forward(self, input_ids, positions, hidden_states, attend: Attend):
        embeds, h = self.embed_tokens(input_ids), hidden_states      # embeds [..., T, H]
        if h.shape[-1] != embeds.shape[-1]:                          # SGLang's exact condition
            if self.input_norm is not None:
                h = self.input_norm(h)
            if self.fc_norm is not None:  # one norm per aux state
                h = torch.cat([n(c) for n, c in zip(self.fc_norm, h.chunk(len(self.fc_norm), -1))],
                              -1)
            h = self.fc(h)                                            # [..., T, n_aux*W] -> H
        residual = None
        for layer in self.layers:
            h, residual = layer(positions, embeds, h, residual, attend)
        normed, prenorm = self.norm(h, residual)
        return normed, (normed if self.norm_output else prenorm)


class SGLangEagle3Draft(nn.Module):
    """SGLang's ``LlamaForCausalLMEagle3`` (the module docstring has the semantics).

    Attributes: ``config`` (the serving ``config.json``), ``hot_token_id`` (int64 ``[draft_vocab]``
    draft id → target id; None without ``d2t``: identity, as SGLang), ``aux_layer_ids`` (SGLang
    "output of layer k" ids from ``eagle_config``; None = SGLang's default capture), ``load_report``
    (``skipped``, ``unfilled``, ``embed_source``, ``lm_head_source``).
    """

    def __init__(self, config: dict):
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.config = dict(config)
        dl.check_config(self.config)
        rotary = LlamaRotaryEmbedding(LlamaConfig(
            hidden_size=config["hidden_size"], num_attention_heads=config["num_attention_heads"],
            head_dim=config.get("head_dim"),  # None: hidden_size // num_attention_heads
            max_position_embeddings=config.get("max_position_embeddings", 8192),
            rope_parameters=rope_parameters(config)))
        # Out of the module tree so ``.to(dtype)`` never rounds ``inv_freq`` (cos/sin in float32).
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

    def states(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor,
               attend: Attend) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft forward (module docstring) over rows ``[..., T]``: ``input_ids`` int64 (target
        vocabulary), ``positions`` int64 ``[T]`` (RoPE), ``hidden`` ``[..., T, W]`` (W =
        ``n_aux × target_hidden_size``: ``fc`` applied; W = H: ``fc`` bypassed); ``attend`` decides
        where keys and values live. Returns ``(normed, next hidden)``, each ``[..., T, H]`` in the
        draft dtype. Differentiable (callers use ``torch.no_grad()`` to measure)."""
        return self.model(input_ids, positions, hidden.to(self.lm_head.weight.dtype), attend)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                cache: DraftKVCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """EXTEND over T rows (causal; after the cached prefix when ``cache`` is given, which gains
        T positions): ``input_ids``, ``positions`` ``[T]``, ``hidden_states`` ``[T, W]`` as
        :meth:`states`. Returns ``(logits [T, draft_vocab] float32, next hidden [T, H])``."""
        if not (input_ids.dim() == positions.dim() == 1 and hidden_states.dim() == 2
                and input_ids.shape[0] == positions.shape[0] == hidden_states.shape[0]):
            raise ValueError(f"SGLangEagle3Draft.forward: expected input_ids [T], positions [T], "
                             f"hidden_states [T, W]; got {tuple(input_ids.shape)}, "
                             f"{tuple(positions.shape)}, {tuple(hidden_states.shape)}")
        normed, hidden = self.states(input_ids, positions, hidden_states, CachedAttention(cache))
        return self.lm_head(normed).float(), hidden

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids (any shape, any device) -> target ids (identity without ``d2t``)."""
        hot = self.hot_token_id
        return draft_ids if hot is None else hot.to(draft_ids.device)[draft_ids]

    @classmethod
    def from_dir(cls, serving_dir: str | Path, dtype: torch.dtype = torch.float32,
                 device: str = "cpu",
                 target_embed: torch.Tensor | None = None, target_head: torch.Tensor | None = None,
                 on_mismatch: Literal["raise", "sglang"] = "raise") -> "SGLangEagle3Draft":
        """Load an SGLang-format draft folder (``config.json`` + ``*.safetensors``) as SGLang does.

        ``target_embed`` ``[vocab, H]`` replaces the draft's embedding unless
        ``target_hidden_size != hidden_size`` (``set_embed``); ``target_head``: the target's LM
        head, used only without ``draft_vocab_size`` (``load_lm_head_from_target``).
        ``on_mismatch="raise"``: CheckpointInvalid naming every tensor SGLang would skip silently
        and every parameter no tensor fills; ``"sglang"``: skip / keep random init, recorded in
        ``load_report`` with a warning. Shape mismatches always raise (SGLang asserts too). Raises
        ConfigError for an unreadable folder, EngineUnsupported for an architecture or activation
        this class does not run.
        """
        from safetensors.torch import load_file

        serving_dir = Path(serving_dir)
        if not (serving_dir / "config.json").is_file():
            raise ConfigError(f"{serving_dir}: expected an SGLang draft folder with config.json, "
                              "found none")
        config = json.loads((serving_dir / "config.json").read_text())
        files = sorted(serving_dir.glob("*.safetensors"))
        if not files:
            raise ConfigError(f"{serving_dir}: expected model.safetensors (or shards), found no "
                              "*.safetensors")
        torch.manual_seed(0)  # unfilled parameters keep a deterministic random init (sglang mode)
        draft = cls(config)   # config checks first: a wrong architecture is named before any read
        tensors = {k: v for f in files for k, v in load_file(str(f)).items()}
        draft._load(tensors, target_embed, target_head, on_mismatch, serving_dir)
        return draft.to(device=device, dtype=dtype).eval()

    def _load(self, tensors, target_embed, target_head, on_mismatch, where) -> None:
        params = dict(self.named_parameters())
        filled: set[str] = set()
        skipped: list[str] = []
        for orig, w in tensors.items():
            r = route(orig, params)  # the profile's mirror of load_weights' renames and routing
            if r.kind == "special":  # d2t
                self.hot_token_id = w.long() + torch.arange(w.shape[0])
            elif r.kind == "unknown":
                skipped.append(orig)
            elif r.kind == "param" and r.shard is None:
                dl.copy_param(params[r.param], w, r.param, orig, where)
                filled.add(r.param)
            elif r.kind == "param":
                dl.load_shard(params[r.param], w, r.shard, self.config, r.param, orig, where)
                filled.add(f"{r.param}#{r.shard}")
        self._bind_target(params, filled, target_embed, target_head, where)
        unfilled = dl.unfilled(params, filled)
        self.load_report.update(skipped=sorted(skipped), unfilled=unfilled)
        if skipped or unfilled:
            msg = (f"{where}: SGLang {VERSION} would silently skip tensors {sorted(skipped)} (no "
                   f"such parameter) and keep random init for parameters {unfilled}")
            if on_mismatch == "raise":
                raise CheckpointInvalid(msg)
            log.warning(msg)
        if self.hot_token_id is None and self.draft_vocab_size != self.config["vocab_size"]:
            log.warning("%s: no d2t although draft_vocab_size %d != vocab_size %d: draft ids are "
                        "used as target ids (SGLang does the same)", where, self.draft_vocab_size,
                        self.config["vocab_size"])

    def _bind_target(self, params, filled, target_embed, target_head, where) -> None:
        """SGLang ``init_lm_head``: share the target's embedding (and head, if from the target)."""
        self.load_report["embed_source"] = "draft checkpoint"
        if target_embed is not None and self.config.get("target_hidden_size") in (
                None, self.config["hidden_size"]):
            dl.copy_param(params["model.embed_tokens.weight"], target_embed,
                          "model.embed_tokens.weight", "target embedding", where)
            filled.add("model.embed_tokens.weight")
            self.load_report["embed_source"] = "target"
        self.load_report["lm_head_source"] = "draft checkpoint"
        if not self.config.get("draft_vocab_size"):
            if target_head is None:
                raise ConfigError(f"{where}/config.json: draft_vocab_size missing, so SGLang loads "
                                  "lm_head from the target; pass target_head (its LM head)")
            dl.copy_param(params["lm_head.weight"], target_head, "lm_head.weight",
                          "target lm_head", where)
            filled.add("lm_head.weight")
            self.load_report["lm_head_source"] = "target"
