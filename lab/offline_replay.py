"""Exact greedy replay from the command line: ``evaluate`` drafts on prompt sets, or time it
(``speed``).

    python lab/offline_replay.py evaluate --target T --draft NAME=DIR [--draft NAME=DIR ...] \\
        --out FILE [--sets mtbench2,gsm8k200] [--max-new-tokens 256] [--num-steps 3] \\
        [--dtype float32] [--device auto] [--batch-size 16] [--resamples 2000] [--seed 0] \\
        [--check-against-decoder N] [--no-requests] [--quiet]
    python lab/offline_replay.py speed [--draft DIR] [--num-prompts 8] [--max-new-tokens 64] \\
        [--repeats 2] [--threads 1] [--work DIR] [--tiny]

``evaluate``: ``eagle3.measure.offline.evaluate_drafts``; every argument is checked before a model
loads (exit 2 with ``error: ...``); the file holds ``{"drafts": {name: result}}`` and one line per
draft is printed. ``--check-against-decoder N`` decodes N requests again with the reference engine's
``SpeculativeDecoder`` and compares (the self-check to run first on a new device or dtype).

``speed``: one target (SmolLM2-135M-Instruct, float32, CPU) and one draft; without ``--draft`` one
is trained first by ``testkit.replay_drafts.distilled_draft`` (full width, 1 layer, draft vocab
2048, on the target's greedy answers to MT-Bench first turns 9..24, held out; 40 Adam steps) and
kept in ``--work``. Alternating for ``--repeats`` rounds on the same MT-Bench prompts: (a) decoding
prompt by prompt (``offline_acceptance(decoder=SpeculativeDecoder)``), (b) replay (batched
continuations, one target pass, the draft's TTT forwards, the walk). Prints both acceptance lengths,
how many requests agree (replay must equal the decoder) and the minimum wall times with their ratio.
``--tiny``: the tiny-random target with a random draft (a smoke run, not a measurement).
"""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import torch
import typer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3.errors import ConfigError, DataError, EngineUnsupported  # noqa: E402

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                  help="Exact greedy replay acceptance of EAGLE-3 drafts (chain, topk 1).")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def parse_drafts(specs: List[str]) -> dict[str, Path]:
    """``["NAME=DIR", ...]`` → ``{NAME: Path(DIR)}``; ConfigError for a malformed or repeated
    name."""
    out: dict[str, Path] = {}
    for s in specs:
        name, sep, path = s.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--draft: expected NAME=DIR, got {s!r}")
        if name in out:
            raise ConfigError(f"--draft: name {name!r} given twice ({out[name]} and {path})")
        out[name] = Path(path)
    return out


def _line(name: str, r: dict) -> str:
    o = r["overall"]
    sets = ", ".join(f"{s} {g['acceptance_length']:.3f}" for s, g in r["per_set"].items())
    text = (f"{name}: acceptance length {o['acceptance_length']:.3f} [{o['ci']['low']:.3f}, "
            f"{o['ci']['high']:.3f}] over {o['num_requests']} requests ({sets}); replay "
            f"{r['wall_s']['replay']:.1f} s")
    check = r.get("decoder_check")
    if check:
        text += f"; decoder check: {check['equal']}/{check['n']} equal"
        if check["different"]:
            text += f", different: {[d['id'] for d in check['different']]}"
    return text


