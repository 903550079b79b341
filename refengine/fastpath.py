"""The reference engine's fast path: chain EAGLE-3 decoding (and plain decoding) with the host out
of the loop, token for token the semantics of :class:`refengine.specdec.SpeculativeDecoder`.

- static KV caches sized ``max_context`` up front (:mod:`.static_cache`; a request that does not fit
  is a DataError naming both lengths); the target is a minimal Llama forward over the HF weights
  writing the aux states into a preallocated buffer (:mod:`.static_target`); the draft runs its own
  ``states`` over its static cache (``StaticDraft``);
- the draft chain, the greedy verify (argmax, compare, accept count ``a``, bonus) and the position
  bookkeeping stay on the device: **one** device→host transfer per verify pass (``a`` and the k+1
  argmaxes, needed to emit tokens) and one per plain decode step;
- CUDA graphs (:mod:`.graphs`) for every fixed-shape step (decode: 1 token; chain: k-1 draft steps;
  verify: k+1 tokens with the accept logic; extend after verify: a+1 tokens, one per a in 0..k),
  each for every attention window of ``kv_buckets``; the prefill runs eagerly. A failed capture
  leaves every step eager, said in :attr:`FastDecoder.graph_status`.

Per verify pass: ``chain → verify → copy to the host``, the host emits tokens and checks stops,
then ``extend[a]``: time per token ≈ ``(t_verify + (k−1)·t_draft + t_extend + t_host) / AL``
(``lab/gpu_speedup.py``). Greedy only: temperature > 0 with a draft runs on the generic path on the
same models; plain decoding samples here with the seeded CPU generator, as ``SpeculativeDecoder``.
``LlamaForCausalLM`` targets only (``unsupported_reason``; others: :func:`build_decoder`'s generic
path). Not thread-safe: callers serialise requests.
"""

from __future__ import annotations

from typing import Callable

import torch

from eagle3.engines.sglang.draft import SGLangEagle3Draft
from eagle3.errors import EngineUnsupported
from eagle3.measure.replay import GenerationResult, stop_ids
from refengine import sampling
from refengine.graphs import Step, capture_steps
from refengine.specdec import SpeculativeDecoder, check_request
from refengine.static_cache import StaticDraft, kv_buckets
from refengine.static_target import StaticLlamaTarget, unsupported_reason
from refengine.timeline import Timeline

DEFAULT_MAX_CONTEXT_CAP = 8192


