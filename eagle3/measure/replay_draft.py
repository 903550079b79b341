"""The SGLang-format draft run over every position of many sequences at once (TTT style), for replay acceptance.

:class:`~eagle3.engines.sglang.draft.SGLangEagle3Draft` runs one request incrementally with a KV cache, the way
SGLang 0.5.23's EAGLE worker does (topk 1). Here the same modules (``fc``/``input_norm``/``fc_norm``, the
decoder layers' norms, ``qkv_proj``, rotary embedding, ``o_proj``, MLP, final ``norm``, ``lm_head``,
``hot_token_id``) compute, for a batch of known token sequences ``s_0..s_{L-1}``, the chain proposals at every
base position ``t`` in one forward per draft step:

- step 1 is the draft extend: row ``t`` is token ``s_{t+1}`` with the target's draft input state of ``s_t``
  (aux states paired with the next token) at RoPE position ``t``, causal attention over rows ``<= t``;
  its output proposes ``s_{t+2}``;
- step ``j > 1`` at row ``t`` is token ``s_{t+j}`` (the true token, which equals the draft's own step ``j-1``
  proposal whenever steps ``1..j-1`` were accepted -- the only case in which step ``j`` matters for acceptance)
  with the draft's own output hidden state of step ``j-1`` at row ``t`` (width H, so ``fc`` is skipped, as
  SGLang) at RoPE position ``t+j-1``. It attends to the extend keys of rows ``<= t`` and to its own chain's
  keys (steps ``2..j`` of row ``t``): a block mask, causal over the extend block, diagonal over each chain
  block -- the keys a chain step sees in the incremental decoder, whose cache holds the committed (extend)
  positions ``0..t`` and the current chain.

Right padding needs no masking: a valid row only ever attends to rows at or before it. The layer control flow
mirrors ``eagle3.engines.sglang.draft._Model.forward`` / ``_DecoderLayer.forward`` (the decoder in
``refengine/specdec.py`` runs those); ``tests/unit/test_replay.py`` checks the two agree token for
token. Everything is differentiable (callers use ``torch.no_grad()`` for measurement).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eagle3.engines.sglang.draft import SGLangEagle3Draft, _apply_rope
from eagle3.errors import DataError

LOGIT_ROWS = 8192  # rows per lm_head chunk when taking proposals (bounds the [rows, draft_vocab] logits)


def _block_mask(t: int, step: int, device) -> torch.Tensor:
    """Bool ``[T, step*T]``: causal over the extend block, the identity over each of the ``step-1`` chain blocks."""
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * (step - 1), dim=1)


def _attend(attn, x: torch.Tensor, positions: torch.Tensor, store: list, mask: torch.Tensor) -> torch.Tensor:
    """One attention block over ``x [B, T, W]``; appends this step's keys/values to ``store`` (per layer)."""
    b, t, _ = x.shape
    nh, nkv, hd = attn.nh, attn.nkv, attn.hd
    q, k, v = attn.qkv_proj(x).split([nh * hd, nkv * hd, nkv * hd], -1)
    q = q.view(b, t, nh, hd).transpose(1, 2)                    # [B, nh, T, d]
    k = k.view(b, t, nkv, hd).transpose(1, 2)                   # [B, nkv, T, d]
    v = v.view(b, t, nkv, hd).transpose(1, 2)
    cos, sin = attn.rotary[0](x, positions[None])               # [1, T, d]
    q, k = _apply_rope(q, cos[:, None], sin[:, None]), _apply_rope(k, cos[:, None], sin[:, None])
    store.append((k, v))
    keys = torch.cat([kv[0] for kv in store], 2)
    values = torch.cat([kv[1] for kv in store], 2)
    rep = nh // nkv
    keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=hd ** -0.5)
    return attn.o_proj(out.transpose(1, 2).reshape(b, t, nh * hd))


