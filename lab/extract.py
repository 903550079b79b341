"""Extraction throughput relative to the plain forward pass of the same target on the same batches.

    python lab/extract.py [--config configs/smollm2-cpu.yaml] [--num-conversations 16] \
        [--max-seq-len 128]

One run, one process, one loaded model: the samples are selected and batched exactly as
``eagle3.extract.stage`` does (shards, sorted by length, ``extract.batch_size``), then, alternating
for ``--repeats`` rounds, (a) the plain forward pass ``model(input_ids, attention_mask)`` (with the
LM head, what serving computes), (b) the decoder body alone (no LM head), and (c) the extractor's
``run_shards`` (aux capture, integrity checks, encoding, atomic fsync'd writes) into a temporary
directory. Throughputs are medians over rounds (tokens/s, real tokens only). Also reports
bytes/token of bf16 and fp8 storage. The last line is the ratio extraction / plain forward (goal >=
0.85).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
import typer

app = typer.Typer(add_completion=False)


def _batches(plan, shard_size: int, batch_size: int) -> list[list[list[int]]]:
    from eagle3.extract.store import make_shards

    out = []
    for spec in make_shards(len(plan.ids), shard_size):
        rows = sorted(range(spec.start, spec.stop), key=lambda i: (len(plan.input_ids[i]), i))
        out += [
            [plan.input_ids[i] for i in rows[b : b + batch_size]]
            for b in range(0, len(rows), batch_size)
        ]
    return out


def _forward_s(model, batches, pad_id: int, body_only: bool) -> float:
    t0 = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            t_max = max(len(x) for x in batch)
            ids = torch.full((len(batch), t_max), pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for b, x in enumerate(batch):
                ids[b, : len(x)] = torch.tensor(x)
                mask[b, : len(x)] = 1
            am = mask if int(mask.sum()) < mask.numel() else None
            (model.model if body_only else model)(input_ids=ids, attention_mask=am, use_cache=False)
    return time.perf_counter() - t0


def _extract_s(model, job_args: dict, store_dtype: str, workdir: Path) -> tuple[float, int]:
    from eagle3.extract.hf_backend import WorkerJob, run_shards

    out = Path(tempfile.mkdtemp(dir=workdir))
    (out / "hidden_states").mkdir()
    job = WorkerJob(**job_args, store_dtype=store_dtype, out_dir=str(out))
    t0 = time.perf_counter()
    written = run_shards(job, model=model)
    return time.perf_counter() - t0, sum(written.values())


@app.command()
def main(
    config: Path = typer.Option(Path("configs/smollm2-cpu.yaml")),
    num_conversations: int = 16,
    max_seq_len: int = 128,
    repeats: int = 3,
    batch_size: int | None = None,
) -> None:
    """Print forward / extraction throughputs, bytes per token (bf16, fp8) and, last, the ratio."""
    from transformers import AutoTokenizer

    from eagle3.assets import resolve_target
    from eagle3.config import load_config
    from eagle3.extract.precheck import aux_ids
    from eagle3.extract.stage import build_plan, target_identity
    from eagle3.extract.hf_backend import resolve_devices
    from eagle3.extract.store import make_shards
    from eagle3.target_model import load_target

    over = [f"data.num_conversations={num_conversations}", f"data.max_seq_len={max_seq_len}"]
    if batch_size:
        over.append(f"extract.batch_size={batch_size}")
    cfg = load_config(config, over)
    target_dir = resolve_target(cfg)
    ident = target_identity(target_dir, cfg)
    capture = aux_ids(cfg, ident["num_layers"]) + [ident["num_layers"]]
    plan = build_plan(cfg, AutoTokenizer.from_pretrained(target_dir))
    device = resolve_devices(cfg.extract.device, 1)[0]
    model, tok = load_target(target_dir, cfg.target.dtype, device)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    batches = _batches(plan, cfg.extract.shard_size, cfg.extract.batch_size)
    tokens = plan.num_tokens
    job_args = dict(
        target_dir=str(target_dir),
        model_dtype=cfg.target.dtype,
        device=device,
        capture_ids=capture,
        batch_size=cfg.extract.batch_size,
        sample_ids=plan.ids,
        input_ids=plan.input_ids,
        loss_masks=plan.loss_masks,
        shards=make_shards(len(plan.ids), cfg.extract.shard_size),
    )
    store = cfg.extract.dtype if cfg.extract.dtype != "fp8" else "bfloat16"
    _forward_s(model, batches[:1], pad, False)  # warm-up
    fwd, body, ext = [], [], []
    with tempfile.TemporaryDirectory() as work:
        for _ in range(repeats):
            fwd.append(tokens / _forward_s(model, batches, pad, False))
            body.append(tokens / _forward_s(model, batches, pad, True))
            secs, bytes_bf16 = _extract_s(model, job_args, store, Path(work))
            ext.append(tokens / secs)
        _, bytes_fp8 = _extract_s(model, job_args, "fp8", Path(work))
    f, b, e = (statistics.median(x) for x in (fwd, body, ext))
    print(
        f"target {target_dir.name} ({cfg.target.dtype}, {device}, {torch.get_num_threads()} "
        f"threads); {len(plan.ids)} samples, {tokens} tokens, {len(batches)} batches of <= "
        f"{cfg.extract.batch_size}; aux {capture[:-1]} + last; {repeats} rounds (median)"
    )
    print(f"| plain forward (with LM head) | {f:,.0f} tok/s |")
    print(f"| decoder body only            | {b:,.0f} tok/s |")
    print(f"| extraction ({store}, written) | {e:,.0f} tok/s |")
    print(f"| bytes/token {store:>9}          | {bytes_bf16 / tokens:,.1f} |")
    print(
        f"| bytes/token       fp8          | {bytes_fp8 / tokens:,.1f} "
        f"({bytes_fp8 / bytes_bf16:.3f} of {store}) |"
    )
    print(f"extraction / decoder-body forward = {e / b:.3f}")
    print(f"extraction / plain forward = {e / f:.3f}")


if __name__ == "__main__":
    app()
