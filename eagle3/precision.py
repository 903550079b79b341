"""``auto`` dtypes and precision: bf16 where it is really fast on this machine, float32 otherwise.

On an AVX2-only CPU oneDNN emulates bf16 matmuls ~50× slower than float32 (AMD EPYC, torch 2.13:
float32 43 GFLOP/s, bf16 0.9), and CPU name, ``get_cpu_capability()`` or ``ONEDNN_MAX_CPU_ISA``
do not tell it reliably, so the CPU rule is **measured** (:func:`probe_cpu_bf16`, ≈ 0.05 s; ≈
0.6 s where emulated): bf16 at ≥ ``BF16_MIN_SPEEDUP`` × float32 speed. CUDA: bf16 where
supported.

:func:`resolve_config` writes concrete values into the :data:`AUTO_FIELDS` (each judged on its
stage's device; ``serve.dtype`` only for the reference engine and offline decoding, SGLang keeps
its own ``auto``), so manifests, MLflow and cache keys carry them."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

BF16_MIN_SPEEDUP = 1.5  # bf16 is chosen on a CPU when its matmul runs at ≥ this × the float32 speed
PROBE_SHAPE = (256, 512, 512)  # (m, k, n) of the probe's matmul: 134 MFLOP per call
PROBE_REPEATS = 5  # timed rounds (best taken); stops after two when bf16 is clearly slow
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")  # cpuinfo
# environment variables that cap torch's CPU kernels: ATen, oneDNN (bf16 matmuls), MKL (float32)
ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


@dataclass(frozen=True)
class Bf16Probe:
    """``float32_gflops`` / ``bfloat16_gflops``: GFLOP/s (2·m·k·n per call, best timed call at
    ``threads``); ``capability``: ``torch.backends.cpu.get_cpu_capability()``; ``features``:
    :data:`CPU_FEATURES` in ``/proc/cpuinfo``; ``isa_env``: the :data:`ISA_ENV` variables set."""

    float32_gflops: float
    bfloat16_gflops: float
    threads: int
    capability: str
    features: dict[str, bool] = field(default_factory=dict)
    isa_env: dict[str, str] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """bf16 speed / float32 speed (>1: bf16 is faster)."""
        return self.bfloat16_gflops / self.float32_gflops if self.float32_gflops > 0 else 0.0

    @property
    def bf16_fast(self) -> bool:
        return self.ratio >= BF16_MIN_SPEEDUP

    def describe(self) -> str:
        """One line: the measured speeds, their ratio and the rule's verdict."""
        verdict = "fast: auto = bf16" if self.bf16_fast else "slow: auto = float32"
        return (f"bf16 matmul {self.bfloat16_gflops:.2f} GFLOP/s vs float32 "
                f"{self.float32_gflops:.1f} GFLOP/s ({self.ratio:.3f}×, {self.threads} thread(s); "
                f"bf16 needs ≥ {BF16_MIN_SPEEDUP}×) → {verdict}")


