"""The SGLang 0.5.23 profile, pinned against the released wheel's source (read statically, never
imported).

The wheel is taken from ``<cache>/wheels/`` or downloaded there with
``pip download --no-deps sglang==0.5.23``; the source-pinning tests skip only when that download
fails (no network).
"""

from __future__ import annotations

import ast
import re

import pytest

from eagle3.engines.registry import get_profile
from eagle3.engines.sglang.profile import STACKED
from eagle3.errors import ConfigError, EngineUnsupported

EAGLE3 = "sglang/srt/models/llama_eagle3.py"


@pytest.fixture(scope="module")
def sglang_source(cache_dir):
    from eagle3.engines.sglang.source import find_engine_source

    try:
        src = find_engine_source("sglang", "0.5.23", cache_dir=cache_dir, download=True)
    except EngineUnsupported as e:
        pytest.skip(f"SGLang 0.5.23 wheel unavailable (download failed): {e}")
    assert src.version() == "0.5.23"
    return src


@pytest.fixture
def profile():
    return get_profile("sglang", "0.5.23")


def _function(tree: ast.AST, cls: str, fn: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == fn:
                    return item
    raise AssertionError(f"{cls}.{fn} not found")


def _literal(fn: ast.FunctionDef, var: str):
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == var for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{var} not assigned in {fn.name}")


def test_name_maps_match_load_weights(sglang_source, profile):
    tree = ast.parse(sglang_source.read(EAGLE3))
    load = _function(tree, "LlamaForCausalLMEagle3", "load_weights")
    assert tuple(_literal(load, "legacy_name_map").items()) == profile.legacy_renames
    assert tuple(map(tuple, _literal(load, "stacked_params_mapping"))) == STACKED
    src = ast.unparse(load)
    assert "'d2t' in name" in src and "loaded_weight + torch.arange(loaded_weight.shape[0])" in src
    assert re.search(r"if 't2d' in name:\s+continue", src), "t2d is no longer ignored"
    assert "f'model.{name}'" in src  # each name tried as-is, then with the model. prefix
    assert profile.route("x.w", {"model.x.w": None}).param == "model.x.w"
    # A name matching no parameter: no else branch raising -> silently skipped.
    assert "raise" not in src and profile.unknown_tensor == "skip"


def test_residual_order_and_flags(sglang_source, profile):
    text = sglang_source.read(EAGLE3)
    fwd = ast.unparse(_function(ast.parse(text), "LlamaDecoderLayer", "forward"))
    body = fwd[fwd.index("if self.is_input_layer:") :]
    assert body.index("residual = hidden_states") < body.index(
        "hidden_states = self.hidden_norm(hidden_states)"
    )
    assert profile.flags["norm_before_residual"].supported == (False,)
    assert "norm_before_residual" not in text  # never read: the order above is fixed
    assert 'eagle_config.get("norm_before_fc", getattr(config, "norm_before_fc", False))' in text
    assert profile.flags["norm_before_fc"].config_keys == (
        "eagle_config.norm_before_fc",
        "norm_before_fc",
    )
    assert (
        'getattr(config, "fc_norm", None) or getattr(\n            config, "use_aux_norm", False'
        in text
    )
    assert profile.flags["fc_norm"].config_keys == ("fc_norm", "use_aux_norm")
    assert 'self.norm_output = getattr(config, "norm_output", False)' in text
    assert "aux = hidden_states_to_logits if self.norm_output else hidden_states_to_aux" in text
    # fc only when wider than the embeddings; qkv of the EAGLE layer has no bias.
    assert "if hidden_states.shape[-1] != embeds.shape[-1]:" in text
    assert re.search(r"self\.self_attn\.qkv_proj = QKVParallelLinear\([^)]*bias=False", text, re.S)
    assert "hidden_size = 2 * self.hidden_size if self.is_input_layer else self.hidden_size" in text
    assert "self.hidden_size_in * self.num_aux_hidden_states" in text


def test_flag_source_lines_are_where_the_wheel_decides_each_flag(sglang_source, profile):
    """Every flag's description (and so the validator's refusal of an unsupported value) cites
    file:line of the released 0.5.23 source; that line must still say what the profile claims."""
    from eagle3.engines.sglang.profile import FLAG_SOURCE_LINES

    assert set(FLAG_SOURCE_LINES) == set(profile.flags)
    for flag, (path, line, text) in FLAG_SOURCE_LINES.items():
        assert text in sglang_source.read(path).splitlines()[line - 1], (flag, path, line)
        assert f"{path}:{line}" in profile.flags[flag].how, profile.flags[flag].how
    with pytest.raises(ConfigError, match=r"llama_eagle3\.py:99.*got norm_before_residual=True"):
        profile.check_flags({"norm_before_residual": True})
    with pytest.raises(ConfigError, match=r"eagle_worker_v2\.py:363.*got embed_requires_grad=True"):
        profile.check_flags({"embed_requires_grad": True})


def test_aux_id_convention(sglang_source, profile):
    llama = sglang_source.read("sglang/srt/models/llama.py")
    cap = ast.unparse(
        _function(ast.parse(llama), "LlamaForCausalLM", "set_eagle3_layers_to_capture")
    )
    assert "[val + 1 for val in layer_ids]" in cap and profile.aux_id_offset == 1
    assert "[2, num_layers // 2, num_layers - 3]" in cap
    aux = sglang_source.read(
        "sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py"
    )
    assert 'eagle_config[\n                "eagle_aux_hidden_state_layer_ids"\n            ]' in aux
    assert profile.aux_ids_key == "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert profile.hf_to_engine_ids([2, 15, 27]) == [1, 14, 26]
    worker = sglang_source.read("sglang/srt/speculative/eagle_worker_v2.py")
    assert "self.draft_runner.model.set_embed(embed)" in worker
    assert profile.flags["embed_requires_grad"].supported == (False,)


def test_capture_classes_pinned(sglang_source, profile):
    from eagle3.engines.sglang.source import CAPTURE_METHOD, ModelIndex

    index = ModelIndex(sglang_source)
    # every registered architecture that implements the capture method, inherited or not
    assert frozenset(filter(index.implements, index.entry_classes)) == profile.aux_capture_classes
    # the model modules where some class defines it itself
    defining = [
        m
        for m, (classes, _) in index._modules.items()
        if any(CAPTURE_METHOD in c.methods for c in classes.values())
    ]
    assert len(defining) == 29


def test_check_flags_messages(profile):
    profile.check_flags(
        {
            "norm_before_residual": False,
            "norm_before_fc": True,
            "fc_norm": False,
            "norm_output": True,
            "embed_requires_grad": None,
        }
    )
    with pytest.raises(ConfigError) as e:
        profile.check_flags({"norm_before_residual": True})
    msg = str(e.value)
    assert (
        "norm_before_residual" in msg and "got norm_before_residual=True" in msg and "=False" in msg
    )
    assert "0.5.23" in msg
    with pytest.raises(ConfigError, match="embed_requires_grad"):
        profile.check_flags({"embed_requires_grad": True})
    with pytest.raises(ConfigError, match="unknown"):
        profile.check_flags({"norm_sandwich": True})
    assert profile.norm_before_residual is False


def test_engine_params_shapes(profile):
    cfg = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "vocab_size": 1000,
        "draft_vocab_size": 100,
        "target_hidden_size": 96,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3]},
        "fc_norm": True,
    }
    p = profile.engine_params(cfg)
    assert p["model.fc.weight"].shape == (64, 192)
    assert p["model.layers.0.self_attn.qkv_proj.weight"].shards == {
        "q": (128, 128),
        "k": (64, 128),
        "v": (64, 128),
    }
    assert p["model.layers.1.self_attn.qkv_proj.weight"].shards["q"] == (128, 64)
    assert p["lm_head.weight"].shape == (100, 64) and p["model.fc_norm.1.weight"].shape == (96,)
    assert (
        p["model.layers.1.input_layernorm.weight"].unused
        and p["model.embed_tokens.weight"].runtime_source
    )
    r = profile.route("midlayer.self_attn.k_proj.weight", p)
    assert (r.kind, r.param, r.shard) == ("param", "model.layers.0.self_attn.qkv_proj.weight", "k")
    assert profile.route("draft_model.layers.0.mlp.up_proj.weight", p).kind == "unknown"
    assert profile.route("aux_norm_mid.weight", p).param == "model.fc_norm.1.weight"
    assert profile.route("t2d", p).kind == "ignored" and profile.route("d2t", p).kind == "special"


def test_unknown_release_and_engine_are_refused_by_name():
    with pytest.raises(EngineUnsupported, match="0.4.0"):
        get_profile("sglang", "0.4.0")
    with pytest.raises(EngineUnsupported, match="vllm"):
        get_profile("vllm")
