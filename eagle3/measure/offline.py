"""The offline acceptance figure: the draft decoded in-process (no server) by the reference engine's decoder.

What the served benchmark would measure if serving lost nothing; the gap between the two is the serving
fault the acceptance gate reports (eagle3.measure.bench.acceptance_verdict).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from eagle3.config import BENCH_MAX_NEW_TOKENS, BENCH_NUM_PROMPTS, BENCH_PROMPTS
from eagle3.errors import DataError
from eagle3.measure.acceptance import ACCEPTANCE_CONVENTION, exact_acceptance_length
from eagle3.measure.prompts import encode_prompts, load_prompts


def offline_acceptance(target_dir: str | Path, serving_dir: str | Path | None, prompts: Any = BENCH_PROMPTS, *,
                       num_prompts: int = BENCH_NUM_PROMPTS, max_new_tokens: int = BENCH_MAX_NEW_TOKENS, num_steps: int = 3, dtype: str = "float32",
                       temperature: float = 0.0, seed: int = 0, capture_aux: bool = True, decoder=None,
                       device: str = "cpu", chat_template_kwargs: dict | None = None,
                       cpu_threads: int | None = None) -> dict:
    """The draft's acceptance length in-process (no server) with the reference engine's decoder
    (``refengine.loader.load_decoder``: the fast path for Llama targets, exactly equal to
    ``SpeculativeDecoder`` in float32; the generic path otherwise).

    Same prompts and template as :func:`eagle3.measure.bench.run_bench` (the target's tokenizer in ``target_dir``). Acceptance
    length = Σ output tokens / Σ verify passes; ``per_position[k]`` = Σ passes that accepted draft position k+1
    / Σ verify passes. ``capture_aux=False`` feeds the draft only the final hidden state (what an engine that
    captures no aux states does) — the broken-integration reference. ``decoder``: an already built decoder
    (then ``serving_dir``/``num_steps``/``dtype``/``capture_aux`` are not used). ``dtype``: float32, bfloat16,
    float16 or ``auto`` (bf16 where it is fast on ``device``: eagle3.precision.resolve_dtype). ``cpu_threads``:
    torch threads while decoding on a CPU (restored after; None = unchanged), as ``serve.cpu_threads`` sets them
    for the reference engine.
    Returns ``{"acceptance_length", "acceptance_rate", "per_position", "histogram", "per_category",
    "per_request", "wall_s", "settings"}``. Raises DataError for a result with no verify pass.
    """
    from transformers import AutoTokenizer

    plist = list(prompts) if isinstance(prompts, list) else load_prompts(prompts, num_prompts)
    ids = encode_prompts(plist, AutoTokenizer.from_pretrained(str(target_dir)), chat_template_kwargs)
    if decoder is None:
        from eagle3.precision import resolve_dtype
        from refengine.loader import load_decoder

        dtype = resolve_dtype(dtype, device)

        decoder, _path = load_decoder(target_dir, serving_dir, num_steps=num_steps, dtype=dtype, device=device,
                                      capture_aux=capture_aux)  # the reference engine's own decoder
    rows = []
    t0 = time.perf_counter()
    from eagle3.precision import torch_threads

    with torch_threads(cpu_threads if str(device).startswith("cpu") else None):
        for p, x in zip(plist, ids):
            res = decoder.generate(x, max_new_tokens, temperature=temperature, seed=seed)
            rows.append(offline_row(p, res))
    return offline_summary(rows, time.perf_counter() - t0, {
        "target_dir": str(target_dir), "serving_dir": str(serving_dir), "num_steps": decoder.num_steps,
        "dtype": dtype, "max_new_tokens": max_new_tokens, "temperature": temperature, "num_prompts": len(plist),
        "capture_aux": getattr(decoder, "capture_aux", capture_aux), "convention": ACCEPTANCE_CONVENTION})


def offline_row(prompt: dict, res) -> dict:
    """One request's figures from a decoder result (``output_ids``, ``verify_ct``, ``accepted_per_position``,
    optional ``num_draft_tokens``/``histogram``). Raises DataError for a result with no verify pass."""
    n_out, verify = len(res.output_ids), int(res.verify_ct)
    if verify <= 0:
        raise DataError(f"offline_acceptance: prompt {prompt['id']}: expected verify_ct > 0, got {verify}")
    return {"id": prompt["id"], "category": prompt["category"], "completion_tokens": n_out, "verify_ct": verify,
            "acceptance_length": exact_acceptance_length(sum(res.accepted_per_position or []), verify),
            "acceptance_length_sglang": n_out / verify,
            "accepted_per_position": [int(a) for a in (res.accepted_per_position or [])],
            "num_draft_tokens": getattr(res, "num_draft_tokens", None),
            "histogram": list(getattr(res, "histogram", None) or [])}


def offline_summary(rows: list[dict], wall_s: float, settings: dict) -> dict:
    """:func:`offline_row` rows pooled: token-weighted acceptance length (bonus token counted), rate, per
    position, histogram and per category; ``wall_s`` in seconds."""
    total_v = sum(r["verify_ct"] for r in rows)
    width = max((len(r["accepted_per_position"]) for r in rows), default=0)
    accepted = [sum(r["accepted_per_position"][k] for r in rows if k < len(r["accepted_per_position"]))
                for k in range(width)]
    proposed = [r["num_draft_tokens"] for r in rows]
    hist = [sum(r["histogram"][j] for r in rows if j < len(r["histogram"]))
            for j in range(max((len(r["histogram"]) for r in rows), default=0))]
    per_cat = {}
    for cat in dict.fromkeys(r["category"] for r in rows):
        sel = [r for r in rows if r["category"] == cat]
        per_cat[cat] = {"acceptance_length": exact_acceptance_length(
                            sum(sum(r["accepted_per_position"]) for r in sel), sum(r["verify_ct"] for r in sel)),
                        "num_requests": len(sel)}
    return {"acceptance_length": exact_acceptance_length(sum(accepted), total_v),
            "acceptance_length_sglang": sum(r["completion_tokens"] for r in rows) / total_v,
            "acceptance_rate": (sum(accepted) / sum(proposed)) if None not in proposed and sum(proposed) else None,
            "per_position": [a / total_v for a in accepted], "histogram": hist, "per_category": per_cat,
            "per_request": rows, "wall_s": wall_s, "settings": settings}
