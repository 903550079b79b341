"""Build SGLang 0.5.23-format EAGLE-3 draft folders with random weights, for tests (no converter
needed).

Tensor names are the checkpoint names SGLang's ``LlamaForCausalLMEagle3.load_weights`` accepts:
``fc.weight``, ``layers.0.*`` (or legacy ``midlayer.*``) with separate q/k/v and gate/up
projections, ``norm.weight``, ``lm_head.weight``, ``d2t`` (target_id = i + d2t[i]) and ``t2d``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def draft_config(
    target_cfg: dict,
    *,
    aux_hf_ids: list[int] | None,
    draft_vocab_size: int,
    num_layers: int = 1,
    intermediate_size: int | None = None,
) -> dict:
    """An SGLang draft config.json for a target config dict; aux ids given in HF index
    convention."""
    h = target_cfg["hidden_size"]
    nh = target_cfg["num_attention_heads"]
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": h,
        "intermediate_size": intermediate_size or target_cfg["intermediate_size"],
        "num_attention_heads": nh,
        "num_key_value_heads": target_cfg["num_key_value_heads"],
        "head_dim": target_cfg.get("head_dim") or h // nh,
        "num_hidden_layers": num_layers,
        "vocab_size": target_cfg["vocab_size"],
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": h,
        "rms_norm_eps": target_cfg["rms_norm_eps"],
        "max_position_embeddings": target_cfg["max_position_embeddings"],
        "tie_word_embeddings": False,
        "eagle_config": {"use_aux_hidden_state": True},
    }
    rp = target_cfg.get("rope_parameters")
    cfg["rope_theta"] = (rp or {}).get("rope_theta", target_cfg.get("rope_theta", 10000.0))
    if aux_hf_ids is not None:
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in aux_hf_ids]
    return cfg


def random_draft_tensors(
    cfg: dict,
    *,
    seed: int = 0,
    legacy_midlayer: bool = False,
    with_embed: bool = False,
    n_aux: int = 3,
) -> dict[str, torch.Tensor]:
    """Random float32 tensors under SGLang's checkpoint names for ``cfg`` (see
    :func:`draft_config`)."""
    g = torch.Generator().manual_seed(seed)
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nh, nkv, v, dv = (
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["vocab_size"],
        cfg["draft_vocab_size"],
    )

    def rnd(*shape, std=0.05):
        return torch.randn(*shape, generator=g) * std

    def norm(n):
        return 1.0 + rnd(n, std=0.1)

    t = {
        "fc.weight": rnd(h, n_aux * cfg["target_hidden_size"]),
        "norm.weight": norm(h),
        "lm_head.weight": rnd(dv, h, std=0.2),
    }
    for layer in range(cfg["num_hidden_layers"]):
        p = ("midlayer" if legacy_midlayer and layer == 0 else f"layers.{layer}") + "."
        width = 2 * h if layer == 0 else h
        t.update(
            {
                p + "self_attn.q_proj.weight": rnd(nh * hd, width),
                p + "self_attn.k_proj.weight": rnd(nkv * hd, width),
                p + "self_attn.v_proj.weight": rnd(nkv * hd, width),
                p + "self_attn.o_proj.weight": rnd(h, nh * hd),
                p + "mlp.gate_proj.weight": rnd(inter, h),
                p + "mlp.up_proj.weight": rnd(inter, h),
                p + "mlp.down_proj.weight": rnd(h, inter),
                p + "input_layernorm.weight": norm(h),
                p + "hidden_norm.weight": norm(h),
                p + "post_attention_layernorm.weight": norm(h),
            }
        )
    hot = torch.randperm(v, generator=g)[:dv].sort().values if dv < v else torch.arange(v)
    t["d2t"] = hot - torch.arange(dv)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[hot] = True
    t["t2d"] = t2d
    if with_embed:
        t["embed_tokens.weight"] = rnd(v, h)
    return t


def write_draft(out_dir: Path, cfg: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """Write ``config.json`` + ``model.safetensors``; returns ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"))
    return out_dir


def make_random_draft(
    out_dir: Path,
    target_dir: Path,
    *,
    aux_hf_ids: list[int] | None = None,
    draft_vocab_size: int = 512,
    seed: int = 0,
    **kw,
) -> Path:
    """A random SGLang-format draft for the HF target in ``target_dir`` (aux ids default [2, L//2,
    L-3])."""
    tcfg = json.loads((Path(target_dir) / "config.json").read_text())
    n = tcfg["num_hidden_layers"]
    ids = aux_hf_ids if aux_hf_ids is not None else [2, n // 2, n - 3]
    cfg = draft_config(
        tcfg, aux_hf_ids=ids, draft_vocab_size=min(draft_vocab_size, tcfg["vocab_size"])
    )
    return write_draft(out_dir, cfg, random_draft_tensors(cfg, seed=seed, n_aux=len(ids), **kw))


class OracleDraft(torch.nn.Module):
    """Test double of a draft that always agrees with the target: it proposes the target's own
    next-token logits (plus optional Gaussian noise of scale ``noise``, which makes it disagree
    sometimes).

    It wraps a real :class:`SGLangEagle3Draft` (identity vocabulary:
    ``draft_vocab_size == vocab_size``) so the KV cache and hidden-state plumbing run for real; only
    the logits are replaced. Call :meth:`reset` with the prompt before each generation: draft inputs
    start at token 1, so the oracle needs token 0 from the caller.
    """

    def __init__(self, inner, target, noise: float = 0.0, seed: int = 0):
        super().__init__()
        self.inner, self.target_ref, self.noise = inner, [target], noise
        self.gen = torch.Generator().manual_seed(seed)
        self.hot_token_id = None
        self.aux_layer_ids, self.use_aux_hidden_state = (
            inner.aux_layer_ids,
            inner.use_aux_hidden_state,
        )
        self.model = inner.model
        self.first_token: int | None = None
        self.history: dict[int, int] = {}
        self.calls = 0

    def reset(self, prompt: list[int]) -> None:
        self.first_token, self.history = int(prompt[0]), {}

    def new_cache(self):
        return self.inner.new_cache()

    def to_target_ids(self, ids):
        return ids

    @torch.no_grad()
    def forward(self, input_ids, positions, hidden_states, cache=None):
        self.calls += 1
        _, hidden = self.inner(input_ids, positions, hidden_states, cache)
        for p, t in zip(positions.tolist(), input_ids.tolist()):
            self.history[p] = t
        top = max(positions.tolist())
        seq = [self.first_token] + [self.history[q] for q in range(top + 1)]
        logits = self.target_ref[0](input_ids=torch.tensor([seq])).logits[0].float()
        out = logits[positions + 1]
        if self.noise:
            out = out + self.noise * torch.randn(out.shape, generator=self.gen)
        return out, hidden
