"""Extraction throughput versus the plain forward pass of the same target, on the GPU, in one run.

A randomly initialised target of a published shape (default: Llama-3.1-8B, bf16) is built directly
on the device; random token streams of ``--seq-len`` tokens are batched ``--batch-size`` at a time.
Alternating for ``--repeats`` rounds over the same batches:

(a) plain forward of the whole model (with the LM head, as serving computes it),
(b) the decoder body alone (what extraction must run: no logits are needed),
(c) ``eagle3.extract.hf_backend.run_shards`` (aux capture, device → pinned-host copies on a side
    stream, integrity checks, encoding, atomic fsync'd writes by writer threads) into ``--out`` (a
    real disk), bf16 storage,
(d) the same into ``/dev/shm`` (RAM) to separate the pipeline from the disk,
then once with fp8 storage for bytes/token. Also a raw disk write probe (GB/s, fsync'd) of the same
bytes.

    python lab/gpu_extract.py                       # H200: 8B shape, 4 x 2048 tokens per batch
    python lab/gpu_extract.py --tiny                # CPU smoke test (tiny shape)

Prints the table last: tokens/s of each, ratios extraction / forward measured side by side.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    "llama8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    "tiny": dict(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
}


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def disk_probe(path: Path, nbytes: int, files: int) -> float:
    """GB/s writing ``nbytes`` in ``files`` fsync'd files under ``path`` (4 threads, like the
    extractor)."""
    from concurrent.futures import ThreadPoolExecutor

    blob = os.urandom(max(1, nbytes // files))

    def one(k: int) -> None:
        p = path / f"probe_{k}.bin"
        with open(p, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(one, range(files)))
    secs = time.perf_counter() - t0
    for p in path.glob("probe_*.bin"):
        p.unlink()
    return len(blob) * files / secs / 1e9


def main() -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle3.extract.hf_backend import WorkerJob, forward_capture, run_shards
    from eagle3.extract.store import make_shards
    from eagle3.target_model import default_aux_layer_ids

    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--shape", default="llama8b", choices=sorted(SHAPES))
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="/tmp/eagle3-gpu-extract")
    a = p.parse_args()
    if a.tiny:
        a.shape, a.seq_len, a.batches, a.repeats = "tiny", 128, 3, 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    conf = LlamaConfig(**SHAPES[a.shape])
    conf._attn_implementation = "sdpa"  # noqa: SLF001
    with torch.device(device):
        model = LlamaForCausalLM(conf).to(torch.bfloat16).eval()
    L = conf.num_hidden_layers
    capture = default_aux_layer_ids(L) + [L]
    n = a.batch_size * a.batches
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, conf.vocab_size, (a.seq_len,), generator=g).tolist() for _ in range(n)]
    batches = [ids[b : b + a.batch_size] for b in range(0, n, a.batch_size)]
    tokens = n * a.seq_len

    def fwd(body_only: bool):
        m = model.model if body_only else model
        with torch.inference_mode():
            for batch in batches:
                m(input_ids=torch.tensor(batch, device=device), use_cache=False)

    job_args = dict(
        target_dir="(in memory)",
        model_dtype="bfloat16",
        device=str(device),
        capture_ids=capture,
        batch_size=a.batch_size,
        sample_ids=[f"s{i}" for i in range(n)],
        input_ids=ids,
        loss_masks=[[1] * a.seq_len for _ in range(n)],
        shards=make_shards(n, n),
    )

    def extract(root: Path, dtype: str) -> tuple[float, int]:
        out = Path(tempfile.mkdtemp(dir=root))
        (out / "hidden_states").mkdir()
        job = WorkerJob(**job_args, store_dtype=dtype, out_dir=str(out))
        written: dict = {}
        secs = timed(lambda: written.update(run_shards(job, model=model)), device)
        shutil.rmtree(out)
        return secs, sum(written.values())

    disk = Path(a.out)
    disk.mkdir(parents=True, exist_ok=True)
    shm = Path(
        tempfile.mkdtemp(
            prefix="eagle3-extract-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
        )
    )
    fwd(False)
    forward_capture(model, capture, batches[0], 0)  # warm-up of both paths
    extract(shm, "bfloat16")
    res: dict[str, list[float]] = {k: [] for k in ("fwd", "body", "ext_disk", "ext_shm")}
    nbytes = 0
    for _ in range(a.repeats):
        res["fwd"].append(tokens / timed(lambda: fwd(False), device))
        res["body"].append(tokens / timed(lambda: fwd(True), device))
        s, nbytes = extract(disk, "bfloat16")
        res["ext_disk"].append(tokens / s)
        s, _ = extract(shm, "bfloat16")
        res["ext_shm"].append(tokens / s)
    s8, bytes_fp8 = extract(disk, "fp8")
    gbps = disk_probe(disk, nbytes, n)
    shutil.rmtree(shm, ignore_errors=True)
    m = {k: statistics.median(v) for k, v in res.items()}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"device {name}; torch {torch.__version__}; target {a.shape} random bf16 "
        f"({L} layers, hidden {conf.hidden_size}); {n} samples x {a.seq_len} "
        f"tokens, batches of {a.batch_size}; aux {capture[:-1]} + last; median "
        f"of {a.repeats} rounds; raw fsync'd disk write {gbps:.2f} GB/s"
    )
    print("| path | tokens/s | / plain forward | / decoder body |")
    print("|---|---|---|---|")
    for k, label in (
        ("fwd", "plain forward (with LM head)"),
        ("body", "decoder body only"),
        ("ext_disk", f"extraction bf16 -> {disk}"),
        ("ext_shm", "extraction bf16 -> /dev/shm"),
    ):
        print(f"| {label} | {m[k]:,.0f} | {m[k] / m['fwd']:.3f} | {m[k] / m['body']:.3f} |")
    print(
        f"| extraction fp8 -> {disk} (1 round) | {tokens / s8:,.0f} | "
        f"{tokens / s8 / m['fwd']:.3f} | {tokens / s8 / m['body']:.3f} |"
    )
    print(f"| bytes/token bf16 | {nbytes / tokens:,.1f} | | |")
    print(f"| bytes/token fp8 | {bytes_fp8 / tokens:,.1f} ({bytes_fp8 / nbytes:.3f} of bf16) | | |")
    print(
        f"extraction(disk) / plain forward = {m['ext_disk'] / m['fwd']:.3f}; "
        f"extraction(RAM) / plain forward = {m['ext_shm'] / m['fwd']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
