"""Training throughput, peak memory and MFU: this project's loop vs speculators' own ``Trainer``,
one run.

Same generated data (``lab/train.py``'s ``synthetic``: random bf16 hidden states of a
Llama-3.1-8B-shaped target, ``--samples`` x ``--seq-len`` tokens, speculators' offline layout), same
draft (``eagle3.train.draft_model. build_draft``: 1 layer, hidden 4096, draft vocab 32000 from the
data's token frequencies padded, target vocab 128256), same TTT steps (3), one sequence of
``--seq-len`` tokens per step, bf16 autocast, AdamW.

- ours: ``eagle3.train.stage.train(cfg, data_dir, out_dir)``; tokens/s = the loop's own logged
  ``tokens_per_s`` (positions of a window of ``--log-every`` optimizer steps / wall time of those
  steps, each step ending in one device sync), median over the windows after the warm-up; a window's
  metrics cost one more sync.
- speculators: ``speculators.train.trainer.Trainer`` with its own data loader
  (``create_train_val_loaders``: ``ArrowDataset`` + ``FileTransfer`` + multipack sampler,
  ``--workers`` workers), its model-call kwargs (``Eagle3DraftModel.get_trainer_kwargs``: kl_div
  loss) and its loop; tokens/s = non-padding positions per step / wall time between steps (one
  device sync per step, in ``step_callback``). Tried in speculators' default configuration first
  (flex attention, fused loss, compiled forward), then with the settings that work; every failure is
  printed with its error.

The first ``--warmup`` steps of each are left out (compilation, caches). MFU = model FLOPs per token
x tokens/s / 989e12 (H200 SXM dense bf16 datasheet); model FLOPs per token = TTT x (6 x trainable
matmul params + 4 x frozen LM-head params) + attention (TTT x 12 x layers x hidden x mean context),
context growing by one sequence per TTT step.

    python lab/gpu_train.py                     # H200
    python lab/gpu_train.py --num-gpus 2 --only ours   # torchrun, 2 GPUs
    python lab/gpu_train.py --tiny              # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEAK_BF16 = 989e12
from lab.gpu_train_speculators import run_speculators  # noqa: E402
from lab.profiling import StepProfiler, flops_per_token  # noqa: E402

TINY = dict(
    vocab_size=2048,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
    rope_theta=10000.0,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
)


def base_overrides(a, work: Path, target: Path) -> list[str]:
    # no evaluation or checkpoint inside the measured steps (eval_every=0 would evaluate and write a
    # checkpoint at every epoch end: with few samples several per run, whose disk writes then slowed
    # the next runs' loaders)
    return [
        f"paths.runs_dir={work / 'runs'}",
        f"train.device={'cuda' if a.cuda else 'cpu'}",
        f"train.max_steps={a.steps}",
        "train.schedule=constant",
        f"train.log_every={a.log_every}",
        f"train.eval_every={a.steps + 1}",
        "train.epochs=1000",
        f"train.draft_vocab_size={a.draft_vocab}",
        "train.pad_draft_vocab=true",
        "train.warmup_steps=0",
        f"train.max_tokens_per_batch={a.seq_len}",
        f"train.num_gpus={a.num_gpus}",
        "train.max_eval_samples=1",
        "train.keep_last=1",
        "train.precision=bf16-autocast",
        f"train.ttt_steps={a.ttt}",
        "train.checkpoint_every=0",
        "train.export=last",
        "target.kind=hf",
        f"target.path={target}",
        f"train.lr={a.lr}",
    ] + ([f"train.loader_workers={a.ours_workers}"] if a.ours_workers is not None else [])


class _Measured(Exception):
    """Raised from our run's metrics callback after its last measured window (nothing after it is
    timed)."""


def run_ours(a, work: Path, target: Path, hs: Path, mode: str = "eager") -> dict:
    """This project's loop; ``mode`` = ``eager`` (no compile) or a ``train.compile_mode``."""
    import torch

    from eagle3.config import load_config
    from eagle3.train.stage import train

    compiled = mode != "eager"
    extra = [f"train.compile={str(compiled).lower()}"] + (
        [f"train.compile_mode={mode}"] if compiled else []
    )
    cfg = load_config(None, base_overrides(a, work, target) + extra + list(a.ours_override))
    out = work / f"out-ours-{a.num_gpus}-{mode}"
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    tps: list[float] = []  # one figure per log window of a.log_every optimizer steps
    L = a.log_every
    wu, pw = -(-a.warmup // L), -(-a.profile // L) if a.num_gpus == 1 else 0
    prof = StepProfiler(f"ours-{mode}", wu, pw, a.out, per_call=L)
    if a.cuda:
        torch.cuda.reset_peak_memory_stats()

    windows = a.steps // L  # the loop logs every L steps; the last window ends the measurement

    def on_metrics(m, s):
        if "tokens_per_s" in m:
            tps.append(m["tokens_per_s"])
            prof.step(len(tps))
            if len(tps) >= windows and a.num_gpus == 1:
                raise _Measured  # skip the final evaluation, checkpoint, export: not timed

    t0 = time.perf_counter()
    try:
        train(cfg, hs, out, progress=False, on_metrics=on_metrics)
    except _Measured:
        pass
    wall = time.perf_counter() - t0
    if not tps:  # torchrun path
        tps = [
            json.loads(x)["tokens_per_s"]
            for x in (out / "metrics.jsonl").read_text().splitlines()
            if '"tokens_per_s"' in x
        ]
    peak = torch.cuda.max_memory_allocated() / 2**30 if a.cuda and a.num_gpus == 1 else float("nan")
    steady = [x for i, x in enumerate(tps) if i >= wu and not wu + 1 <= i + 1 <= wu + pw]
    if not steady:
        raise RuntimeError(
            f"no measured window left after {wu} warm-up and {pw} profiled "
            f"windows of {L} steps ({len(tps)} windows): raise --steps"
        )
    from eagle3.train.ttt_forward import choose

    impl, attention = choose(cfg.train, "cuda" if a.cuda else "cpu", a.num_gpus)
    opt = (
        cfg.train.optimizer_impl
        if cfg.train.optimizer_impl != "auto"
        else ("fused" if a.cuda else "default")
    )
    how = f"compiled ({mode}, static shapes, padded)" if compiled and a.cuda else "uncompiled"
    how += "".join(f", {o}" for o in a.ours_override)
    return {
        "name": f"ours ({a.num_gpus} GPU)" if a.cuda else "ours (cpu)",
        "tokens_per_s": statistics.median(steady),
        "peak_gib": peak,
        "steps": a.steps,
        "wall_s": wall,
        "profile": prof.result,
        "settings": f"{impl} forward, {attention} attention, {cfg.train.loss} loss, {how}, AdamW "
        f"{opt}, {a.ours_workers if a.ours_workers is not None else (4 if a.cuda else 0)} "
        f"loader workers",
    }


def _partial(a, rows: list[dict], failures: list[str], rnd: int) -> None:
    """``--out/gpu_train_rounds.json``: the rows (tokens/s, peak GiB, settings) of the rounds
    finished so far."""
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gpu_train_rounds.json").write_text(
        json.dumps(
            {"rounds_done": rnd + 1, "rows": rows, "failures": failures}, indent=1, default=str
        )
    )


