"""This project's training forward of speculators' ``Eagle3DraftModel``
(``train.forward_impl: project``): the same ``ttt_steps`` teacher-forced steps and per-step
``compound_loss`` on the positions ``align_for_step`` aligns, with the draft's own modules and
checkpoint format, restructured so ``torch.compile`` makes one static graph per micro-batch:

- attention by structure: at TTT step k a query at p attends step-0 keys j ≤ p of its document
  plus its own position's keys of steps 1..k (speculators' ``create_combined_mask_mod``); ``eager``
  (CPU): ``[S, S]`` scores plus k diagonals, one softmax; ``flex`` (CUDA, compiled): block-sparse
  mask; ``sdpa`` (any device): speculators' dense ``[S, (k+1)·S]`` layout;
- the embedding half of q/k/v projected once for the ``S + ttt_steps - 1`` shifted ids (step k
  takes rows ``k..k+S``); the verifier's argmax from the targets already computed;
- no in-place input update, data-dependent shape or graph break: the :mod:`eagle3.train.metrics`
  counts come out of the graph as one ``stats`` vector.

Supported: speculators' Llama draft (``LlamaDecoderEagle3FirstLayer`` then ``LlamaDecoderLayer``),
every layer flag, no sliding window (else :func:`check_supported` raises ConfigError). Equal to
speculators' forward in float32 on the CPU: tests/unit/test_ttt_forward.py.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from eagle3.errors import ConfigError
from eagle3.train.metrics import first_tokens, step_stats

ATTENTIONS = ("eager", "sdpa", "flex")


def resolve_attention(setting: str, device_type: str, compiled: bool) -> str:
    """The attention for ``train.attn_implementation`` = ``setting``; ``auto``: ``flex`` on CUDA
    compiled (uncompiled it materialises every score), ``sdpa`` on CUDA uncompiled, ``eager`` on
    the CPU (a quarter of the dense layout's score work at 3 TTT steps). ConfigError for an unknown
    setting."""
    if setting == "auto":
        return ("flex" if compiled else "sdpa") if device_type == "cuda" else "eager"
    if setting not in ATTENTIONS:
        raise ConfigError(f"train.attn_implementation: expected auto or one of {list(ATTENTIONS)} "
                          f"with train.forward_impl=project, got {setting!r}")
    return setting


def choose(train_cfg, device_type: str, world: int) -> tuple[str, str]:
    """``(forward, attention)`` for a TrainConfig: ``("project", eager|sdpa|flex)`` or
    ``("speculators", sdpa|eager)``. ``forward_impl: auto`` is ``project`` except under fsdp with
    several processes (FSDP2 gathers a layer's weights around its own ``forward`` call, which this
    forward does not make). ConfigError for ``project`` under fsdp, ``flex`` with speculators'
    forward or off CUDA."""
    t = train_cfg
    fsdp = t.distributed == "fsdp" and world > 1
    impl = ("speculators" if fsdp else "project") if t.forward_impl == "auto" else t.forward_impl
    if impl == "project" and fsdp:
        raise ConfigError("train.forward_impl=project with train.distributed=fsdp: expected ddp "
                          "(or train.forward_impl=speculators / auto), got fsdp")
    if impl == "speculators":
        if t.attn_implementation == "flex":
            why = (" (train.forward_impl=auto takes speculators' forward under "
                   "train.distributed=fsdp with num_gpus > 1)"
                   if t.forward_impl == "auto" else "")
            raise ConfigError("train.attn_implementation=flex: expected auto, sdpa or eager with "
                              f"speculators' forward{why} (its flex path failed under "
                              "torch.compile), got flex")
        return impl, "sdpa" if t.attn_implementation == "auto" else t.attn_implementation
    if t.attn_implementation == "flex" and device_type != "cuda":
        raise ConfigError("train.attn_implementation=flex: expected auto, sdpa or eager on a "
                          f"{device_type} training device (flex attention has no backward there; "
                          "it is for compiled CUDA training), got flex")
    compiled = bool(t.compile) and device_type == "cuda"
    return impl, resolve_attention(t.attn_implementation, device_type, compiled)


def resolved_settings(train_cfg, device_type: str, world: int) -> dict[str, dict]:
    """The ``auto`` settings resolved as :attr:`eagle3.config.RunConfig.auto_resolved`
    (``{"train.forward_impl": {"setting", "value", "device", "why"}, ...}``); raises as
    :func:`choose`."""
    t = train_cfg
    impl, attention = choose(t, device_type, world)
    rows = {"forward_impl": (impl, "project, except speculators' forward under fsdp with several "
                                   "processes"),
            "attn_implementation": (attention, "flex on CUDA compiled, sdpa on CUDA uncompiled, "
                                    "eager on the CPU (sdpa with speculators' forward)"),
            "optimizer_impl": (optimizer_impl(t, device_type),
                               "fused AdamW on CUDA, the default AdamW elsewhere")}
    return {f"train.{k}": {"setting": "auto", "value": v, "device": device_type, "why": why}
            for k, (v, why) in rows.items() if getattr(t, k) == "auto"}


def optimizer_impl(train_cfg, device_type: str) -> str:
    """``train.optimizer_impl``; ``auto`` = ``fused`` on CUDA, ``default`` elsewhere."""
    o = train_cfg.optimizer_impl
    return o if o != "auto" else ("fused" if device_type == "cuda" else "default")


def check_supported(model) -> None:
    """Raise ConfigError unless this forward reproduces ``model`` exactly."""
    from speculators.models.eagle3.model_definitions import LlamaDecoderEagle3FirstLayer
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    if not isinstance(model.layers[0], LlamaDecoderEagle3FirstLayer) or \
            any(type(layer) is not LlamaDecoderLayer for layer in model.layers[1:]):
        raise ConfigError("train.forward_impl=project: expected speculators' Llama draft layers "
                          "(LlamaDecoderEagle3FirstLayer, then LlamaDecoderLayer), got "
                          f"{[type(x).__name__ for x in model.layers]}; "
                          "use train.forward_impl=speculators")
    if model.uses_sliding_window_attn:
        raise ConfigError("train.forward_impl=project: sliding-window draft layers are not "
                          f"supported (layers {model.sliding_window_indices}); use "
                          "train.forward_impl=speculators")


def document_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """``[S, S]`` bool: query p sees step-0 key j if j ≤ p in p's document, or j == p.
    ``document_ids``: ``[1, S]`` int64, -1 = padding (speculators' ``create_combined_mask_mod``)."""
    doc = document_ids[0]
    idx = torch.arange(doc.shape[0], device=doc.device)
    same = (doc[:, None] == doc[None, :]) & (doc[:, None] != -1)
    return ((idx[:, None] >= idx[None, :]) & same) | (idx[:, None] == idx[None, :])


def flex_block_masks(document_ids: torch.Tensor, ttt_steps: int) -> list:
    """One flex-attention ``BlockMask`` per TTT step k over ``(k+1)·S`` keys (speculators' mask:
    causal ∧ same document on the first block, the diagonal on every later one). Traceable:
    torch.compile builds them in-graph."""
    from torch.nn.attention.flex_attention import create_block_mask

    doc = document_ids[0]
    S = doc.shape[0]

    def mask_mod(_b, _h, q, kv):
        first = (kv < S) & (q >= kv) & (doc[q] != -1) & (doc[q] == doc[kv % S])
        return first | (kv % S == q)

    return [create_block_mask(mask_mod, None, None, S, (k + 1) * S, device=doc.device)
        for k in range(ttt_steps)]


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``[1, S, n·d]`` → ``[1, n, S, d]``."""
    return x.view(1, x.shape[1], -1, head_dim).transpose(1, 2)


def _attend(q, keys, values, attention: str, mask, scale: float):
    """One TTT step's attention: ``q [1, H, S, d]``, ``keys``/``values`` per step ``[1, KV, S, d]``,
    ``mask``: :func:`document_mask` or this step's BlockMask (flex); returns ``[1, H, S, d]``."""
    from transformers.models.llama.modeling_llama import repeat_kv  # GQA: [1, KV, S, d] → H heads

    groups = q.shape[1] // keys[0].shape[1]
    S = q.shape[2]
    if attention == "flex":
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, torch.cat(keys, dim=2), torch.cat(values, dim=2), block_mask=mask,
                              scale=scale, enable_gqa=groups > 1)
    if attention == "sdpa":
        eye = torch.eye(S, dtype=torch.bool, device=q.device)
        dense = torch.cat([mask] + [eye] * (len(keys) - 1), dim=-1)  # [S, (k+1)·S]
        return F.scaled_dot_product_attention(q, repeat_kv(torch.cat(keys, dim=2), groups),
                                              repeat_kv(torch.cat(values, dim=2), groups),
                                              attn_mask=dense, scale=scale)
    k0, v0 = repeat_kv(keys[0], groups), repeat_kv(values[0], groups)
    scores = ((q @ k0.transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf"))  # [1,H,S,S]
    diag = [(q * repeat_kv(k, groups)).sum(-1, keepdim=True) * scale for k in keys[1:]]  # [1,H,S,1]
    probs = torch.cat([scores, *diag], dim=-1).softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    out = probs[..., :S] @ v0
    for m, v in enumerate(values[1:]):
        out = out + probs[..., S + m:S + m + 1] * repeat_kv(v, groups)
    return out


def _first_layer(layer, h, embed_parts, head_dim, cos, sin, cache, attention, mask):
    """speculators' ``Eagle3FirstLayerMixin.forward``, embedding half precomputed."""
    a, H = layer.self_attn, h.shape[-1]
    hidden_n = layer.hidden_norm(h)
    residual = hidden_n if layer.norm_before_residual else h
    q, k, v = (_heads(e + F.linear(hidden_n, p.weight[:, H:]), head_dim)
               for e, p in zip(embed_parts, (a.q_proj, a.k_proj, a.v_proj)))
    return _layer_tail(layer, residual, q, k, v, cos, sin, cache, attention, mask)


def _plain_layer(layer, h, head_dim, cos, sin, cache, attention, mask):
    """transformers' ``LlamaDecoderLayer.forward`` for one step (draft layers after the first)."""
    a, x = layer.self_attn, layer.input_layernorm(h)
    q, k, v = (_heads(p(x), head_dim) for p in (a.q_proj, a.k_proj, a.v_proj))
    return _layer_tail(layer, h, q, k, v, cos, sin, cache, attention, mask)


def _layer_tail(layer, residual, q, k, v, cos, sin, cache, attention, mask):
    """Rotate q/k, cache k/v, attend, project, add the residual, then the MLP block."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    # rotated q/k come out in float32 under autocast (float32 cos/sin); SDPA would cast them
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    cache[0].append(k.to(v.dtype))
    cache[1].append(v)
    a = layer.self_attn
    out = _attend(q.to(v.dtype), cache[0], cache[1], attention, mask, a.scaling)  # [1, H, S, d]
    h = residual + a.o_proj(out.transpose(1, 2).reshape(1, q.shape[2], -1))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def ttt_forward(model, *, hidden_states: torch.Tensor, input_ids: torch.Tensor,
                document_ids: torch.Tensor,
                loss_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                verifier_last_hidden_states: torch.Tensor, ttt_steps: int = 3,
                ttt_step_loss_decay: float = 1.0,
                loss_config: dict | None = None, attention: str = "eager", masks=None):
    """One packed micro-batch through the draft's ``ttt_steps`` training steps.

    model: speculators' ``Eagle3DraftModel``. hidden_states: ``[1, S, n_aux·H]`` (float32 or bf16).
    input_ids, document_ids, position_ids: ``[1, S]`` int64 (position_ids None = 1..S, speculators'
    default). loss_mask: ``[1, S]`` bool/int, None = all. verifier_last_hidden_states:
    ``[1, S, H]``, before the final norm. ttt_steps, ttt_step_loss_decay, loss_config: as
    speculators' ``forward`` (None = eager KL). masks: :func:`step_masks` (None: built here).
    Returns ``(loss, stats)``: the scalar sum of per-step losses and a float32
    ``[ttt_steps·8 + 2]`` vector in :func:`eagle3.train.metrics.new_counts`' layout."""
    from speculators.losses import compound_loss, exp_loss_decay, resolve_loss_config

    if loss_config is None:
        loss_config = resolve_loss_config("kl_div", "eager")
    if masks is None:
        masks = step_masks(document_ids, ttt_steps, attention)
    S, K, device = hidden_states.shape[1], ttt_steps, hidden_states.device
    if position_ids is None:
        position_ids = torch.arange(1, S + 1, device=device)[None]
    if loss_mask is None:
        loss_mask = torch.ones(1, S, dtype=torch.bool, device=device)
    first, H = model.layers[0], model.hidden_size
    head_dim = first.self_attn.head_dim

    # verifier targets over the draft vocabulary, computed once: [1, S, V_draft]
    with torch.no_grad():
        targets = model.verifier_lm_head(model.verifier_norm(verifier_last_hidden_states.float()))
        target_ids = targets.argmax(-1)[0]  # [S]
        embeds = model.embed_tokens(F.pad(input_ids, (0, K - 1)))  # [1, S+K-1, H]
    # first-layer q/k/v of norm(embed(ids)) for S + K - 1 positions, once: q_proj(cat([e, h])) =
    # e @ Wq[:, :H]ᵀ + h @ Wq[:, H:]ᵀ + b; step k takes rows k..k+S. Each [1, S+K-1, out]
    embeds_n, a = first.input_layernorm(embeds), first.self_attn
    embed_proj = [F.linear(embeds_n, p.weight[:, :H], p.bias)
                  for p in (a.q_proj, a.k_proj, a.v_proj)]

    x = hidden_states
    if model.input_norm is not None or model.fc_norm is not None:
        x = x.float()  # speculators' norms see float32 states (the loop upcasts for its forward)
    if model.input_norm is not None:
        x = model.input_norm(x)
    if model.fc_norm is not None:
        chunks = x.chunk(len(model.fc_norm), dim=-1)
        x = torch.cat([norm(c) for norm, c in zip(model.fc_norm, chunks)], dim=-1)
    h = model.fc(x)  # [1, S, H]

    caches = [([], []) for _ in model.layers]
    mask_bool = loss_mask.to(torch.bool)
    valid_base = mask_bool[0]
    first_starts = first_tokens(valid_base, document_ids[0])
    alive = torch.ones(S, dtype=torch.bool, device=device)
    run = torch.zeros(S, dtype=torch.float32, device=device)
    loss = torch.zeros((), dtype=torch.float32, device=device)
    stats = []
    decay = functools.partial(exp_loss_decay, gamma=ttt_step_loss_decay)
    for k in range(K):
        cos, sin = model.rotary_emb(embeds, position_ids + k)
        mask = masks[k] if attention == "flex" else masks
        h = _first_layer(first, h, [p[:, k:k + S] for p in embed_proj], head_dim, cos, sin,
                         caches[0], attention, mask)
        for layer, cache in zip(model.layers[1:], caches[1:]):
            h = _plain_layer(layer, h, head_dim, cos, sin, cache, attention, mask)
        if model.config.norm_output:  # the normed state feeds the next step too
            h = model.norm(h)
        logits = model.lm_head(h if model.config.norm_output else model.norm(h))  # [1, S, V_draft]
        # speculators' align_for_step: logits of starts 0..S-k-1 against targets k..S-1
        pos_idx = torch.full((1, S - k), k, device=device, dtype=torch.long)
        s_loss, _ = compound_loss(logits[:, :S - k], targets[:, k:], mask_bool[:, k:], pos_idx,
                                  loss_config=loss_config, decay_fn=decay)
        loss = loss + s_loss
        with torch.no_grad():
            counts, alive, run = step_stats(logits[0].argmax(-1), target_ids, valid_base,
                                             document_ids[0], k, alive, run, first_starts)
            stats.append(torch.cat([counts[:4], s_loss.detach().float().reshape(1),
                                    counts.new_ones(1), counts[4:]]))
    with torch.no_grad():
        chain = torch.stack([(run + valid_base.float()).sum(), valid_base.float().sum()])
        return loss, torch.cat([*stats, chain])


def step_masks(document_ids: torch.Tensor, ttt_steps: int, attention: str):
    """The masks :func:`ttt_forward` takes for ``attention``."""
    return (flex_block_masks(document_ids, ttt_steps) if attention == "flex"
            else document_mask(document_ids))


def install(model, *, attention: str, compile_mode: str | None = None, backend: str | None = None,
            fullgraph: bool = False) -> None:
    """Bind this forward as ``model.forward``, ``torch.compile``-d (static shapes) in
    ``compile_mode`` unless None; ``backend``/``fullgraph`` for tests. ConfigError
    (:func:`check_supported`, unknown attention or mode)."""
    from eagle3.train.draft_model import compiled

    check_supported(model)
    if attention not in ATTENTIONS:
        raise ConfigError(f"attention: expected one of {list(ATTENTIONS)}, got {attention!r}")
    core = functools.partial(ttt_forward, model, attention=attention)
    if compile_mode is not None:
        core = compiled(core, compile_mode, backend, fullgraph=fullgraph)
    model.forward = core
    model._eagle3_forward = "project"  # noqa: SLF001  (what the loop reads)


def uses_project_forward(model) -> bool:
    """True when :func:`install` bound this forward to ``model``."""
    return getattr(model, "_eagle3_forward", None) == "project"


__all__ = ["ATTENTIONS", "choose", "resolve_attention", "check_supported", "ttt_forward", "install",
           "uses_project_forward", "document_mask", "flex_block_masks", "step_masks"]