def cpu_features(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, bool]:
    """:data:`CPU_FEATURES` flags of the first CPU in ``cpuinfo`` (``{}`` when unreadable)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return {}
    flags = next((set(ln.split(":", 1)[1].split()) for ln in text.splitlines()
                  if ln.startswith("flags")), None)
    return {} if flags is None else {f: f in flags for f in CPU_FEATURES}


def measure_bf16(shape: tuple[int, int, int] = PROBE_SHAPE,
                 repeats: int = PROBE_REPEATS) -> Bf16Probe:
    """Time a ``[m, k] @ [k, n]`` matmul in float32 and bf16 on one CPU thread (no memo),
    alternately over ``repeats`` rounds after an untimed warm-up (oneDNN builds kernels), best call
    of each; stops after two rounds when bf16 is over 10× slower."""
    import torch

    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    pairs = {"float32": (a, b), "bfloat16": (a.bfloat16(), b.bfloat16())}
    best = dict.fromkeys(pairs, float("inf"))
    with torch_threads(1):  # a ratio of kernels, not of how busy the other cores are
        for x, y in pairs.values():
            x @ y
        for r in range(repeats):
            for name, (x, y) in pairs.items():
                t0 = time.perf_counter()
                x @ y
                best[name] = min(best[name], time.perf_counter() - t0)
            if r >= 1 and best["bfloat16"] > 10 * best["float32"]:
                break
    flop = 2.0 * m * k * n
    return Bf16Probe(float32_gflops=flop / best["float32"] / 1e9,
                     bfloat16_gflops=flop / best["bfloat16"] / 1e9, threads=1,
                     capability=torch.backends.cpu.get_cpu_capability(), features=cpu_features(),
                     isa_env={v: os.environ[v] for v in ISA_ENV if v in os.environ})


@functools.lru_cache(maxsize=1)
def probe_cpu_bf16() -> Bf16Probe:
    """:func:`measure_bf16`, once per process."""
    return measure_bf16()


def _device_type(device: str) -> str:
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device.split(":", 1)[0]


def bf16_is_fast(device: str = "cpu") -> tuple[bool, str]:
    """(bf16 is fast on ``device``, why); ``device``: 'auto', 'cpu', 'cuda', 'cuda:N'. CUDA:
    ``torch.cuda.is_bf16_supported()``; CPU: :func:`probe_cpu_bf16`."""
    kind = _device_type(device)
    if kind == "cuda":
        import torch

        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, "CUDA: bf16 supported" if ok else "CUDA without bf16 support"
    if kind != "cpu":
        return False, f"device {device!r}: no bf16 rule, float32"
    probe = probe_cpu_bf16()
    return probe.bf16_fast, f"CPU: {probe.describe()}"


def resolve_dtype(value: str, device: str = "cpu") -> str:
    """``auto`` → ``"bfloat16"`` where :func:`bf16_is_fast` on ``device``, else ``"float32"``."""
    return value if value != "auto" else "bfloat16" if bf16_is_fast(device)[0] else "float32"


def resolve_precision(value: str, device: str = "cpu") -> str:
    """``auto`` → ``"bf16-autocast"`` where bf16 is fast on ``device``, else ``"float32"``."""
    return value if value != "auto" else "bf16-autocast" if bf16_is_fast(device)[0] else "float32"


# (section, field, device field, resolver); serve.dtype only when the reference engine serves
AUTO_FIELDS = (("target", "dtype", ("extract", "device"), resolve_dtype),
               ("extract", "dtype", ("extract", "device"), resolve_dtype),
               ("train", "precision", ("train", "device"), resolve_precision),
               ("serve", "dtype", ("serve", "device"), resolve_dtype))
BF16_VALUES = ("bfloat16", "bf16-autocast")


def _serves_reference(cfg) -> bool:
    """Whether serve.dtype ``auto`` is the reference engine's (not SGLang's own ``auto``)."""
    return cfg.serve.engine == "reference" or (cfg.serve.engine == "auto"
                                               and _device_type("auto") == "cpu")


def resolve_config(cfg) -> dict[str, dict]:
    """Replace every ``auto`` of :data:`AUTO_FIELDS` in ``cfg`` (a RunConfig, in place). Returns
    ``{"target.dtype": {"setting": "auto", "value": "float32", "device": "cpu", "why": ...}, ...}``.
    An explicit bf16 on a CPU where bf16 measures slow is kept, with a warning."""
    record: dict[str, dict] = {}
    for section, name, (dev_section, dev_name), resolver in AUTO_FIELDS:
        if section == "serve" and not _serves_reference(cfg):
            continue
        sec, device = getattr(cfg, section), getattr(getattr(cfg, dev_section), dev_name)
        value = getattr(sec, name)
        if value == "auto":
            setattr(sec, name, resolver(value, device))
            record[f"{section}.{name}"] = {"setting": "auto", "value": getattr(sec, name),
                                           "device": _device_type(device),
                                           "why": bf16_is_fast(device)[1]}
        elif value in BF16_VALUES and _device_type(device) == "cpu" and not bf16_is_fast(device)[0]:
            log.warning("%s.%s=%s is honoured, but bf16 is slow on this CPU (%s); `auto` would "
                        "choose float32", section, name, value, probe_cpu_bf16().describe())
    return record


def summary_line(record: dict[str, dict]) -> str:
    """``target.dtype=float32, train.precision=float32 (auto; CPU: ...)``, or '' if empty."""
    if not record:
        return ""
    values = ", ".join(f"{k}={v['value']}" for k, v in record.items())
    return f"{values} (auto; {'; '.join(dict.fromkeys(v['why'] for v in record.values()))})"


def has_auto(cfg) -> bool:
    """Whether an :data:`AUTO_FIELDS` field is still ``auto`` (serve.dtype: reference engine)."""
    return any(getattr(getattr(cfg, s), n) == "auto" and (s != "serve" or _serves_reference(cfg))
               for s, n, _, _ in AUTO_FIELDS)


def resolved(cfg):
    """``cfg`` if nothing is ``auto``, else a resolved deep copy (how: ``auto_resolved``); stage
    functions call it first, so a directly built ``RunConfig(...)`` follows the same rule."""
    if not has_auto(cfg):
        return cfg
    out = cfg.model_copy(deep=True)
    out._auto_resolved = resolve_config(out)  # noqa: SLF001 - RunConfig's own record
    return out


@contextlib.contextmanager
def torch_threads(n: int | None):
    """torch CPU threads set to ``n`` in the block (None: unchanged), then restored."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