def torch_format(hs: Path) -> None:
    """Give ``hs/data`` the torch format that extraction writes (speculators' reader compares
    tensors)."""
    import shutil

    import datasets

    ds = datasets.load_from_disk(str(hs / "data"))
    if ds.format["type"] == "torch":
        return
    ds = ds.cast(
        datasets.Features(
            {
                "input_ids": datasets.Sequence(datasets.Value("int64")),
                "loss_mask": datasets.Sequence(datasets.Value("int64")),
                "seq_len": datasets.Value("int64"),
            }
        )
    )
    ds.set_format("torch", columns=["input_ids", "loss_mask", "seq_len"], output_all_columns=True)
    ds.save_to_disk(str(hs / "data.tmp"))
    shutil.rmtree(hs / "data")
    (hs / "data.tmp").rename(hs / "data")


def main() -> int:
    import torch

    import lab.train as bt

    p = argparse.ArgumentParser()
    p.add_argument(
        "--tiny",
        action="store_true",
        help="CPU smoke test: a tiny target, 6 samples x 128 tokens, 6 steps (1 warm-up), draft "
        "vocab 512, no loader workers, logging every step (these override the matching options)",
    )
    p.add_argument("--work", default="/tmp/eagle3-gpu-train")
    p.add_argument("--samples", type=int, default=24)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--draft-vocab", type=int, default=32000)
    p.add_argument("--ttt", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--num-gpus", type=int, default=1)
    p.add_argument(
        "--skip-known-failures",
        action="store_true",
        help="start speculators at sdpa + eager loss (its flex/fused defaults fail on torch 2.11)",
    )
    p.add_argument(
        "--uncompiled-only", action="store_true", help="no torch.compile anywhere (short runs)"
    )
    p.add_argument("--only", choices=["ours", "speculators", "both"], default="both")
    p.add_argument(
        "--shape",
        choices=["llama8b", "smollm2"],
        default="llama8b",
        help="target/draft shape (lab/train.py SHAPES); smollm2 = hidden 576, vocab 49152",
    )
    p.add_argument(
        "--modes",
        default="eager,default",
        help="our runs: comma list of eager (uncompiled) and train.compile_mode values "
        "(default, reduce-overhead, max-autotune-no-cudagraphs)",
    )
    p.add_argument(
        "--ours-workers", type=int, default=None, help="train.loader_workers (None = 4 on CUDA)"
    )
    p.add_argument(
        "--ours-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for our runs (repeatable), e.g. train.optimizer_impl=fused: one "
        "lever measured against the same speculators runs",
    )
    p.add_argument(
        "--log-every",
        type=int,
        default=1,
        help="train.log_every of ours: one metrics sync per window (speculators' runs log never); "
        "ours' tokens/s is the median over windows",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        help="profile this many steps after the warm-up of each run (left out of tokens/s)",
    )
    p.add_argument(
        "--out", default=None, help="folder for profile tables and gpu_train.json (e.g. $OUT)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="alternating rounds (speculators, then ours, again): "
        "tokens/s is each trainer's median over rounds; profiles come from round 0",
    )
    p.add_argument(
        "--results",
        default=None,
        metavar="JSON",
        help="also merge this shape's figures (both trainers' tokens/s, the ratio, peak memory) "
        "into JSON under shapes.<shape> (e.g. lab/results/DATE_gpu_train_3rounds.json; "
        "written to --out/results/ when --out is given, else in place)",
    )
    a = p.parse_args()
    a.cuda = torch.cuda.is_available()
    a.out = Path(a.out) if a.out else None
    if a.results is not None:
        from lab.gpu_train_report import read_results, results_destination

        try:
            read_results(Path(a.results))
            results_destination(Path(a.results), a.out)
        except ValueError as e:
            p.error(f"--results: {e}")
    from eagle3.train.draft_model import COMPILE_MODES

    from eagle3.config import load_config
    from eagle3.errors import ConfigError

    try:
        if a.num_gpus < 1:
            p.error(f"--num-gpus: expected >= 1, got {a.num_gpus}")
        # as our runs will load it (their device and process count), so a setting they would refuse
        # is refused here
        load_config(
            None,
            [f"train.num_gpus={a.num_gpus}", f"train.device={'cuda' if a.cuda else 'cpu'}"]
            + list(a.ours_override),
        )
    except ConfigError as e:
        p.error(f"--ours-override: {e}")
    # keys this benchmark sets for both trainers (or that its figures are computed from): changing
    # them for ours alone would compare unlike runs under the recorded settings
    fixed = {
        "train.max_steps": "--steps",
        "train.ttt_steps": "--ttt",
        "train.lr": "--lr",
        "train.draft_vocab_size": "--draft-vocab",
        "train.max_tokens_per_batch": "--seq-len",
        "train.num_gpus": "--num-gpus",
        "train.precision": None,
        "train.schedule": None,
        "train.warmup_steps": None,
        "target.path": None,
        "target.kind": None,
    }
    for o in a.ours_override:
        key = o.split("=", 1)[0].strip()
        if key in fixed:
            p.error(
                f"--ours-override {o!r}: {key} is set by this benchmark for both trainers"
                + (f" (use {fixed[key]})" if fixed[key] else "")
            )
    bad = [m for m in a.modes.split(",") if m and m != "eager" and m not in COMPILE_MODES]
    if bad or not a.modes.strip(","):
        p.error(
            f"--modes: expected a comma list of eager, {', '.join(COMPILE_MODES)}; got {a.modes!r}"
        )
    shape = a.shape
    if a.tiny:
        bt.SHAPES["tiny"] = TINY
        shape, a.samples, a.seq_len, a.steps, a.warmup, a.draft_vocab, a.workers = (
            "tiny",
            6,
            128,
            6,
            1,
            512,
            0,
        )
        a.log_every = 1
        print(
            "--tiny: 6 samples x 128 tokens, 6 steps (first 1 left "
            "out), draft vocab 512, 0 workers, log every step",
            file=sys.stderr,
        )
    for bad, msg in (
        (
            min(a.steps, a.log_every, a.seq_len, a.ttt, a.num_gpus, a.rounds) < 1,
            "--steps, --log-every, --seq-len, --ttt, --num-gpus and --rounds must be ≥ 1",
        ),
        (a.samples < 4, f"--samples: expected ≥ 4 (one is held out), got {a.samples}"),
        (not 0 < a.lr < float("inf"), f"--lr: expected a finite value > 0, got {a.lr}"),
        (a.draft_vocab < 2, f"--draft-vocab: expected ≥ 2, got {a.draft_vocab}"),
        (a.workers < 0, f"--workers: expected ≥ 0, got {a.workers}"),
        (
            a.ours_workers is not None and a.ours_workers < 0,
            f"--ours-workers: expected ≥ 0, got {a.ours_workers}",
        ),
        (
            a.out is not None and a.out.exists() and not a.out.is_dir(),
            f"--out: {a.out} exists and is not a folder",
        ),
        (a.warmup < 0 or a.profile < 0, "--warmup and --profile must be ≥ 0"),
        (
            a.steps < a.warmup + a.profile + a.log_every,
            f"--steps {a.steps}: expected ≥ --warmup + --profile + --log-every ({a.warmup} "
            f"+ {a.profile} + {a.log_every}) so that some measured steps are left",
        ),
        (
            a.profile > 0 and a.out is None,
            "--profile needs --out (the folder for the profile tables)",
        ),
    ):
        if bad:
            p.error(msg)
    if not a.cuda and a.modes != "eager" and not a.uncompiled_only:
        print(
            f"--modes {a.modes}: no CUDA here, so ours runs uncompiled (eager) only",
            file=sys.stderr,
        )
    work = Path(a.work)
    t0 = time.perf_counter()
    target, hs = bt.synthetic(work, shape, a.samples, a.seq_len)
    torch_format(hs)
    print(f"data: {hs} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    rows, failures = [], []
    attempts = (
        [
            ("simple_flex_attention", "fused", True),
            ("sdpa", "fused", True),
            ("sdpa", "eager", True),
            ("sdpa", "eager", False),
        ]
        if a.cuda
        else [("sdpa", "eager", False)]
    )
    if a.skip_known_failures and a.cuda:
        attempts = attempts[2:]
    if a.uncompiled_only:
        attempts = [("sdpa", "eager", False)]
    modes = ["eager"] if a.uncompiled_only or not a.cuda else [m for m in a.modes.split(",") if m]
    spec_model = None
    for rnd in range(a.rounds):
        if rnd:
            a.profile = 0  # profiles come from round 0
        if a.only in ("speculators", "both"):
            for attn, loss_impl, compiled in attempts:
                try:
                    row = run_speculators(a, work, target, hs, attn, loss_impl, compiled)
                    trained = row.pop(
                        "model"
                    )  # off the device: no round's model counts in a later run's peak
                    spec_model = trained.to("cpu") if spec_model is None else spec_model
                    del trained
                    rows.append({**row, "round": rnd})
                    print("ROW " + json.dumps(rows[-1]), flush=True)
                    attempts = [
                        (attn, loss_impl, compiled)
                    ]  # later rounds: the configuration that ran
                    break
                except Exception as e:  # noqa: BLE001 - report and try the next configuration
                    failures.append(
                        f"speculators Trainer "
                        f"{attn}/{loss_impl}/{'compiled' if compiled else 'eager'}: "
                        f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                    )
                    traceback.print_exc(limit=3)
                    torch._dynamo.reset()
                    if a.cuda:
                        torch.cuda.empty_cache()
            # speculators' frames are ours too: its graphs must not count against our runs'
            # recompile limit
            torch._dynamo.reset()
            if a.cuda:
                torch.cuda.empty_cache()
        if a.only in ("ours", "both"):
            for mode in modes:
                try:
                    rows.append({**run_ours(a, work, target, hs, mode), "round": rnd})
                    print("ROW " + json.dumps(rows[-1]), flush=True)
                except Exception as e:  # noqa: BLE001 - report and go on with the next mode
                    traceback.print_exc(limit=4)
                    failures.append(
                        f"ours {mode} (round {rnd}): {type(e).__name__}: "
                        f"{' / '.join(str(e).splitlines())[:600]}"
                    )
                torch._dynamo.reset()  # each run compiles afresh: no graphs carried over
                if a.cuda:
                    torch.cuda.empty_cache()
        if a.out is not None:  # after every round: a call cut short keeps the rounds it finished
            _partial(a, rows, failures, rnd)
    model = spec_model  # speculators' first trained draft (on the CPU), for the FLOPs per token
    if model is None:
        from eagle3.artifacts import read_manifest
        from eagle3.train.draft_model import build_draft
        from eagle3.train.vocab import build_vocab_map, load_token_freq

        tconf = json.loads((target / "config.json").read_text())
        vmap = build_vocab_map(
            load_token_freq(hs / "token_freq.pt"), a.draft_vocab, tconf["vocab_size"], pad=True
        )
        model = build_draft(
            target,
            aux_layer_ids=read_manifest(hs)["aux_layer_ids"],
            d2t=vmap.d2t,
            t2d=vmap.t2d,
            num_layers=1,
            ttt_steps=a.ttt,
            flags={},
        )
    fpt = flops_per_token(model, a.ttt, a.seq_len)
    name = torch.cuda.get_device_name() if a.cuda else "cpu"
    import transformers
    from importlib.metadata import version

    print(
        f"device {name}; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, speculators {version('speculators')}; draft: 1 "
        f"layer, hidden {model.config.transformer_layer_config.hidden_size}, draft vocab "
        f"{a.draft_vocab}, TTT {a.ttt}, {a.seq_len}-token sequences, bf16 autocast, "
        f"{a.steps} steps (first {a.warmup} left out); model FLOPs/token {fpt / 1e9:.2f} G"
    )
    for f in failures:
        print(f"FAILED: {f}")
    from lab.gpu_train_report import print_table, summarize, write_json

    summary = summarize([r for r in rows if "tokens_per_s" in r], fpt, PEAK_BF16)
    print_table(summary, rows)
    spec = [r for r in rows if r["name"].startswith("speculators")]
    meta = {
        "device": name,
        "shape": shape,
        "rounds": a.rounds,
        "steps": a.steps,
        "warmup": a.warmup,
        "seq_len": a.seq_len,
        "draft_vocab": a.draft_vocab,
        "ttt": a.ttt,
        "model_flops_per_token": fpt,
        "peak_flops": PEAK_BF16,
        "torch": torch.__version__,
        "failures": failures,
    }
    if a.out is not None:
        write_json(a.out / "gpu_train.json", summary, meta)
    if a.results is not None:
        from lab.gpu_train_report import merge_results

        dest = merge_results(Path(a.results), a.out, summary, meta)
        print(f"shape {shape} merged into {dest}")
    # 1 when a run of ours failed or speculators ran in none of its configurations (its
    # known-failing defaults that a later configuration replaced do not count)
    ours_failed = any(f.startswith("ours ") for f in failures)
    spec_missing = a.only in ("speculators", "both") and not spec
    return 1 if ours_failed or spec_missing else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