def _step(model, ids: torch.Tensor, positions: torch.Tensor, h: torch.Tensor, stores: list, mask: torch.Tensor):
    """One draft step over ``[B, T]`` rows → ``(normed [B, T, H], next hidden [B, T, H])``."""
    embeds = model.embed_tokens(ids)
    if h.shape[-1] != embeds.shape[-1]:                         # SGLang's condition for applying fc
        if model.input_norm is not None:
            h = model.input_norm(h)
        if model.fc_norm is not None:
            chunks = h.chunk(model.num_aux_hidden_states, -1)
            h = torch.cat([n(c) for n, c in zip(model.fc_norm, chunks)], -1)
        h = model.fc(h)
    residual = None
    for layer, store in zip(model.layers, stores):
        if layer.is_input_layer:
            residual = h
            x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(h)], -1)
        else:
            x, residual = layer.hidden_norm(h, residual)
        x = _attend(layer.self_attn, x, positions, store, mask)
        x, residual = layer.post_attention_layernorm(x, residual)
        h = layer.mlp(x)
    normed, prenorm = model.norm(h, residual)
    return normed, (normed if model.norm_output else prenorm)


def chain_states(draft: SGLangEagle3Draft, tokens: torch.Tensor, hidden: torch.Tensor,
                 num_steps: int) -> list[torch.Tensor]:
    """Normed draft outputs of every chain step at every base row (see the module docstring).

    ``tokens`` int64 ``[B, L]`` (right padded; any pad id inside the vocabulary), ``hidden`` ``[B, L, W]``: the
    draft input state of each token (the target's aux states, or one layer's state for the broken-integration
    reference). Returns ``num_steps`` tensors ``[B, L-1, H]`` (draft dtype): element ``j-1`` at row ``t`` is the
    state whose ``lm_head`` argmax is the draft's proposal for ``s_{t+1+j}`` at base ``t``. Rows at or past a
    sequence's own length are padding. Raises DataError for bad shapes or ``num_steps < 1``.
    """
    if tokens.dim() != 2 or hidden.dim() != 3 or tuple(hidden.shape[:2]) != tuple(tokens.shape) \
            or tokens.shape[1] < 2 or num_steps < 1:
        raise DataError(f"chain_states: expected tokens [B, L >= 2], hidden [B, L, W], num_steps >= 1; got "
                        f"{tuple(tokens.shape)}, {tuple(hidden.shape)}, {num_steps}")
    model = draft.model
    b, length = tokens.shape
    t = length - 1
    base = torch.arange(t, device=tokens.device)
    padded = torch.cat([tokens, tokens.new_zeros(b, num_steps)], 1)   # s_{t+j} past the end: padding
    stores: list[list] = [[] for _ in model.layers]
    h = hidden[:, :t].to(draft.lm_head.weight.dtype)
    out = []
    for j in range(1, num_steps + 1):
        normed, h = _step(model, padded[:, j:j + t], base + (j - 1), h, stores, _block_mask(t, j, tokens.device))
        out.append(normed)
    return out


def to_target_ids(draft: SGLangEagle3Draft, draft_ids: torch.Tensor) -> torch.Tensor:
    """Draft-vocabulary ids (any shape, any device) → target ids through ``hot_token_id`` (identity without d2t)."""
    hot = draft.hot_token_id
    return draft_ids if hot is None else hot.to(draft_ids.device)[draft_ids]


def greedy_ids(draft: SGLangEagle3Draft, normed: torch.Tensor, rows: int = LOGIT_ROWS) -> torch.Tensor:
    """``argmax lm_head(normed)`` as target ids, ``normed [..., H]`` → int64 ``[...]``, ``rows`` rows at a time
    (float32 logits, as ``SGLangEagle3Draft.forward`` returns them)."""
    flat = normed.reshape(-1, normed.shape[-1])
    ids = torch.cat([draft.lm_head(flat[i:i + rows]).float().argmax(-1) for i in range(0, flat.shape[0], rows)])
    return to_target_ids(draft, ids).reshape(normed.shape[:-1])


@torch.no_grad()
def chain_proposals(draft: SGLangEagle3Draft, tokens: torch.Tensor, hidden: torch.Tensor,
                    num_steps: int) -> torch.Tensor:
    """Greedy chain proposals at every base: int64 ``[B, L-1, num_steps]``, ``[b, t, j-1]`` = the draft's
    (target-vocabulary) token for ``s_{t+1+j}`` when the verify point's last committed row is ``t``.
    Arguments as :func:`chain_states`."""
    return torch.stack([greedy_ids(draft, s) for s in chain_states(draft, tokens, hidden, num_steps)], -1)
