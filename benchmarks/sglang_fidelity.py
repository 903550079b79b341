"""Fidelity of the CPU reference engine to the real SGLang 0.5.23: acceptance length served by SGLang over the
acceptance length of the project's in-process reference (``eagle3.measure.offline.offline_acceptance``), same draft,
target, prompts and settings (greedy, chain drafting, topk 1).

    python benchmarks/sglang_fidelity.py [--config configs/tiny-random.yaml] [--draft SERVING_DIR]
        [--num-prompts 2] [--max-new-tokens 12] [--num-steps 3]

SGLang runs from ``.venv-sglang`` (``make sglang-env``) on the CPU with ``TRITON_INTERPRET=1`` and the shims of
``testkit/sglang_shims`` (docs/SGLANG_ON_CPU.md), started by the project's launcher and readiness gate;
a start takes minutes. Without ``--draft`` a random draft for the config's target is made (speculators format →
``eagle3.convert.stage``). Prints the gate's phase timeline, both acceptance lengths, and last the ratio (goal >= 0.97).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import typer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # testkit.sglang_harness (the CPU server settings and shims)

app = typer.Typer(add_completion=False)


def _random_draft(target: Path, work: Path) -> Path:
    from eagle3.convert.stage import convert
    from testkit.broken_corpus import make_speculators_draft

    spec = make_speculators_draft(target, work / "speculators", seed=7)
    convert(spec, work / "serving", engine="sglang", target_dir=target)
    return work / "serving"


@app.command()
def main(config: Path = typer.Option(REPO / "configs/tiny-random.yaml"), draft: Path | None = typer.Option(None),
         prompts: str = typer.Option("mtbench"), num_prompts: int = typer.Option(2),
         max_new_tokens: int = typer.Option(12), num_steps: int = typer.Option(3)) -> None:
    """Serve the draft on SGLang (CPU), measure acceptance there and in the reference; print the ratio last."""
    from eagle3.assets import resolve_target
    from eagle3.measure.bench import run_bench
    from eagle3.measure.offline import offline_acceptance
    from eagle3.config import load_config
    from eagle3.serve.launcher import launch_ready
    from eagle3.measure.prompts import load_prompts
    from testkit.sglang_harness import cpu_serve_config, sglang_env_missing

    missing = sglang_env_missing()
    if missing:
        raise typer.Exit(f"SGLang environment unavailable: {missing}")
    cfg = cpu_serve_config(load_config(config), num_steps=num_steps)
    target = resolve_target(cfg)
    plist = load_prompts(prompts, num_prompts)
    with tempfile.TemporaryDirectory(prefix="sglang_fidelity_") as tmp:
        work = Path(tmp)
        draft = draft or _random_draft(target, work)
        with launch_ready(cfg, target, draft, work / "deploy", use_gpu=False) as (eng, gate):
            print("gate:", gate.summary())
            print("phases (s):", {k: round(v, 1) for k, v in gate.phases.items()})
            served = run_bench(eng.url, prompts=plist, max_new_tokens=max_new_tokens, tokenizer_dir=target)
    ref = offline_acceptance(target, draft, plist, max_new_tokens=max_new_tokens, num_steps=num_steps)
    s_len, r_len = served["summary"]["acceptance_length"], ref["acceptance_length"]
    print(f"prompts {len(plist)} x {max_new_tokens} new tokens, steps {num_steps}, topk 1, greedy")
    print(f"acceptance length: SGLang 0.5.23 {s_len:.4f}, reference engine {r_len:.4f}")
    print(f"fidelity (SGLang / reference acceptance length): {s_len / r_len:.4f}")


if __name__ == "__main__":
    app()