@app.command()
def evaluate(target: Path = typer.Option(..., "--target", help="HF target folder"),
             draft: List[str] = typer.Option(..., "--draft", help="NAME=DIR of an SGLang draft"),
             sets: str = typer.Option("mtbench2,gsm8k200", "--sets",
                                      help="comma list: mtbench2, mtbench, gsm8k, gsm8k<N>, "
                                           "humaneval or files"),
             out: Path = typer.Option(..., "--out", help="JSON file to write"),
             max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
             num_steps: int = typer.Option(3, "--num-steps", help="draft tokens per verify pass"),
             dtype: str = typer.Option("float32", "--dtype"),
             device: str = typer.Option("auto", "--device"),
             batch_size: int = typer.Option(16, "--batch-size"),
             resamples: int = typer.Option(2000, "--resamples"),
             seed: int = typer.Option(0, "--seed"),
             check_against_decoder: int = typer.Option(
                 0, "--check-against-decoder",
                 help="also decode N requests with SpeculativeDecoder"),
             no_requests: bool = typer.Option(False, "--no-requests",
                                              help="leave per-request rows out of the file"),
             quiet: bool = typer.Option(False, "--quiet", help="no progress bars")) -> None:
    """Replay acceptance of every --draft on --sets; writes --out."""
    from eagle3.artifacts import atomic_write_json
    from eagle3.measure.offline import check_arguments, evaluate_drafts
    from refengine.specdec import SpeculativeDecoder

    names = [s.strip() for s in sets.split(",") if s.strip()]
    make = SpeculativeDecoder.from_models
    try:
        drafts = parse_drafts(draft)
        if out.is_dir() or not out.parent.is_dir():
            raise ConfigError(f"--out {out}: expected a file path in an existing folder")
        check_arguments(target, drafts, names, max_new_tokens, num_steps, dtype, device, batch_size,
                        resamples, check_against_decoder, make)
    except (ConfigError, DataError) as e:
        _fail(str(e))
    try:  # what only the loaded models show (a draft replay cannot run, a prompt past the context)
        result = evaluate_drafts(target, drafts, prompt_sets=names, max_new_tokens=max_new_tokens,
                                 num_steps=num_steps, dtype=dtype, device=device,
                                 batch_size=batch_size, resamples=resamples, seed=seed,
                                 check_against_decoder=check_against_decoder, make_decoder=make,
                                 include_requests=not no_requests, progress=not quiet)
    except (ConfigError, DataError, EngineUnsupported) as e:
        _fail(str(e))
    atomic_write_json(out, {"drafts": result})
    for name, r in result.items():
        typer.echo(_line(name, r))
    typer.echo(f"wrote {out}")


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                     if ln.startswith("Model name")), "?")
    except (OSError, subprocess.TimeoutExpired):
        name = platform.processor() or "?"
    cap = torch.backends.cpu.get_cpu_capability()
    return f"{name}; torch.backends.cpu.get_cpu_capability() = {cap}"


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
        say = lambda s, loss: s % 5 or print(f"  draft fit step {s}: loss {loss:.3f} "  # noqa: E731
                                             f"({time.perf_counter() - t0:.0f} s)", flush=True)
        distilled_draft(out, target, held_out, max_new_tokens=48, draft_vocab_size=2048, steps=40,
                        lr=3e-3, on_step=say)
        print(f"trained {out} in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def _replay(target, tok, draft, plist, max_new_tokens, num_steps, batch_size):
    from eagle3.measure.replay import generate_requests, replay_requests

    convs = [{"id": p["id"], "category": p["category"], "set": "mtbench", "turns": [p["text"]]}
             for p in plist]
    t0 = time.perf_counter()
    reqs = generate_requests(target, tok, convs, max_new_tokens, batch_size=batch_size,
                             num_steps=num_steps)
    gen_s = time.perf_counter() - t0
    res, draft_s, target_s = replay_requests(target, {"d": draft}, reqs, num_steps,
                                             max_new_tokens=max_new_tokens, batch_size=batch_size)
    parts = {"generation": gen_s, "target_forward": target_s, "draft": draft_s["d"]}
    return time.perf_counter() - t0, parts, res["d"]


@app.command()
def speed(draft: Path = typer.Option(None, help="an SGLang draft for SmolLM2 (default: train one)"),
          num_prompts: int = typer.Option(8), max_new_tokens: int = typer.Option(64),
          num_steps: int = typer.Option(3), batch_size: int = typer.Option(8),
          repeats: int = typer.Option(2), threads: int = typer.Option(1),
          work: Path = typer.Option(Path("runs/bench-offline-replay")),
          tiny: bool = typer.Option(False)) -> None:
    """Replay against decoding prompt by prompt: acceptance, agreement and wall time."""
    from eagle3.assets import prepare_smollm2, resolve_target
    from eagle3.config import PathsConfig, load_config
    from eagle3.engines.sglang.draft import SGLangEagle3Draft
    from eagle3.measure.acceptance import exact_acceptance_length
    from eagle3.measure.offline import offline_acceptance
    from eagle3.measure.prompts import load_prompts
    from eagle3.target_model import load_target
    from refengine.specdec import SpeculativeDecoder

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
    print(f"target {target_dir.name} float32, draft {ddir}, {num_prompts} MT-Bench prompts x "
          f"{max_new_tokens} tokens, num_steps {num_steps}, replay batch {batch_size}")
    off_times, rep_times = [], []
    for rnd in range(repeats):
        off = offline_acceptance(target_dir, None, plist, max_new_tokens=max_new_tokens,
                                 decoder=dec)
        rep_s, parts, rep = _replay(target, tok, d, plist, max_new_tokens, num_steps, batch_size)
        off_times.append(off["wall_s"])
        rep_times.append(rep_s)
        same = sum((r.verify_ct, r.accepted_per_position, r.completion_tokens) ==
                   (o["verify_ct"], o["accepted_per_position"], o["completion_tokens"])
                   for r, o in zip(rep, off["per_request"]))
        rep_len = exact_acceptance_length(sum(sum(r.accepted_per_position) for r in rep),
                                          sum(r.verify_ct for r in rep))
        print(f"round {rnd + 1}: offline_acceptance {off['wall_s']:.2f} s (acceptance length "
              f"{off['acceptance_length']:.4f}); replay {rep_s:.2f} s = generation "
              f"{parts['generation']:.2f} + target forward {parts['target_forward']:.2f} + draft "
              f"and walk {parts['draft']:.2f} (acceptance length {rep_len:.4f}); requests equal "
              f"{same}/{len(rep)}; histogram {off['histogram']}", flush=True)
    best_off, best_rep = min(off_times), min(rep_times)
    print(f"offline_acceptance / replay wall time = {best_off:.2f} s / {best_rep:.2f} s = "
          f"{best_off / best_rep:.2f}x (minimum of {repeats} rounds each)")


if __name__ == "__main__":
    app()
