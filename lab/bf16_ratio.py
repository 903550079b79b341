"""bf16 / float32 speed ratio of the machine it runs on: the fact behind every ``auto`` dtype
(eagle3.precision).

    python lab/bf16_ratio.py [--seconds 0.3] [--repeats 3]

For the matmul shapes the demo spends its time in (SmolLM2-135M: hidden 576, MLP 1536, a 4096-token
draft vocabulary; 512-token micro-batches in training, 4 × 512 tokens per extraction batch, 4 tokens
per verify pass in serving) and the probe's own shape, at one thread and at torch's thread count:
float32 and bf16 GFLOP/s, timed alternately in rounds of ``--seconds`` each (the best round counts;
the cores may be shared), and their ratio; then one forward + backward of a 576 → 1536 → 576 MLP on
512 tokens under bf16 autocast against float32 (what ``train.precision`` switches). The last line is
the ratio at the probe's shape and what ``auto`` resolves to here. Run it with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` to see what an
AVX2-only CPU does on a CPU with AMX (lab/NOTEBOOK.md, "The demo and the tests on a CPU
without native bf16").
"""

from __future__ import annotations

import time

import torch
import typer

app = typer.Typer(add_completion=False)

SHAPES = {  # name: (m, k, n) of [m, k] @ [k, n]
    "probe (eagle3.precision)": (256, 512, 512),
    "train MLP, 512 tokens": (512, 576, 1536),
    "train draft head, 512 tokens": (512, 576, 4096),
    "extract MLP, 4x512 tokens": (2048, 576, 1536),
    "serve verify MLP, 4 tokens": (4, 576, 1536),
}


def _rate(fn, flop: float, seconds: float, repeats: int) -> float:
    """GFLOP/s of ``fn`` (``flop`` per call): the best of ``repeats`` rounds of at least ``seconds``
    each (at least one call per round), after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= seconds:
                break
        best = min(best, dt / n)
    return flop / best / 1e9


def _matmul_pair(m: int, k: int, n: int, seconds: float, repeats: int) -> tuple[float, float]:
    a, b = torch.randn(m, k), torch.randn(k, n)
    a16, b16 = a.bfloat16(), b.bfloat16()
    flop = 2.0 * m * k * n
    f32 = _rate(lambda: a @ b, flop, seconds, repeats)
    bf16 = _rate(lambda: a16 @ b16, flop, seconds, repeats)
    return f32, bf16


def _mlp_step_pair(seconds: float, repeats: int) -> tuple[float, float]:
    """Forward + backward of Linear(576→1536)-SiLU-Linear(1536→576) on 512 tokens: float32 vs bf16
    autocast."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(576, 1536), torch.nn.SiLU(), torch.nn.Linear(1536, 576)
    )
    x = torch.randn(512, 576)
    flop = 3 * 2.0 * 512 * (576 * 1536 * 2)  # forward + backward ≈ 3 × the forward's matmuls

    def step(autocast: bool):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = mlp(x)
        y.float().square().mean().backward()
        mlp.zero_grad(set_to_none=True)

    return _rate(lambda: step(False), flop, seconds, repeats), _rate(
        lambda: step(True), flop, seconds, repeats
    )


@app.command()
def main(
    seconds: float = typer.Option(0.3, help="seconds per timed round"),
    repeats: int = typer.Option(3, help="timed rounds per measurement (the best counts)"),
) -> None:
    """Print float32 and bf16 GFLOP/s and their ratio per shape and thread count; last line: the
    verdict."""
    from eagle3.precision import BF16_MIN_SPEEDUP, cpu_features, measure_bf16

    if seconds <= 0 or repeats < 1:
        raise SystemExit(f"--seconds must be > 0 and --repeats >= 1, got {seconds} and {repeats}")
    threads = torch.get_num_threads()
    feats = ", ".join(f for f, on in cpu_features().items() if on) or "unknown"
    print(
        f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
        f"CPU flags: {feats}; {threads} thread(s) by default"
    )
    print("| shape | threads | float32 GFLOP/s | bf16 GFLOP/s | bf16 / float32 |")
    print("|---|---|---|---|---|")
    for n_threads in sorted({1, threads}):
        torch.set_num_threads(n_threads)
        for name, (m, k, n) in SHAPES.items():
            f32, bf16 = _matmul_pair(m, k, n, seconds, repeats)
            print(
                f"| {name} {m}x{k}@{k}x{n} | {n_threads} | "
                f"{f32:.1f} | {bf16:.2f} | {bf16 / f32:.3f} |"
            )
        f32, bf16 = _mlp_step_pair(seconds, repeats)
        print(
            f"| MLP forward+backward, 512 tokens (autocast) | "
            f"{n_threads} | {f32:.1f} | {bf16:.2f} | {bf16 / f32:.3f} |"
        )
    torch.set_num_threads(threads)
    probe = measure_bf16()
    verdict = "bfloat16 / bf16-autocast" if probe.bf16_fast else "float32"
    print(
        f"bf16/float32 ratio {probe.ratio:.3f} at the probe's shape (1 "
        f"thread; bf16 needs >= {BF16_MIN_SPEEDUP}): auto = {verdict}"
    )


if __name__ == "__main__":
    app()
