"""Random-weight targets of published shapes and random SGLang-format drafts for them, built on the
device.

Shapes (from the published ``config.json`` files): SmolLM2-135M-Instruct — 30 layers, hidden 576,
FFN 1536, 9 heads / 3 KV heads (head dim 64), vocab 49152, RoPE θ 1e5, tied embeddings, RMSNorm eps
1e-5; Llama-3.1-8B — 32 layers, hidden 4096, FFN 14336, 32 heads / 8 KV heads, vocab 128256, RoPE θ
500000 with the ``llama3`` scaling (factor 8, low/high frequency factors 1/4, original context
8192), untied, eps 1e-5. Their EAGLE-3 drafts: one layer, draft vocabulary 8192 and 32000. ``tiny``:
a CPU smoke shape with SmolLM2's vocabulary (so its tokenizer's ids are valid). Weights follow
transformers' init (normal, std 0.02; norms 1).
"""

from __future__ import annotations

import torch

SHAPES: dict[str, dict] = {
    "smollm2": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    ),
    "llama8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "tiny": dict(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
}
DRAFT_VOCAB = {"smollm2": 8192, "llama8b": 32000, "tiny": 512}


def random_target(
    shape: str, device: str | torch.device, dtype: torch.dtype = torch.float32, seed: int = 0
):
    """A random ``LlamaForCausalLM`` of ``shape`` (SHAPES), built directly on ``device`` in
    ``dtype``, eval, sdpa attention; eos id 2 (SmolLM2's ``<|im_end|>``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    conf = LlamaConfig(
        **SHAPES[shape], bos_token_id=1, eos_token_id=2, pad_token_id=2, hidden_act="silu"
    )
    conf._attn_implementation = "sdpa"  # noqa: SLF001
    torch.manual_seed(seed)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(conf)
    finally:
        torch.set_default_dtype(before)
    return model.eval()


def random_draft(
    target,
    draft_vocab: int,
    device: str | torch.device,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
):
    """A random one-layer :class:`SGLangEagle3Draft` for ``target`` (aux HF ids ``[2, L//2, L-3]``,
    a random sorted hot-token set of ``draft_vocab`` target ids, the target's embedding), on
    ``device`` in ``dtype``."""
    import json

    from eagle3.engines.sglang.draft import SGLangEagle3Draft
    from testkit.sglang_drafts import draft_config

    tcfg = json.loads(target.config.to_json_string())
    tcfg.setdefault("rope_theta", (tcfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    n = tcfg["num_hidden_layers"]
    cfg = draft_config(tcfg, aux_hf_ids=[2, n // 2, n - 3], draft_vocab_size=draft_vocab)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.device(device):
        draft = SGLangEagle3Draft(cfg)
    draft = draft.to(device=device, dtype=dtype).eval()
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight") or ".fc_norm." in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g, device=device).mul_(0.02))
        draft.model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
    v = tcfg["vocab_size"]
    draft.hot_token_id = torch.randperm(v, generator=g, device=device)[:draft_vocab].sort().values
    return draft
