"""A briefly trained SGLang-format draft for replay-acceptance tests and benchmarks (no extraction,
no trainer).

:func:`distilled_draft` fits a 1-layer draft to the target's own greedy continuations of a few
prompts: the target's aux states are captured once, then the draft's trainable parameters (``fc``,
the layer, the final norm, ``lm_head``; the embedding is the target's when the widths match) take
``steps`` Adam steps on the TTT-style loss of :func:`eagle3.measure.replay.chain_states` (step j
predicts ``s_{t+1+j}``). The result is written under SGLang's checkpoint names and loads with
``SGLangEagle3Draft.from_dir`` like any served draft. Trained briefly it accepts a realistic mix
(some passes nothing, some part of the chain, some all of it).
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle3.engines.sglang.draft import SGLangEagle3Draft
from eagle3.measure.replay import capture_indices, chain_states, greedy_continuations, target_states
from eagle3.target_model import default_aux_layer_ids, num_layers
from testkit.sglang_drafts import draft_config, random_draft_tensors, write_draft


def _config(target, hidden_size: int | None, draft_vocab_size: int) -> dict:
    tcfg = json.loads(target.config.to_json_string())
    cfg = draft_config(
        tcfg,
        aux_hf_ids=default_aux_layer_ids(num_layers(target)),
        draft_vocab_size=draft_vocab_size,
    )
    if hidden_size is not None and hidden_size != cfg["hidden_size"]:
        heads = max(1, hidden_size // 16)
        cfg.update(
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            head_dim=16,
        )
    return cfg


def _hot_tokens(seqs: list[list[int]], n: int, vocab: int) -> torch.Tensor:
    """The ``n`` most frequent ids of ``seqs`` (ties by id), topped up with the smallest unused ids;
    sorted."""
    ranked = [
        t
        for t, _ in sorted(
            Counter(t for s in seqs for t in s).items(), key=lambda kv: (-kv[1], kv[0])
        )
    ]
    chosen = set(ranked[:n])
    filler = (t for t in range(vocab) if t not in chosen)
    while len(chosen) < n:
        chosen.add(next(filler))
    return torch.tensor(sorted(chosen))


def _export(
    draft: SGLangEagle3Draft, hot: torch.Tensor, vocab: int, own_embed: bool
) -> dict[str, torch.Tensor]:
    """The draft's parameters under SGLang's checkpoint names (q/k/v and gate/up unstacked)."""
    c = draft.config
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = {}
    for name, p in draft.named_parameters():
        w = p.detach().float().contiguous()
        key = name.removeprefix("model.")
        if key.endswith("qkv_proj.weight"):
            for part, rows in zip("qkv", w.split([q, kv, kv])):
                out[key.replace("qkv_proj", f"{part}_proj")] = rows.clone()
        elif key.endswith("gate_up_proj.weight"):
            gate, up = w.chunk(2)
            (
                out[key.replace("gate_up_proj", "gate_proj")],
                out[key.replace("gate_up_proj", "up_proj")],
            ) = gate, up
        elif key != "embed_tokens.weight" or own_embed:
            out[key] = w
    out["d2t"] = hot - torch.arange(hot.numel())
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[hot] = True
    out["t2d"] = t2d
    return out


def _loss(draft, tokens, hidden, lengths, to_draft, num_steps):
    total = 0.0
    for j, normed in enumerate(chain_states(draft, tokens, hidden, num_steps), start=1):
        t = tokens.shape[1] - 1
        want = torch.cat([tokens, tokens.new_zeros(tokens.shape[0], num_steps + 1)], 1)[
            :, 1 + j : 1 + j + t
        ]
        rows = torch.arange(t)[None] + 1 + j < lengths[:, None]
        labels = torch.where(rows, to_draft[want], torch.full_like(want, -100))
        total = total + F.cross_entropy(
            draft.lm_head(normed).flatten(0, 1), labels.flatten(), ignore_index=-100
        )
    return total


def distilled_draft(
    out_dir: Path,
    target,
    prompts: list[list[int]],
    *,
    max_new_tokens: int = 48,
    hidden_size: int | None = None,
    draft_vocab_size: int = 512,
    num_steps: int = 3,
    steps: int = 150,
    lr: float = 3e-3,
    seed: int = 0,
    on_step=None,
) -> Path:
    """Train and write a draft for ``target`` on its greedy continuations of ``prompts``; returns
    ``out_dir``.

    ``hidden_size`` None: the target's width (embedding and tied head shared with the target); a
    smaller value makes a narrow draft with its own embedding (SGLang keeps it when
    ``target_hidden_size != hidden_size``). ``on_step(step, loss)`` is called after every optimizer
    step (progress for long fits).
    """
    torch.manual_seed(seed)
    conts = greedy_continuations(target, prompts, max_new_tokens)
    seqs = [p + c for p, c in zip(prompts, conts)]
    vocab = int(target.config.vocab_size)
    hot = _hot_tokens(seqs, draft_vocab_size, vocab)
    cfg = _config(target, hidden_size, draft_vocab_size)
    own_embed = cfg["hidden_size"] != cfg["target_hidden_size"]
    tensors = random_draft_tensors(cfg, seed=seed, with_embed=own_embed)
    embed = target.get_input_embeddings().weight.detach().float()
    if not own_embed:
        tensors["lm_head.weight"] = embed[hot].clone()
    with tempfile.TemporaryDirectory() as tmp:  # the final folder only holds the trained draft
        draft = SGLangEagle3Draft.from_dir(
            write_draft(Path(tmp), cfg, tensors), target_embed=embed
        ).train()
    draft.model.embed_tokens.weight.requires_grad_(own_embed)
    tokens, captured, _ = target_states(target, seqs, capture_indices(draft, target), 0)
    hidden = torch.cat([captured[i] for i in capture_indices(draft, target)], -1).float()
    lengths = torch.tensor([len(s) for s in seqs])
    to_draft = torch.full((vocab,), -100, dtype=torch.long)
    to_draft[hot] = torch.arange(hot.numel())
    opt = torch.optim.Adam([p for p in draft.parameters() if p.requires_grad], lr=lr)
    for step in range(1, steps + 1):
        opt.zero_grad()
        loss = _loss(draft, tokens, hidden, lengths, to_draft, num_steps)
        loss.backward()
        opt.step()
        if on_step is not None:
            on_step(step, float(loss.detach()))
    write_draft(Path(out_dir), cfg, _export(draft.eval(), hot, vocab, own_embed))
    return Path(out_dir)
