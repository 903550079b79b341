"""An SGLang-format draft that agrees with its target part of the time, built from the target's own
weights.

For tests that need accepted *and* rejected draft tokens from a real (not test-double) draft module,
so that a decoder's accept logic runs over every accept count: ``fc`` passes the aux chunk of HF
index L-1 (the input of the target's last layer) through unchanged, the draft's final norm and LM
head are the target's, and the decoder layer's attention and MLP outputs are random weights scaled
by ``mix``. With ``mix=0`` the draft repeats what the target's second-to-last layer predicted for
the current position ("logit lens"), so it is right whenever the target repeats a token; ``mix`` > 0
perturbs each chain step differently, giving partial accepts. On the tiny-random target with
``mix=0.3``: accept counts 0, 1, 2 and 3 all occur over three prompts; on SmolLM2 mostly 0 with some
1.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from testkit.sglang_drafts import draft_config, random_draft_tensors, write_draft


def make_echo_draft(
    out_dir: Path,
    target_dir: Path,
    target_model,
    *,
    mix: float = 0.3,
    seed: int = 1,
    aux_hf_ids: list[int] | None = None,
    pass_chunk: int = 2,
) -> Path:
    """Write the draft for the HF ``target_model`` (loaded from ``target_dir``) into ``out_dir``;
    returns it.

    Full draft vocabulary (identity d2t); aux ids (HF indices) ``aux_hf_ids``, default
    ``[2, L//2, L-1]``; ``fc`` passes aux chunk ``pass_chunk`` through (the state of
    ``aux_hf_ids[pass_chunk]``).
    """
    tcfg = json.loads((Path(target_dir) / "config.json").read_text())
    n_layers, h = tcfg["num_hidden_layers"], tcfg["hidden_size"]
    ids = aux_hf_ids or [2, n_layers // 2, n_layers - 1]
    cfg = draft_config(tcfg, aux_hf_ids=ids, draft_vocab_size=tcfg["vocab_size"])
    t = random_draft_tensors(cfg, seed=seed, n_aux=len(ids))
    fc = torch.zeros(h, len(ids) * h)
    fc[:, pass_chunk * h : (pass_chunk + 1) * h] = torch.eye(h)
    t["fc.weight"] = fc
    t["layers.0.self_attn.o_proj.weight"] *= mix
    t["layers.0.mlp.down_proj.weight"] *= mix
    t["norm.weight"] = target_model.model.norm.weight.detach().float().clone()
    t["lm_head.weight"] = target_model.lm_head.weight.detach().float().clone()
    return write_draft(out_dir, cfg, t)
