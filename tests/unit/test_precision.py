"""``auto`` dtypes and precision (eagle3.precision): bf16 where the CPU measures it fast, float32
where it does not, bf16 on CUDA; explicit values honoured; the resolved value in the config, its
hashes and the commands."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import eagle3.config as config_mod
from eagle3 import precision
from eagle3.config import RunConfig, load_config
from eagle3.precision import BF16_MIN_SPEEDUP, Bf16Probe

AUTO = ["target.dtype=auto", "extract.dtype=auto", "train.precision=auto", "serve.dtype=auto"]


def _probe(ratio: float) -> Bf16Probe:
    return Bf16Probe(
        float32_gflops=40.0,
        bfloat16_gflops=40.0 * ratio,
        threads=1,
        capability="AVX2",
        features={"avx2": True, "amx_bf16": ratio > 1},
    )


@pytest.fixture
def cpu_bf16(monkeypatch):
    """Fake the CPU probe (``cpu_bf16(ratio)``) and CUDA's absence; clears load_config's memo."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(config_mod, "_PARSED", {})

    def fake(ratio: float) -> None:
        monkeypatch.setattr(precision, "probe_cpu_bf16", lambda: _probe(ratio))

    return fake


def test_auto_is_bf16_where_the_cpu_measures_bf16_fast(cpu_bf16):
    cpu_bf16(BF16_MIN_SPEEDUP * 2)
    cfg = load_config("configs/smollm2-cpu.yaml", AUTO + ["serve.engine=reference"])
    assert (cfg.target.dtype, cfg.extract.dtype, cfg.train.precision, cfg.serve.dtype) == (
        "bfloat16",
        "bfloat16",
        "bf16-autocast",
        "bfloat16",
    )
    rec = cfg.auto_resolved
    assert sorted(rec) == ["extract.dtype", "serve.dtype", "target.dtype", "train.precision"]
    assert rec["train.precision"]["device"] == "cpu" and "3.000×" in rec["train.precision"]["why"]


def test_auto_is_float32_where_bf16_is_slow_and_the_hashes_differ(cpu_bf16):
    cpu_bf16(2.0)
    fast = load_config("configs/smollm2-cpu.yaml", AUTO)
    cpu_bf16(0.02)  # an AVX2-only CPU: bf16 matmuls ~50x slower than float32
    config_mod._PARSED.clear()
    slow = load_config("configs/smollm2-cpu.yaml", AUTO)
    assert (slow.target.dtype, slow.extract.dtype, slow.train.precision, slow.serve.dtype) == (
        "float32",
        "float32",
        "float32",
        "float32",
    )
    assert (
        "0.020×" in slow.auto_resolved["target.dtype"]["why"]
        and "float32" in slow.auto_resolved["target.dtype"]["why"]
    )
    # the stage cache keys hash these sections: a bf16 extraction is not reused for a float32 run
    for sections in (("target", "data", "extract"), ("train",), ("target", "serve")):
        assert fast.section_hash(*sections) != slow.section_hash(*sections)
    assert (
        "auto" not in slow.to_yaml().split("dtype:")[1].split("\n")[0]
    )  # the saved config is concrete


def test_the_demo_config_and_the_defaults_are_auto_and_the_test_config_float32():
    import yaml

    raw = yaml.safe_load(Path("configs/smollm2-cpu.yaml").read_text())
    assert (
        raw["target"].get("dtype", "auto") == "auto"
        and raw["extract"].get("dtype", "auto") == "auto"
    )
    assert (
        raw["train"].get("precision", "auto") == "auto"
        and raw.get("serve", {}).get("dtype", "auto") == "auto"
    )
    tiny = load_config(
        "configs/tiny-random.yaml"
    )  # tests compare outputs exactly: float32 everywhere
    assert (tiny.target.dtype, tiny.extract.dtype, tiny.train.precision, tiny.serve.dtype) == (
        "float32",
    ) * 4
    d = RunConfig()
    assert (d.target.dtype, d.extract.dtype, d.train.precision, d.serve.dtype) == ("auto",) * 4


