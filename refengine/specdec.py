"""Chain EAGLE-3 speculative decoding in-process: the HF target verifies, the SGLang-format draft
proposes.

Semantics of SGLang's EAGLE worker (``sglang/srt/speculative/eagle_worker_v2.py``:
``_draft_extend_for_prefill``, ``draft_forward``, ``_draft_extend_for_decode``; topk 1):

- prefill: the target runs the prompt ``x_0..x_{n-1}``, capturing the aux states ``h_0..h_{n-1}``,
  and produces ``x_n``; the draft extend pairs ``h_p`` with token ``p+1`` (ids ``x_1..x_n`` at
  positions ``0..n-1``); its last row proposes ``d_1``;
- draft steps: ``d_i`` at position ``n+i-1`` with the draft's own (pre-norm) output of the previous
  row (width H: ``fc`` skipped) proposes ``d_{i+1}``; ``num_steps`` tokens in all;
- verify: one target forward over ``[x_n, d_1..d_k]``. Greedy: accept while the target's argmax
  equals the draft token; the target's token at the first mismatch (or after the last draft) is the
  bonus. T > 0: speculative sampling (:mod:`refengine.sampling`), the draft's distribution mapped to
  the target vocabulary through ``hot_token_id``;
- draft extend after verify: ``d_1..d_a, bonus`` paired with the target's aux states at
  ``x_n, d_1..d_a``; the draft's KV entries of rejected positions are dropped, as SGLang's extend
  overwrites them (attention is causal: accepted rows never see rejected ones).

KV caches: the target's a transformers ``DynamicCache`` cropped after rejection, the draft's a
``DraftKVCache``. Aux capture ids: ``eagle3.measure.replay.capture_indices`` (the engine profile's
"output of layer k" → HF index k+1, else SGLang's default ``[2, L//2, L-3]``). Acceptance length =
completion tokens / verify passes, as SGLang's ``spec_accept_length`` (bonus and prefill token
counted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from eagle3.engines.sglang.draft import DraftKVCache, SGLangEagle3Draft
from eagle3.errors import DataError, EngineUnsupported
from eagle3.measure.replay import GenerationResult, capture_indices, stop_ids
from eagle3.target_model import capture_hidden_states, load_target, torch_dtype
from refengine import sampling


def crop_draft_cache(cache: DraftKVCache, length: int) -> None:
    """Keep the first ``length`` positions of a draft's KV cache (the speculative positions of a
    verify pass dropped); ValueError naming the cache's length when ``length`` is outside
    ``[0, cache.length]``."""
    if length < 0 or length > cache.length:
        raise ValueError(f"crop_draft_cache: expected 0 <= length <= {cache.length}, got {length}")
    cache.kv = [None if e is None or length == 0 else (e[0][..., :length, :],
                                                       e[1][..., :length, :]) for e in cache.kv]


def check_request(input_ids: list[int], max_new_tokens: int, vocab_size: int) -> None:
    """A generation request both decoders accept: at least one prompt token, every id in
    ``[0, vocab_size)``, ``max_new_tokens`` >= 1 (tokens). Raises DataError naming the field, the
    expected and the actual value."""
    if not input_ids:
        raise DataError("generate: input_ids is empty (expected at least one token)")
    bad = [t for t in input_ids if not 0 <= int(t) < vocab_size]
    if bad:
        raise DataError(f"generate: token ids {bad[:5]} outside the target vocabulary [0, "
                        f"{vocab_size})")
    if max_new_tokens < 1:
        raise DataError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")


class SpeculativeDecoder:
    """Chain EAGLE-3 speculative decoding (topk 1), batch size 1, with an HF target and an
    SGLang-format draft. ``capture_aux=False`` feeds the draft only the target's final normed state,
    as SGLang for a target that captures no aux states (``fc`` bypassed, acceptance collapses:
    failure class 11). Not thread-safe: callers serialise."""

    def __init__(self, target_dir: str | Path, serving_draft_dir: str | Path, num_steps: int = 3,
                 dtype: str = "float32", device: str = "cpu", capture_aux: bool = True):
        target, tokenizer = load_target(target_dir, dtype=dtype, device=device)
        draft = SGLangEagle3Draft.from_dir(
            serving_draft_dir, dtype=torch_dtype(dtype), device=device,
            target_embed=target.get_input_embeddings().weight.detach(),
            target_head=target.get_output_embeddings().weight.detach())
        self._setup(target, draft, tokenizer, num_steps, capture_aux)

    @classmethod
    def from_models(cls, target, draft: SGLangEagle3Draft, tokenizer=None, num_steps: int = 3,
                    capture_aux: bool = True) -> "SpeculativeDecoder":
        """Build from already loaded models (tests, test doubles, a server sharing one target)."""
        self = cls.__new__(cls)
        self._setup(target, draft, tokenizer, num_steps, capture_aux)
        return self

    def _setup(self, target, draft, tokenizer, num_steps: int, capture_aux: bool) -> None:
        if num_steps < 1:
            raise EngineUnsupported(f"speculative num_steps: expected >= 1, got {num_steps}")
        self.target, self.draft, self.tokenizer = target.eval(), draft.eval(), tokenizer
        self.num_steps = num_steps
        self.capture_aux = capture_aux and draft.use_aux_hidden_state
        self.device = next(target.parameters()).device
        self.vocab_size = int(target.get_output_embeddings().weight.shape[0])
        self.max_positions = int(getattr(target.config, "max_position_embeddings", 1 << 30))
        self.capture_indices = capture_indices(draft, target, check_fc=self.capture_aux)
        self.eos_token_ids = stop_ids(target)

    @torch.no_grad()
    def _target_forward(self, ids: list[int], cache, last_only: bool = False):
        """Target over ``ids`` after the cached prefix → ``(logits [T, V] float32, draft input [T,
        W])``; ``last_only``: logits ``[1, V]`` of the last position."""
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        kw = {"logits_to_keep": 1} if last_only else {}
        if self.capture_aux:
            with capture_hidden_states(self.target, self.capture_indices) as cap:
                out = self.target(input_ids=x, past_key_values=cache, use_cache=True, **kw)
            hidden = torch.cat([cap[i][0] for i in self.capture_indices], dim=-1)  # [T, n_aux*H]
        else:
            store = {}
            handle = self.target.get_decoder().norm.register_forward_hook(
                lambda _m, _a, o: store.__setitem__("h", o))
            try:
                out = self.target(input_ids=x, past_key_values=cache, use_cache=True, **kw)
            finally:
                handle.remove()
            hidden = store["h"][0]                                  # [T, H], after the final norm
        return out.logits[0].float(), hidden

    def _draft(self, ids: list[int], start: int, hidden: torch.Tensor, cache):
        pos = torch.arange(start, start + len(ids), device=self.device)
        return self.draft(torch.tensor(ids, device=self.device), pos, hidden, cache)

    def _propose(self, logits: torch.Tensor, temperature: float, top_p: float,
                 gen) -> tuple[int, torch.Tensor | None]:
        """Draft logits ``[draft_vocab]`` → (target token id, its draft distribution over the target
        vocab or None)."""
        if sampling.is_greedy(temperature):
            return int(self.draft.to_target_ids(logits.argmax()).item()), None
        q_draft = sampling.probs_from_logits(logits, temperature, top_p)
        d = sampling.sample(q_draft, gen)
        if self.draft.hot_token_id is None:
            q = torch.zeros(self.vocab_size, device=q_draft.device)
            q[: q_draft.shape[0]] = q_draft
        else:
            q = torch.zeros(self.vocab_size,
                            device=q_draft.device).index_add_(0, self.draft.hot_token_id, q_draft)
        return int(self.draft.to_target_ids(torch.tensor(d)).item()), q

    def _verify(self, logits: torch.Tensor, drafts: list[int], qs: list, temperature: float,
                top_p: float,
                gen) -> tuple[int, int]:
        """Verify pass rows ``logits [k+1, V]`` against ``drafts`` → (accepted count, bonus
        token)."""
        if sampling.is_greedy(temperature):
            best = logits.argmax(-1).tolist()
            a = 0
            while a < len(drafts) and drafts[a] == best[a]:
                a += 1
            return a, best[a]
        for j, (d, q) in enumerate(zip(drafts, qs)):
            p = sampling.probs_from_logits(logits[j], temperature, top_p)
            ok, repl = sampling.accept_or_resample(p, q, d, gen)
            if not ok:
                return j, repl
        p = sampling.probs_from_logits(logits[len(drafts)], temperature, top_p)
        return len(drafts), sampling.sample(p, gen)

    def _pick(self, logits: torch.Tensor, temperature: float, top_p: float, gen) -> int:
        if sampling.is_greedy(temperature):
            return int(logits.argmax().item())
        return sampling.sample(sampling.probs_from_logits(logits, temperature, top_p), gen)

    def _check(self, input_ids: list[int], max_new_tokens: int) -> None:
        check_request(input_ids, max_new_tokens, self.vocab_size)
        need = len(input_ids) + max_new_tokens + self.num_steps
        if need > self.max_positions:
            raise DataError(f"generate: prompt {len(input_ids)} + max_new_tokens {max_new_tokens} "
                            "+ num_steps "
                            f"{self.num_steps} = {need} tokens exceeds the context length "
                            f"{self.max_positions}")

    @torch.no_grad()
    def generate(self, input_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0,
                 seed: int = 0, stop_token_ids: list[int] | None = None, ignore_eos: bool = False,
                 on_tokens: Callable[[GenerationResult], None] | None = None) -> GenerationResult:
        """Up to ``max_new_tokens`` tokens after ``input_ids``. ``on_tokens(result)`` after every
        step that emitted tokens (the hook the engine streams from). Stops after an EOS id (unless
        ``ignore_eos``) or one of ``stop_token_ids`` (kept, as SGLang). ``temperature`` < 1e-6 is
        greedy, else speculative sampling with ``top_p``, seeded by ``seed``. Raises DataError for
        empty or out-of-vocabulary input or a request past the context."""
        from transformers import DynamicCache

        input_ids = [int(t) for t in input_ids]
        self._check(input_ids, max_new_tokens)
        gen = torch.Generator(device="cpu").manual_seed(int(seed))
        stops = (set() if ignore_eos else set(self.eos_token_ids)) | set(stop_token_ids or [])
        k = self.num_steps
        res = GenerationResult([], 0, [0] * k, 0, [0] * (k + 1), prompt_tokens=len(input_ids))
        cache = DynamicCache(config=self.target.config)
        logits, hidden = self._target_forward(input_ids, cache, last_only=True)
        last = self._pick(logits[-1], temperature, top_p, gen)
        done = self._emit(res, [last], stops, max_new_tokens)[1]
        if on_tokens is not None:
            on_tokens(res)
        if done:
            return res
        dcache = self.draft.new_cache()
        pend_ids, pend_h, start, committed = input_ids[1:] + [last], hidden, 0, len(input_ids)
        while True:
            dl, dh = self._draft(pend_ids, start, pend_h,
                                 dcache)          # draft extend (target states)
            drafts, qs = [], []
            for i in range(k):
                tok, q = self._propose(dl[-1], temperature, top_p, gen)
                drafts.append(tok)
                qs.append(q)
                if i < k - 1:
                    dl, dh = self._draft([tok], committed + i, dh[-1:],
                                         dcache)  # draft step (own state)
            crop_draft_cache(dcache, committed)
            vlogits, vhidden = self._target_forward([last] + drafts,
                                                    cache)  # positions committed..committed+k
            a, bonus = self._verify(vlogits, drafts, qs, temperature, top_p, gen)
            cache.crop(-(k - a))                                    # keep committed + a + 1
            new = drafts[:a] + [bonus]
            res.verify_ct += 1
            res.num_draft_tokens += k
            res.accept_counts.append(a)
            appended, done = self._emit(res, new, stops, max_new_tokens)
            counted = min(a, appended)                              # accepted drafts emitted
            for j in range(counted):
                res.accepted_per_position[j] += 1
            res.histogram[counted] += 1
            if on_tokens is not None:
                on_tokens(res)
            if done:
                return res
            pend_ids, pend_h, start = new, vhidden[: a + 1], committed
            committed += a + 1
            last = bonus

    @staticmethod
    def _emit(res: GenerationResult, tokens: list[int], stops: set[int],
              max_new_tokens: int) -> tuple[int, bool]:
        """Append tokens up to a stop token or the budget → (tokens appended, finished); sets
        finish_reason."""
        for n, t in enumerate(tokens, start=1):
            res.output_ids.append(t)
            if t in stops:
                res.finish_reason = {"type": "stop", "matched": t}
                return n, True
            if len(res.output_ids) >= max_new_tokens:
                res.finish_reason = {"type": "length", "length": max_new_tokens}
                return n, True
        return len(tokens), False
