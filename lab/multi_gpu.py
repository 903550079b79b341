"""Scaling across the GPUs of one host, side by side in one call: training (``train.num_gpus`` N
under torchrun, DDP and/or FSDP) and extraction (``extract.num_gpus`` N worker processes) tokens/s
for each N of ``--gpus``, and the scaling efficiency = tokens/s on N GPUs ÷ (N × tokens/s on 1 GPU)
(goal ≥ 0.9). Writes ``--out`` (JSON, by the script itself) and prints a table.

Training: the 8B shape of lab/train.py (Llama-3.1-8B target: hidden 4096, vocab 128,256; 1-layer
draft, draft vocab 32,000, TTT 3, bf16 autocast, compiled forward), one ``--seq-len``-token
micro-batch per rank and step (weak scaling: N ranks take N micro-batches per step). The data is
random bf16 hidden states in the documented layout: ``--distinct`` files hard-linked under as many
sample names as the run needs, so every run reads from the page cache (this measures compute and
communication, not the disk; at 8 GPUs × ~44k tokens/s the trainer reads ~11 GB/s of hidden states).
The figure of a run is the median ``tokens_per_s`` of its metrics windows (``--log-every`` steps
each, all ranks' tokens over rank 0's step time) after ``--warmup`` steps.

Extraction: a random Llama-3.1-8B-shaped target saved as an HF folder (bf16, ~16 GB), extracted by
``eagle3.extract.workers.run_data_parallel`` (the code ``extract.num_gpus`` runs: one spawned
process per GPU, each loading the target from disk) over ``--extract-samples`` random
``--seq-len``-token samples per GPU, into each ``--extract-dest`` (a folder on the disk, and
``/dev/shm`` to separate the pipeline from the disk). A run's figure is the sum over workers of
tokens / (done − ready) from their status files (the target's load left out); ``span_tokens_per_s``
(all tokens / (last done − first ready)) and ``overlap`` (the share of that span when all workers
ran) are recorded beside it.

    python lab/multi_gpu.py --kinds train --gpus 1,2,4,8 --out lab/results/DATE_multi_gpu.json
    python lab/multi_gpu.py --kinds extract --gpus 1,2,4,8 --out lab/results/DATE_multi_gpu.json
    python lab/multi_gpu.py --tiny --device cpu --gpus 1,2 --out /tmp/mg.json  # CPU smoke (gloo)

With an existing ``--out`` the other kind's figures there are kept (one call per kind, one file).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.train import SHAPES, write_synthetic_manifest  # noqa: E402

TINY = dict(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
)
GOAL = 0.9


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _tokenizer(folder: Path) -> None:
    """A word-level tokenizer (the workers load one; extraction of token ids never uses it)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<unk>": 0, "<pad>": 1}, unk_token="<unk>")),
        unk_token="<unk>",
        pad_token="<pad>",
    )
    tok.save_pretrained(folder)


