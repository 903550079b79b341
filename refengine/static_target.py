"""The target's forward for the fast path: a minimal Llama decoder over the HF model's own weights,
with a static KV cache and aux capture into caller-given buffers (no hooks, no allocation a CUDA
graph could not replay).

Per layer as transformers' ``LlamaDecoderLayer``: ``h += o_proj(attn(...))`` on
``input_layernorm(h)``, ``h += down(act(gate(x)) · up(x))`` on ``post_attention_layernorm(h)``;
logits ``lm_head(norm(h))``. q/k/v and gate/up are fused by re-pointing the HF linears' weights at
row slices of one tensor (no copy). Aux index i = the input of layer i, L = the last layer's output
before the norm (``eagle3.target_model``); ``capture_final``: the final normed state instead
(failure class 11). ``LlamaForCausalLM`` only: :func:`unsupported_reason` names anything else (the
caller keeps ``SpeculativeDecoder``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from refengine.static_cache import (StaticKVCache, cached_attention, causal_mask, grouped_mask,
                                    rope_tables)

FAST_ARCHITECTURES = ("LlamaForCausalLM",)
_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def _rope_type(config) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")) or "default")


def unsupported_reason(model) -> str | None:
    """Why the fast path cannot run ``model`` (a sentence naming the class or setting), or None when
    it can."""
    name = type(model).__name__
    if name not in FAST_ARCHITECTURES:
        return f"target class {name}: the fast path implements {', '.join(FAST_ARCHITECTURES)} only"
    rope = _rope_type(model.config)
    if rope in _LENGTH_DEPENDENT_ROPE:
        return (f"target rope_type {rope!r}: its frequencies depend on the sequence length (no "
                "static RoPE table)")
    cfg = model.config
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        return (f"target num_attention_heads {cfg.num_attention_heads} is not a multiple of "
                "num_key_value_heads "
                f"{cfg.num_key_value_heads}")
    return None


def fuse_rows(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One ``[Σ out, in]`` weight (and bias) for several linears with the same input; each linear's
    weight becomes a row slice (a view) of it, so nothing is duplicated. Idempotent."""
    first = linears[0].weight
    fused = getattr(linears[0], "_eagle3_fused", None)
    if fused is not None and fused[0].data_ptr() == first.data_ptr():
        return fused
    weight = torch.cat([lin.weight.data for lin in linears], 0)
    has_bias = all(lin.bias is not None for lin in linears)
    bias = torch.cat([lin.bias.data for lin in linears], 0) if has_bias else None
    start = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = weight[start:start + n]
        if has_bias:
            lin.bias.data = bias[start:start + n]
        start += n
    linears[0]._eagle3_fused = (weight, bias)  # noqa: SLF001 - marks the slices for a second call
    return weight, bias


class StaticLlamaTarget:
    """The HF ``LlamaForCausalLM`` ``model`` over a :class:`StaticKVCache` of ``max_context``
    positions. ``capture``: sorted HF indices of the aux states (an index may repeat, e.g. ``[2,
    L//2, L-3]`` on a 4-layer target, filling every chunk it names); ``capture_final``: the final
    normed state instead; neither: none. Attributes: ``hidden_width``, ``cache``, ``vocab_size``,
    ``device``, ``dtype``."""

    def __init__(self, model, max_context: int, capture: list[int] | None = None,
                 capture_final: bool = False):
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"StaticLlamaTarget: {reason}")
        self.model, cfg = model, model.config
        dec = model.model
        self.layers = list(dec.layers)
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.hidden = cfg.hidden_size
        self.scale = self.layers[0].self_attn.scaling
        w = model.lm_head.weight
        self.device, self.dtype, self.vocab_size = w.device, w.dtype, int(w.shape[0])
        self.capture = list(capture or [])
        self.slots: dict[int, list[int]] = {}    # HF index → chunk positions (may repeat)
        for j, index in enumerate(self.capture):
            self.slots.setdefault(index, []).append(j)
        self.capture_final = capture_final
        self.hidden_width = self.hidden * (1 if capture_final else len(self.capture))
        self.qkv = [fuse_rows([ly.self_attn.q_proj, ly.self_attn.k_proj, ly.self_attn.v_proj])
                    for ly in self.layers]
        self.gate_up = [fuse_rows([ly.mlp.gate_proj, ly.mlp.up_proj]) for ly in self.layers]
        self.inter = self.layers[0].mlp.gate_proj.weight.shape[0]
        self.cache = StaticKVCache(len(self.layers), self.n_kv, self.head_dim, max_context,
                                   self.dtype, self.device)
        self.cos, self.sin = rope_tables(dec.rotary_emb, max_context, self.dtype, self.device)
        self.kv_positions = torch.arange(max_context, device=self.device)

    def _attention(self, i: int, x: torch.Tensor, positions, cos, sin, mask,
                   kv_len: int) -> torch.Tensor:
        w, b = self.qkv[i]
        heads = (self.n_heads, self.n_kv, self.head_dim)
        out = cached_attention(self.cache, i, F.linear(x, w, b), heads,
                               positions, cos, sin, mask, kv_len, self.scale)
        return self.layers[i].self_attn.o_proj(out)

    def _mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        w, b = self.gate_up[i]
        gate, up = F.linear(x, w, b).split([self.inter, self.inter], dim=-1)
        mlp = self.layers[i].mlp
        return mlp.down_proj(mlp.act_fn(gate) * up)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, kv_len: int,
                hidden_out: torch.Tensor | None = None, last_only: bool = False) -> torch.Tensor:
        """``ids`` int64 ``[T]`` at device ``positions`` over the first ``kv_len`` cache positions;
        the cache gains the T positions; ``hidden_out [T, hidden_width]`` receives the captured
        states. Returns logits ``[T, V]`` (``[1, V]`` with ``last_only``) in the model dtype."""
        cos, sin = self.cos[positions], self.sin[positions]
        mask = grouped_mask(causal_mask(self.kv_positions[:kv_len], positions),
                            self.n_heads // self.n_kv)
        h = self.model.model.embed_tokens(ids)
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            self._store(hidden_out, i, h)
            a = self._attention(i, layer.input_layernorm(h), positions, cos, sin, mask, kv_len)
            h = h + a
            h = h + self._mlp(i, layer.post_attention_layernorm(h))
        self._store(hidden_out, n, h)
        normed = self.model.model.norm(h[-1:] if last_only and not self.capture_final else h)
        if self.capture_final and hidden_out is not None:
            hidden_out.copy_(normed)
        return self.model.lm_head(normed[-1:] if last_only else normed)

    def _store(self, out: torch.Tensor | None, index: int, h: torch.Tensor) -> None:
        if out is None or self.capture_final:
            return
        for j in self.slots.get(index, ()):
            out[:, j * self.hidden:(j + 1) * self.hidden].copy_(h)