class FastDecoder:
    """Fast chain EAGLE-3 / plain decoding, batch size 1 (see the module docstring).

    ``target``: an HF ``LlamaForCausalLM`` (eval); ``draft``: an :class:`SGLangEagle3Draft` or None
    (plain decoding only); ``num_steps``: draft tokens per verify pass; ``max_context``: positions
    of the static caches (default: the target's ``max_position_embeddings``, at most 8192);
    ``use_cuda_graphs``: None = on for a CUDA target; ``static_shapes``: run eager steps with the
    graphs' attention windows (the CPU twin of the graphs). ``capture_aux=False``: feed the draft
    the target's final normed state (failure class 11, as SpeculativeDecoder). Raises
    EngineUnsupported for a target the fast path does not implement, plus SpeculativeDecoder's
    checks (aux ids, fc width). Attributes used by the server: ``tokenizer``, ``num_steps`` (0
    without a draft), ``max_positions``, ``capture_indices``, ``capture_aux``, ``draft``,
    ``graph_status``, :meth:`describe`.
    """

    def __init__(self, target, draft: SGLangEagle3Draft | None = None, tokenizer=None, *,
                 num_steps: int = 3, max_context: int | None = None,
                 use_cuda_graphs: bool | None = None, capture_aux: bool = True,
                 static_shapes: bool = False):
        reason = unsupported_reason(target)
        if reason:
            raise EngineUnsupported(f"fast path: {reason}")
        self.target, self.draft, self.tokenizer = target.eval(), draft, tokenizer
        self.device = target.lm_head.weight.device
        limit = int(getattr(target.config, "max_position_embeddings", DEFAULT_MAX_CONTEXT_CAP))
        self.max_positions = int(max_context or min(limit, DEFAULT_MAX_CONTEXT_CAP))
        self.slow = None
        if draft is not None:
            self.slow = SpeculativeDecoder.from_models(target, draft, tokenizer, num_steps,
                                                       capture_aux)
            self.slow.max_positions = self.max_positions
            self.capture_aux = self.slow.capture_aux
            self.capture_indices = self.slow.capture_indices
        else:
            self.capture_aux, self.capture_indices = False, []
        self.num_steps = num_steps if draft is not None else 0
        self.eos_token_ids = stop_ids(target)
        self.vocab_size = int(target.lm_head.weight.shape[0])
        capture_final = draft is not None and not self.capture_aux
        self.tgt = StaticLlamaTarget(target, self.max_positions, self.capture_indices
                                     if self.capture_aux else None,
                                     capture_final=capture_final)
        self.sd = StaticDraft(draft, self.max_positions) if draft is not None else None
        self.buckets = kv_buckets(self.max_positions)
        self._buffers()
        self.steps = self._make_steps()
        self.graph_status = self._maybe_capture(use_cuda_graphs)
        self.static = self.graph_status.startswith("on") or static_shapes

    # --- buffers and steps ---

    def _buffers(self) -> None:
        k, dev, long = self.num_steps, self.device, torch.long
        self.pos = torch.zeros(1, dtype=long,
                               device=dev)        # committed positions (= position of vin[0])
        self.start = torch.zeros(1, dtype=long,
                                 device=dev)      # first position of the pending draft extend
        self.vin = torch.zeros(k + 1, dtype=long, device=dev)    # verify input: [last, d_1..d_k]
        self.vbest = torch.zeros(k + 1, dtype=long, device=dev)  # verify argmax
        self.res = torch.zeros(k + 2, dtype=long,
                               device=dev)    # [a, vbest...]: the one transfer per iteration
        self.ar = torch.arange(k + 1, dtype=long, device=dev)
        self.aux = torch.zeros(k + 1, max(self.tgt.hidden_width, 1), dtype=self.tgt.dtype,
                               device=dev)
        width = self.sd.hidden_size if self.sd is not None else 1
        self.dh = torch.zeros(1, width, dtype=self.sd.dtype if self.sd else self.tgt.dtype,
                              device=dev)
        self.ptok = torch.zeros(1, dtype=long, device=dev)       # plain decoding: the last token
        pin = dev.type == "cuda"
        self.host = torch.zeros(k + 2, dtype=long, pin_memory=pin)

    def _make_steps(self) -> dict[tuple[str, int], Step]:
        steps = {}
        for kv in self.buckets:
            steps[("decode", kv)] = Step(f"decode@{kv}", lambda kv=kv: self._decode(kv))
            if self.sd is None:
                continue
            steps[("verify", kv)] = Step(f"verify@{kv}", lambda kv=kv: self._verify(kv))
            if self.num_steps > 1:
                steps[("chain", kv)] = Step(f"chain@{kv}", lambda kv=kv: self._chain(kv))
            for a in range(self.num_steps + 1):
                steps[(f"extend{a}", kv)] = Step(f"extend{a}@{kv}", lambda kv=kv,
                                                 a=a: self._extend(a, kv))
        return steps

    def _maybe_capture(self, use_cuda_graphs: bool | None) -> str:
        if self.device.type != "cuda":
            return f"off (device {self.device.type})"
        if use_cuda_graphs is False:
            return "off (disabled: --disable-cuda-graph)"
        with torch.no_grad():
            return capture_steps(list(self.steps.values()), self.device, self._reset)

    def _reset(self) -> None:
        for t in (self.pos, self.start, self.vin, self.vbest, self.ptok, self.res):
            t.zero_()
        self.aux.zero_()
        self.dh.zero_()

    def _run(self, name: str, end: int, eager: Callable[[int], None]) -> None:
        """Run step ``name`` whose attention reaches position ``end - 1``: its graph (or
        graph-shaped eager twin) for the smallest window holding ``end``, or eagerly over exactly
        ``end`` positions."""
        if self.static:
            self.steps[(name, next(b for b in self.buckets if b >= end))]()
        else:
            eager(end)

    def _fetch(self, src: torch.Tensor) -> list[int]:
        """The one device→host transfer of an iteration (pinned buffer, then wait for the
        stream)."""
        if self.device.type != "cuda":
            return src.tolist()
        n = src.numel()
        self.host[:n].copy_(src, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return self.host[:n].tolist()

    # --- the device-side pieces (also the bodies of the graphs) ---

    def _decode(self, kv_len: int, logits_out: list | None = None) -> None:
        logits = self.tgt.forward(self.ptok, self.pos + self.ar[:1], kv_len)
        if logits_out is not None:
            logits_out.append(logits[0].float())
        else:
            self.ptok.copy_(logits.argmax(-1))
        self.pos.add_(1)

    def _chain(self, kv_len: int) -> None:
        for i in range(self.num_steps - 1):
            logits, h = self.sd.forward(self.vin[1 + i:2 + i], self.pos + i, self.dh, kv_len)
            self.vin[2 + i:3 + i].copy_(self.sd.to_target_ids(logits.argmax(-1)))
            self.dh.copy_(h)

    def _verify(self, kv_len: int) -> None:
        k = self.num_steps
        logits = self.tgt.forward(self.vin, self.pos + self.ar, kv_len, self.aux)
        best = logits.argmax(-1)
        self.vbest.copy_(best)
        a = (self.vin[1:] == best[:k]).long().cumprod(0).sum()
        self.res[:1].copy_(a.view(1))
        self.res[1:].copy_(best)
        self.vin[:1].copy_(best.gather(0, a.view(1)))
        self.start.copy_(self.pos)
        self.pos.add_(a + 1)

    def _extend(self, a: int, kv_len: int) -> None:
        t = a + 1
        logits, h = self.sd.forward(self.vbest[:t], self.start + self.ar[:t], self.aux[:t], kv_len)
        self.vin[1:2].copy_(self.sd.to_target_ids(logits[-1:].argmax(-1)))
        self.dh.copy_(h[-1:])

    # --- requests ---

    def describe(self) -> str:
        """One line for logs: path, target class, cache size, graph status."""
        return (f"fast path ({type(self.target).__name__}, static KV cache {self.max_positions} "
                "positions, "
                f"attention windows {self.buckets}, CUDA graphs {self.graph_status})")

    def _check(self, input_ids: list[int], max_new_tokens: int, k: int) -> None:
        check_request(input_ids, max_new_tokens, self.vocab_size)
        self.tgt.cache.check_fits(len(input_ids) + max_new_tokens + k, f"prompt {len(input_ids)} + "
                                                                       "max_new_tokens "
                                  f"{max_new_tokens} + num_steps {k}")

    @torch.no_grad()
    def generate(self, input_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0,
                 seed: int = 0, stop_token_ids: list[int] | None = None, ignore_eos: bool = False,
                 on_tokens: Callable[[GenerationResult], None] | None = None,
                 speculative: bool = True,
                 profile: dict | None = None) -> GenerationResult:
        """``SpeculativeDecoder.generate``'s contract (stop tokens kept, ``on_tokens`` after each
        emitting step, DataError for empty / out-of-vocabulary input and for a request longer than
        the static cache).

        ``speculative=False`` (or no draft): plain decoding on the same engine, one target step per
        token. ``profile``: a dict filled with
        ``{"intervals_ms": {piece: [ms, ...]}, "iteration_ms": [...]}`` (device time of each piece,
        see :mod:`.timeline`). Temperature > 0 with a draft: the generic path (no profile).
        """
        input_ids = [int(t) for t in input_ids]
        spec = speculative and self.sd is not None
        if spec and not sampling.is_greedy(temperature):
            return self.slow.generate(input_ids, max_new_tokens, temperature, top_p, seed,
                                      stop_token_ids,
                                      ignore_eos, on_tokens)
        self._check(input_ids, max_new_tokens, self.num_steps if spec else 0)
        stops = (set() if ignore_eos else set(self.eos_token_ids)) | set(stop_token_ids or [])
        tl = Timeline(self.device) if profile is not None else None
        k = self.num_steps if spec else 0
        res = GenerationResult([], 0, [0] * k, 0, [0] * (k + 1) if spec else [],
                               prompt_tokens=len(input_ids))
        run = self._speculate if spec else self._plain
        run(input_ids, res, stops, max_new_tokens, on_tokens, tl, (temperature, top_p, seed))
        if tl is not None:
            profile["intervals_ms"] = tl.durations_ms()
            profile["iteration_ms"] = tl.host_intervals_ms("chain" if spec else "decode")
        return res

    def _prefill(self, ids: list[int], hidden_width: int):
        """Prompt through the target: ``(last logits, captured states or None, ids on device)``."""
        n = len(ids)
        ids_t = torch.tensor(ids, dtype=torch.long, device=self.device)
        hidden = torch.empty(n, hidden_width, dtype=self.tgt.dtype,
                             device=self.device) if hidden_width else None
        logits = self.tgt.forward(ids_t, self.tgt.kv_positions[:n], n, hidden, last_only=True)
        return logits[-1], hidden, ids_t

    def _speculate(self, ids, res, stops, budget, on_tokens, tl, _sampling) -> None:
        k, n = self.num_steps, len(ids)
        if tl:
            tl.mark("prefill")
        logits, hidden, ids_t = self._prefill(ids, self.tgt.hidden_width)
        best = logits.argmax(-1)
        first = self._fetch(best.view(1))
        done = SpeculativeDecoder._emit(res, first, stops,
                                        budget)[1]  # noqa: SLF001 - the shared emit rule
        if on_tokens is not None:
            on_tokens(res)
        if done:
            return
        dl, dh = self.sd.forward(torch.cat([ids_t[1:], best.view(1)]), self.tgt.kv_positions[:n],
                                 hidden, n)
        self.vin[:1].copy_(best.view(1))
        self.vin[1:2].copy_(self.sd.to_target_ids(dl[-1:].argmax(-1)))
        self.dh.copy_(dh[-1:])
        self.pos.fill_(n)
        hpos = n
        while True:
            if tl:
                tl.mark("chain")
            if k > 1:
                self._run("chain", hpos + k - 1, self._chain)
            if tl:
                tl.mark("verify")
            self._run("verify", hpos + k + 1, self._verify)
            if tl:
                tl.mark("host")
            vals = self._fetch(self.res)
            a = vals[0]
            res.verify_ct += 1
            res.num_draft_tokens += k
            res.accept_counts.append(a)
            emit = SpeculativeDecoder._emit  # noqa: SLF001 - the shared emit rule
            appended, done = emit(res, vals[1:a + 2], stops, budget)
            for j in range(min(a, appended)):
                res.accepted_per_position[j] += 1
            res.histogram[min(a, appended)] += 1
            if _reported(res, done, on_tokens, tl):
                return
            start, hpos = hpos, hpos + a + 1
            if tl:
                tl.mark(f"extend{a}")
            self._run(f"extend{a}", start + a + 1, lambda end, a=a: self._extend(a, end))

    def _plain(self, ids, res, stops, budget, on_tokens, tl, sampling_args) -> None:
        temperature, top_p, seed = sampling_args
        greedy = sampling.is_greedy(temperature)
        gen = torch.Generator(device="cpu").manual_seed(int(seed))
        n = len(ids)
        if tl:
            tl.mark("prefill")
        logits, _, _ = self._prefill(ids, 0)
        if greedy:
            tok = self._fetch(logits.argmax(-1).view(1))[0]
        else:
            probs = sampling.probs_from_logits(logits.float().cpu(), temperature, top_p)
            tok = sampling.sample(probs, gen)
        self.ptok.fill_(tok)
        self.pos.fill_(n)
        hpos, done = n, SpeculativeDecoder._emit(res, [tok], stops, budget)[1]  # noqa: SLF001
        while True:
            if _reported(res, done, on_tokens, tl):
                return
            if tl:
                tl.mark("decode")
            if greedy:
                self._run("decode", hpos + 1, self._decode)
                if tl:
                    tl.mark("host")
                tok = self._fetch(self.ptok)[0]
            else:
                out: list = []
                kv = next(b for b in self.buckets if b >= hpos + 1) if self.static else hpos + 1
                self._decode(kv, logits_out=out)
                if tl:
                    tl.mark("host")
                tok = sampling.sample(sampling.probs_from_logits(out[0].cpu(), temperature, top_p),
                                      gen)
                self.ptok.fill_(tok)
            hpos += 1
            done = SpeculativeDecoder._emit(res, [tok], stops, budget)[1]  # noqa: SLF001


def build_decoder(target, draft: SGLangEagle3Draft | None, tokenizer=None, *, num_steps: int = 3,
                  capture_aux: bool = True, max_context: int | None = None,
                  use_cuda_graphs: bool | None = None) -> tuple[object, str]:
    """The decoder the reference engine serves with, and one line saying which path and why.

    The fast path (:class:`FastDecoder`) for targets it implements; otherwise, with a draft, the
    generic HF path (:class:`SpeculativeDecoder`, the line names the target class). Plain decoding
    (``draft`` None) exists only on the fast path: EngineUnsupported names the target class
    otherwise.
    """
    reason = unsupported_reason(target)
    if reason is None and draft is not None and not isinstance(draft, SGLangEagle3Draft):
        reason = f"draft class {type(draft).__name__}: the fast path runs SGLangEagle3Draft only"
    if reason is None:
        dec = FastDecoder(target, draft, tokenizer, num_steps=num_steps, max_context=max_context,
                          use_cuda_graphs=use_cuda_graphs, capture_aux=capture_aux)
        return dec, dec.describe()
    if draft is None:
        raise EngineUnsupported("plain decoding (no --speculative-algorithm) runs on the fast "
                                f"path only: {reason}")
    dec = SpeculativeDecoder.from_models(target, draft, tokenizer, num_steps, capture_aux)
    if max_context:
        dec.max_positions = max_context
    return dec, f"generic HF path (SpeculativeDecoder): {reason}"


def _reported(res: GenerationResult, done: bool, on_tokens, tl) -> bool:
    """After each pass: hand the tokens so far to ``on_tokens`` (streaming), and when the request is
    ``done`` mark the timeline's end; returns ``done``."""
    if on_tokens is not None:
        on_tokens(res)
    if done and tl:
        tl.mark("end")
    return done

