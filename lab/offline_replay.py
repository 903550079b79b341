"""Replay acceptance vs ``offline_acceptance`` (``SpeculativeDecoder`` prompt by prompt): wall time, side by side.

    python lab/offline_replay.py [--draft DIR] [--num-prompts 8] [--max-new-tokens 64] [--repeats 2]
                                        [--threads 1] [--work DIR] [--tiny]

One process, one loaded target (SmolLM2-135M-Instruct, float32, CPU) and one loaded draft. Without ``--draft``
a draft is trained first by ``testkit.replay_drafts.distilled_draft`` (full target width, 1 layer, draft vocab
2048, on the target's greedy answers (48 tokens) to MT-Bench first turns 9..24, held out from the measured prompts;
40 Adam steps) and
kept in ``--work``. Then, alternating for ``--repeats`` rounds on the same ``--num-prompts`` MT-Bench prompts
(round-robin over categories, as the pipeline's bench) × ``--max-new-tokens``:

(a) ``eagle3.measure.offline.offline_acceptance(..., decoder=SpeculativeDecoder.from_models(...))``: its ``wall_s``
    (the generate loop);
(b) replay: ``generate_requests`` (batched greedy continuations) + ``replay_requests`` (one target pass, the
    draft's TTT forwards, the walk), ``--batch-size`` requests a batch.

Both acceptance lengths and the per-request agreement are printed (replay must equal the decoder), then the
minimum over rounds of each wall time and the ratio offline / replay. ``--tiny`` runs the tiny-random target
with a random draft (a smoke run for tests, not a measurement).
"""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import typer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

app = typer.Typer(add_completion=False)


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")
    except (OSError, subprocess.TimeoutExpired):
        name = platform.processor() or "?"
    return f"{name}; torch.backends.cpu.get_cpu_capability() = {torch.backends.cpu.get_cpu_capability()}"


def _draft(work: Path, target, tok, draft_arg: Path | None, tiny: bool, target_dir: Path) -> Path:
    from eagle3.measure.prompts import encode_prompts, mtbench_prompts
    from testkit.replay_drafts import distilled_draft
    from testkit.sglang_drafts import make_random_draft

    if draft_arg is not None:
        return draft_arg
    if tiny:
        return make_random_draft(work / "tiny-random-draft", target_dir)
    out = work / "smollm2-distilled"
    if not (out / "model.safetensors").is_file():
        t0 = time.perf_counter()
        held_out = encode_prompts(mtbench_prompts()[8:24], tok)
        distilled_draft(out, target, held_out, max_new_tokens=48, draft_vocab_size=2048, steps=40, lr=3e-3,
                        on_step=lambda s, loss: s % 5 or print(f"  draft fit step {s}: loss {loss:.3f} "
                                                                f"({time.perf_counter() - t0:.0f} s)", flush=True))
        print(f"trained {out} in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def _offline(target_dir, plist, dec, max_new_tokens):
    from eagle3.measure.offline import offline_acceptance

    r = offline_acceptance(target_dir, None, plist, max_new_tokens=max_new_tokens, decoder=dec)
    return r["wall_s"], r


def _replay(target, tok, draft, plist, max_new_tokens, num_steps, batch_size):
    from eagle3.measure.replay_core import generate_requests, replay_requests

    convs = [{"id": p["id"], "category": p["category"], "set": "mtbench", "turns": [p["text"]]} for p in plist]
    t0 = time.perf_counter()
    reqs = generate_requests(target, tok, convs, max_new_tokens, batch_size=batch_size, num_steps=num_steps)
    gen_s = time.perf_counter() - t0
    res, draft_s, target_s = replay_requests(target, {"d": draft}, reqs, num_steps, max_new_tokens=max_new_tokens,
                                             batch_size=batch_size)
    return time.perf_counter() - t0, {"generation": gen_s, "target_forward": target_s, "draft": draft_s["d"]}, res["d"]


@app.command()
def main(draft: Path = typer.Option(None, help="an SGLang-format draft for SmolLM2 (default: train one)"),
         num_prompts: int = typer.Option(8), max_new_tokens: int = typer.Option(64), num_steps: int = typer.Option(3),
         batch_size: int = typer.Option(8), repeats: int = typer.Option(2), threads: int = typer.Option(1),
         work: Path = typer.Option(Path("runs/bench-offline-replay")), tiny: bool = typer.Option(False)) -> None:
    from eagle3.assets import prepare_smollm2, resolve_target
    from eagle3.config import PathsConfig, load_config
    from eagle3.engines.sglang.draft import SGLangEagle3Draft
    from eagle3.measure.acceptance import exact_acceptance_length
    from eagle3.measure.prompts import load_prompts
    from refengine.specdec import SpeculativeDecoder
    from eagle3.target_model import load_target

    if min(num_prompts, max_new_tokens, num_steps, batch_size, repeats, threads) < 1:
        raise typer.BadParameter("every number must be >= 1")
    torch.set_num_threads(threads)
    work.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[1]
    target_dir = (resolve_target(load_config(repo / "configs/tiny-random.yaml")) if tiny
                  else prepare_smollm2(PathsConfig().resolved_cache_dir()))
    target, tok = load_target(target_dir, dtype="float32", device="cpu")
    ddir = _draft(work, target, tok, draft, tiny, target_dir)
    d = SGLangEagle3Draft.from_dir(ddir, target_embed=target.get_input_embeddings().weight.detach(),
                                   target_head=target.get_output_embeddings().weight.detach())
    dec = SpeculativeDecoder.from_models(target, d, tok, num_steps=num_steps)
    plist = load_prompts("mtbench", num_prompts)
    print(f"cpu: {_cpu()}; torch threads {threads}; torch {torch.__version__}")
    print(f"target {target_dir.name} float32, draft {ddir}, {num_prompts} MT-Bench prompts x {max_new_tokens} tokens, "
          f"num_steps {num_steps}, replay batch {batch_size}")
    off_times, rep_times = [], []
    for rnd in range(repeats):
        off_s, off = _offline(target_dir, plist, dec, max_new_tokens)
        rep_s, parts, rep = _replay(target, tok, d, plist, max_new_tokens, num_steps, batch_size)
        off_times.append(off_s)
        rep_times.append(rep_s)
        same = sum((r.verify_ct, r.accepted_per_position, r.completion_tokens) ==
                   (o["verify_ct"], o["accepted_per_position"], o["completion_tokens"])
                   for r, o in zip(rep, off["per_request"]))
        rep_len = exact_acceptance_length(sum(sum(r.accepted_per_position) for r in rep), sum(r.verify_ct for r in rep))
        print(f"round {rnd + 1}: offline_acceptance {off_s:.2f} s (acceptance length {off['acceptance_length']:.4f}); "
              f"replay {rep_s:.2f} s = generation {parts['generation']:.2f} + target forward "
              f"{parts['target_forward']:.2f} + draft and walk {parts['draft']:.2f} (acceptance length "
              f"{rep_len:.4f}); requests equal {same}/{len(rep)}; histogram {off['histogram']}", flush=True)
    best_off, best_rep = min(off_times), min(rep_times)
    print(f"offline_acceptance / replay wall time = {best_off:.2f} s / {best_rep:.2f} s = {best_off / best_rep:.2f}x "
          f"(minimum of {repeats} rounds each)")


if __name__ == "__main__":
    app()
