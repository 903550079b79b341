"""Fidelity of the CPU reference engine to the real SGLang 0.5.23, request by request: the same
draft, target, prompts and token budget on both engines, greedy decoding, chain drafting (topk 1,
EOS ignored so every request runs its whole budget), and the target's own greedy output
(transformers, float32, no draft) as the yardstick.

    python lab/sglang_fidelity.py [--config configs/tiny-random.yaml] [--draft SERVING_DIR]
        [--num-prompts 2] [--max-new-tokens 12] [--num-steps 3]
        [--out lab/results/DATE_sglang_fidelity.json]

Per request it compares the output tokens (both engines against the target's greedy output), the
draft tokens each verify pass accepted (SGLang's per-pass counts are read from the sizes of its
streamed chunks, one per pass) and the acceptance length (``1 + accepted drafts / verify passes``,
the same definition on both sides: each engine's own count of accepted drafts, before truncation at
the budget). Where the engines part, it names the first request, pass and output position and says
why: the reference's logit gap between the two choices there (a near-tie that float32 rounding can
flip, or a real difference). It prints the ratio SGLang / reference last and writes everything
(figures, prompts, tokens, wall times, the command, the CPU model, torch's CPU capability) to
``--out``.

SGLang runs from its own environment (``make sglang-env``) on the CPU with ``TRITON_INTERPRET=1``
and the shims of ``testkit/sglang_shims`` (docs/SGLANG_ON_CPU.md), started by the project's launcher
and readiness gate; a start takes minutes and decoding runs at about 1 token/s. Without ``--draft``
a random draft is made (speculators format → ``eagle3.convert.stage``), which accepts almost
nothing: use a trained draft for a meaningful ratio.
"""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import typer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # testkit.sglang_harness (the CPU server settings and shims), lab.*

from lab.fidelity_compare import (  # noqa: E402
    compare_request,
    explain_margin,
    passes_from_stream,
    pooled,
)

app = typer.Typer(add_completion=False)
GOAL = 0.97


def _random_draft(target: Path, work: Path) -> Path:
    from eagle3.convert.stage import convert
    from testkit.broken_corpus import make_speculators_draft

    spec = make_speculators_draft(target, work / "speculators", seed=7)
    convert(spec, work / "serving", engine="sglang", target_dir=target)
    return work / "serving"


def target_greedy(model, input_ids: list[int], n: int) -> tuple[list[int], list[dict]]:
    """The target alone, greedy, ``n`` tokens (EOS ignored), with a KV cache; float32 as loaded.

    Returns the tokens and per output position ``{"top2": [id1, id2], "gap": logit1 - logit2,
    "scale": max|logit|}`` (what explains an engine that picks the runner-up there)."""
    import torch
    from transformers import DynamicCache

    cache, x, out, margins = DynamicCache(config=model.config), torch.tensor([input_ids]), [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=x, past_key_values=cache, use_cache=True).logits[0, -1].float()
            top = logits.topk(2)
            margins.append(
                {
                    "top2": top.indices.tolist(),
                    "gap": float(top.values[0] - top.values[1]),
                    "scale": float(logits.abs().max()),
                }
            )
            out.append(int(top.indices[0]))
            x = top.indices[:1].view(1, 1)
    return out, margins


def reference_record(res) -> dict:
    """A reference-engine ``GenerationResult`` as a comparison record (lab/fidelity_compare.py)."""
    return {
        "output_ids": list(res.output_ids),
        "accept_counts": list(res.accept_counts),
        "verify_ct": int(res.verify_ct),
        "accepted": int(sum(res.accept_counts)),
    }