def test_explicit_bfloat16_is_honoured_on_a_slow_cpu_with_a_warning(cpu_bf16, caplog):
    cpu_bf16(0.02)
    with caplog.at_level(logging.WARNING, logger="eagle3.precision"):
        cfg = load_config(
            "configs/smollm2-cpu.yaml",
            [
                "target.dtype=bfloat16",
                "extract.dtype=bfloat16",
                "train.precision=bf16-autocast",
                "serve.dtype=bfloat16",
            ],
        )
    assert (cfg.target.dtype, cfg.extract.dtype, cfg.train.precision, cfg.serve.dtype) == (
        "bfloat16",
        "bfloat16",
        "bf16-autocast",
        "bfloat16",
    )
    assert cfg.auto_resolved == {}
    assert (
        sum("is honoured, but bf16 is slow on this CPU" in r.getMessage() for r in caplog.records)
        == 4
    )
    cpu_bf16(0.02)
    config_mod._PARSED.clear()
    fp32 = load_config(
        "configs/smollm2-cpu.yaml", ["target.dtype=float32", "train.precision=float32"]
    )
    assert (fp32.target.dtype, fp32.train.precision) == ("float32", "float32")


def test_cuda_keeps_bf16_whatever_the_cpu_measures(monkeypatch):
    import torch

    monkeypatch.setattr(
        precision, "probe_cpu_bf16", lambda: pytest.fail("the CPU probe must not run for CUDA")
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    cfg = RunConfig.model_validate(
        {
            "extract": {"device": "cuda:1"},
            "train": {"device": "auto"},
            "serve": {"engine": "reference", "device": "cuda"},
        }
    )
    rec = precision.resolve_config(cfg)
    assert (cfg.target.dtype, cfg.extract.dtype, cfg.train.precision, cfg.serve.dtype) == (
        "bfloat16",
        "bfloat16",
        "bf16-autocast",
        "bfloat16",
    )
    assert {v["device"] for v in rec.values()} == {"cuda"}
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert precision.resolve_dtype("auto", "cuda") == "float32"


def test_sglang_keeps_its_own_dtype_auto(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    cfg = RunConfig.model_validate({"serve": {"engine": "sglang"}})
    rec = precision.resolve_config(cfg)
    assert cfg.serve.dtype == "auto" and "serve.dtype" not in rec


def test_library_entry_points_resolve_a_directly_built_config(cpu_bf16):
    cpu_bf16(0.02)
    cfg = RunConfig()
    out = precision.resolved(cfg)
    assert out is not cfg and cfg.train.precision == "auto"  # the caller's object is untouched
    assert (out.target.dtype, out.train.precision) == ("float32", "float32")
    assert precision.resolved(out) is out  # nothing left to resolve: no copy


def test_reference_engine_and_offline_decoding_follow_the_rule(cpu_bf16):
    from eagle3.serve.launcher import build_command
    from refengine.launch_server import parse_args
    from tasks.bench import offline_settings

    base = [
        "--model-path",
        "/t",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "/d",
    ]
    for ratio, want in ((0.02, "float32"), (4.0, "bfloat16")):
        cpu_bf16(ratio)
        config_mod._PARSED.clear()
        assert parse_args(base).dtype == want
        assert parse_args(base + ["--dtype", "bfloat16"]).dtype == "bfloat16"  # explicit: honoured
        cfg = load_config(
            "configs/tiny-random.yaml", ["serve.engine=reference", "serve.dtype=auto"]
        )
        argv, _ = build_command(cfg, Path("/t"), Path("/d"), 1)
        assert argv[argv.index("--dtype") + 1] == want == cfg.serve.dtype
        assert offline_settings(cfg)["dtype"] == want


def test_cpu_features_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nflags\t\t: fpu sse avx2 fma\n\nprocessor\t: 1\nflags\t\t: avx512f\n"
    )
    feats = precision.cpu_features(info)
    assert feats["avx2"] and not feats["avx512f"] and not feats["amx_bf16"]
    assert precision.cpu_features(tmp_path / "missing") == {}


def test_the_real_probe_measures_both_dtypes():
    p = precision.measure_bf16(shape=(64, 128, 128), repeats=2)
    assert p.float32_gflops > 0 and p.bfloat16_gflops > 0 and p.threads == 1
    assert p.bf16_fast == (p.ratio >= BF16_MIN_SPEEDUP)
    assert (
        f"{p.ratio:.3f}×" in p.describe()
        and ("auto = bf16" if p.bf16_fast else "auto = float32") in p.describe()
    )
