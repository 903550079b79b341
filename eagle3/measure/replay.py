"""Replay acceptance of many drafts on whole prompt sets: :func:`evaluate_drafts` and ``python -m eagle3.measure.replay_cli``.

The method and its exactness argument are in :mod:`eagle3.measure.replay_core`: under greedy chain decoding
(topk 1) the acceptance of a draft follows from the target's own greedy continuation, so the continuations are
generated once per target and prompt set (batched ``generate``) and every draft is replayed on them with a few
batched forwards. Rows and summaries have the shape of :func:`eagle3.measure.offline.offline_acceptance`'s
(``offline_row`` / ``offline_summary``), plus per set, per category, per turn and a bootstrap interval
(:mod:`eagle3.measure.spread`).

``check_against_decoder=N`` decodes N requests (spread over the list) again with
:class:`~refengine.specdec.SpeculativeDecoder` and reports which agree in output tokens, verify
passes, accepted drafts per position and histogram: the self-check to run first on a new device or dtype.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Mapping, Sequence

import torch

from eagle3.errors import ConfigError
from eagle3.measure.acceptance import ACCEPTANCE_CONVENTION
from eagle3.measure.offline import offline_row, offline_summary
from eagle3.measure.prompts import load_conversations
from eagle3.measure.replay_core import Request, capture_indices, generate_requests, replay_requests
from eagle3.measure.spread import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, METHOD, bootstrap_acceptance

DEFAULT_SETS = ("mtbench2", "gsm8k200")
GROUP_KEYS = ("acceptance_length", "acceptance_length_sglang", "acceptance_rate", "per_position", "histogram")


def check_arguments(target_dir, drafts: Mapping, prompt_sets: Sequence[str], max_new_tokens: int, num_steps: int,
                    dtype: str, device: str, batch_size: int, resamples: int, check_against_decoder: int) -> dict:
    """Check every argument of :func:`evaluate_drafts` before any model loads; returns the loaded conversations
    per set. Raises ConfigError (folders, numbers, dtype, device) or DataError (prompt sets), naming the argument
    with the expected and the actual value."""
    from eagle3.target_model import resolve_device, torch_dtype

    if not (Path(target_dir) / "config.json").is_file():
        raise ConfigError(f"target_dir {target_dir}: expected an HF model folder with config.json, found none")
    if not drafts:
        raise ConfigError("drafts: expected at least one {name: serving_dir}, got none")
    for name, d in drafts.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"drafts: expected non-empty string names, got {name!r}")
        if not (Path(d) / "config.json").is_file():
            raise ConfigError(f"draft {name!r}: {d}: expected an SGLang draft folder with config.json, found none")
        if "speculators_model_type" in _json_or_empty(Path(d) / "config.json"):
            raise ConfigError(f"draft {name!r}: {d}: expected an SGLang draft folder, got a speculators training "
                              f"checkpoint; convert it first: eagle3 convert {d} DST --to sglang")
    for label, value, low in (("max_new_tokens", max_new_tokens, 1), ("num_steps", num_steps, 1),
                              ("batch_size", batch_size, 1), ("check_against_decoder", check_against_decoder, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{label}: expected an integer >= {low}, got {value!r}")
    if resamples < 1000:
        raise ConfigError(f"resamples: expected >= 1000 bootstrap resamples, got {resamples}")
    torch_dtype(dtype)
    dev = resolve_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: {device!r} asked, but torch {torch.__version__} sees no CUDA device")
    if not prompt_sets or len(set(prompt_sets)) != len(prompt_sets):
        raise ConfigError(f"prompt_sets: expected distinct set names, got {list(prompt_sets)}")
    return {s: load_conversations(s) for s in prompt_sets}


def _json_or_empty(path: Path) -> dict:
    """A JSON object file's content, or ``{}`` when it is not one (the loader reports that case)."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _group(rows: list[dict], resamples: int, seed: int) -> dict:
    """One group's figures: ``offline_summary``'s acceptance keys, counts and the bootstrap interval ``ci``
    (``low``, ``high``, ``units``; resamples, seed, confidence and method are in ``settings["bootstrap"]``)."""
    s = offline_summary(rows, 0.0, {})
    return {**{k: s[k] for k in GROUP_KEYS}, "num_requests": len(rows),
            "completion_tokens": sum(r["completion_tokens"] for r in rows),
            "verify_ct": sum(r["verify_ct"] for r in rows),
            "ci": {k: v for k, v in bootstrap_acceptance(rows, resamples=resamples, seed=seed).items()
                   if k in ("low", "high", "units")}}


