"""The same short training on real data with speculators' training forward and with this project's:
is the faster forward as good?

Extracts ``CONFIG``'s conversations once (real target; reused from ``--work`` when already there),
then trains the draft twice from the same seed on the same hidden states,
``train.forward_impl=speculators`` (speculators' own) and ``train.forward_impl=project``
(eagle3/train/ttt_forward.py), every other setting equal. Prints, per evaluation, both validation
simulated acceptance lengths (bonus token counted) and their ratio, each run's training tokens/s,
and writes ``--out`` (JSON). Exit 1 when the final ratio is outside ``1 ± --tol``.

    python lab/train_forward_quality.py configs/smollm2-cpu.yaml \\
        --out lab/results/DATE_train_forward_quality.json \\
        -o target.dtype=float32 -o extract.dtype=float32 -o train.precision=float32
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer  # noqa: E402

app = typer.Typer(add_completion=False)


def _rows(out: Path) -> tuple[list[dict], list[float]]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if r["kind"] == "eval"], [
        r["tokens_per_s"] for r in rows if "tokens_per_s" in r
    ]


@app.command()
def main(
    config: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="a run config (e.g. the demo's)"
    ),
    override: list[str] = typer.Option([], "-o", help="section.key=value, applied to both runs"),
    work: Path = typer.Option(
        Path("/tmp/eagle3-forward-quality"), help="extraction and both trainings"
    ),
    out: Path = typer.Option(None, help="JSON with both runs' evaluations, the ratio and tokens/s"),
    tol: float = typer.Option(
        0.01, min=0.0, help="allowed |project / speculators - 1| of the final figure"
    ),
):
    import torch

    from eagle3.config import load_config
    from eagle3.extract.stage import extract
    from eagle3.train.stage import train

    from eagle3.errors import ConfigError

    mine = [o for o in override if o.split("=", 1)[0].strip() == "train.forward_impl"]
    if mine:
        raise typer.BadParameter(
            f"{mine[0]!r}: this script sets train.forward_impl "
            f"itself (speculators, then project); leave it out",
            param_hint="-o",
        )
    from eagle3.train.stage import check_settings

    run = "the"
    try:  # both runs' configurations, checked before the extraction spends its time
        cfg = load_config(
            config, list(override) + [f"paths.runs_dir={work / 'runs'}", "train.export=last"]
        )
        for run in ("the speculators run's", "the project run's"):
            c = load_config(
                config,
                list(override)
                + [f"paths.runs_dir={work / 'runs'}", f"train.forward_impl={run.split()[1]}"],
            )
            check_settings(c)
    except ConfigError as e:
        raise typer.BadParameter(f"{run} configuration: {e}", param_hint="-o") from e
    if cfg.train.num_gpus != 1:
        raise typer.BadParameter(
            f"train.num_gpus: expected 1 (this comparison "
            f"trains in one process), got {cfg.train.num_gpus}",
            param_hint="-o",
        )
    if out is not None and (
        out.is_dir() or not out.parent.is_dir() or not os.access(out.parent, os.W_OK)
    ):
        raise typer.BadParameter(
            f"{out}: expected a file path in an existing, writable folder", param_hint="--out"
        )
    hs = work / "extract"
    t0 = time.perf_counter()
    extract(cfg, hs, progress=True)
    print(f"hidden states: {hs} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    runs = {}
    for impl in ("speculators", "project"):
        c = load_config(
            config,
            list(override)
            + [
                f"paths.runs_dir={work / 'runs'}",
                "train.export=last",
                f"train.forward_impl={impl}",
                "train.resume=false",
            ],
        )
        dest = work / f"train-{impl}"
        t0 = time.perf_counter()
        train(c, hs, dest, progress=True)
        evals, tps = _rows(dest)
        runs[impl] = {
            "seconds": time.perf_counter() - t0,
            "tokens_per_s_median": statistics.median(tps),
            "evals": [
                {
                    k: r[k]
                    for k in (
                        "step",
                        "val/simulated_acceptance_length",
                        "val/loss",
                        "val/acc_cond_0",
                    )
                }
                for r in evals
            ],
        }
    spec, ours = runs["speculators"]["evals"], runs["project"]["evals"]
    if [r["step"] for r in spec] != [r["step"] for r in ours] or not spec:
        raise typer.Exit(
            f"the two runs evaluated at different steps: "
            f"{[r['step'] for r in spec]} vs {[r['step'] for r in ours]}"
        )
    print("| step | simulated AL, speculators' forward | simulated AL, project forward | ratio |")
    print("|---|---|---|---|")
    for a, b in zip(spec, ours):
        sa, sb = a["val/simulated_acceptance_length"], b["val/simulated_acceptance_length"]
        print(f"| {a['step']} | {sa:.4f} | {sb:.4f} | {sb / sa:.4f} |")
    final = (
        ours[-1]["val/simulated_acceptance_length"] / spec[-1]["val/simulated_acceptance_length"]
    )
    speed = runs["project"]["tokens_per_s_median"] / runs["speculators"]["tokens_per_s_median"]
    print(
        f"final simulated acceptance length, project / speculators = {final:.4f} (tolerance "
        f"±{tol:g}); training tokens/s {runs['project']['tokens_per_s_median']:,.0f} vs "
        f"{runs['speculators']['tokens_per_s_median']:,.0f} ({speed:.2f}×)"
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "config": str(config),
                    "overrides": list(override),
                    "runs": runs,
                    "final_ratio": final,
                    "tokens_per_s_ratio": speed,
                    "tol": tol,
                    "device": cfg.train.device,
                    "precision": cfg.train.precision,
                    "cpu": platform.processor() or platform.machine(),
                    "torch_capability": torch.backends.cpu.get_cpu_capability(),
                    "torch": torch.__version__,
                },
                indent=1,
            )
            + "\n"
        )
    if abs(final - 1) > tol:
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
