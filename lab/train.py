"""Training throughput (tokens/s) of eagle3.train.stage on SmolLM2-shaped data (hidden 576, 3 aux
states).

Hidden states are made by the real SmolLM2-135M-Instruct target on random token streams
(testkit/hs_fixture.py), once, into ``--work``. Then the same training code runs for ``--steps``
optimizer steps per setting and the mean tokens/s of the logged steps (after the first, warm-up) is
printed as a markdown table.

    python lab/train.py --device cpu --steps 6
    python lab/train.py --device cuda --steps 30 --precision float32 bf16-autocast
    python lab/train.py --device cuda --num-gpus 2 --steps 30      # torchrun + DDP
    python lab/train.py --device cuda --shape llama8b --seq-len 2048 --tokens-per-batch 2048 \
        --draft-vocab 32000 --precision bf16-autocast       # synthetic 8B-shaped target
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


SHAPES = {  # synthetic targets: only the tensors the trainer reads (embedding, final norm, LM head)
    "smollm2": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
    ),
    "llama8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=False,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    ),
}


def write_synthetic_manifest(hs: Path, tgt: Path, spec: dict, samples: int) -> None:
    """The hidden-states manifest of a synthetic set of ``samples`` bf16 samples of the target
    ``tgt`` (shape ``spec``, a LlamaConfig dict): EAGLE-3's default aux ids [2, L//2, L-3], the last
    two samples for validation."""
    from eagle3.artifacts import write_manifest

    L = spec["num_hidden_layers"]
    write_manifest(
        hs,
        "hidden_states",
        target={
            "path": str(tgt.resolve()),
            "hidden_size": spec["hidden_size"],
            "num_layers": L,
            "vocab_size": spec["vocab_size"],
        },
        aux_layer_ids=[2, L // 2, L - 3],
        layer_id_convention="hf_hidden_states_index",
        dtype="bfloat16",
        splits={"train": list(range(samples - 2)), "val": [samples - 2, samples - 1]},
    )


def synthetic(work: Path, shape: str, samples: int, seq_len: int) -> tuple[Path, Path]:
    """A target folder with random embedding/LM head/norm of ``shape`` and random hidden states
    (bf16).

    Throughput does not depend on the values; the layout is the documented one.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    spec = SHAPES[shape]
    tgt, hs = work / f"target-{shape}", work / f"hs-{shape}-{samples}x{seq_len}"
    g = torch.Generator().manual_seed(0)
    if not (tgt / "model.safetensors").is_file():
        tgt.mkdir(parents=True, exist_ok=True)
        LlamaConfig(**spec).save_pretrained(tgt)
        V, H = spec["vocab_size"], spec["hidden_size"]
        w = {
            "model.embed_tokens.weight": (torch.randn(V, H, generator=g) * 0.02).bfloat16(),
            "model.norm.weight": torch.ones(H, dtype=torch.bfloat16),
        }
        if not spec["tie_word_embeddings"]:
            w["lm_head.weight"] = (torch.randn(V, H, generator=g) * 0.02).bfloat16()
        save_file(w, str(tgt / "model.safetensors"))
    if not (hs / "manifest.json").is_file():
        from datasets import Dataset

        (hs / "hidden_states").mkdir(parents=True, exist_ok=True)
        rows: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
        freq: dict[int, int] = {}
        for i in range(samples):
            ids = torch.randint(0, spec["vocab_size"], (seq_len,), generator=g)
            mask = torch.ones(seq_len, dtype=torch.long)
            mask[: seq_len // 4] = 0
            save_file(
                {
                    "token_ids": ids,
                    "hidden_states": torch.randn(
                        seq_len, 4, spec["hidden_size"], generator=g
                    ).bfloat16(),
                },
                str(hs / "hidden_states" / f"hs_{i}.safetensors"),
            )
            rows["input_ids"].append(ids.tolist())
            rows["loss_mask"].append(mask.tolist())
            rows["seq_len"].append(seq_len)
            for t in ids[mask.bool()].tolist():
                freq[t] = freq.get(t, 0) + 1
        Dataset.from_dict(rows).save_to_disk(str(hs / "data"))
        torch.save(freq, hs / "token_freq.pt")
        write_synthetic_manifest(hs, tgt, spec, samples)
    return tgt, hs


def main() -> int:
    from eagle3.assets import resolve_target
    from eagle3.config import load_config
    from eagle3.train.stage import train
    from testkit.hs_fixture import build_hidden_states_dir

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
    p.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default=None,
        help="synthetic target + random hidden states of this shape (no target forward)",
    )
    a = p.parse_args()
    work = Path(a.work)
    if a.shape:
        tgt, _ = synthetic(work, a.shape, a.samples, a.seq_len)
        a.target = str(tgt)
    base = [
        f"paths.runs_dir={work / 'runs'}",
        f"train.device={a.device}",
        f"train.max_steps={a.steps}",
        "train.schedule=constant",
        "train.log_every=1",
        "train.eval_every=0",
        "train.epochs=1000",
        f"train.draft_vocab_size={a.draft_vocab}",
        "train.pad_draft_vocab=true",
        "train.warmup_steps=0",
        f"train.max_tokens_per_batch={a.tokens_per_batch}",
        f"train.num_gpus={a.num_gpus}",
        "train.max_eval_samples=2",
        "train.keep_last=1",
        "train.resume=false",
    ]
    base += ["target.kind=hf", f"target.path={a.target}"] if a.target else ["target.kind=smollm2"]
    cfg = load_config(None, base)
    target = resolve_target(cfg)
    hs = work / (
        f"hs-{a.shape}-{a.samples}x{a.seq_len}"
        if a.shape
        else f"hs-{target.name}-{a.samples}x{a.seq_len}"
    )
    if not (hs / "manifest.json").is_file():
        t0 = time.perf_counter()
        build_hidden_states_dir(
            hs,
            target,
            num_samples=a.samples,
            min_len=a.seq_len // 2,
            max_len=a.seq_len + 1,
            token_range=(0, 49152),
            val_samples=2,
            dtype=__import__("torch").bfloat16,
        )
        print(f"hidden states: {hs} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    rows = []
    for prec in a.precision:
        c = load_config(None, base + [f"train.precision={prec}"])
        tps: list[float] = []
        out = work / f"out-{a.device}-{a.num_gpus}-{prec}"
        t0 = time.perf_counter()
        man = train(
            c,
            hs,
            out,
            progress=False,
            on_metrics=lambda m, s: tps.append(m["tokens_per_s"]) if "tokens_per_s" in m else None,
        )
        wall = time.perf_counter() - t0
        if not tps:  # the torchrun path forwards records from metrics.jsonl
            tps = [
                json.loads(x)["tokens_per_s"]
                for x in (out / "metrics.jsonl").read_text().splitlines()
                if '"tokens_per_s"' in x
            ]
        steady = tps[1:] or tps
        rows.append(
            (
                a.device,
                a.num_gpus,
                prec,
                a.tokens_per_batch,
                man.get("optimizer_steps"),
                statistics.mean(steady),
                wall,
            )
        )
    print(
        "| device | processes | precision | tokens/micro-batch | steps | train tokens/s | wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]:.0f} | {r[6]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
