"""The SGLang-format EAGLE-3 draft for the fast path: :class:`eagle3.engines.sglang.draft.SGLangEagle3Draft`'s
own modules and weights, run over a static KV cache with positions on the device.

The computation is the draft's EXTEND forward exactly as ``SGLangEagle3Draft.forward`` does it (SGLang 0.5.23
``LlamaForCausalLMEagle3``; see that module's docstring): ``fc`` (with ``input_norm`` / ``fc_norm``) only when
the incoming hidden width differs from the embedding width, layer 0 takes ``cat(input_layernorm(embeds),
hidden_norm(h))`` with the residual taken *before* ``hidden_norm``, later layers ``hidden_norm(h, residual)``,
then ``norm(h, residual)`` → ``(normed, prenorm)``; logits ``lm_head(normed)`` over the draft vocabulary; the
state handed to the next step is ``prenorm`` (``normed`` with ``norm_output``). What changes is only where the
keys and values live (a preallocated cache written at the positions, instead of a growing ``torch.cat``) and
that GQA attention reads the shared KV heads without ``repeat_interleave``.
"""

from __future__ import annotations

import torch

from eagle3.engines.sglang.draft import SGLangEagle3Draft
from refengine.static_cache import (StaticKVCache, causal_mask, gqa_attention, grouped_mask,
                                                 qkv_heads, rope_tables)


class StaticDraft:
    """``draft`` (an :class:`SGLangEagle3Draft`) with a :class:`StaticKVCache` of ``max_context`` positions.

    Attributes: ``hot_token_id`` (int64 ``[draft_vocab]`` on the draft's device, draft id → target id; None =
    identity), ``hidden_size``, ``cache``.
    """

    def __init__(self, draft: SGLangEagle3Draft, max_context: int):
        if not isinstance(draft, SGLangEagle3Draft):
            raise TypeError(f"StaticDraft: expected an SGLangEagle3Draft, got {type(draft).__name__}")
        self.draft, self.model = draft, draft.model
        w = draft.lm_head.weight
        self.device, self.dtype = w.device, w.dtype
        attn = self.model.layers[0].self_attn
        self.n_heads, self.n_kv, self.head_dim = attn.nh, attn.nkv, attn.hd
        self.hidden_size = draft.hidden_size
        self.hot_token_id = None if draft.hot_token_id is None else draft.hot_token_id.to(self.device)
        self.cache = StaticKVCache(len(self.model.layers), self.n_kv, self.head_dim, max_context, self.dtype,
                                   self.device)
        self.cos, self.sin = rope_tables(draft._rotary[0], max_context, self.dtype, self.device)  # noqa: SLF001
        self.kv_positions = torch.arange(max_context, device=self.device)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids → target ids (on the device; identity without ``d2t``)."""
        return draft_ids if self.hot_token_id is None else self.hot_token_id[draft_ids]

    def _attention(self, i: int, attn, x, positions, cos, sin, mask, kv_len: int) -> torch.Tensor:
        q, k, v = qkv_heads(attn.qkv_proj(x), self.n_heads, self.n_kv, self.head_dim, cos, sin)
        self.cache.write(i, positions, k, v)
        keys, values = self.cache.window(i, kv_len)
        return attn.o_proj(gqa_attention(q, keys, values, mask, attn.hd ** -0.5))

    def _fc(self, h: torch.Tensor, embed_width: int) -> torch.Tensor:
        m = self.model
        if h.shape[-1] == embed_width:                                      # SGLang's exact condition
            return h
        if m.input_norm is not None:
            h = m.input_norm(h)
        if m.fc_norm is not None:
            chunks = h.chunk(m.num_aux_hidden_states, -1)
            h = torch.cat([n(c) for n, c in zip(m.fc_norm, chunks)], -1)
        return m.fc(h)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor,
                kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """EXTEND over T positions: ``ids`` int64 ``[T]`` (target vocabulary), ``positions`` int64 ``[T]``,
        ``hidden`` ``[T, W]`` (aux states: ``fc`` applied; or the draft's own state, width H: ``fc`` skipped),
        attending over the first ``kv_len`` cache positions. Returns ``(logits [T, draft_vocab], hidden [T, H])``
        in the draft dtype; the cache gains the T positions."""
        m = self.model
        cos, sin = self.cos[positions], self.sin[positions]
        mask = grouped_mask(causal_mask(self.kv_positions[:kv_len], positions), self.n_heads // self.n_kv)
        embeds = m.embed_tokens(ids)
        h = self._fc(hidden.to(self.dtype), embeds.shape[-1])
        residual = None
        for i, layer in enumerate(m.layers):
            if layer.is_input_layer:
                residual = h
                h = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(h)], -1)
            else:
                h, residual = layer.hidden_norm(h, residual)
            h = self._attention(i, layer.self_attn, h, positions, cos, sin, mask, kv_len)
            h, residual = layer.post_attention_layernorm(h, residual)
            h = layer.mlp(h)
        normed, prenorm = m.norm(h, residual)
        return self.draft.lm_head(normed), (normed if m.norm_output else prenorm)
