"""Pure-torch stand-in for ``vllm._custom_ops.rotary_embedding`` (test harness only).

SGLang 0.5.23's ``RotaryEmbedding.__init__`` (``sglang/srt/layers/rotary_embedding/base.py``) picks
vLLM's fused kernel on a platform that is neither CUDA, HIP nor its own CPU engine, and calls it as
``rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)`` expecting the
rotation to be applied **in place** to ``query`` and ``key``. The formula is the standard rotary
embedding (Su et al., RoFormer, 2021): for each head, ``x1' = x1*cos - x2*sin`` and
``x2' = x2*cos + x1*sin``, where NeoX style pairs the two halves of the rotary dims and GPT-J style
pairs even/odd dims.
"""

from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """Rotate ``x [T, heads, rot_dim]`` with ``cos``/``sin`` ``[T, 1, rot_dim // 2]``; returns a new
    tensor."""
    if is_neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Apply the rotary embedding in place.

    Args:
        positions: ``[T]`` int token positions.
        query: ``[T, num_heads * head_size]`` (or ``[T, num_heads, head_size]``), modified in place.
        key: like ``query`` with ``num_kv_heads``, modified in place; may be ``None``.
        head_size: per-head width; only the first ``rot_dim = cos_sin_cache.shape[-1]`` dims rotate.
        cos_sin_cache: ``[max_positions, rot_dim]``: cos in the first half, sin in the second.
        is_neox: NeoX (half-split) pairing when true, GPT-J (interleaved) pairing otherwise.
    """
    rot_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.index_select(0, positions.flatten().long()).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    for x in (query, key):
        if x is None:
            continue
        view = x.view(positions.numel(), -1, head_size)
        rotated = _rotate(view[..., :rot_dim].float(), cos.float(), sin.float(), is_neox)
        view[..., :rot_dim] = rotated.to(x.dtype)
