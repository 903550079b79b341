"""Training throughput (tokens/s) of eagle3.train on SmolLM2-shaped data (hidden 576, 3 aux states).

Hidden states are made by the real SmolLM2-135M-Instruct target on random token streams
(tests/support/hs_fixture.py), once, into ``--work``. Then the same training code runs for ``--steps``
optimizer steps per setting and the mean tokens/s of the logged steps (after the first, warm-up) is printed
as a markdown table.

    python benchmarks/train.py --device cpu --steps 6
    python benchmarks/train.py --device cuda --steps 30 --precision float32 bf16-autocast
    python benchmarks/train.py --device cuda --num-gpus 2 --steps 30      # torchrun + DDP
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from eagle3.assets import resolve_target
    from eagle3.config import load_config
    from eagle3.train import train
    from tests.support.hs_fixture import build_hidden_states_dir

    p = argparse.ArgumentParser()
    p.add_argument("--work", default="/tmp/eagle3-bench-train")
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--samples", type=int, default=24)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--tokens-per-batch", type=int, default=512)
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--num-gpus", type=int, default=1)
    p.add_argument("--target", default=None, help="HF folder (default: the prepared SmolLM2)")
    p.add_argument("--precision", nargs="+", default=["float32"])
    a = p.parse_args()
    work = Path(a.work)
    base = [f"paths.runs_dir={work / 'runs'}", f"train.device={a.device}", f"train.max_steps={a.steps}",
            "train.schedule=constant", "train.log_every=1", "train.eval_every=0", "train.epochs=1000",
            f"train.draft_vocab_size={a.draft_vocab}", "train.pad_draft_vocab=true", "train.warmup_steps=0",
            f"train.max_tokens_per_batch={a.tokens_per_batch}", f"train.num_gpus={a.num_gpus}",
            "train.max_eval_samples=2", "train.keep_last=1"]
    base += [f"target.kind=hf", f"target.path={a.target}"] if a.target else ["target.kind=smollm2"]
    cfg = load_config(None, base)
    target = resolve_target(cfg)
    hs = work / f"hs-{target.name}-{a.samples}x{a.seq_len}"
    if not (hs / "manifest.json").is_file():
        t0 = time.perf_counter()
        build_hidden_states_dir(hs, target, num_samples=a.samples, min_len=a.seq_len // 2, max_len=a.seq_len + 1,
                                token_range=(0, 49152), val_samples=2, dtype=__import__("torch").bfloat16)
        print(f"hidden states: {hs} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    rows = []
    for prec in a.precision:
        c = load_config(None, base + [f"train.precision={prec}"])
        tps: list[float] = []
        out = work / f"out-{a.device}-{a.num_gpus}-{prec}"
        t0 = time.perf_counter()
        man = train(c, hs, out, progress=False, on_metrics=lambda m, s: tps.append(m["tokens_per_s"])
                    if "tokens_per_s" in m else None)
        wall = time.perf_counter() - t0
        if not tps:  # the torchrun path forwards records from metrics.jsonl
            tps = [json.loads(x)["tokens_per_s"] for x in (out / "metrics.jsonl").read_text().splitlines()
                   if '"tokens_per_s"' in x]
        steady = tps[1:] or tps
        rows.append((a.device, a.num_gpus, prec, a.tokens_per_batch, man.get("optimizer_steps"),
                     statistics.mean(steady), wall))
    print("| device | processes | precision | tokens/micro-batch | steps | train tokens/s | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]:.0f} | {r[6]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
