"""The offline acceptance figure: what the served benchmark would measure if serving lost nothing.

Exact greedy replay in-process (:mod:`eagle3.measure.replay`; chain, topk 1, temperature 0); the
gap to served is the gate's serving fault (``bench.acceptance_verdict``); bench settings it cannot
follow are labelled (:func:`unlike_served`). :func:`offline_acceptance`: one draft, bench prompts;
:func:`evaluate_drafts`: many drafts, whole prompt sets, bootstrap interval (``spread``)."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from eagle3.config import BENCH_MAX_NEW_TOKENS, BENCH_NUM_PROMPTS, BENCH_PROMPTS
from eagle3.errors import ConfigError, DataError
from eagle3.measure.acceptance import (ACCEPTANCE_CONVENTION, all_positions_acceptance_length,
                                       exact_acceptance_length, sum_lists)
from eagle3.measure.prompts import encode_prompts, load_conversations, load_prompts
from eagle3.measure.replay import (Request, capture_indices, generate_requests, prompt_requests,
                                   replay_requests)
from eagle3.measure.spread import (DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, METHOD,
                                   bootstrap_acceptance)

DEFAULT_SETS = ("mtbench2", "gsm8k200")
REPLAY_METHOD = "replay (eagle3.measure.replay)"  # the ``method`` of a replayed figure
GROUP_KEYS = ("acceptance_length", "acceptance_length_sglang", "acceptance_rate", "per_position",
              "histogram", "acceptance_length_all_positions", "out_of_draft_vocab_share")


def unlike_served(temperature: float, topk: int = 1) -> str | None:
    """Why greedy chain does not predict a bench at ``temperature``/``topk``, or None."""
    why = [w for w, on in ((f"temperature {temperature:g} (sampling)", temperature >= 1e-6),
                           (f"speculative_eagle_topk {topk} (tree drafting)", topk > 1)) if on]
    return None if not why else (
        "the offline figure is greedy chain decoding (temperature 0, topk 1) and the bench serves "
        f"with {' and '.join(why)}: reported beside the served figure, not compared")


def _load(target_dir, drafts: Mapping, dtype: str, device: str):
    """``(target, tokenizer, {name: SGLangEagle3Draft}, device)``; shared embed/head (SGLang)."""
    from eagle3.engines.sglang.draft import SGLangEagle3Draft
    from eagle3.target_model import load_target, torch_dtype

    target, tok = load_target(target_dir, dtype=dtype, device=device)
    embed = target.get_input_embeddings().weight.detach()
    head = target.get_output_embeddings().weight.detach()
    dev = str(next(target.parameters()).device)
    loaded = {n: SGLangEagle3Draft.from_dir(d, dtype=torch_dtype(dtype), device=dev,
                                            target_embed=embed, target_head=head)
              for n, d in drafts.items()}
    return target, tok, loaded, dev


def offline_acceptance(target_dir: str | Path, serving_dir: str | Path | None,
                       prompts: Any = BENCH_PROMPTS, *, num_prompts: int = BENCH_NUM_PROMPTS,
                       max_new_tokens: int = BENCH_MAX_NEW_TOKENS, num_steps: int = 3,
                       dtype: str = "float32", temperature: float = 0.0, topk: int = 1,
                       seed: int = 0, capture_aux: bool = True, decoder=None, device: str = "cpu",
                       chat_template_kwargs: dict | None = None, cpu_threads: int | None = None,
                       batch_size: int = 16) -> dict:
    """The draft's acceptance length in-process on ``run_bench``'s prompts and template by exact
    greedy replay; ``per_position[k]`` = passes accepting draft k+1 / passes.
    ``capture_aux=False``: final hidden state only (broken-integration reference). ``dtype``:
    float32, bfloat16, float16 or ``auto``. ``temperature``/``topk``: the bench's. ``decoder``:
    ``generate(ids, max_new_tokens, temperature=, seed=)`` and ``num_steps``, used instead.
    Returns :func:`offline_summary` keys + ``unlike_served``. DataError: no verify pass."""
    from transformers import AutoTokenizer

    from eagle3.precision import resolve_dtype, torch_threads

    plist = list(prompts) if isinstance(prompts, list) else load_prompts(prompts, num_prompts)
    if decoder is None:
        dtype = resolve_dtype(dtype, device)
        target, tokenizer, drafts, _ = _load(target_dir, {"d": serving_dir}, dtype, device)
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    ids = encode_prompts(plist, tokenizer, chat_template_kwargs)
    if decoder is not None:
        num_steps, capture_aux = decoder.num_steps, getattr(decoder, "capture_aux", capture_aux)
    settings = {
        "target_dir": str(target_dir), "serving_dir": str(serving_dir), "num_steps": num_steps,
        "dtype": dtype, "max_new_tokens": max_new_tokens,
        "temperature": temperature if decoder is not None else 0.0,
        "num_prompts": len(plist), "capture_aux": capture_aux, "convention": ACCEPTANCE_CONVENTION,
        "method": "decoder" if decoder is not None else REPLAY_METHOD}
    t0 = time.perf_counter()
    with torch_threads(cpu_threads if str(device).startswith("cpu") else None):
        if decoder is not None:
            results = [decoder.generate(x, max_new_tokens, temperature=temperature, seed=seed)
                       for x in ids]
            out = offline_summary([offline_row(p, r) for p, r in zip(plist, results)],
                                  time.perf_counter() - t0, settings)
        else:
            reqs = prompt_requests(target, ids, [(p["id"], p["category"], "") for p in plist],
                                   max_new_tokens, num_steps, batch_size=batch_size,
                                   pad_id=tokenizer.pad_token_id)
            out = replay_summaries(target, drafts, reqs, num_steps, max_new_tokens=max_new_tokens,
                                   batch_size=batch_size, capture_aux=capture_aux,
                                   settings=settings, started=t0)["d"]
    out["unlike_served"] = unlike_served(temperature if decoder is None else 0.0, topk)
    return out


def offline_row(prompt: dict, res) -> dict:
    """One request's figures from a decoder result (``output_ids``, ``verify_ct``,
    ``accepted_per_position``, ``num_draft_tokens``/``histogram``; from replay also
    ``position_histogram`` and ``out_of_draft_vocab``, else ``[]`` / None). DataError: no verify
    pass."""
    n_out, verify = len(res.output_ids), int(res.verify_ct)
    if verify <= 0:
        raise DataError(f"offline_acceptance: prompt {prompt['id']}: expected verify_ct > 0, "
                        f"got {verify}")
    accepted = [int(a) for a in (res.accepted_per_position or [])]
    return {"id": prompt["id"], "category": prompt["category"], "completion_tokens": n_out,
            "verify_ct": verify,
            "acceptance_length": exact_acceptance_length(sum(accepted), verify),
            "acceptance_length_sglang": n_out / verify, "accepted_per_position": accepted,
            "num_draft_tokens": getattr(res, "num_draft_tokens", None),
            "histogram": list(getattr(res, "histogram", None) or []),
            "position_histogram": list(getattr(res, "position_histogram", None) or []),
            "out_of_draft_vocab": getattr(res, "out_of_draft_vocab", None)}


def replay_summaries(target, drafts: Mapping, requests: list[Request], num_steps: int, *,
                     max_new_tokens: int, batch_size: int = 16, capture_aux: bool = True,
                     settings: dict | None = None, started: float | None = None,
                     skip_no_pass: bool = False) -> dict[str, dict]:
    """Replay and summarise: every draft (``{name: SGLangEagle3Draft}``) replayed over
    ``requests`` (:func:`eagle3.measure.replay.replay_requests`), then ``{name:
    offline_summary}`` of its :func:`offline_row` rows (id and category from each request) with
    ``settings``; ``wall_s`` counts from ``started`` (a ``time.perf_counter()`` value; None: the
    replay's start). A request without a verify pass raises DataError unless ``skip_no_pass``
    leaves it out."""
    t0 = time.perf_counter() if started is None else started
    results = replay_requests(target, drafts, requests, num_steps, max_new_tokens=max_new_tokens,
                              batch_size=batch_size, capture_aux=capture_aux)[0]
    rows = {name: [offline_row({"id": q.id, "category": q.category}, r)
                   for q, r in zip(requests, res) if r.verify_ct or not skip_no_pass]
            for name, res in results.items()}
    wall_s = time.perf_counter() - t0
    return {name: offline_summary(r, wall_s, dict(settings or {})) for name, r in rows.items()}


def offline_summary(rows: list[dict], wall_s: float, settings: dict) -> dict:
    """Pooled rows: token-weighted length, rate, per position/category, histogram, ``wall_s``;
    ``acceptance_length_all_positions`` (every position a pass could start at, pooled
    ``position_histogram``) and ``out_of_draft_vocab_share`` (of the completion tokens), None
    unless every row has them (replay)."""
    total_v = sum(r["verify_ct"] for r in rows)
    accepted = sum_lists([r["accepted_per_position"] for r in rows])
    proposed = [r["num_draft_tokens"] for r in rows]
    per_cat = {cat: {"acceptance_length": exact_acceptance_length(
                         sum(sum(r["accepted_per_position"]) for r in sel),
                         sum(r["verify_ct"] for r in sel)), "num_requests": len(sel)}
               for cat, sel in _by(rows, lambda r: r["category"]).items()}
    rate = (sum(accepted) / sum(proposed)) if None not in proposed and sum(proposed) else None
    replayed = bool(rows) and all(r.get("position_histogram") for r in rows)
    oov = [r.get("out_of_draft_vocab") for r in rows]
    tokens = sum(r["completion_tokens"] for r in rows)
    return {"acceptance_length": exact_acceptance_length(sum(accepted), total_v),
            "acceptance_length_sglang": sum(r["completion_tokens"] for r in rows) / total_v,
            "acceptance_rate": rate, "per_position": [a / total_v for a in accepted],
            "histogram": sum_lists([r["histogram"] for r in rows]), "per_category": per_cat,
            "acceptance_length_all_positions": all_positions_acceptance_length(
                sum_lists([r["position_histogram"] for r in rows])) if replayed else None,
            "out_of_draft_vocab_share":
                sum(oov) / tokens if rows and None not in oov and tokens else None,
            "per_request": rows, "wall_s": wall_s, "settings": settings}


# --- many drafts on whole prompt sets ---

def check_arguments(target_dir, drafts: Mapping, prompt_sets: Sequence[str], max_new_tokens: int,
                    num_steps: int, dtype: str, device: str, batch_size: int, resamples: int,
                    check_against_decoder: int, make_decoder: Callable | None = None) -> dict:
    """Validate :func:`evaluate_drafts`' arguments before loading; returns conversations per set.
    ConfigError / DataError name the argument, the expected and the actual value."""
    from eagle3.target_model import resolve_device, torch_dtype

    if not (Path(target_dir) / "config.json").is_file():
        raise ConfigError(f"target_dir {target_dir}: expected an HF model folder with config.json, "
                          "found none")
    if not drafts:
        raise ConfigError("drafts: expected at least one {name: serving_dir}, got none")
    for name, d in drafts.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"drafts: expected non-empty string names, got {name!r}")
        if not (Path(d) / "config.json").is_file():
            raise ConfigError(f"draft {name!r}: {d}: expected an SGLang draft folder with "
                              "config.json, found none")
        try:
            conf = json.loads((Path(d) / "config.json").read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            conf = {}  # the loader reports an unreadable config
        if isinstance(conf, dict) and "speculators_model_type" in conf:
            raise ConfigError(f"draft {name!r}: {d}: expected an SGLang draft folder, got a "
                              f"speculators training checkpoint; convert it first: eagle3 convert "
                              f"{d} DST --to sglang")
    for label, value, low in (("max_new_tokens", max_new_tokens, 1), ("num_steps", num_steps, 1),
                              ("batch_size", batch_size, 1),
                              ("check_against_decoder", check_against_decoder, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{label}: expected an integer >= {low}, got {value!r}")
    if check_against_decoder and make_decoder is None:
        raise ConfigError("check_against_decoder: needs make_decoder (a decoder factory, e.g. the "
                          "reference engine's SpeculativeDecoder.from_models)")
    if resamples < 1000:
        raise ConfigError(f"resamples: expected >= 1000 bootstrap resamples, got {resamples}")
    torch_dtype(dtype)
    dev = resolve_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: {device!r} asked, but torch {torch.__version__} sees no CUDA "
                          "device")
    if not prompt_sets or len(set(prompt_sets)) != len(prompt_sets):
        raise ConfigError(f"prompt_sets: expected distinct set names, got {list(prompt_sets)}")
    return {s: load_conversations(s) for s in prompt_sets}


def _group(rows: list[dict], resamples: int, seed: int) -> dict:
    """``offline_summary``'s acceptance keys, counts, bootstrap ``ci`` (low, high, units)."""
    s = offline_summary(rows, 0.0, {})
    ci = bootstrap_acceptance(rows, resamples=resamples, seed=seed)
    return {**{k: s[k] for k in GROUP_KEYS}, "num_requests": len(rows),
            "completion_tokens": sum(r["completion_tokens"] for r in rows),
            "verify_ct": sum(r["verify_ct"] for r in rows),
            "ci": {k: v for k, v in ci.items() if k in ("low", "high", "units")}}


def _by(rows: list[dict], key) -> dict[str, list[dict]]:
    """``rows`` grouped by ``key(row)``, first-seen order."""
    return {k: [r for r in rows if key(r) == k] for k in dict.fromkeys(map(key, rows))}


def summarize(rows: list[dict], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict:
    """:func:`_group` overall, per set, category, turn and category × turn (``"turn1"``...)."""
    g = lambda sel: _group(sel, resamples, seed)  # noqa: E731
    turn, cat = (lambda r: f"turn{r['turn']}"), (lambda r: r["category"])  # noqa: E731
    out = {"overall": g(rows), "per_set": {}, "per_category": {}, "per_turn": {},
           "per_category_turn": {}}
    for name, sel in _by(rows, lambda r: r["set"]).items():
        out["per_set"][name] = g(sel)
        out["per_category"][name] = {c: g(x) for c, x in _by(sel, cat).items()}
        if len({r["turn"] for r in sel}) > 1:
            out["per_turn"][name] = {t: g(x) for t, x in _by(sel, turn).items()}
            out["per_category_turn"][name] = {c: {t: g(y) for t, y in _by(x, turn).items()}
                                              for c, x in _by(sel, cat).items()}
    return out


def decoder_check(decoder, requests: list[Request], results: list, n: int,
                  max_new_tokens: int) -> dict:
    """``n`` requests decoded by ``decoder`` vs replay: ``{"n", "equal", "different": [{"id",
    "fields", "first_output_difference"}], "wall_s"}`` (a difference: a near-tie, or a bug)."""
    t0 = time.perf_counter()
    picks = sorted({int(i * len(requests) / n) for i in range(min(n, len(requests)))})
    different = []
    for i in picks:
        got, want = results[i], decoder.generate(requests[i].prompt_ids, max_new_tokens)
        fields = [f for f in ("output_ids", "verify_ct", "accepted_per_position", "histogram")
                  if getattr(got, f) != getattr(want, f)]
        if fields:
            first = next((p for p, (a, b) in enumerate(zip(got.output_ids, want.output_ids))
                          if a != b), min(len(got.output_ids), len(want.output_ids)))
            different.append({"id": requests[i].id, "fields": fields,
                              "first_output_difference": first if "output_ids" in fields else None})
    return {"n": len(picks), "equal": len(picks) - len(different), "different": different,
            "wall_s": time.perf_counter() - t0}


def evaluate_drafts(target_dir: str | Path, drafts: Mapping[str, str | Path], *,
                    prompt_sets: Sequence[str] = DEFAULT_SETS, max_new_tokens: int = 256,
                    num_steps: int = 3, dtype: str = "float32", device: str = "auto",
                    batch_size: int = 16, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                    check_against_decoder: int = 0, make_decoder: Callable | None = None,
                    include_requests: bool = True, progress: bool = True) -> dict[str, dict]:
    """Greedy chain acceptance of every draft ({name: SGLang serving folder}) on ``prompt_sets``;
    continuations generated once, the target run once per batch for all drafts.
    ``check_against_decoder=N``: :func:`decoder_check` via ``make_decoder(target, draft, tokenizer,
    num_steps=)``. Returns ``{name: result}``: :func:`summarize` groups, ``no_verify_pass``,
    ``wall_s``, ``generation``, ``settings``, ``decoder_check``, ``offline_format``,
    ``per_request``. Raises what :func:`check_arguments` raises, before loading."""
    from tqdm.auto import tqdm

    sets = check_arguments(target_dir, drafts, list(prompt_sets), max_new_tokens, num_steps, dtype,
                           device, batch_size, resamples, check_against_decoder, make_decoder)
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
    with tqdm(total=total, desc=f"replay {len(loaded)} drafts", unit="req",
              disable=not progress) as bar:
        results, draft_s, target_s = replay_requests(target, loaded, requests, num_steps,
                                                     max_new_tokens=max_new_tokens,
                                                     batch_size=batch_size, progress=bar)
    generation = {"requests": len(requests),
                  "completion_tokens": sum(len(r.output_ids) for r in requests),
                  "finished_by_stop": sum(r.finish_reason.get("type") == "stop" for r in requests),
                  "wall_s": gen_s}
    settings = {"target_dir": str(target_dir), "prompt_sets": list(sets),
                "max_new_tokens": max_new_tokens, "num_steps": num_steps, "topk": 1,
                "temperature": 0.0, "dtype": dtype, "device": dev, "batch_size": batch_size,
                "method": REPLAY_METHOD,
                "bootstrap": {"resamples": resamples, "seed": seed,
                              "confidence": DEFAULT_CONFIDENCE, "method": METHOD},
                "convention": ACCEPTANCE_CONVENTION, "torch": torch.__version__,
                "python": platform.python_version()}
    out = {}
    for name, draft in loaded.items():
        rows = [{**offline_row({"id": q.id, "category": q.category}, r), "set": q.set,
                 "turn": q.turn, "conversation": f"{q.set}:{q.conversation}",
                 "prompt_tokens": len(q.prompt_ids), "finish_reason": r.finish_reason}
                for q, r in zip(requests, results[name]) if r.verify_ct > 0]
        res = {"draft": name, "serving_dir": str(drafts[name]),
               **summarize(rows, resamples=resamples, seed=seed),
               "no_verify_pass": [q.id for q, r in zip(requests, results[name])
                                  if r.verify_ct == 0],
               "wall_s": {"replay": draft_s[name], "shared": load_s + gen_s + target_s,
                          "load": load_s, "generation": gen_s, "target_forward": target_s},
               "generation": generation, "decoder_check": None,
               "settings": {**settings, "serving_dir": str(drafts[name]),
                            "capture_indices": capture_indices(draft, target)}}
        res["per_position"], res["ci"] = res["overall"]["per_position"], res["overall"]["ci"]
        flat = offline_summary(rows, draft_s[name], res["settings"])   # offline_acceptance's shape
        res["offline_format"] = {k: v for k, v in flat.items() if k != "per_request"}
        if check_against_decoder:
            dec = make_decoder(target, draft, tok, num_steps=num_steps)
            res["decoder_check"] = decoder_check(dec, requests, results[name],
                                                 check_against_decoder, max_new_tokens)
        if include_requests:
            res["per_request"] = rows
        out[name] = res
    return out
