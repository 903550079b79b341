"""Pre-flight: aux capture of the target class (read from SGLang 0.5.23's wheel) and the memory
estimate."""

from __future__ import annotations

import json

import pytest

from eagle3.errors import ConfigError, EngineUnsupported
from eagle3.engines.sglang.source import check_aux_capture
from eagle3.serve.preflight import estimate_memory
from eagle3.target_config import target_architecture


@pytest.fixture(scope="module")
def sglang_source(cache_dir):
    from eagle3.engines.sglang.source import find_engine_source

    try:
        return find_engine_source("sglang", "0.5.23", cache_dir=cache_dir, download=True)
    except EngineUnsupported as e:
        pytest.skip(f"SGLang 0.5.23 wheel unavailable (download failed): {e}")


@pytest.mark.parametrize(
    "cls", ["LlamaForCausalLM", "KimiK25ForConditionalGeneration", "Phi3ForCausalLM"]
)
def test_capturing_classes_from_source(sglang_source, cls):
    got = check_aux_capture(cls, source=sglang_source)
    assert (
        got["captures"] is True
        and got["class"] == cls
        and got["module"].startswith("sglang.srt.models.")
    )
    assert check_aux_capture(cls)["captures"] is True  # the pinned profile list agrees


@pytest.mark.parametrize("cls", ["GPT2LMHeadModel", "NoSuchForCausalLM"])
def test_class_without_capture_is_an_error(sglang_source, cls):
    with pytest.raises(EngineUnsupported) as e:
        check_aux_capture(cls, source=sglang_source)
    assert cls in str(e.value) and "0.5.23" in str(e.value)
    with pytest.raises(EngineUnsupported, match=cls):
        check_aux_capture(cls)


def test_target_architecture(tiny_target_dir):
    assert target_architecture(tiny_target_dir) == "LlamaForCausalLM"


def _dir(tmp_path, name, cfg, nbytes):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").write_bytes(b"\0" * nbytes)
    return d


def test_memory_estimate_numbers(tmp_path):
    target = _dir(
        tmp_path,
        "t",
        {
            "num_hidden_layers": 8,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_size": 64,
        },
        10_000,
    )
    draft = _dir(
        tmp_path,
        "d",
        {
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_size": 64,
            "head_dim": 16,
        },
        3_000,
    )
    r = estimate_memory(
        target,
        draft,
        context_length=100,
        batch_size=2,
        gpu_memory_bytes=10**6,
        mem_fraction_static=0.5,
        kv_dtype="bfloat16",
    )
    assert (
        r["target_kv"] == 200 * 2 * 8 * 2 * 16 * 2
    )  # tokens × K,V × layers × kv heads × head_dim × bytes
    assert r["draft_kv"] == 200 * 2 * 1 * 2 * 16 * 2
    assert r["need_bytes"] == 10_000 + 3_000 + r["target_kv"] + r["draft_kv"] and r["fits"]
    with pytest.raises(ConfigError) as e:
        estimate_memory(
            target,
            draft,
            context_length=100,
            batch_size=2,
            gpu_memory_bytes=200_000,
            mem_fraction_static=0.5,
        )
    msg = str(e.value)
    assert "mem_fraction_static 0.5" in msg and "draft_kv" in msg and "context 100 x batch 2" in msg


@pytest.mark.parametrize(
    "config,cls",
    [
        ("kimi-k2.5.yaml", "KimiK25ForConditionalGeneration"),
        ("llama3.1-8b.yaml", "LlamaForCausalLM"),
    ],
)
def test_realistic_configs_pass_preflight(sglang_source, config, cls):
    from eagle3.config import load_config
    from tests.conftest import CONFIGS

    cfg = load_config(CONFIGS / config)
    assert cfg.serve.engine == "sglang"
    check_aux_capture(
        cls, engine="sglang", version=cfg.convert.engine_version, source=sglang_source
    )
    if config.startswith("kimi"):  # the seed story's serving settings
        s = cfg.serve
        assert (
            s.tp,
            s.speculative_num_steps,
            s.speculative_eagle_topk,
            s.speculative_num_draft_tokens,
        ) == (8, 3, 4, 5)
        assert cfg.data.num_conversations == 10000 and cfg.target.trust_remote_code is True
