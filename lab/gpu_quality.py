"""Quality parity on SmolLM2-135M-Instruct + ShareGPT: this project's trainer vs speculators'
``Trainer``, and fp8- vs bf16-stored hidden states, in one run.

Stages (one process; each stage's figures are written to ``--out/results.json`` as soon as it ends,
so a run stopped by a time limit still reports what it finished):

1. target: SmolLM2-135M-Instruct as an HF folder, converted from its GGUF by the project's own
   :func:`eagle3.assets.prepare_smollm2` (``--gguf``), or an existing folder (``--target``).
2. extract bf16: :func:`eagle3.extract.stage.extract` (backend hf), ``--max-convs`` conversations of
   ``--data`` (seeded order, first N usable), cut at ``--max-seq-len`` tokens, 5% held out
   (``data.val_fraction``).
3. ours bf16: :func:`eagle3.train.stage.train` on it (constant LR ``--lr``, no warmup, ``--epochs``
   epochs, packed micro-batches of ``--tokens-per-batch`` tokens, one per optimizer step, bf16
   autocast, TTT 3, kl_div loss).
4. speculators: ``speculators.train.trainer.Trainer`` on the same folder with its own loader
   (``create_train_val_loaders``, multipack to ``--tokens-per-batch``), the same draft (same
   :func:`eagle3.train.draft_model.build_draft` call and seed), LR, epochs, TTT, loss (kl_div,
   eager), clip 1.0, no weight decay, no schedule; uncompiled forward on both sides (``--compile``
   compiles both).
5. extract fp8 (``extract.dtype=fp8``) of the same conversations; ours fp8: step 3 on that folder.
6. simulated acceptance length (the project's :func:`eagle3.train.loop.evaluate`: greedy chain
   acceptance of the TTT steps' predictions against the verifier's argmax, bonus token counted) of
   every draft on the held-out rows of the *bf16* folder: each draft is loaded with
   ``train.init_from`` into a ``train.max_steps=0`` run.
7. offline acceptance length (:func:`eagle3.measure.offline.offline_acceptance` with
   :class:`refengine.specdec.SpeculativeDecoder`: real chain speculative decoding, 3 draft tokens
   per verify pass, greedy, bonus counted) of each draft, converted to SGLang's format by
   :func:`eagle3.convert.stage.convert`, on the first user turns of ``--offline-prompts`` held-out
   conversations, ``--max-new-tokens`` tokens each.

The table printed last has one row per draft; the goals: ours ≥ 0.98 × speculators, fp8-trained ≥
0.98 × bf16-trained, on both acceptance figures.

    python lab/gpu_quality.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --data sharegpt_en.jsonl \\
        --max-convs 2000 --out $OUT                                # GPU
    python lab/gpu_quality.py --device cpu --max-convs 16 --draft-vocab 512 --offline-prompts 2 \\
        --max-new-tokens 16                     # CPU smoke test (uses the asset cache)
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.peer import do_speculators  # noqa: E402
from lab.harness import Results, data_file, log, prepare_target, stage  # noqa: E402

GOAL = 0.98
STAGES = (
    "target",
    "extract/bf16",
    "extract/fp8",
    "train/ours-bf16",
    "train/ours-fp8",
    "sim/ours-fp8",
    "train/speculators-bf16",
    "sim/speculators-bf16",
)  # in run order; offline acceptance comes last


def overrides(a, work: Path, target: Path, data: Path) -> list[str]:
    return [
        f"paths.runs_dir={work / 'runs'}",
        f"paths.cache_dir={work / 'cache'}",
        "target.kind=hf",
        f"target.path={target}",
        "target.dtype=bfloat16",
        "data.source=file",
        f"data.path={data}",
        f"data.num_conversations={a.max_convs}",
        f"data.max_seq_len={a.max_seq_len}",
        "data.val_fraction=0.05",
        "extract.backend=hf",
        f"extract.batch_size={a.extract_batch}",
        f"extract.device={a.device}",
        f"train.device={a.device}",
        f"train.ttt_steps={a.ttt}",
        f"train.draft_vocab_size={a.draft_vocab}",
        "train.schedule=constant",
        "train.warmup_steps=0",
        f"train.epochs={a.epochs}",
        f"train.lr={a.lr}",
        f"train.max_tokens_per_batch={a.tokens_per_batch}",
        "train.grad_accum=1",
        "train.precision=bf16-autocast",
        "train.log_every=10",
        "train.eval_every=0",
        "train.export=last",
        "train.keep_last=1",
        "train.loss=kl_div",
        "train.loss_implementation=eager",
        f"train.compile={str(a.compile).lower()}",
        "train.resume=false",
        "train.weight_decay=0.0",
        f"train.compile_mode={a.compile_mode}",
    ]


def memoize_plan():
    """Tokenise the conversations once for both extractions (same data section → same plan)."""
    import eagle3.extract.stage as ex

    orig, cache = ex.build_plan, {}

    def build_plan(cfg, tokenizer, regen=None):
        key = (cfg.data.model_dump_json(), id(regen) if regen else None)
        if key not in cache:
            cache[key] = orig(cfg, tokenizer, regen)
        return cache[key]

    ex.build_plan = build_plan


def do_extract(a, base: list[str], out_dir: Path, dtype: str) -> dict:
    from eagle3.config import load_config
    from eagle3.extract.stage import extract

    shutil.rmtree(out_dir, ignore_errors=True)
    t0 = time.perf_counter()
    m = extract(load_config(None, base + [f"extract.dtype={dtype}"]), out_dir, progress=False)
    c = m["counts"]
    return {
        "dir": str(out_dir),
        "seconds": time.perf_counter() - t0,
        "samples": c["samples"],
        "train_samples": c["train_samples"],
        "val_samples": c["val_samples"],
        "tokens": c["tokens"],
        "loss_tokens": c["loss_tokens"],
        "truncated": c["truncated"],
        "bytes": m["bytes"],
        "bytes_per_token": m["bytes_per_token"],
        "tokens_per_s": m["tokens_per_s"],
        "records": c["records"],
        "skipped": c["skipped"],
    }


def do_train(a, base: list[str], hs: Path, out_dir: Path, extra: list[str] = ()) -> dict:
    """This project's trainer; returns its figures (simulated acceptance from its own final
    evaluation)."""
    import torch

    from eagle3.config import load_config
    from eagle3.train.stage import train

    shutil.rmtree(out_dir, ignore_errors=True)
    tps: list[float] = []
    t0 = time.perf_counter()
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    man = train(
        load_config(None, base + list(extra)),
        hs,
        out_dir,
        progress=False,
        on_metrics=lambda m, s: tps.append(m["tokens_per_s"]) if "tokens_per_s" in m else None,
    )
    ev = man["metrics"]["final_eval"]
    return {
        "dir": str(out_dir),
        "seconds": time.perf_counter() - t0,
        "steps": man["optimizer_steps"],
        "tokens_seen": man["counts"]["tokens_seen"],
        "epochs_over_data": man["epochs_over_data"],
        "simulated_acceptance_length": ev.get("val/simulated_acceptance_length"),
        "val_loss": ev.get("val/loss"),
        "val_acc_0": ev.get("val/acc_full_0"),
        "train_tokens_per_s_median": sorted(tps)[len(tps) // 2] if tps else None,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if a.device == "cuda" else None,
    }


def sim_eval(a, base: list[str], hs: Path, draft: Path, out_dir: Path) -> dict:
    """Simulated acceptance of ``draft`` on ``hs``'s held-out rows: a ``max_steps=0`` run started
    from it."""
    r = do_train(a, base, hs, out_dir, [f"train.init_from={draft}", "train.max_steps=0"])
    return {
        k: r[k] for k in ("dir", "simulated_acceptance_length", "val_loss", "val_acc_0", "seconds")
    }


def held_out_prompts(hs: Path, data: Path, k: int) -> list[dict]:
    """First user turns of the first ``k`` held-out conversations of ``hs`` (by id, from the source
    file)."""
    import datasets

    from eagle3.artifacts import read_manifest
    from eagle3.extract.conversations import read_conversations

    val = read_manifest(hs)["splits"]["val"][:k]
    ds = datasets.load_from_disk(str(hs / "data"))
    ids = [ds[int(i)]["id"] for i in val]
    convs = {c.id: c for c in read_conversations(data)[0]}
    out = []
    for i in ids:
        first = next(m["content"] for m in convs[i].messages if m["role"] == "user")
        out.append({"id": i, "category": "sharegpt-val", "text": first})
    return out


def offline(
    a, target: Path, drafts: dict[str, Path], prompts: list[dict], work: Path, res: Results
) -> None:
    import torch

    from eagle3.measure.offline import offline_acceptance
    from eagle3.convert.stage import convert
    from eagle3.engines.sglang.draft import SGLangEagle3Draft
    from refengine.specdec import SpeculativeDecoder
    from eagle3.target_model import load_target, torch_dtype

    tgt, tok = load_target(target, dtype=a.offline_dtype, device=a.device)
    for name, src in drafts.items():
        if f"offline/{name}" in res.data["stages"]:
            log(f"offline {name}: done in an earlier call")
            continue
        try:
            t0 = time.perf_counter()
            dst = work / f"serving-{name}"
            shutil.rmtree(dst, ignore_errors=True)
            convert(src, dst, engine="sglang", target_dir=target)
            draft = SGLangEagle3Draft.from_dir(
                dst,
                dtype=torch_dtype(a.offline_dtype),
                device=a.device,
                target_embed=tgt.get_input_embeddings().weight.detach(),
                target_head=tgt.get_output_embeddings().weight.detach(),
            )
            dec = SpeculativeDecoder.from_models(tgt, draft, tok, num_steps=a.ttt)
            r = offline_acceptance(
                target,
                dst,
                prompts,
                max_new_tokens=a.max_new_tokens,
                decoder=dec,
                dtype=a.offline_dtype,
            )
            res.put(
                f"offline/{name}",
                {
                    "acceptance_length": r["acceptance_length"],
                    "acceptance_rate": r["acceptance_rate"],
                    "per_position": r["per_position"],
                    "completion_tokens": sum(x["completion_tokens"] for x in r["per_request"]),
                    "verify_passes": sum(x["verify_ct"] for x in r["per_request"]),
                    "prompts": len(prompts),
                    "seconds": time.perf_counter() - t0,
                },
            )
            log(f"offline {name}: {r['acceptance_length']:.4f}")
            del draft, dec
            if a.device == "cuda":
                torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - report and go on with the next draft
            traceback.print_exc(limit=4)
            res.fail(f"offline {name}", e)


def table(res: Results) -> None:
    s = res.data["stages"]
    rows = [
        ("ours, bf16 data", "sim/ours-bf16", "offline/ours-bf16", "train/ours-bf16"),
        (
            "speculators Trainer, bf16 data",
            "sim/speculators-bf16",
            "offline/speculators-bf16",
            "train/speculators-bf16",
        ),
        ("ours, fp8 data", "sim/ours-fp8", "offline/ours-fp8", "train/ours-fp8"),
    ]

    def g(key, field):
        return (s.get(key) or {}).get(field)

    for f in res.data["failures"]:
        print(f"FAILED: {f}")
    ex = s.get("extract/bf16") or {}
    print(
        f"data: {ex.get('samples')} conversations ({ex.get('train_samples')} train / "
        f"{ex.get('val_samples')} held out), {ex.get('tokens')} tokens, {ex.get('loss_tokens')} "
        f"loss tokens, {ex.get('truncated')} cut at the length cap; bytes/token bf16 "
        f"{ex.get('bytes_per_token')}, fp8 {(s.get('extract/fp8') or {}).get('bytes_per_token')}"
    )
    print(
        "| draft | simulated AL (held-out, bf16 states) | "
        "offline AL (SpeculativeDecoder) | train s | steps |"
    )
    print("|---|---|---|---|---|")

    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)

    for label, sk, ok, tk in rows:
        print(
            f"| {label} | {fmt(g(sk, 'simulated_acceptance_length'), '.4f')} "
            f"| {fmt(g(ok, 'acceptance_length'), '.4f')} | "
            f"{fmt(g(tk, 'seconds'), '.1f')} | {g(tk, 'steps')} |"
        )
    for what, num, den in (
        ("ours / speculators", "ours-bf16", "speculators-bf16"),
        ("fp8-trained / bf16-trained", "ours-fp8", "ours-bf16"),
    ):
        for kind, field in (
            ("sim", "simulated_acceptance_length"),
            ("offline", "acceptance_length"),
        ):
            x, y = g(f"{kind}/{num}", field), g(f"{kind}/{den}", field)
            if x is not None and y:
                print(
                    f"{what} {kind} AL = {x / y:.4f} (goal ≥ {GOAL}: "
                    f"{'MET' if x / y >= GOAL else 'NOT MET'})"
                )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--work", default="/tmp/eagle3-quality", help="local scratch folder (hidden states, drafts)"
    )
    p.add_argument("--out", default=None, help="results.json goes here (default: --work)")
    p.add_argument("--gguf", default=None, help="SmolLM2-135M-Instruct GGUF to convert")
    p.add_argument("--target", default=None, help="an HF target folder instead of --gguf")
    p.add_argument(
        "--data", default=".benchdata/sharegpt_en.jsonl.gz", help="ShareGPT JSONL (.gz ok)"
    )
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--max-convs", type=int, default=11115)
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--extract-batch", type=int, default=32)
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--ttt", type=int, default=3)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--tokens-per-batch", type=int, default=2048)
    p.add_argument("--workers", type=int, default=4, help="speculators loader workers")
    p.add_argument(
        "--compile", action="store_true", help="torch.compile the draft forward on both sides"
    )
    p.add_argument("--offline-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--offline-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--skip", default="", help="comma list of stages to skip: spec,fp8,offline")
    p.add_argument(
        "--compile-mode",
        default="default",
        help="train.compile_mode of ours with --compile (default, reduce-overhead, ...)",
    )
    p.add_argument(
        "--resume", action="store_true", help="keep the stages <work>/results.json already has"
    )
    p.add_argument(
        "--until", default=None, help="stop after this stage (e.g. train/speculators-bf16)"
    )
    a = p.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    if skip - {"spec", "fp8", "offline"}:
        p.error(f"--skip: expected a comma list of spec, fp8, offline; got {sorted(skip)}")
    if a.until is not None and a.until not in STAGES:
        p.error(f"--until: expected one of {', '.join(STAGES)}; got {a.until!r}")
    skipped = {"spec": "speculators", "fp8": "fp8"}
    if a.until and any(skipped[k] in a.until for k in skip if k in skipped):
        p.error(f"--until {a.until}: that stage is skipped by --skip {a.skip}")
    from eagle3.train.draft_model import COMPILE_MODES

    if a.compile_mode not in COMPILE_MODES:
        p.error(
            f"--compile-mode: expected one of {', '.join(COMPILE_MODES)}; got {a.compile_mode!r}"
        )
    if a.compile_mode != "default" and not a.compile:
        p.error(f"--compile-mode {a.compile_mode} needs --compile")
    if not a.target and not Path(a.data).expanduser().is_file():
        p.error(f"--data: {a.data} is not a file (a ShareGPT JSONL, .gz allowed)")
    if a.gguf and not Path(a.gguf).is_file():
        p.error(f"--gguf: {a.gguf} is not a file")
    for name in (
        "max_convs",
        "max_seq_len",
        "extract_batch",
        "draft_vocab",
        "ttt",
        "tokens_per_batch",
    ):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected ≥ 1, got {getattr(a, name)}")
    if (
        not (a.lr > 0 and a.epochs > 0)
        or a.workers < 0
        or a.offline_prompts < 0
        or a.max_new_tokens < 1
    ):
        p.error(
            "--lr and --epochs must be > 0, --workers and "
            "--offline-prompts ≥ 0, --max-new-tokens ≥ 1"
        )
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    settings = {
        k: getattr(a, k)
        for k in (
            "max_convs",
            "max_seq_len",
            "draft_vocab",
            "ttt",
            "epochs",
            "lr",
            "tokens_per_batch",
            "compile",
            "compile_mode",
            "device",
        )
    }
    settings.update(
        {
            k: str(Path(getattr(a, k)).expanduser().resolve()) if getattr(a, k) else None
            for k in ("data", "gguf", "target")
        }
    )  # the same file by another path is the same
    res = Results(work, Path(a.out) if a.out else work, resume=a.resume, settings=settings)
    res.until, res.stop = a.until, False
    import torch

    from importlib.metadata import version
    import transformers

    calls = len([k for k in res.data["stages"] if k.startswith("env")])  # one env record per call
    res.put(
        f"env/{calls}",
        {
            "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "speculators": version("speculators"),
            "args": vars(a),
        },
    )
    target = stage(res, "target", lambda: {"dir": str(prepare_target(a, work))})
    if target is None:
        table(res)
        return 0 if res.stop else 1
    target = Path(target["dir"])
    data = data_file(a, work)
    base = overrides(a, work, target, data)
    memoize_plan()
    ex = stage(res, "extract/bf16", do_extract, a, base, work / "hs-bf16", "bfloat16")
    if ex is None:
        table(res)
        return 0 if res.stop and not res.data["failures"] else 1
    hs = work / "hs-bf16"
    fp8 = (
        None
        if "fp8" in skip
        else stage(res, "extract/fp8", do_extract, a, base, work / "hs-fp8", "fp8")
    )
    drafts: dict[str, Path] = {}
    if stage(res, "train/ours-bf16", do_train, a, base, hs, work / "ours-bf16"):
        res.put(
            "sim/ours-bf16",
            {
                k: res.data["stages"]["train/ours-bf16"][k]
                for k in ("simulated_acceptance_length", "val_loss", "val_acc_0")
            },
        )
        drafts["ours-bf16"] = work / "ours-bf16"
    if fp8:
        if stage(res, "train/ours-fp8", do_train, a, base, work / "hs-fp8", work / "ours-fp8"):
            res.put(
                "sim-own-fp8-val/ours-fp8",
                {
                    k: res.data["stages"]["train/ours-fp8"][k]
                    for k in ("simulated_acceptance_length", "val_loss")
                },
            )
            if stage(
                res,
                "sim/ours-fp8",
                sim_eval,
                a,
                base,
                hs,
                work / "ours-fp8",
                work / "ours-fp8-eval",
            ):
                drafts["ours-fp8"] = work / "ours-fp8-eval"
    if "spec" not in skip and stage(
        res, "train/speculators-bf16", do_speculators, a, target, hs, work / "spec-bf16"
    ):
        if stage(
            res,
            "sim/speculators-bf16",
            sim_eval,
            a,
            base,
            hs,
            work / "spec-bf16" / "draft",
            work / "spec-bf16-eval",
        ):
            drafts["speculators-bf16"] = work / "spec-bf16-eval"
    if "offline" not in skip and drafts and not res.stop:
        prompts = held_out_prompts(hs, data, a.offline_prompts)
        short = (
            f" (of {a.offline_prompts} asked: the held-out split has only {len(prompts)})"
            if len(prompts) < a.offline_prompts
            else ""
        )
        log(
            f"offline acceptance: {len(prompts)} held-out "
            f"prompts{short}, {a.max_new_tokens} new tokens"
        )
        offline(a, target, drafts, prompts, work, res)
    log("done")
    table(res)
    return 1 if res.data["failures"] else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