def _by(rows: list[dict], key) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def summarize(rows: list[dict], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict:
    """Overall, per set, per category (inside each set), per turn and per category × turn (multi-turn sets).

    ``rows``: ``offline_row`` rows with ``set``, ``turn`` and ``conversation``. Keys of the turn groups are
    ``"turn1"``, ``"turn2"``. Every group: see :func:`_group`.
    """
    g = lambda sel: _group(sel, resamples, seed)  # noqa: E731
    out = {"overall": g(rows), "per_set": {}, "per_category": {}, "per_turn": {}, "per_category_turn": {}}
    for name, sel in _by(rows, lambda r: r["set"]).items():
        out["per_set"][name] = g(sel)
        out["per_category"][name] = {c: g(x) for c, x in _by(sel, lambda r: r["category"]).items()}
        if len({r["turn"] for r in sel}) > 1:
            out["per_turn"][name] = {t: g(x) for t, x in _by(sel, lambda r: f"turn{r['turn']}").items()}
            out["per_category_turn"][name] = {
                c: {t: g(y) for t, y in _by(x, lambda r: f"turn{r['turn']}").items()}
                for c, x in _by(sel, lambda r: r["category"]).items()}
    return out


def _row(req: Request, res) -> dict:
    return {**offline_row({"id": req.id, "category": req.category}, res), "set": req.set, "turn": req.turn,
            "conversation": f"{req.set}:{req.conversation}", "prompt_tokens": len(req.prompt_ids),
            "finish_reason": res.finish_reason}


def decoder_check(target, tokenizer, draft, requests: list[Request], results: list, n: int, num_steps: int,
                  max_new_tokens: int) -> dict:
    """Decode ``n`` requests (evenly spread over ``requests``) with ``SpeculativeDecoder`` and compare with replay.

    Returns ``{"n", "equal", "different": [{"id", "fields", "first_output_difference"}], "wall_s"}``; a differing
    output (``first_output_difference`` = its token index) is a numeric near-tie in the continuation, differing
    counts with equal outputs a near-tie in a draft proposal (or a bug, in float32).
    """
    from refengine.specdec import SpeculativeDecoder

    t0 = time.perf_counter()
    dec = SpeculativeDecoder.from_models(target, draft, tokenizer, num_steps=num_steps)
    picks = sorted({int(i * len(requests) / n) for i in range(min(n, len(requests)))})
    different = []
    for i in picks:
        got, want = results[i], dec.generate(requests[i].prompt_ids, max_new_tokens)
        fields = [f for f in ("output_ids", "verify_ct", "accepted_per_position", "histogram")
                  if getattr(got, f) != getattr(want, f)]
        if fields:
            first = next((p for p, (a, b) in enumerate(zip(got.output_ids, want.output_ids)) if a != b),
                         min(len(got.output_ids), len(want.output_ids)))
            different.append({"id": requests[i].id, "fields": fields,
                              "first_output_difference": first if "output_ids" in fields else None})
    return {"n": len(picks), "equal": len(picks) - len(different), "different": different,
            "wall_s": time.perf_counter() - t0}


def _load(target_dir, drafts: Mapping, dtype: str, device: str):
    from eagle3.engines.sglang.draft import SGLangEagle3Draft
    from eagle3.target_model import load_target, torch_dtype

    target, tok = load_target(target_dir, dtype=dtype, device=device)
    embed, head = target.get_input_embeddings().weight.detach(), target.get_output_embeddings().weight.detach()
    dev = str(next(target.parameters()).device)
    loaded = {n: SGLangEagle3Draft.from_dir(d, dtype=torch_dtype(dtype), device=dev, target_embed=embed,
                                            target_head=head) for n, d in drafts.items()}
    return target, tok, loaded, dev


def evaluate_drafts(target_dir: str | Path, drafts: Mapping[str, str | Path], *,
                    prompt_sets: Sequence[str] = DEFAULT_SETS, max_new_tokens: int = 256, num_steps: int = 3,
                    dtype: str = "float32", device: str = "auto", batch_size: int = 16,
                    resamples: int = DEFAULT_RESAMPLES, seed: int = 0, check_against_decoder: int = 0,
                    include_requests: bool = True, progress: bool = True) -> dict[str, dict]:
    """Greedy chain acceptance of every draft in ``drafts`` ({name: SGLang serving folder}) on ``prompt_sets``.

    The target (``target_dir``, ``dtype``, ``device``: "auto" | "cpu" | "cuda" | "cuda:1") generates the
    continuations of all sets once (``max_new_tokens`` each, ``batch_size`` prompts a batch; multi-turn sets turn
    by turn), then runs once per batch of ``batch_size`` requests for all drafts together; each draft proposes
    ``num_steps`` tokens per verify pass. Returns ``{name: result}``, JSON-able: ``overall``, ``per_set``,
    ``per_category``, ``per_turn``, ``per_category_turn`` (each group: acceptance_length (bonus counted),
    acceptance_length_sglang, acceptance_rate, per_position, histogram, counts, ``ci`` = bootstrap interval of
    ``resamples`` resamples seeded with ``seed``), ``no_verify_pass`` (request ids whose prefill token already
    ended them: not counted), ``wall_s`` (``replay``: this draft's forwards and walk; ``shared``: loading,
    generation and target forwards, paid once for all drafts), ``generation``, ``settings`` (with
    ``ACCEPTANCE_CONVENTION``), ``decoder_check`` (None unless ``check_against_decoder`` > 0),
    ``offline_format`` (all requests pooled in :func:`~eagle3.measure.offline.offline_acceptance`'s shape, for
    ``save_report(offline=...)`` and ``check_acceptance``) and ``per_request`` rows (``include_requests``). Raises what :func:`check_arguments` raises, before loading.
    """
    from tqdm.auto import tqdm

    sets = check_arguments(target_dir, drafts, list(prompt_sets), max_new_tokens, num_steps, dtype, device,
                           batch_size, resamples, check_against_decoder)
    t0 = time.perf_counter()
    target, tok, loaded, dev = _load(target_dir, drafts, dtype, device)
    load_s = time.perf_counter() - t0
    convs = [c for s in sets.values() for c in s]
    total = sum(len(c["turns"]) for c in convs)
    t0 = time.perf_counter()
    with tqdm(total=total, desc="generate", unit="req", disable=not progress) as bar:
        requests = generate_requests(target, tok, convs, max_new_tokens, batch_size=batch_size,
                                     num_steps=num_steps, progress=bar)
    gen_s = time.perf_counter() - t0
    with tqdm(total=total, desc=f"replay {len(loaded)} drafts", unit="req", disable=not progress) as bar:
        results, draft_s, target_s = replay_requests(target, loaded, requests, num_steps,
                                                     max_new_tokens=max_new_tokens, batch_size=batch_size,
                                                     progress=bar)
    generation = {"requests": len(requests), "completion_tokens": sum(len(r.output_ids) for r in requests),
                  "finished_by_stop": sum(r.finish_reason.get("type") == "stop" for r in requests),
                  "wall_s": gen_s}
    settings = {"target_dir": str(target_dir), "prompt_sets": list(sets), "max_new_tokens": max_new_tokens,
                "num_steps": num_steps, "topk": 1, "temperature": 0.0, "dtype": dtype, "device": dev,
                "batch_size": batch_size, "method": "replay (eagle3.measure.replay_core)",
                "bootstrap": {"resamples": resamples, "seed": seed, "confidence": DEFAULT_CONFIDENCE,
                              "method": METHOD},
                "convention": ACCEPTANCE_CONVENTION, "torch": torch.__version__, "python": platform.python_version()}
    out = {}
    for name, draft in loaded.items():
        rows = [_row(q, r) for q, r in zip(requests, results[name]) if r.verify_ct > 0]
        res = {"draft": name, "serving_dir": str(drafts[name]), **summarize(rows, resamples=resamples, seed=seed),
               "no_verify_pass": [q.id for q, r in zip(requests, results[name]) if r.verify_ct == 0],
               "wall_s": {"replay": draft_s[name], "shared": load_s + gen_s + target_s, "load": load_s,
                          "generation": gen_s, "target_forward": target_s},
               "generation": generation,
               "settings": {**settings, "serving_dir": str(drafts[name]),
                            "capture_indices": capture_indices(draft, target)},
               "decoder_check": None}
        res["per_position"], res["ci"] = res["overall"]["per_position"], res["overall"]["ci"]
        flat = offline_summary(rows, draft_s[name], res["settings"])   # offline_acceptance's shape
        res["offline_format"] = {k: v for k, v in flat.items() if k != "per_request"}
        if check_against_decoder:
            res["decoder_check"] = decoder_check(target, tok, draft, requests, results[name], check_against_decoder,
                                                 num_steps, max_new_tokens)
        if include_requests:
            res["per_request"] = rows
        out[name] = res
    return out
