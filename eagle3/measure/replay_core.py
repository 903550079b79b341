"""Replay acceptance (core): the exact greedy chain acceptance of EAGLE-3 drafts, from a few batched forwards.

The entry points (``evaluate_drafts``, the CLI) are in :mod:`eagle3.measure.replay`.

Why it is exact. Under greedy decoding (temperature 0) speculative decoding emits exactly the target's own greedy
continuation ``s_n, s_{n+1}, ...`` of the prompt ``s_0..s_{n-1}`` (every emitted token is the target's argmax
after a committed prefix that is itself greedy). The chain's proposals at a verify point depend only on the
committed prefix: the draft cache holds the extend rows of the committed positions (token ``s_{p+1}`` with the
target's draft input state of ``s_p``), and the chain continues from the last one. So, given the continuation,
the proposals at every possible verify point can be computed at once (:mod:`eagle3.measure.replay_draft`), and
the decoder's bookkeeping replayed on them (:func:`walk`). In four steps:

1. :func:`generate_requests`: the target's greedy continuation of every prompt, batched (HF ``generate``, left
   padding, ``do_sample=False``, the target's generation config replaced by a plain one so no logits processor
   applies), turn by turn for multi-turn sets (turn 2 is asked after the target's own turn-1 answer);
2. :func:`replay_requests`: the target once over prompt + continuation (right padding), capturing the draft
   input states at the capture indices the engine profile gives (:func:`capture_indices`) -- the same states
   ``SpeculativeDecoder`` pairs with the next token in its prefill and extend;
3. the draft in TTT style over all positions (:func:`eagle3.measure.replay_draft.chain_proposals`);
4. :func:`walk`: from base ``t = n-1`` (the last prompt position, after the prefill token) accept the longest
   prefix ``j = 1..k`` with ``proposal_j(t) == s_{t+1+j}``, emit ``a + 1`` tokens, continue at ``t + a + 1``;
   stop at the budget or a stop token exactly as ``SpeculativeDecoder._emit`` counts (drafts accepted beyond
   the budget are not counted).

Limits: greedy only (sampling draws depend on the random stream), chain drafting with topk 1 (no trees), and
equal numerics: batched and batch-1 forwards agree to rounding, so in float32 the argmaxes match (checked in
``tests/unit/test_replay.py`` against ``SpeculativeDecoder``); in bfloat16 a batched (padded) forward can flip a
rare near-tie in the continuation or in a draft proposal, so bf16 figures match batch-1 decoding statistically,
not token for token (``evaluate_drafts(check_against_decoder=N)`` reports how often). A request whose prefill
token already ends it (stop token, or a budget of 1) has no verify pass; it is listed, not counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

import torch

from eagle3.engines.registry import get_profile
from eagle3.engines.sglang.draft import SGLangEagle3Draft
from eagle3.errors import CheckpointInvalid, DataError, EngineUnsupported
from eagle3.measure.prompts import encode_conversation
from eagle3.measure.replay_draft import chain_proposals
from refengine.specdec import GenerationResult
from eagle3.target_model import capture_hidden_states, default_aux_layer_ids, num_layers


@dataclass
class Request:
    """One generated turn: ``prompt_ids`` (templated), ``output_ids`` (the target's greedy continuation, stop
    token kept), ``finish_reason`` as SGLang's. ``conversation``: the id shared by a conversation's turns."""

    id: str
    category: str
    set: str
    turn: int
    conversation: str
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: dict = field(default_factory=dict)


def stop_ids(target) -> set[int]:
    """The target's EOS ids: ``generation_config.eos_token_id``, else ``config.eos_token_id`` (int or list) --
    the rule ``SpeculativeDecoder`` stops on."""
    gen_cfg = getattr(target, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None) or target.config.eos_token_id
    return set(eos if isinstance(eos, list) else ([] if eos is None else [eos]))


def capture_indices(draft: SGLangEagle3Draft, target, engine: str = "sglang") -> list[int]:
    """HF ``hidden_states`` indices the engine captures for ``draft``: its aux ids through the engine profile
    (``EngineProfile.engine_to_hf_ids``), in layer order; without ids the EAGLE-3 default ``[2, L//2, L-3]``.

    Raises EngineUnsupported for an index the engine never captures (outside ``0..L-1``), CheckpointInvalid
    when ``fc`` does not take ``len(indices) × hidden_size`` inputs.
    """
    n = num_layers(target)
    ids = draft.aux_layer_ids
    indices = sorted(get_profile(engine).engine_to_hf_ids(ids)) if ids else default_aux_layer_ids(n)
    bad = [i for i in indices if not 0 <= i < n]
    if bad:
        raise EngineUnsupported(f"draft eagle_config.eagle_aux_hidden_state_layer_ids {ids}: {engine} captures "
                                f"inputs of layers 0..{n - 1}; HF indices {bad} are never captured for a "
                                f"{n}-layer target")
    width, fc_in = int(target.config.hidden_size) * len(indices), draft.model.fc.in_features
    if width != fc_in:
        raise CheckpointInvalid(f"draft fc.weight expects {fc_in} input features, but the target feeds "
                                f"{len(indices)} aux states x hidden {target.config.hidden_size} = {width}")
    return indices


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _check_lengths(target, prompts: list[list[int]], max_new_tokens: int, num_steps: int) -> None:
    limit = int(getattr(target.config, "max_position_embeddings", 1 << 30))
    vocab = int(target.get_output_embeddings().weight.shape[0])
    if max_new_tokens < 1:
        raise DataError(f"replay: max_new_tokens must be >= 1, got {max_new_tokens}")
    for i, p in enumerate(prompts):
        if not p or not all(0 <= t < vocab for t in p):
            raise DataError(f"replay: prompt {i}: expected a non-empty list of ids in [0, {vocab}), got "
                            f"{len(p)} ids, first out of range {next((t for t in p if not 0 <= t < vocab), None)}")
        if len(p) + max_new_tokens + num_steps > limit:
            raise DataError(f"replay: prompt {i}: {len(p)} tokens + max_new_tokens {max_new_tokens} + num_steps "
                            f"{num_steps} exceeds the context length {limit}")


def _finish(output: list[int], stops: set[int], max_new_tokens: int) -> dict:
    if output and output[-1] in stops:
        return {"type": "stop", "matched": output[-1]}
    return {"type": "length", "length": max_new_tokens}


@torch.no_grad()
def greedy_continuations(target, prompts: list[list[int]], max_new_tokens: int, *, batch_size: int = 16,
                         pad_id: int | None = None, progress=None) -> list[list[int]]:
    """The target's greedy continuation of each prompt (stop token kept, at most ``max_new_tokens``), batched.

    HF ``generate`` with left padding and ``do_sample=False``; prompts are sorted by length so a batch pads
    little. The target's ``generation_config`` is swapped for a plain one during the call (restored after), so
    no repetition penalty or other processor from the model's files applies: the continuation is plain argmax,
    as ``SpeculativeDecoder`` decodes. ``progress``: a tqdm bar to advance by prompts. Returns one list per prompt,
    in input order.
    """
    from transformers import GenerationConfig

    stops = sorted(stop_ids(target))
    pad = int(pad_id if pad_id is not None else (stops[0] if stops else 0))
    plain = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                             eos_token_id=stops or None, pad_token_id=pad)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    out: list[list[int] | None] = [None] * len(prompts)
    saved, dev = target.generation_config, _device(target)
    target.generation_config = plain
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            width = max(len(prompts[i]) for i in idx)
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, i in enumerate(idx):
                ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
                mask[row, width - len(prompts[i]):] = 1
            gen = target.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), generation_config=plain)
            for row, i in enumerate(idx):
                cont = gen[row, width:].tolist()[:max_new_tokens]
                cut = next((p for p, t in enumerate(cont) if t in stops), None)
                out[i] = cont if cut is None else cont[:cut + 1]
            if progress is not None:
                progress.update(len(idx))
    finally:
        target.generation_config = saved
    return out  # type: ignore[return-value]


def generate_requests(target, tokenizer, conversations: list[dict], max_new_tokens: int, *, batch_size: int = 16,
                      num_steps: int = 0, progress=None) -> list[Request]:
    """Greedy answers to every turn of every conversation (:func:`eagle3.measure.prompts.load_conversations`).

    Turn r of a conversation is templated after its questions and the target's own answers 1..r-1 (decoded
    text, special tokens skipped: what a chat client sends back), and all turns r are generated in one batched
    pass. ``num_steps``: the draft tokens the replay will add, for the context-length check. Request ids are the
    conversation id, with ``/turn<r>`` appended for conversations of more than one turn. Raises DataError for an
    empty or over-long prompt.
    """
    stops = stop_ids(target)
    answers: dict[str, list[str]] = {c["id"]: [] for c in conversations}
    requests: list[Request] = []
    for turn in range(max((len(c["turns"]) for c in conversations), default=0)):
        todo = [c for c in conversations if len(c["turns"]) > turn]
        prompts = [encode_conversation(tokenizer, c["turns"][:turn + 1], answers[c["id"]]) for c in todo]
        _check_lengths(target, prompts, max_new_tokens, num_steps)
        outs = greedy_continuations(target, prompts, max_new_tokens, batch_size=batch_size,
                                    pad_id=tokenizer.pad_token_id, progress=progress)
        for c, p, o in zip(todo, prompts, outs):
            rid = c["id"] if len(c["turns"]) == 1 else f"{c['id']}/turn{turn + 1}"
            requests.append(Request(rid, c["category"], c.get("set", ""), turn + 1, c["id"], p, o,
                                    _finish(o, stops, max_new_tokens)))
            answers[c["id"]].append(tokenizer.decode(o, skip_special_tokens=True))
    return requests


def walk(prompt_len: int, seq: list[int], proposals: list[list[int]], num_steps: int, stops: set[int],
         max_new_tokens: int) -> GenerationResult:
    """Replay the decoder's verify passes over a known greedy sequence ``seq = prompt + continuation``.

    ``proposals[t][j-1]``: the draft's token for ``seq[t+1+j]`` at base ``t`` (rows ``0..len(seq)-2``). The
    continuation ends with a stop token or at the budget; a pass may only match tokens inside it, since the
    decoder counts ``min(accepted, emitted)`` and emission ends there. Returns the counts ``SpeculativeDecoder``
    would report (``GenerationResult``: output ids, verify_ct, accepted_per_position, num_draft_tokens,
    histogram, finish_reason).
    """
    k, last = num_steps, len(seq) - 1
    out = list(seq[prompt_len:])
    res = GenerationResult(out, 0, [0] * k, 0, [0] * (k + 1), finish_reason=_finish(out, stops, max_new_tokens),
                           prompt_tokens=prompt_len)
    t = prompt_len - 1
    while last - t - 1 >= 1:
        limit = min(k, last - t - 1)
        row, a = proposals[t], 0
        while a < limit and row[a] == seq[t + 2 + a]:
            a += 1
        res.verify_ct += 1
        res.num_draft_tokens += k
        for j in range(a):
            res.accepted_per_position[j] += 1
        res.histogram[a] += 1
        t += a + 1
    return res


def draft_inputs(captured: dict, indices: list[int] | None, final: torch.Tensor | None) -> torch.Tensor:
    """The draft's input states ``[B, L, W]``: the captured aux states at ``indices`` side by side, or (indices
    None) the target's final normed state -- what an engine that captures no aux states feeds."""
    return final if indices is None else torch.cat([captured[i] for i in indices], -1)


