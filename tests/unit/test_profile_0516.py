"""The SGLang 0.5.16 profile, pinned against that released wheel's source (read statically).

0.5.16 is the release whose pins match a torch 2.11 GPU image (``lab/gpu/sglang_kit.sh``). The
wheel is taken from ``<cache>/wheels/`` or downloaded there with ``pip download --no-deps
sglang==0.5.16``; the source-pinning tests skip, saying so, only when that download fails.
"""

from __future__ import annotations

import ast
import re

import pytest

from eagle3.engines.registry import get_profile
from eagle3.engines.sglang import profile as sglang_profile
from eagle3.errors import ConfigError, EngineUnsupported

V = "0.5.16"
EAGLE3 = "sglang/srt/models/llama_eagle3.py"


@pytest.fixture(scope="module")
def src(cache_dir):
    from eagle3.engines.sglang.source import find_engine_source

    try:
        source = find_engine_source("sglang", V, cache_dir=cache_dir, download=True)
    except EngineUnsupported as e:
        pytest.skip(f"SGLang {V} wheel unavailable (download failed): {e}")
    assert source.version() == V
    return source


@pytest.fixture
def profile():
    return get_profile("sglang", V)


def _method(text: str, cls: str, fn: str) -> str:
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == fn:
                    return ast.unparse(item)
    raise AssertionError(f"{cls}.{fn} not found")


def test_loader_name_maps_and_silent_skip(src, profile):
    load = _method(src.read(EAGLE3), "LlamaForCausalLMEagle3", "load_weights")
    for legacy, new in profile.legacy_renames:
        assert f"'{legacy}': '{new}'" in load
    for param, weight, shard in sglang_profile.STACKED:
        assert f"('{param}', '{weight}', {shard!r})" in load
    assert "loaded_weight + torch.arange(loaded_weight.shape[0])" in load
    assert re.search(r"if 't2d' in name:\s+continue", load)
    assert "f'model.{name}'" in load and "raise" not in load and profile.unknown_tensor == "skip"


def test_flag_lines_and_no_input_norm(src, profile):
    lines = sglang_profile.RELEASES[V]["flag_source_lines"]
    assert set(lines) | {"norm_before_fc"} == set(profile.flags)
    for flag, (path, line, text) in lines.items():
        assert text in src.read(path).splitlines()[line - 1], (flag, path, line)
        assert f"{path}:{line}" in profile.flags[flag].how
    assert "norm_before_fc" not in src.read(EAGLE3) and "input_norm" not in src.read(EAGLE3)
    with pytest.raises(ConfigError, match=r"norm_before_fc: sglang 0\.5\.16 computes"):
        profile.check_flags({"norm_before_fc": True})
    cfg = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "vocab_size": 100,
        "draft_vocab_size": 50,
        "eagle_config": {"norm_before_fc": True},
    }
    params = profile.engine_params(cfg)
    assert not any("input_norm" in k for k in params)
    assert profile.route("input_norm.weight", params).kind == "unknown"  # skipped silently
    assert "input_norm" in "".join(get_profile("sglang", sglang_profile.VERSION).engine_params(cfg))
    assert "norm_before_fc" not in profile.eagle_config_keys


def test_aux_ids_and_capture_classes(src, profile):
    from eagle3.engines.sglang.source import ModelIndex

    cap = _method(
        src.read("sglang/srt/models/llama.py"), "LlamaForCausalLM", "set_eagle3_layers_to_capture"
    )
    assert "[val + 1 for val in layer_ids]" in cap and profile.aux_id_offset == 1
    assert "[2, num_layers // 2, num_layers - 3]" in cap
    index = ModelIndex(src)
    assert frozenset(filter(index.implements, index.entry_classes)) == profile.aux_capture_classes
    assert "LlamaForCausalLM" in profile.aux_capture_classes
    assert "Qwen3_5ForCausalLM" not in profile.aux_capture_classes
    with pytest.raises(EngineUnsupported, match=r"sglang 0\.5\.16 has no set_eagle3_layers"):
        profile.require_aux_capture("Qwen3_5ForCausalLM")


def test_serving_facts(src):
    release = sglang_profile.RELEASES[V]
    hook = src.read("sglang/srt/arg_groups/speculative_hook.py")
    limit = release["spec_max_running_requests"]
    assert f"server_args.max_running_requests = {limit}" in hook
    args = src.read("sglang/srt/server_args.py")
    assert release["return_aux_flag"] is None and "return_aux_hidden_states" not in args
    assert release["cuda_graph_bs_flag"].lstrip("-").replace("-", "_") in args
    assert 'aliases=["--speculative-draft-model"]' in args
    tm = src.read("sglang/srt/managers/tokenizer_manager.py")
    assert re.search(
        r'meta_info\["spec_accept_length"\] = \(\s+recv_obj\.completion_tokens\[i\]'
        r" / recv_obj\.spec_verify_ct\[i\]",
        tm,
    )


def test_launch_server_flags_pinned(src):
    from eagle3.engines.sglang import server_flags
    from eagle3.engines.sglang.serving import extra_args_problems
    from tests.support.sglang_flags import server_flags as derive

    table = server_flags.options(V)
    assert {k: v for k, v in table.items() if k not in ("-h", "--help")} == derive(src)
    assert table["--cuda-graph-max-bs"] == "--cuda-graph-max-bs-decode"  # a deprecated spelling
    # a flag only 0.5.23 knows is refused for 0.5.16; the deprecated spelling of a flag the
    # launcher sets is refused as owned
    codes = [c for c, _ in extra_args_problems(["--enable-return-aux-hidden-states"], version=V)]
    assert codes == ["EXTRA_ARG_UNKNOWN"]
    ((code, msg),) = extra_args_problems(["--cuda-graph-max-bs", "8"], version=V)
    assert code == "EXTRA_ARG_OWNED" and "--cuda-graph-max-bs-decode" in msg and V in msg
    assert extra_args_problems(["--attention-backend", "triton"], version=V) == []
    # how many values each takes, and a value-taking flag without one
    from tests.support.sglang_flags import server_flag_nargs

    counts = server_flags.nargs(V)
    assert {k: v for k, v in counts.items() if k not in ("-h", "--help")} == server_flag_nargs(src)
    assert counts["--cuda-graph-bs"] == "+" and counts["--stream-output"] == "0"
    ((code, msg),) = extra_args_problems(["--log-level"], version=V)
    assert code == "EXTRA_ARG_NO_VALUE" and "--log-level takes one value" in msg
    assert [c for c, _ in extra_args_problems(["-h"], version=V)] == ["EXTRA_ARG_HELP"]


def test_sglang_extraction_backend_is_refused_for_a_release_without_aux_return(tmp_path):
    from eagle3.config import load_config
    from eagle3.extract.stage import _check_backend

    cfg = load_config(
        None,
        [f"paths.runs_dir={tmp_path}", "extract.backend=sglang", f"convert.engine_version={V}"],
    )
    with pytest.raises(EngineUnsupported, match=r"SGLang 0\.5\.16 cannot return .*0\.5\.23"):
        _check_backend(cfg)