def train_data(
    work: Path, spec: dict, samples: int, distinct: int, seq_len: int
) -> tuple[Path, Path]:
    """A target folder holding only what the trainer reads (embedding, final norm, LM head; random)
    and a hidden-states folder of ``samples`` samples: ``distinct`` random files, hard-linked under
    the other names."""
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    tag = f"{spec['hidden_size']}x{spec['vocab_size']}"
    tgt, hs = work / f"target-{tag}", work / f"hs-{tag}-{samples}x{seq_len}"
    g = torch.Generator().manual_seed(0)
    if not (tgt / "model.safetensors").is_file():
        tgt.mkdir(parents=True, exist_ok=True)
        LlamaConfig(**spec).save_pretrained(tgt)
        V, H = spec["vocab_size"], spec["hidden_size"]
        save_file(
            {
                "model.embed_tokens.weight": (torch.randn(V, H, generator=g) * 0.02).bfloat16(),
                "model.norm.weight": torch.ones(H, dtype=torch.bfloat16),
                "lm_head.weight": (torch.randn(V, H, generator=g) * 0.02).bfloat16(),
            },
            str(tgt / "model.safetensors"),
        )
    if (hs / "manifest.json").is_file():
        return tgt, hs
    shutil.rmtree(hs, ignore_errors=True)
    (hs / "hidden_states").mkdir(parents=True)
    base = []
    for k in range(distinct):
        ids = torch.randint(0, spec["vocab_size"], (seq_len,), generator=g)
        path = hs / "hidden_states" / f"hs_{k}.safetensors"
        save_file(
            {
                "token_ids": ids,
                "hidden_states": torch.randn(
                    seq_len, 4, spec["hidden_size"], generator=g
                ).bfloat16(),
            },
            str(path),
        )
        base.append((ids, path))
    rows: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    mask = [0] * (seq_len // 4) + [1] * (seq_len - seq_len // 4)
    for i in range(samples):
        ids, path = base[i % distinct]
        if i >= distinct:
            os.link(path, hs / "hidden_states" / f"hs_{i}.safetensors")
        rows["input_ids"].append(ids.tolist())
        rows["loss_mask"].append(mask)
        rows["seq_len"].append(seq_len)
    Dataset.from_dict(rows).save_to_disk(str(hs / "data"))
    freq: dict[int, int] = {}
    for ids, _ in base:
        for t in ids[seq_len // 4 :].tolist():
            freq[t] = freq.get(t, 0) + 1
    torch.save(freq, hs / "token_freq.pt")
    write_synthetic_manifest(hs, tgt, spec, samples)
    return tgt, hs


def train_one(a, tgt: Path, hs: Path, n: int, mode: str) -> dict:
    from eagle3.config import load_config
    from eagle3.train.stage import train

    cuda = a.device == "cuda"
    steps = a.warmup + a.steps
    over = [
        f"paths.runs_dir={a.work / 'runs'}",
        "target.kind=hf",
        f"target.path={tgt}",
        f"train.device={a.device}",
        f"train.max_steps={steps}",
        "train.schedule=constant",
        f"train.log_every={a.log_every}",
        "train.eval_every=0",
        "train.epochs=1000",
        f"train.draft_vocab_size={a.draft_vocab}",
        "train.pad_draft_vocab=true",
        "train.warmup_steps=0",
        f"train.max_tokens_per_batch={a.seq_len}",
        f"train.num_gpus={n}",
        f"train.distributed={mode}",
        "train.max_eval_samples=2",
        "train.keep_last=1",
        "train.resume=false",
        "train.ttt_steps=3",
        f"train.precision={'bf16-autocast' if cuda else 'float32'}",
        f"train.compile={str(cuda and not a.no_compile).lower()}",
        f"train.startup_timeout_s={a.startup_timeout}",
        f"train.first_step_timeout_s={a.first_step_timeout}",
        f"train.stall_timeout_s={a.stall_timeout}",
    ]
    windows: list[tuple[int, float]] = []
    out = a.work / f"train-{mode}-{n}"
    t0 = time.perf_counter()
    man = train(
        load_config(None, over),
        hs,
        out,
        progress=False,
        on_metrics=lambda m, s: (
            windows.append((s, m["tokens_per_s"])) if "tokens_per_s" in m else None
        ),
    )
    wall = time.perf_counter() - t0
    seen = dict(windows)  # a step forwarded twice counts once
    steady = [v for s, v in sorted(seen.items()) if s - a.log_every >= a.warmup]
    if not steady:
        raise RuntimeError(
            f"no metrics window after the {a.warmup} warm-up steps (got steps {sorted(seen)})"
        )
    return {
        "gpus": n,
        "distributed": mode if n > 1 else "none",
        "tokens_per_s": statistics.median(steady),
        "windows_tokens_per_s": steady,
        "optimizer_steps": man.get("optimizer_steps"),
        "wall_s": wall,
    }


def run_train(a, gpus: list[int]) -> dict:
    spec = TINY if a.tiny else SHAPES["llama8b"]
    samples = (
        max(gpus) * (a.warmup + a.steps + 1) + 2
    )  # one epoch covers every run: no evaluation mid-run
    tgt, hs = train_data(a.work, spec, samples, a.distinct, a.seq_len)
    runs = []
    for mode in a.distributed:
        for n in gpus:
            if n == 1 and any(r["gpus"] == 1 for r in runs):
                continue
            log(f"train: {n} GPU(s), {mode}")
            try:
                runs.append(train_one(a, tgt, hs, n, mode))
            except Exception as e:  # noqa: BLE001 - recorded, the other settings still run
                traceback.print_exc()
                runs.append(
                    {
                        "gpus": n,
                        "distributed": mode if n > 1 else "none",
                        "error": f"{type(e).__name__}: {e}",
                    }
                )
            log(f"train: {runs[-1].get('tokens_per_s', runs[-1].get('error'))}")
    settings = {
        "shape": "tiny" if a.tiny else "llama8b",
        "seq_len": a.seq_len,
        "draft_vocab": a.draft_vocab,
        "steps": a.steps,
        "warmup": a.warmup,
        "log_every": a.log_every,
        "samples": samples,
        "distinct_files": a.distinct,
        "compile": a.device == "cuda" and not a.no_compile,
        "precision": "bf16-autocast" if a.device == "cuda" else "float32",
    }
    return {"settings": settings, "runs": runs, "efficiency": efficiency(runs, "distributed")}


def efficiency(
    runs: list[dict], label: str, group: str | None = None, figure: str = "tokens_per_s"
) -> dict:
    """``{"<label>/<N>": figure on N ÷ (N × figure on 1)}``; the 1-GPU partner is the run with the
    same ``group`` value (extraction: the same destination) or the one 1-GPU run (training)."""
    ones = {r.get(group) if group else None: r for r in runs if r["gpus"] == 1 and figure in r}
    out = {}
    for r in runs:
        one = ones.get(r.get(group) if group else None)
        if r["gpus"] > 1 and figure in r and one:
            out[f"{r.get(label)}/{r['gpus']}"] = r[figure] / (r["gpus"] * one[figure])
    return out


def extract_target(a) -> tuple[Path, list[int]]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle3.target_model import default_aux_layer_ids

    spec = TINY if a.tiny else SHAPES["llama8b"]
    folder = a.work / f"xtarget-{spec['hidden_size']}"
    conf = LlamaConfig(**spec)
    if not (folder / "config.json").is_file():
        log(f"extract: writing a random target of {spec['num_hidden_layers']} layers to {folder}")
        torch.manual_seed(0)
        with torch.device("cuda" if a.device == "cuda" else "cpu"):
            model = LlamaForCausalLM(conf).to(torch.bfloat16)
        model.save_pretrained(folder)
        _tokenizer(folder)
        del model
    L = conf.num_hidden_layers
    return folder, default_aux_layer_ids(L) + [L]


def extract_one(a, target: Path, capture: list[int], n: int, dest: Path) -> dict:
    import torch

    from eagle3.extract.hf_backend import WorkerJob
    from eagle3.extract.store import assign_shards, make_shards
    from eagle3.extract.workers import run_data_parallel
    from eagle3.workers import read_statuses

    spec = TINY if a.tiny else SHAPES["llama8b"]
    total = n * a.extract_samples
    g = torch.Generator().manual_seed(1)
    ids = [
        torch.randint(0, spec["vocab_size"], (a.seq_len,), generator=g).tolist()
        for _ in range(total)
    ]
    out = dest / f"extract-{n}"
    shutil.rmtree(out, ignore_errors=True)
    (out / "hidden_states").mkdir(parents=True)
    devices = [f"cuda:{k}" for k in range(n)] if a.device == "cuda" else ["cpu"] * n
    threads = max(1, (os.cpu_count() or 1) // n) if a.device == "cpu" else None
    shards = assign_shards(make_shards(total, a.batch_size), n)
    jobs = [
        WorkerJob(
            str(target),
            "bfloat16",
            dev,
            capture,
            "bfloat16",
            a.batch_size,
            str(out),
            [f"s{i}" for i in range(total)],
            ids,
            [[1] * a.seq_len for _ in range(total)],
            mine,
            threads,
        )
        for dev, mine in zip(devices, shards)
    ]
    final: dict = {}
    status_dir = out / ".progress" / "workers"
    t0 = time.perf_counter()
    run_data_parallel(
        jobs,
        lambda: final.update(read_statuses(status_dir, n, prefix="worker")),
        status_dir=status_dir,
        startup_s=a.startup_timeout,
        stall_s=a.stall_timeout,
    )
    wall = time.perf_counter() - t0
    nbytes = sum(p.stat().st_size for p in (out / "hidden_states").glob("hs_*.safetensors"))
    shutil.rmtree(out, ignore_errors=True)
    workers = []
    for k, job in enumerate(jobs):
        s = final.get(k) or {}
        if s.get("phase") != "done":
            raise RuntimeError(f"worker {k}: final status {s!r}, expected phase 'done'")
        tok = sum(len(ids[i]) for sh in job.shards for i in range(sh.start, sh.stop))
        workers.append(
            {
                "device": job.device,
                "tokens": tok,
                "ready": s["ready_time"],
                "done": s["time"],
                "tokens_per_s": tok / (s["time"] - s["ready_time"]),
            }
        )
    first, last = min(w["ready"] for w in workers), max(w["done"] for w in workers)
    together = min(w["done"] for w in workers) - max(w["ready"] for w in workers)
    return {
        "gpus": n,
        "dest": str(dest),
        "tokens_per_s": sum(w["tokens_per_s"] for w in workers),
        "span_tokens_per_s": sum(w["tokens"] for w in workers) / (last - first),
        "overlap": max(0.0, together) / (last - first),
        "bytes_per_token": nbytes / (total * a.seq_len),
        "wall_s": wall,
        "workers": workers,
    }


def run_extract(a, gpus: list[int]) -> dict:
    from lab.gpu_extract import disk_probe

    target, capture = extract_target(a)
    runs, probes = [], {}
    for dest in a.extract_dest:
        dest.mkdir(parents=True, exist_ok=True)
        probes[str(dest)] = disk_probe(dest, 256 * 2**20, 16)
        for n in gpus:
            log(f"extract: {n} GPU(s) -> {dest}")
            try:
                runs.append(extract_one(a, target, capture, n, dest))
            except Exception as e:  # noqa: BLE001 - recorded, the other settings still run
                traceback.print_exc()
                runs.append({"gpus": n, "dest": str(dest), "error": f"{type(e).__name__}: {e}"})
            log(f"extract: {runs[-1].get('tokens_per_s', runs[-1].get('error'))}")
    settings = {
        "shape": "tiny" if a.tiny else "llama8b",
        "seq_len": a.seq_len,
        "batch_size": a.batch_size,
        "samples_per_gpu": a.extract_samples,
        "store_dtype": "bfloat16",
        "capture_ids": capture,
        "write_probe_gb_per_s": probes,
    }
    return {
        "settings": settings,
        "runs": runs,
        "efficiency": efficiency(runs, "dest", "dest"),
        "efficiency_span": efficiency(runs, "dest", "dest", "span_tokens_per_s"),
    }


def host_facts(device: str) -> dict:
    import torch

    facts = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "device": device,
    }
    if device == "cuda":
        facts["gpus"] = [torch.cuda.get_device_name(k) for k in range(torch.cuda.device_count())]
        try:
            facts["topology"] = subprocess.run(
                ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20
            ).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            facts["topology"] = f"nvidia-smi topo -m failed: {e}"
    return facts


def table(res: dict) -> str:
    lines = []
    for kind, key in (("train", "distributed"), ("extract", "dest")):
        if kind not in res:
            continue
        eff = res[kind]["efficiency"]
        span = res[kind].get("efficiency_span", {})
        lines += [
            f"{kind}:",
            f"| GPUs | {key} | tokens/s | scaling efficiency "
            f"(goal >= {GOAL}) | span efficiency | overlap |",
            "|---|---|---|---|---|---|",
        ]
        for r in res[kind]["runs"]:
            name = f"{r.get(key)}/{r['gpus']}"
            e, sp = eff.get(name), span.get(name)
            got = (
                f"{r['tokens_per_s']:,.0f}"
                if "tokens_per_s" in r
                else f"FAILED: {r['error'][:200]}"
            )
            overlap = f"{r['overlap']:.2f}" if "overlap" in r else ""
            lines.append(
                f"| {r['gpus']} | {r.get(key)} | {got} | {'' if e is None else f'{e:.3f}'} "
                f"| {'' if sp is None else f'{sp:.3f}'} | {overlap} |"
            )
    return "\n".join(lines)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", default="train,extract", help="comma list of train, extract")
    p.add_argument(
        "--gpus",
        default="1,2,4,8",
        help="comma list of GPU counts (those above the GPUs present are left out and said so)",
    )
    p.add_argument(
        "--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available"
    )
    p.add_argument("--tiny", action="store_true", help="tiny shapes, a few steps (CPU smoke test)")
    p.add_argument("--distributed", default="ddp", help="comma list of ddp, fsdp (training)")
    p.add_argument(
        "--steps", type=int, default=30, help="measured optimizer steps per training run"
    )
    p.add_argument(
        "--warmup", type=int, default=10, help="optimizer steps left out first (compile, warm-up)"
    )
    p.add_argument(
        "--log-every", type=int, default=5, help="steps per metrics window (train.log_every)"
    )
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--draft-vocab", type=int, default=32000)
    p.add_argument(
        "--distinct", type=int, default=8, help="distinct hidden-state files (the rest hard links)"
    )
    p.add_argument("--no-compile", action="store_true", help="train.compile=false on CUDA")
    p.add_argument("--extract-samples", type=int, default=64, help="samples per GPU (extraction)")
    p.add_argument("--batch-size", type=int, default=4, help="extract.batch_size (and shard size)")
    p.add_argument(
        "--extract-dest",
        default=None,
        help="comma list of output folders (default: <work>/x and /dev/shm/eagle3-multi-gpu)",
    )
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--first-step-timeout", type=float, default=420.0)
    p.add_argument("--stall-timeout", type=float, default=300.0)
    p.add_argument("--work", default="/tmp/eagle3-multi-gpu")
    p.add_argument("--out", required=True, help="JSON results (other kinds already there are kept)")
    a = p.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    bad = [k for k in kinds if k not in ("train", "extract")] + [
        m for m in a.distributed.split(",") if m not in ("ddp", "fsdp")
    ]
    if bad or not kinds:
        p.error(
            f"--kinds / --distributed: unknown {bad or 'empty list'}; "
            f"expected train,extract / ddp,fsdp"
        )
    try:
        a.gpu_list = sorted({int(x) for x in a.gpus.split(",") if x})
    except ValueError:
        p.error(f"--gpus: expected a comma list of integers, got {a.gpus!r}")
    if (
        not a.gpu_list
        or min(a.gpu_list) < 1
        or min(a.steps, a.log_every, a.seq_len, a.distinct) < 1
    ):
        p.error("--gpus, --steps, --log-every, --seq-len, --distinct: expected positive values")
    if a.tiny:
        a.seq_len, a.steps, a.warmup, a.log_every, a.draft_vocab = 64, 2, 1, 1, 64
        a.extract_samples, a.batch_size, a.distinct = 4, 2, 2
    a.kinds, a.distributed, a.work = kinds, a.distributed.split(","), Path(a.work)
    return a


def main(argv=None) -> int:
    import torch

    from eagle3.artifacts import atomic_write_json, utc_now

    a = parse(argv)
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    have = torch.cuda.device_count() if a.device == "cuda" else (os.cpu_count() or 1)
    gpus = [n for n in a.gpu_list if n <= have]
    skipped = [n for n in a.gpu_list if n > have]
    if skipped:
        log(
            f"--gpus: leaving out {skipped}: only {have} "
            f"{'GPUs' if a.device == 'cuda' else 'CPUs'} here"
        )
    if 1 not in gpus:
        gpus = [1, *gpus]  # the reference of every efficiency
    a.extract_dest = [
        Path(x)
        for x in (
            a.extract_dest.split(",")
            if a.extract_dest
            else [str(a.work / "x"), "/dev/shm/eagle3-multi-gpu"]
        )
    ]
    a.work.mkdir(parents=True, exist_ok=True)
    out = Path(a.out)
    res = json.loads(out.read_text()) if out.is_file() else {}
    res.update(
        {
            "created_at": utc_now(),
            "command": [sys.executable, *sys.argv],
            "host": host_facts(a.device),
            "goal": GOAL,
            "gpus_left_out": skipped,
            "smoke_test": a.tiny,
        }
    )
    for kind in a.kinds:
        res[kind] = (run_train if kind == "train" else run_extract)(a, gpus)
        res[kind]["measured_at"] = utc_now()
        atomic_write_json(out, res)
    print(table(res))
    failed = [r for k in a.kinds for r in res[k]["runs"] if "error" in r]
    if a.tiny:
        print(
            "--tiny: a smoke test of the code paths; these "
            "figures measure nothing (a few tiny steps)"
        )
        return 1 if failed else 0
    for k in a.kinds:
        low = {n: e for n, e in res[k]["efficiency"].items() if e < GOAL}
        print(
            f"{k}: scaling efficiency >= {GOAL}: "
            f"{'MET' if res[k]['efficiency'] and not low else 'NOT MET'}"
            + (f" (below: {low})" if low else "")
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
