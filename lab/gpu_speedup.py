"""Serving speedup of EAGLE-3 through the reference engine's fast path: plain vs speculative
decoding, one run.

Both modes run through the same engine (:class:`refengine.fastpath.FastDecoder`: static KV caches,
CUDA graphs on a GPU; plain decoding = ``generate(speculative=False)`` on the same instance), on the
same prompts (MT-Bench first turns, :mod:`eagle3.measure.prompts`, templated with the target's chat
template), greedy, batch size 1, ``--max-new-tokens`` new tokens per prompt (EOS ignored, so both
modes emit the same count). Rounds alternate plain, speculative, plain, …; figures are the median
over ``--rounds`` (≥ 3) rounds. One extra profiled round per mode times every piece on the device
(:mod:`refengine.timeline`).

Prediction (the figures printed next to the measured ratio): one verify iteration emits AL tokens on
average (AL = 1 + accepted drafts / verify passes, the project's convention) and costs

    t_iteration = t_verify + (k − 1)·t_draft + t_extend + t_host

(k = ``--num-steps``; the first draft token of an iteration comes from the draft *extend* over the
a+1 committed tokens, SGLang's EAGLE worker, so a chain of k tokens needs k − 1 draft steps; t_host
= the time the device waits between the end of the verify pass and the start of the next extend: the
one device→host transfer, emitting tokens, launching the next graph). Each is the median over the
profiled round's iterations, timed by device events. Plain decoding costs t_plain = t_plain_step +
t_plain_host per token. So

    tokens/s_spec ≈ AL / t_iteration,   speedup ≈ AL · t_plain / t_iteration,

given at the measured AL and at AL 2.0, 2.5, 3.0 (t_extend at a = AL − 1, interpolated between the
extend graphs' timings). Random drafts accept almost nothing (AL ≈ 1.0): the random shapes measure
the timings; the ``--target/--draft`` mode measures a trained draft's real AL and speedup, also
through the HTTP server.

Self-check (before the timed rounds, first prompt): the fast path's tokens and per-verify accept
counts against the generic ``SpeculativeDecoder`` on the same models, and its plain decoding against
HF ``generate`` (greedy), in float32 (``--self-check-dtype``; the models are built in float32,
checked, then cast to ``--dtype``), and again in ``--dtype``, where a near-tie between two tokens
may flip legitimately: a mismatch prints the logit gap of the two tokens. A float32 mismatch with a
gap above 1e-3 fails the run.

Modes:

    python lab/gpu_speedup.py --shape smollm2 --prompt-ids P.json --out $OUT/speedup_smollm2.json
    python lab/gpu_speedup.py --shape llama8b --prompt-ids P.json --out $OUT/speedup_llama8b.json
    python lab/gpu_speedup.py --target T --draft D --prompt-ids P.json --out $OUT/speedup.json
        # + the HTTP reference server (launcher behind the readiness gate), concurrency 1 and 4
    python lab/gpu_speedup.py --export-prompt-ids P.json
        # here: MT-Bench ids for a machine without the MT-Bench wheel (SmolLM2 template)
    python lab/gpu_speedup.py --tiny --device cpu --out /tmp/s.json   # CPU smoke run

``--compare-generic N`` adds N alternating rounds on the first prompt of the fast path against the
generic one (HF ``generate`` for plain decoding, ``SpeculativeDecoder`` for speculative): the host
overhead removed.

Prints one line per finished round, the table last; writes every figure to ``--out`` (JSON,
rewritten after each stage). Exit 0; 1 when a stage failed or the float32 self-check found a real
mismatch; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.speedup_parts import (  # noqa: E402
    check_args,
    generic_compare,
    http_rounds,
    load_prompts_ids,
    predictions,
    print_table,
    self_check,
    summarize_profile,
    target_from_gguf,
)

AL_POINTS = (2.0, 2.5, 3.0)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--shape",
        choices=["smollm2", "llama8b"],
        default=None,
        help="random weights of a published shape (default smollm2 unless --target)",
    )
    p.add_argument("--target", default=None, help="an HF Llama target folder (with --draft)")
    p.add_argument(
        "--draft", default=None, help="an SGLang-format EAGLE-3 draft folder (with --target)"
    )
    p.add_argument(
        "--gguf",
        default=None,
        help="instead of --target: the SmolLM2-135M-Instruct GGUF, converted "
        "into --work/cache by eagle3.assets.prepare_smollm2",
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="CPU smoke run: tiny random shape, 2 prompts x 16 tokens",
    )
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16", "float16", "float32"],
        help="default bfloat16 on cuda, float32 on cpu",
    )
    p.add_argument("--self-check-dtype", default="float32", choices=["float32", "none"])
    p.add_argument("--self-check-tokens", type=int, default=64)
    p.add_argument(
        "--num-steps", type=int, default=3, help="draft tokens per verify pass (chain, topk 1)"
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--prompts", default="mtbench", help="mtbench | gsm8k | humaneval | a prompt file"
    )
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument(
        "--prompt-ids",
        default=None,
        help="JSON written by --export-prompt-ids (no tokenizer needed)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer folder for random shapes (default: the asset cache's SmolLM2 folder)",
    )
    p.add_argument(
        "--export-prompt-ids",
        default=None,
        help="write the templated prompt ids to this file, exit",
    )
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="static cache positions (default: enough for the longest prompt, in 256s)",
    )
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's; 1 with "
        "--tiny: contended threads are ~20x slower here)",
    )
    p.add_argument(
        "--http",
        dest="http",
        action="store_true",
        default=None,
        help="also through the HTTP reference server (default on with --draft)",
    )
    p.add_argument("--no-http", dest="http", action="store_false")
    p.add_argument("--concurrency", default="1,4", help="HTTP concurrencies, comma list")
    p.add_argument(
        "--compare-generic",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also time the generic path (HF generate, SpeculativeDecoder) against the fast path "
        "on the first prompt, this many rounds (default 0: off)",
    )
    p.add_argument(
        "--work", default="/tmp/eagle3-gpu-speedup", help="HTTP server logs and gate diagnostics"
    )
    p.add_argument("--out", default=f"lab/results/{time.strftime('%Y-%m-%d')}_gpu_speedup.json")
    a = p.parse_args(argv)
    try:
        check_args(a)
    except ValueError as e:
        p.error(str(e))
    return a


class Run:
    """The figures of this run, rewritten to ``--out`` after every stage (a cut-off run keeps what
    it did)."""

    def __init__(self, a: argparse.Namespace):
        self.path = Path(a.out)
        self.data: dict = {
            "settings": {k: v for k, v in vars(a).items()},
            "rounds": [],
            "errors": [],
        }
        if a.draft:  # identifies the draft when its figures join a study (study_speedup.py)
            from lab.study_speedup import draft_digest

            self.data["draft_sha256"] = draft_digest(Path(a.draft))

    def save(self) -> None:
        from eagle3.artifacts import atomic_write_json

        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, self.data)

    def stage(self, name: str, fn):
        """Run ``fn()``, store its result under ``name``; a failure is printed loudly, recorded, and
        returns None."""
        try:
            self.data[name] = fn()
            return self.data[name]
        except Exception as e:  # noqa: BLE001
            # every stage's failure is reported and makes the exit code 1
            print(f"!!! stage {name} FAILED: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
            self.data["errors"].append({"stage": name, "error": f"{type(e).__name__}: {e}"})
            return None
        finally:
            self.save()


def build_models(a, dtype):
    """``(target, draft)`` on ``a.device`` in ``dtype``: random of ``a.shape``, or loaded from the
    folders."""
    import torch

    if a.target:
        from eagle3.engines.sglang.draft import SGLangEagle3Draft
        from eagle3.target_model import load_target

        name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[
            dtype
        ]
        target, _ = load_target(a.target, dtype=name, device=a.device)
        draft = SGLangEagle3Draft.from_dir(
            a.draft,
            dtype=dtype,
            device=a.device,
            target_embed=target.get_input_embeddings().weight.detach(),
            target_head=target.get_output_embeddings().weight.detach(),
        )
        return target, draft
    from testkit.random_models import DRAFT_VOCAB, random_draft, random_target

    target = random_target(a.shape, a.device, dtype)
    return target, random_draft(target, DRAFT_VOCAB[a.shape], a.device, dtype)


def one_pass(fast, prompts: list[dict], n: int, speculative: bool, profile: bool = False) -> dict:
    """Every prompt once → tokens, wall seconds, verify passes, accepted drafts, piece timings."""
    tokens = verify = accepted = 0
    profs = []
    t0 = time.perf_counter()
    for p in prompts:
        prof = {} if profile else None
        r = fast.generate(p["input_ids"], n, ignore_eos=True, speculative=speculative, profile=prof)
        tokens, verify, accepted = (
            tokens + r.completion_tokens,
            verify + r.verify_ct,
            accepted + sum(r.accept_counts),
        )
        if profile:
            profs.append(prof)
    wall = time.perf_counter() - t0
    out = {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "verify_ct": verify,
        "accepted": accepted,
    }
    if profile:
        out["profiles"] = profs
    return out


def timed_rounds(run: Run, fast, prompts, a) -> dict:
    """Warm-up, then ``a.rounds`` alternating rounds (plain, speculative), then one profiled round
    of each."""
    n = a.max_new_tokens
    for spec in (False, True):
        fast.generate(prompts[0]["input_ids"], min(n, 16), ignore_eos=True, speculative=spec)
    for r in range(a.rounds):
        for mode, spec in (("plain", False), ("speculative", True)):
            res = one_pass(fast, prompts, n, spec)
            run.data["rounds"].append({"round": r, "mode": mode, **res})
            al = f", AL {1 + res['accepted'] / res['verify_ct']:.3f}" if spec else ""
            print(
                f"round {r + 1}/{a.rounds} {mode}: {res['tokens']} tokens in "
                f"{res['wall_s']:.2f} s = {res['tokens_per_s']:.1f} tokens/s{al}",
                flush=True,
            )
        run.save()
    prof = {
        m: one_pass(fast, prompts, n, spec, profile=True)
        for m, spec in (("plain", False), ("speculative", True))
    }
    return summarize_profile(run.data["rounds"], prof, a.num_steps)


def prepare_engine(run: Run, a, prompts, ctx: int, dtype):
    """Models and the engine in ``dtype``; before that, the float32 self-check (models built in
    float32, checked, then cast: the same weights, rounded once)."""
    import gc

    import torch

    from refengine.fastpath import FastDecoder

    def engine(t, d):
        return FastDecoder(
            t,
            d,
            None,
            num_steps=a.num_steps,
            max_context=ctx,
            use_cuda_graphs=not a.disable_cuda_graph,
        )

    strict = a.self_check_dtype == "float32"
    target, draft = build_models(a, torch.float32 if strict else dtype)
    if strict and dtype != torch.float32:
        fast32 = engine(target, draft)
        print(f"self-check engine (float32): {fast32.describe()}", flush=True)
        run.stage(
            "self_check_float32",
            lambda: self_check(fast32, prompts[0]["input_ids"], a.self_check_tokens, strict=True),
        )
        del fast32
        gc.collect()
        target, draft = target.to(dtype), draft.to(dtype)
        if torch.device(a.device).type == "cuda":
            torch.cuda.empty_cache()
    fast = engine(target, draft)
    name = "self_check_float32" if strict and dtype == torch.float32 else f"self_check_{a.dtype}"
    run.stage(
        name,
        lambda: self_check(
            fast, prompts[0]["input_ids"], a.self_check_tokens, strict=name == "self_check_float32"
        ),
    )
    return target, draft, fast


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)

    if a.gguf:
        a.target = target_from_gguf(a.gguf, a.work)
        a.tokenizer = a.tokenizer or a.target
        print(f"target converted from {a.gguf}: {a.target}", flush=True)
    prompts = load_prompts_ids(a)
    if a.export_prompt_ids:
        from eagle3.artifacts import atomic_write_json

        atomic_write_json(
            a.export_prompt_ids, {"source": a.prompts, "tokenizer": a.tokenizer, "prompts": prompts}
        )
        print(f"wrote {len(prompts)} prompts to {a.export_prompt_ids}")
        return 0
    run = Run(a)
    dev = torch.device(a.device)
    longest = max(len(p["input_ids"]) for p in prompts)
    ctx = a.context_length or -(-(longest + a.max_new_tokens + a.num_steps + 1) // 256) * 256
    dtype = getattr(torch, a.dtype)
    run.data["device"] = {
        "name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "context_length": ctx,
        "prompts": len(prompts),
        "prompt_tokens": [len(p["input_ids"]) for p in prompts],
    }
    print(
        f"device {run.data['device']['name']}; torch {torch.__version__}; {len(prompts)} "
        f"prompts ({min(run.data['device']['prompt_tokens'])}-{longest} tokens) x "
        f"{a.max_new_tokens} new tokens; k={a.num_steps}; static cache {ctx} positions",
        flush=True,
    )
    target, draft, fast = prepare_engine(run, a, prompts, ctx, dtype)
    run.data["graph_status"] = fast.graph_status
    print(f"engine: {fast.describe()}", flush=True)
    if not fast.graph_status.startswith("on") and dev.type == "cuda" and not a.disable_cuda_graph:
        print(f"!!! CUDA GRAPHS OFF: {fast.graph_status}; timings below are eager", flush=True)
    summary = run.stage("summary", lambda: timed_rounds(run, fast, prompts, a))
    if summary:
        run.stage("predicted", lambda: predictions(summary, AL_POINTS))
    if a.compare_generic:
        run.stage(
            "generic_compare",
            lambda: generic_compare(
                fast, prompts[0]["input_ids"], a.max_new_tokens, a.compare_generic
            ),
        )
    if a.http:
        del fast, target, draft
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        run.stage("http", lambda: http_rounds(a, prompts, ctx))
    print_table(run.data, a)
    strict = run.data.get("self_check_float32") or {}
    failed = bool(run.data["errors"]) or strict.get("verdict") == "MISMATCH"
    print(
        f"results: {run.path}" + ("  (FAILED: see errors / self-check above)" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