@torch.no_grad()
def target_states(target, seqs: list[list[int]], union: list[int], pad: int):
    """Target over right-padded ``seqs``: ``(tokens [B, L] on the device, captured {index: [B, L, H]}, final)``."""
    dev = _device(target)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(seqs):
        ids[row, :len(s)] = torch.tensor(s)
        mask[row, :len(s)] = 1
    ids, store = ids.to(dev), {}
    handle = target.get_decoder().norm.register_forward_hook(lambda _m, _a, o: store.__setitem__("h", o))
    try:
        with capture_hidden_states(target, union) as cap:
            target(input_ids=ids, attention_mask=mask.to(dev), use_cache=False, logits_to_keep=1)
            captured = dict(cap)
    finally:
        handle.remove()
    return ids, captured, store["h"]


def replay_requests(target, drafts: Mapping[str, SGLangEagle3Draft], requests: list[Request], num_steps: int, *,
                    max_new_tokens: int, batch_size: int = 16, capture_aux: bool = True,
                    progress=None) -> tuple[dict[str, list[GenerationResult]], dict[str, float], float]:
    """Replay every draft on every request; the target runs once per batch for all drafts.

    ``max_new_tokens``: the budget (continuations longer than it are cut to it: a prefix of a greedy
    continuation is the greedy continuation with the smaller budget). ``capture_aux=False`` feeds each draft
    the target's final normed state (fc bypassed: the broken-integration reference). Returns ``(results per
    draft in request order, seconds spent in each draft's forwards and walk, seconds in target forwards)``.
    """
    if num_steps < 1:
        raise EngineUnsupported(f"speculative num_steps: expected >= 1, got {num_steps}")
    stops = stop_ids(target)
    idx = {n: capture_indices(d, target) if capture_aux and d.use_aux_hidden_state else None
           for n, d in drafts.items()}
    union = sorted({i for v in idx.values() if v for i in v})
    seqs = [r.prompt_ids + r.output_ids[:max_new_tokens] for r in requests]
    order = sorted(range(len(requests)), key=lambda i: -len(seqs[i]))
    results: dict[str, list] = {n: [None] * len(requests) for n in drafts}
    draft_s, target_s = {n: 0.0 for n in drafts}, 0.0
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        t0 = time.perf_counter()
        tokens, captured, final = target_states(target, [seqs[i] for i in batch], union, next(iter(stops), 0))
        target_s += time.perf_counter() - t0
        for name, draft in drafts.items():
            t0 = time.perf_counter()
            props = chain_proposals(draft, tokens, draft_inputs(captured, idx[name], final), num_steps).cpu()
            for row, i in enumerate(batch):
                results[name][i] = walk(len(requests[i].prompt_ids), seqs[i], props[row].tolist(), num_steps,
                                        stops, max_new_tokens)
            draft_s[name] += time.perf_counter() - t0
        if progress is not None:
            progress.update(len(batch))
    return results, draft_s, target_s
