"""Exact greedy replay: EAGLE-3 draft acceptance under greedy chain decoding (topk 1) from a few
batched forwards instead of decoding request by request.

At temperature 0 the output is the target's greedy continuation, and the chain's proposals at a
verify point depend only on the committed prefix. So: (1) batched continuations
(:func:`generate_requests`); (2) one target pass over prompt + continuation capturing draft inputs
(:func:`target_states`); (3) proposals at every verify point at once (:func:`chain_states`); (4)
:func:`walk`: from ``t = n-1`` accept the longest prefix with ``proposal_j(t) == s_{t+1+j}``, emit
``a + 1`` tokens, continue at ``t + a + 1``, stop at the budget or a stop token.

Chain: step 1 is the draft extend (row ``t``: token ``s_{t+1}``, state of ``s_t``, position ``t``,
causal); step ``j > 1`` at row ``t`` is token ``s_{t+j}`` (the draft's own proposal whenever steps
``1..j-1`` were accepted, the only case that counts) with step ``j-1``'s output (width H, ``fc``
skipped) at position ``t+j-1``, seeing extend keys of rows ``<= t`` and its own chain's keys.

Limits: greedy chain only; float32 batched argmaxes equal batch-1 decoding
(``tests/unit/test_replay.py``); bf16 padding can flip a rare near-tie. A request whose prefill
token ends it has no verify pass: listed, not counted."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

import torch

from eagle3.engines.registry import get_profile
from eagle3.engines.sglang.draft import CachedAttention, SGLangEagle3Draft
from eagle3.errors import CheckpointInvalid, DataError, EngineUnsupported
from eagle3.measure.prompts import encode_conversation
from eagle3.target_config import text_config
from eagle3.target_model import capture_hidden_states, num_layers

LOGIT_ROWS = 8192  # rows per lm_head chunk when taking proposals (bounds the [rows, vocab] logits)


@dataclass
class GenerationResult:
    """One generation: ``output_ids`` (prompt excluded), ``accepted_per_position[j]`` (0-based),
    ``histogram[j]`` (passes accepting exactly j), ``finish_reason`` (SGLang's),
    ``accept_counts[i]`` (pass i's drafts before a stop cut); from replay also
    ``position_histogram[j]`` (positions of the continuation where a pass *could* start whose
    chain would accept exactly j, whether or not decoding visits them: see
    :func:`eagle3.measure.acceptance.all_positions_acceptance_length`) and
    ``out_of_draft_vocab`` (continuation tokens no draft token maps to)."""

    output_ids: list[int]
    verify_ct: int
    accepted_per_position: list[int]
    num_draft_tokens: int
    histogram: list[int]
    finish_reason: dict = field(default_factory=dict)
    prompt_tokens: int = 0
    accept_counts: list[int] = field(default_factory=list)
    position_histogram: list[int] = field(default_factory=list)
    out_of_draft_vocab: int | None = None

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def num_correct_drafts(self) -> int:
        """Draft tokens accepted (bonus excluded)."""
        return sum(self.accepted_per_position)


@dataclass
class Request:
    """One turn: templated ``prompt_ids``, greedy ``output_ids`` (stop kept), ``conversation``."""

    id: str
    category: str
    set: str
    turn: int
    conversation: str
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: dict = field(default_factory=dict)


def stop_ids(target) -> set[int]:
    """The target's EOS ids: ``generation_config.eos_token_id``, else ``config.eos_token_id``."""
    gen_cfg = getattr(target, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None) or target.config.eos_token_id
    return set(eos if isinstance(eos, list) else ([] if eos is None else [eos]))


def capture_indices(draft: SGLangEagle3Draft, target, engine: str = "sglang",
                    check_fc: bool = True) -> list[int]:
    """HF ``hidden_states`` indices captured for ``draft``: its aux ids via ``engine_to_hf_ids``,
    else SGLang's default ``[2, L//2, L-3]``. Raises EngineUnsupported for an index never captured,
    CheckpointInvalid (``check_fc``) when ``fc`` does not take ``len(indices) × hidden_size``."""
    n = num_layers(target)
    ids = draft.aux_layer_ids
    indices = sorted(get_profile(engine).engine_to_hf_ids(ids)) if ids else [2, n // 2, n - 3]
    bad = [i for i in indices if not 0 <= i < n]
    if bad:
        raise EngineUnsupported(f"draft eagle_config.eagle_aux_hidden_state_layer_ids {ids}: "
                                f"{engine} captures inputs of layers 0..{n - 1}; HF indices {bad} "
                                f"are never captured for a {n}-layer target")
    hidden = int(text_config(target.config).hidden_size)
    width, fc_in = hidden * len(indices), draft.model.fc.in_features
    if check_fc and width != fc_in:
        raise CheckpointInvalid(f"draft fc.weight expects {fc_in} input features, but the target "
                                f"feeds {len(indices)} aux states x hidden {hidden} = {width}")
    return indices


def context_limit(target) -> int:
    """The target's context length in tokens: ``max_position_embeddings`` of its text config
    (2**30 when the config has none)."""
    return int(getattr(text_config(target.config), "max_position_embeddings", 1 << 30))


def check_lengths(target, prompts: list[list[int]], max_new_tokens: int, num_steps: int) -> None:
    """DataError: empty/out-of-vocab prompt, budget < 1, prompt + budget + num_steps > context."""
    limit = context_limit(target)
    vocab = int(target.get_output_embeddings().weight.shape[0])
    if max_new_tokens < 1:
        raise DataError(f"replay: max_new_tokens must be >= 1, got {max_new_tokens}")
    for i, p in enumerate(prompts):
        bad = next((t for t in p if not 0 <= t < vocab), None)
        if not p or bad is not None:
            raise DataError(f"replay: prompt {i}: expected a non-empty list of ids in "
                            f"[0, {vocab}), got {len(p)} ids, first out of range {bad}")
        if len(p) + max_new_tokens + num_steps > limit:
            raise DataError(f"replay: prompt {i}: {len(p)} tokens + max_new_tokens "
                            f"{max_new_tokens} + num_steps {num_steps} exceeds the context "
                            f"length {limit}")


def _finish(output: list[int], stops: set[int], max_new_tokens: int) -> dict:
    return ({"type": "stop", "matched": output[-1]} if output and output[-1] in stops
            else {"type": "length", "length": max_new_tokens})


def _padded(seqs: list[list[int]], pad: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention mask)``, int64 ``[B, max len]``, padded with ``pad`` on the left or
    right (HF's ``padding_side``)."""
    width = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, x in enumerate(seqs):
        cols = slice(width - len(x), width) if left else slice(0, len(x))
        ids[row, cols], mask[row, cols] = torch.tensor(x), 1
    return ids, mask


@torch.no_grad()
def greedy_continuations(target, prompts: list[list[int]], max_new_tokens: int, *,
                         batch_size: int = 16, pad_id: int | None = None,
                         progress=None) -> list[list[int]]:
    """Each prompt's greedy continuation (stop token kept, ≤ ``max_new_tokens``), input order: HF
    ``generate``, left padding, sorted by length, plain ``generation_config`` (plain argmax).
    ``progress``: a tqdm bar advanced by prompts."""
    from transformers import GenerationConfig

    stops = sorted(stop_ids(target))
    pad = int(pad_id if pad_id is not None else (stops[0] if stops else 0))
    plain = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                             eos_token_id=stops or None, pad_token_id=pad)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    out: list[list[int] | None] = [None] * len(prompts)
    saved, dev = target.generation_config, next(target.parameters()).device
    target.generation_config = plain
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            ids, mask = _padded([prompts[i] for i in idx], pad, left=True)
            gen = target.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                                  generation_config=plain)
            for row, i in enumerate(idx):
                cont = gen[row, ids.shape[1]:].tolist()[:max_new_tokens]
                cut = next((p for p, t in enumerate(cont) if t in stops), None)
                out[i] = cont if cut is None else cont[:cut + 1]
            if progress is not None:
                progress.update(len(idx))
    finally:
        target.generation_config = saved
    return out  # type: ignore[return-value]


def prompt_requests(target, prompts: list[list[int]], names: list[tuple[str, str, str]],
                    max_new_tokens: int, num_steps: int, *, batch_size: int = 16,
                    pad_id: int | None = None) -> list[Request]:
    """One single-turn :class:`Request` per templated prompt (token ids) with the target's greedy
    continuation (:func:`greedy_continuations`); ``names[i]``: prompt i's ``(id, category, set)``.
    DataError (:func:`check_lengths`) for an empty, out-of-vocabulary or over-long prompt."""
    check_lengths(target, prompts, max_new_tokens, num_steps)
    conts = greedy_continuations(target, prompts, max_new_tokens, batch_size=batch_size,
                                 pad_id=pad_id)
    return [Request(rid, category, set_, 1, rid, p, c)
            for (rid, category, set_), p, c in zip(names, prompts, conts)]


def generate_requests(target, tokenizer, conversations: list[dict], max_new_tokens: int, *,
                      batch_size: int = 16, num_steps: int = 0, progress=None) -> list[Request]:
    """Greedy answers to every turn (``prompts.load_conversations``): turn r after the target's own
    answers 1..r-1, all turns r in one batched pass; ids get ``/turn<r>`` when multi-turn.
    Raises DataError for an empty or over-long prompt."""
    stops = stop_ids(target)
    answers: dict[str, list[str]] = {c["id"]: [] for c in conversations}
    requests: list[Request] = []
    for turn in range(max((len(c["turns"]) for c in conversations), default=0)):
        todo = [c for c in conversations if len(c["turns"]) > turn]
        prompts = [encode_conversation(tokenizer, c["turns"][:turn + 1], answers[c["id"]])
                   for c in todo]
        check_lengths(target, prompts, max_new_tokens, num_steps)
        outs = greedy_continuations(target, prompts, max_new_tokens, batch_size=batch_size,
                                    pad_id=tokenizer.pad_token_id, progress=progress)
        for c, p, o in zip(todo, prompts, outs):
            rid = c["id"] if len(c["turns"]) == 1 else f"{c['id']}/turn{turn + 1}"
            requests.append(Request(rid, c["category"], c.get("set", ""), turn + 1, c["id"], p, o,
                                    _finish(o, stops, max_new_tokens)))
            answers[c["id"]].append(tokenizer.decode(o, skip_special_tokens=True))
    return requests


def chain_states(draft: SGLangEagle3Draft, tokens: torch.Tensor, hidden: torch.Tensor,
                 num_steps: int) -> list[torch.Tensor]:
    """Normed draft outputs of every chain step at every base row: ``tokens`` int64 ``[B, L]``
    (right padded), ``hidden`` ``[B, L, W]``. Returns ``num_steps`` tensors ``[B, L-1, H]`` (``j-1``
    at row ``t`` proposes ``s_{t+1+j}``). Differentiable. DataError for bad shapes or ``num_steps <
    1``."""
    if tokens.dim() != 2 or hidden.dim() != 3 or tuple(hidden.shape[:2]) != tuple(tokens.shape) \
            or tokens.shape[1] < 2 or num_steps < 1:
        raise DataError("chain_states: expected tokens [B, L >= 2], hidden [B, L, W], num_steps >= "
                        f"1; got {tuple(tokens.shape)}, {tuple(hidden.shape)}, {num_steps}")
    b, length = tokens.shape
    t = length - 1
    base = torch.arange(t, device=tokens.device)
    padded = torch.cat([tokens, tokens.new_zeros(b, num_steps)], 1)   # s_{t+j} past the end: pad
    cache, h, out = draft.new_cache(), hidden[:, :t], []
    causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=tokens.device)
    for j in range(1, num_steps + 1):
        # [T, j*T]: causal over the extend block, the identity over each chain block
        attend = CachedAttention(cache, torch.cat([causal] + [eye] * (j - 1), dim=1))
        normed, h = draft.states(padded[:, j:j + t], base + (j - 1), h, attend)
        out.append(normed)
    return out


@torch.no_grad()
def chain_proposals(draft: SGLangEagle3Draft, tokens: torch.Tensor, hidden: torch.Tensor,
                    num_steps: int, rows: int = LOGIT_ROWS) -> torch.Tensor:
    """Proposals int64 ``[B, L-1, num_steps]`` (``[b, t, j-1]`` → ``s_{t+1+j}``); float32 logits."""
    out = []
    for normed in chain_states(draft, tokens, hidden, num_steps):
        flat = normed.reshape(-1, normed.shape[-1])
        ids = torch.cat([draft.lm_head(flat[i:i + rows]).float().argmax(-1)
                         for i in range(0, flat.shape[0], rows)])
        out.append(draft.to_target_ids(ids).reshape(normed.shape[:-1]))
    return torch.stack(out, -1)


def _accepted(seq: list[int], proposals: list[list[int]], t: int, num_steps: int) -> int:
    """Drafts a pass at ``t`` accepts: the leading run of ``proposals[t][j-1] == seq[t+1+j]``,
    at most ``num_steps`` and within ``seq``."""
    limit, row, a = min(num_steps, len(seq) - t - 2), proposals[t], 0
    while a < limit and row[a] == seq[t + 2 + a]:
        a += 1
    return a


def walk(prompt_len: int, seq: list[int], proposals: list[list[int]], num_steps: int,
         stops: set[int], max_new_tokens: int) -> GenerationResult:
    """Verify passes over a known greedy ``seq`` (``proposals[t][j-1]`` proposes ``seq[t+1+j]``),
    counting drafts inside the continuation only (``min(accepted, emitted)``); also
    ``position_histogram`` over every position ``t`` a pass could start at (``prompt_len - 1 <=
    t <= len(seq) - 3``), visited or not."""
    k, last = num_steps, len(seq) - 1
    out = list(seq[prompt_len:])
    res = GenerationResult(out, 0, [0] * k, 0, [0] * (k + 1), prompt_tokens=prompt_len,
                           finish_reason=_finish(out, stops, max_new_tokens),
                           position_histogram=[0] * (k + 1))
    for t in range(prompt_len - 1, last - 1):
        res.position_histogram[_accepted(seq, proposals, t, k)] += 1
    t = prompt_len - 1
    while last - t - 1 >= 1:
        a = _accepted(seq, proposals, t, k)
        res.verify_ct += 1
        res.num_draft_tokens += k
        res.accepted_per_position[:a] = [c + 1 for c in res.accepted_per_position[:a]]
        res.histogram[a] += 1
        t += a + 1
    return res


def draft_vocabulary(draft: SGLangEagle3Draft) -> set[int]:
    """The target ids the draft can propose: ``d2t`` mapped over its whole vocabulary (the
    target's whole vocabulary without ``d2t``)."""
    ids = torch.arange(int(draft.lm_head.weight.shape[0]), device=draft.lm_head.weight.device)
    return set(draft.to_target_ids(ids).tolist())


@torch.no_grad()
def target_states(target, seqs: list[list[int]], union: list[int], pad: int):
    """Right-padded ``seqs`` → ``(tokens [B, L], {index: [B, L, H]}, final normed [B, L, H])``."""
    dev = next(target.parameters()).device
    ids, mask = _padded(seqs, pad, left=False)
    ids, store = ids.to(dev), {}
    keep = lambda _m, _a, o: store.__setitem__("h", o)  # noqa: E731
    hook = target.get_decoder().norm.register_forward_hook(keep)
    try:
        with capture_hidden_states(target, union) as cap:
            target(input_ids=ids, attention_mask=mask.to(dev), use_cache=False, logits_to_keep=1)
            captured = dict(cap)
    finally:
        hook.remove()
    return ids, captured, store["h"]


def replay_requests(target, drafts: Mapping[str, SGLangEagle3Draft], requests: list[Request],
                    num_steps: int, *, max_new_tokens: int, batch_size: int = 16,
                    capture_aux: bool = True, progress=None):
    """Every draft on every request, the target once per batch; ``capture_aux=False``: final normed
    state (fc bypassed). Returns ``({name: [GenerationResult]}, {name: draft s}, target s)``."""
    if num_steps < 1:
        raise EngineUnsupported(f"speculative num_steps: expected >= 1, got {num_steps}")
    stops = stop_ids(target)
    idx = {n: capture_indices(d, target) if capture_aux and d.use_aux_hidden_state else None
           for n, d in drafts.items()}
    union = sorted({i for v in idx.values() if v for i in v})
    seqs = [r.prompt_ids + r.output_ids[:max_new_tokens] for r in requests]
    order = sorted(range(len(requests)), key=lambda i: -len(seqs[i]))
    results: dict[str, list] = {n: [None] * len(requests) for n in drafts}
    vocab = {n: draft_vocabulary(d) for n, d in drafts.items()}
    draft_s, target_s = {n: 0.0 for n in drafts}, 0.0
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        t0 = time.perf_counter()
        pad = next(iter(stops), 0)
        tokens, captured, final = target_states(target, [seqs[i] for i in batch], union, pad)
        target_s += time.perf_counter() - t0
        for name, draft in drafts.items():
            t0 = time.perf_counter()
            # aux states at the capture indices side by side [B, L, W], or the final normed state
            inputs = final if idx[name] is None else torch.cat([captured[i] for i in idx[name]], -1)
            props = chain_proposals(draft, tokens, inputs, num_steps).cpu()
            for row, i in enumerate(batch):
                res = walk(len(requests[i].prompt_ids), seqs[i], props[row].tolist(),
                           num_steps, stops, max_new_tokens)
                res.out_of_draft_vocab = sum(x not in vocab[name] for x in res.output_ids)
                results[name][i] = res
            draft_s[name] += time.perf_counter() - t0
        if progress is not None:
            progress.update(len(batch))
    return results, draft_s, target_s
