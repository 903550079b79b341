"""Building blocks of the fast path, on fixed-address tensors with positions as a *device* tensor
(capturable in a CUDA graph: no host sync, no value-dependent allocation).

- :class:`StaticKVCache`: ``[layers, n_kv_heads, max_context, head_dim]`` allocated once, written
with ``index_copy_`` at the positions, never cropped: stale keys past the committed length are
rewritten before the causal mask lets a query see them. - :func:`rope_tables`: the HF rotary module
evaluated once for ``0..max_context-1``; elementwise, so a row is bit-identical to the module's
value in a forward (length-dependent RoPE types are refused by the callers). -
:func:`gqa_attention`: GQA without repeated K/V: the ``rep`` query heads sharing a KV head (HF
``repeat_kv``) are stacked, ``[n_kv, rep·T, d]``, and attend as ``n_kv``-head attention (any SDPA
backend of torch ≥ 2.1). - :class:`StaticDraft`: the draft's own forward over such a cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eagle3.engines.sglang.draft import SGLangEagle3Draft
from eagle3.errors import DataError


class StaticKVCache:
    """Preallocated ``k``/``v`` ``[num_layers, n_kv_heads, max_context, head_dim]`` (zeros); a write
    past ``max_context`` would index out of bounds on the device, so callers check lengths first
    (:meth:`check_fits`)."""

    def __init__(self, num_layers: int, n_kv_heads: int, head_dim: int, max_context: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, n_kv_heads, max_context, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_context = max_context

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k, v`` ``[n_kv, T, d]`` of layer ``layer`` at ``positions`` (int64 ``[T]``, on
        the device)."""
        self.k[layer].index_copy_(1, positions, k)
        self.v[layer].index_copy_(1, positions, v)

    def window(self, layer: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the first ``kv_len`` positions of layer ``layer``: ``[n_kv, kv_len, d]``
        each."""
        return self.k[layer, :, :kv_len], self.v[layer, :, :kv_len]

    def check_fits(self, need: int, what: str) -> None:
        """Raise DataError naming both lengths when ``need`` positions do not fit in the cache."""
        if need > self.max_context:
            raise DataError(f"generate: {what} = {need} positions exceeds the static KV cache of "
                            f"{self.max_context} positions (max_context / --context-length)")


def rope_tables(rotary: torch.nn.Module, max_context: int, dtype: torch.dtype,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``[max_context, head_dim]`` in ``dtype``, from an HF rotary module
    (``forward(x, position_ids [1, S]) -> (cos [1, S, d], sin [1, S, d])`` in ``x.dtype`` on
    ``x.device``)."""
    probe = torch.empty(0, dtype=dtype, device=device)
    positions = torch.arange(max_context, device=device)[None]
    cos, sin = rotary(probe, positions)
    return cos[0].contiguous(), sin[0].contiguous()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary, HF ``apply_rotary_pos_emb``: ``x·cos + rotate_half(x)·sin``; x
    ``[heads, T, d]``, cos/sin ``[T, d]`` (the same expression, in the same order, as HF and
    SGLang)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


def causal_mask(kv_positions: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Boolean ``[T, S]``: query t (at ``positions[t]``) may attend key s (at ``kv_positions[s]``)
    iff s ≤ t's position. ``kv_positions`` = ``arange(S)`` on the device."""
    return kv_positions[None, :] <= positions[:, None]


def grouped_mask(mask: torch.Tensor, rep: int) -> torch.Tensor:
    """``[T, S]`` → ``[1, 1, rep·T, S]``: the causal mask of the ``rep`` query heads stacked per KV
    head (build it once per forward pass, every layer uses it)."""
    return (mask.repeat(rep, 1) if rep > 1 else mask)[None, None]


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gmask: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """Attention of ``q`` ``[n_heads, T, d]`` over ``k, v`` ``[n_kv, S, d]`` with the
    :func:`grouped_mask` of a boolean ``[T, S]`` mask (True = attend) → ``[T, n_heads·d]``. Query
    heads are grouped per KV head (module docstring)."""
    n_heads, t, d = q.shape
    n_kv = k.shape[0]
    if n_heads % n_kv or gmask.shape[-2] != t * (n_heads // n_kv):
        raise ValueError(f"gqa_attention: n_heads {n_heads}, n_kv_heads {n_kv}, {t} queries: "
                         "expected n_heads a "
                         "multiple of n_kv_heads and a grouped mask of "
                         f"{t * max(n_heads // n_kv, 1)} rows, got "
                         f"{gmask.shape[-2]}")
    qg = q.reshape(n_kv, (n_heads // n_kv) * t, d)
    out = F.scaled_dot_product_attention(qg[None], k[None], v[None], attn_mask=gmask, scale=scale)
    out = out[0]
    return out.reshape(n_heads, t, d).transpose(0, 1).reshape(t, n_heads * d)


def qkv_heads(qkv: torch.Tensor, n_heads: int, n_kv: int, head_dim: int, cos: torch.Tensor,
              sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused projection output ``[T, (n_heads + 2·n_kv)·d]`` → ``q [n_heads, T, d]``,
    ``k, v [n_kv, T, d]`` with RoPE applied to q and k in one elementwise pass (the same arithmetic
    as rotating each separately)."""
    t = qkv.shape[0]
    heads = qkv.view(t, n_heads + 2 * n_kv, head_dim)
    qk = apply_rope(heads[:, :n_heads + n_kv].transpose(0, 1), cos, sin)
    return qk[:n_heads], qk[n_heads:], heads[:, n_heads + n_kv:].transpose(0, 1)


def cached_attention(cache: StaticKVCache, layer: int, qkv: torch.Tensor, heads: tuple,
                     positions: torch.Tensor, cos, sin, gmask, kv_len: int, scale: float):
    """One layer's attention over the cache: fused projection ``qkv [T, (nh + 2·nkv)·d]`` with
    ``heads = (nh, nkv, d)`` → RoPE, keys/values written at ``positions``, :func:`gqa_attention`
    over the first ``kv_len`` positions → ``[T, nh·d]`` (before ``o_proj``)."""
    q, k, v = qkv_heads(qkv, *heads, cos, sin)
    cache.write(layer, positions, k, v)
    keys, values = cache.window(layer, kv_len)
    return gqa_attention(q, keys, values, gmask, scale)


class StaticDraft:
    """``draft`` (an SGLangEagle3Draft) run by its own ``states`` over a :class:`StaticKVCache` of
    ``max_context`` positions. Attributes: ``hot_token_id`` (on the draft's device; None =
    identity), ``hidden_size``, ``dtype``, ``cache``."""

    def __init__(self, draft: SGLangEagle3Draft, max_context: int):
        if not isinstance(draft, SGLangEagle3Draft):
            raise TypeError("StaticDraft: expected an SGLangEagle3Draft, got "
                            f"{type(draft).__name__}")
        self.draft, w = draft, draft.lm_head.weight
        self.device, self.dtype = w.device, w.dtype
        attn = draft.model.layers[0].self_attn
        self.heads, self.rep = (attn.nh, attn.nkv, attn.hd), attn.nh // attn.nkv
        self.hidden_size = draft.hidden_size
        hot = draft.hot_token_id
        self.hot_token_id = None if hot is None else hot.to(self.device)
        self.cache = StaticKVCache(len(draft.model.layers), attn.nkv, attn.hd, max_context,
                                   self.dtype, self.device)
        rotary = draft._rotary[0]  # noqa: SLF001 - the draft's own float32 rotary module
        self.cos, self.sin = rope_tables(rotary, max_context, self.dtype, self.device)
        self.kv_positions = torch.arange(max_context, device=self.device)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids → target ids (on the device; identity without ``d2t``)."""
        return draft_ids if self.hot_token_id is None else self.hot_token_id[draft_ids]

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor,
                kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """EXTEND over T rows (``SGLangEagle3Draft.forward``'s inputs) attending over the first
        ``kv_len`` cache positions; the cache gains the T positions. Returns ``(logits [T,
        draft_vocab], hidden [T, H])`` in the draft dtype."""
        cos, sin = self.cos[positions], self.sin[positions]
        mask = grouped_mask(causal_mask(self.kv_positions[:kv_len], positions), self.rep)

        def attend(layer, attn, x, pos):
            out = cached_attention(self.cache, layer, attn.qkv_proj(x), self.heads, pos, cos, sin,
                                   mask, kv_len, attn.hd ** -0.5)
            return attn.o_proj(out)

        normed, h = self.draft.states(ids, positions, hidden, attend)
        return self.draft.lm_head(normed), h


def kv_buckets(max_context: int, smallest: int = 256) -> list[int]:
    """Attention window lengths the graphs are captured for: powers of two from ``smallest`` below
    ``max_context``, then ``max_context`` itself (a step attends over the smallest bucket that holds
    it)."""
    out, b = [], smallest
    while b < max_context:
        out.append(b)
        b *= 2
    return out + [max_context]