def sglang_request(url: str, input_ids: list[int], n: int, timeout_s: float = 1800) -> dict:
    """One streamed greedy ``/generate`` on SGLang (``ignore_eos``); a comparison record plus its
    raw meta_info.

    Raises RuntimeError when the stream ends without a final chunk or the server reports no verify
    pass."""
    import httpx

    body = {
        "input_ids": input_ids,
        "stream": True,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True},
    }
    chunks, last = [], None
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=timeout_s) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            last = json.loads(line[5:])
            chunks.append(len(last.get("output_ids") or []))
    meta = (last or {}).get("meta_info", {})
    if not meta.get("spec_verify_ct"):
        raise RuntimeError(
            f"SGLang /generate: expected a final chunk with spec_verify_ct > 0, got {meta}"
        )
    counts = passes_from_stream(
        chunks, int(meta["spec_verify_ct"]), int(meta["spec_num_correct_drafts"])
    )
    return {
        "output_ids": list(last["output_ids"]),
        "accept_counts": counts,
        "verify_ct": int(meta["spec_verify_ct"]),
        "accepted": int(meta["spec_num_correct_drafts"]),
        "wall_s": time.perf_counter() - t0,
        "chunks": len(chunks),
        "meta_info": {
            k: v for k, v in meta.items() if k.startswith("spec_") or k == "completion_tokens"
        },
    }


def diagnose_pass(
    decoder_parts, input_ids: list[int], n: int, diff: dict, target_ids: list[int]
) -> dict:
    """Why verify pass ``diff["pass"]`` accepted a different number of drafts: re-decode the request
    with the reference's generic decoder (equal to the fast path in float32), record the draft's
    logits at every proposal, and measure at draft step ``diff["draft_step"]`` the reference's logit
    gap between its choice and the other engine's (the target's token when SGLang accepted more; the
    runner-up when it accepted fewer)."""
    from refengine.specdec import SpeculativeDecoder

    target, draft, tok, k = decoder_parts
    dec = SpeculativeDecoder.from_models(target, draft, tok, num_steps=k)
    seen, propose = [], dec._propose  # noqa: SLF001 - a probe on the reference's own proposal step

    def probe(logits, *a):
        seen.append(logits.detach().float().clone())
        return propose(logits, *a)

    dec._propose = probe  # noqa: SLF001
    res = dec.generate(input_ids, n, ignore_eos=True)
    i, j = diff["pass"], diff["draft_step"]
    logits = seen[i * k + j]
    scale, mine = float(logits.abs().max()), int(logits.argmax())
    want = target_ids[diff["position"] + j]
    hot = draft.hot_token_id
    if (
        diff["sglang"] > diff["reference"]
    ):  # SGLang proposed the target's token here, the reference did not
        idx = (hot == want).nonzero().flatten().tolist() if hot is not None else [want]
        gap = float(logits[mine] - logits[idx[0]]) if idx else None
        what = (
            f"pass {i} draft step {j}: the reference proposed "
            f"{int(draft.to_target_ids(logits.argmax()))}, SGLang the target's {want}"
        )
    else:
        top = logits.topk(2).values
        gap = float(top[0] - top[1])
        what = (
            f"pass {i} draft step {j}: the reference proposed "
            f"the target's {want}, SGLang another token"
        )
    return {
        "generic_path_accept_counts_equal_fast_path": list(res.accept_counts)
        == diff.get("_ref_counts"),
        "gap": gap,
        "scale": scale,
        "why": explain_margin(gap, scale, what),
    }


def diagnose_output(diff: dict, margins: list[dict]) -> dict:
    """Why an engine's output left the target's greedy output at ``diff["position"]``."""
    p = diff["position"]
    if p >= len(margins) or diff["got"] is None:
        return {"why": f"output length differs at {p} (budget handling), not a token choice"}
    m = margins[p]
    if diff["got"] == m["top2"][1]:
        return m | {
            "why": explain_margin(
                m["gap"],
                m["scale"],
                f"{diff['engine']} output position {p}: target top-1 "
                f"{m['top2'][0]}, engine took the runner-up {diff['got']}",
            )
        }
    return m | {
        "why": f"{diff['engine']} output position {p}: took {diff['got']}, neither the target's "
        f"top-1 nor its runner-up: a real difference, not a tie"
    }


def machine_facts() -> dict:
    """CPU model (lscpu), cores, torch version and CPU capability here and in SGLang's venv."""
    import torch

    from testkit.sglang_harness import sglang_env, sglang_python

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next(
        (ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")),
        None,
    )
    flags = next(
        (ln.split(":", 1)[1].split() for ln in lscpu.splitlines() if ln.startswith("Flags")), []
    )
    sg = subprocess.run(
        [
            str(sglang_python()),
            "-c",
            "import torch, sglang; print(torch.__version__, "
            "torch.backends.cpu.get_cpu_capability(), sglang.__version__)",
        ],
        capture_output=True,
        text=True,
        env=sglang_env(),
        timeout=300,
    ).stdout.split()
    return {
        "cpu_model": model,
        "cpu_count": __import__("os").cpu_count(),
        "platform": platform.platform(),
        "cpu_bf16_flags": sorted(f for f in flags if "bf16" in f or f.startswith("amx")),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "sglang_env": dict(zip(["torch", "torch_cpu_capability", "sglang"], sg)),
    }


def run_reference(
    target: Path, draft: Path, ids: list[list[int]], n: int, steps: int
) -> tuple[list, dict]:
    """The reference engine's own decoder (``load_decoder``: the fast path for a Llama target),
    float32, one torch thread (``serve.cpu_threads``' default); its records for every prompt and
    wall times."""
    import torch

    from refengine.loader import load_decoder

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    decoder, path = load_decoder(target, draft, num_steps=steps, dtype="float32", device="cpu")
    t1 = time.perf_counter()
    refs = [reference_record(decoder.generate(x, n, ignore_eos=True)) for x in ids]
    return refs, {
        "reference_load_s": t1 - t0,
        "reference_decode_s": time.perf_counter() - t1,
        "reference_path": path,
    }


@app.command()
def main(
    config: Path = typer.Option(REPO / "configs/tiny-random.yaml"),
    draft: Path | None = typer.Option(None),
    prompts: str = typer.Option("mtbench"),
    num_prompts: int = typer.Option(2),
    max_new_tokens: int = typer.Option(12),
    num_steps: int = typer.Option(3),
    out: Path = typer.Option(
        REPO / f"lab/results/{time.strftime('%Y-%m-%d')}_sglang_fidelity.json"
    ),
) -> None:
    """Both engines and the target's greedy output on the same prompts; per-request comparison;
    ratio last."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3.assets import resolve_target
    from eagle3.config import load_config
    from eagle3.engines.sglang.draft import SGLangEagle3Draft
    from eagle3.measure.prompts import encode_prompts, load_prompts
    from eagle3.serve.launcher import launch_ready
    from testkit.sglang_harness import cpu_serve_config, sglang_env_missing

    missing = sglang_env_missing()
    if missing:
        raise typer.Exit(f"SGLang environment unavailable: {missing}")
    t_start = time.perf_counter()
    cfg = cpu_serve_config(load_config(config), num_steps=num_steps)
    target = resolve_target(cfg)
    plist = load_prompts(prompts, num_prompts)
    tok = AutoTokenizer.from_pretrained(str(target))
    ids = encode_prompts(plist, tok)
    walls: dict = {}
    with tempfile.TemporaryDirectory(prefix="sglang_fidelity_") as tmp:
        work = Path(tmp)
        draft = Path(draft) if draft else _random_draft(target, work)
        refs, walls = run_reference(target, draft, ids, max_new_tokens, num_steps)
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(str(target), dtype="float32").eval()
        greedy = [target_greedy(model, x, max_new_tokens) for x in ids]
        walls["target_greedy_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with launch_ready(cfg, target, draft, work / "deploy", use_gpu=False) as (eng, gate):
            walls["sglang_start_s"] = time.perf_counter() - t0
            print(
                "gate:",
                gate.summary(),
                {k: round(v, 1) for k, v in gate.phases.items()},
                flush=True,
            )
            sgls = []
            for i, x in enumerate(ids):
                sgls.append(sglang_request(eng.url, x, max_new_tokens))
                print(
                    f"  request {i}: {sgls[-1]['wall_s']:.1f} "
                    f"s, {len(sgls[-1]['output_ids'])} tokens",
                    flush=True,
                )
        walls["sglang_decode_s"] = sum(r["wall_s"] for r in sgls)
    rows, diagnosis = [], None
    parts = None
    for i, (p, x, (tgt, margins), ref, sgl) in enumerate(zip(plist, ids, greedy, refs, sgls)):
        cmp = compare_request(tgt, ref, sgl)
        rows.append(
            {
                "id": p["id"],
                "category": p["category"],
                "prompt_tokens": len(x),
                "target_ids": tgt,
                "reference": ref,
                "sglang": sgl,
                **cmp,
            }
        )
        if diagnosis is None and (
            cmp["outputs"]["first_output_difference"] or cmp["first_pass_difference"]
        ):
            diagnosis = {"request": i, "id": p["id"]}
            if cmp["outputs"]["first_output_difference"]:
                diagnosis["output"] = cmp["outputs"]["first_output_difference"] | diagnose_output(
                    cmp["outputs"]["first_output_difference"], margins
                )
            if (
                cmp["first_pass_difference"]
                and cmp["first_pass_difference"].get("draft_step") is not None
            ):
                import torch

                target_m = AutoModelForCausalLM.from_pretrained(
                    str(target), dtype=torch.float32
                ).eval()
                parts = parts or (
                    target_m,
                    SGLangEagle3Draft.from_dir(
                        draft,
                        dtype=torch.float32,
                        target_embed=target_m.get_input_embeddings().weight.detach(),
                        target_head=target_m.get_output_embeddings().weight.detach(),
                    ),
                    tok,
                    num_steps,
                )
                d = cmp["first_pass_difference"] | {"_ref_counts": ref["accept_counts"]}
                diagnosis["pass"] = cmp["first_pass_difference"] | diagnose_pass(
                    parts, x, max_new_tokens, d, tgt
                )
    ref_tot, sgl_tot = pooled(refs), pooled(sgls)
    ratio = sgl_tot["acceptance"] / ref_tot["acceptance"]
    result = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "settings": {
            "config": str(config),
            "target": str(target),
            "draft": str(draft),
            "prompts": prompts,
            "num_prompts": len(plist),
            "max_new_tokens": max_new_tokens,
            "num_steps": num_steps,
            "topk": 1,
            "num_draft_tokens": num_steps + 1,
            "temperature": 0.0,
            "ignore_eos": True,
            "dtype": "float32",
            "sglang_server_args": cfg.serve.extra_args,
            "acceptance": "1 + accepted drafts / verify passes, each engine's own count (before "
            "truncation at the budget); SGLang: spec_num_correct_drafts",
        },
        "machine": machine_facts(),
        "figures": {
            "reference": ref_tot,
            "sglang": sgl_tot,
            "ratio_sglang_over_reference": ratio,
            "goal": GOAL,
            "output_tokens_per_engine": sum(len(r["output_ids"]) for r in refs),
            "requests_all_three_equal": sum(
                r["outputs"]["reference_equals_target"] and r["outputs"]["sglang_equals_target"]
                for r in rows
            ),
            "requests_accept_counts_equal": sum(r["accept_counts_equal"] for r in rows),
            "requests": len(rows),
        },
        "first_divergence": diagnosis,
        "wall_s": walls | {"total_s": time.perf_counter() - t_start},
        "per_request": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    _print(result)


def _print(r: dict) -> None:
    f, s = r["figures"], r["settings"]
    print(
        f"prompts {s['num_prompts']} x {s['max_new_tokens']} new tokens, steps "
        f"{s['num_steps']}, topk 1, greedy, EOS ignored; CPU {r['machine']['cpu_model']}"
    )
    for row in r["per_request"]:
        o = row["outputs"]
        print(
            f"  {row['id']}: target==reference {o['reference_equals_target']}, target==SGLang "
            f"{o['sglang_equals_target']}; acceptance reference "
            f"{row['acceptance']['reference']:.4f}, SGLang {row['acceptance']['sglang']:.4f}; "
            f"per-pass counts equal {row['accept_counts_equal']}"
        )
    print(
        "first divergence:",
        json.dumps(r["first_divergence"], default=str) if r["first_divergence"] else "none",
    )
    print("wall (s):", {k: round(v, 1) for k, v in r["wall_s"].items() if isinstance(v, float)})
    print(
        f"acceptance length: SGLang 0.5.23 {f['sglang']['acceptance']:.4f} "
        f"({f['sglang']['accepted']} accepted / {f['sglang']['verify_ct']} "
        f"passes), reference engine {f['reference']['acceptance']:.4f} "
        f"({f['reference']['accepted']} / {f['reference']['verify_ct']})"
    )
    print(
        f"fidelity (SGLang / reference acceptance length): "
        f"{f['ratio_sglang_over_reference']:.4f} (goal >= {GOAL})"
    )


if __name__ == "__main__":
    app()
