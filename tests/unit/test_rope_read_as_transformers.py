"""RoPE keys are read the way transformers 5 builds them (a non-empty ``rope_scaling`` replaces
``rope_parameters``) by the reference draft's loader and by ``ROPE_MISMATCH``; a ``sliding_window``
that is not a positive integer beside ``use_sliding_window: true`` is ``SLIDING_WINDOW``."""

from __future__ import annotations

import json

import pytest
import torch

from eagle3.convert.checkpoint import Checkpoint, Target
from eagle3.convert.checks import check_target
from eagle3.convert.draft_checks import check_sliding_window
from eagle3.engines.registry import get_profile
from eagle3.engines.sglang.draft import SGLangEagle3Draft
from eagle3.engines.sglang.profile import RELEASES

PROFILE = get_profile("sglang")
LINEAR = {"rope_type": "linear", "factor": 2.0}
DEFAULT_1M = {"rope_theta": 1000000.0, "rope_type": "default"}

# Configs stating both keys (and one without rope_scaling as the control).
BOTH = [
    {"rope_scaling": LINEAR, "rope_parameters": DEFAULT_1M},
    {"rope_theta": 500000.0, "rope_scaling": LINEAR, "rope_parameters": DEFAULT_1M},
    {
        "rope_scaling": {"type": "linear", "factor": 4.0, "rope_theta": 9.0},
        "rope_parameters": DEFAULT_1M,
    },
    {"rope_scaling": {"rope_type": "default", "rope_theta": 5.0}, "rope_parameters": DEFAULT_1M},
    {"rope_scaling": {}, "rope_parameters": DEFAULT_1M},
    {"rope_parameters": DEFAULT_1M},
]


def _draft_config(rope: dict) -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "vocab_size": 256,
        "draft_vocab_size": 32,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
        **json.loads(json.dumps(rope)),
    }


@pytest.mark.parametrize("rope", BOTH)
def test_reference_draft_builds_the_rope_transformers_builds(rope):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = _draft_config(rope)
    want = LlamaRotaryEmbedding(LlamaConfig.from_dict(json.loads(json.dumps(cfg))))
    got = SGLangEagle3Draft(cfg)._rotary[0]
    assert got.rope_type == want.rope_type
    assert got.attention_scaling == want.attention_scaling
    torch.testing.assert_close(got.inv_freq, want.inv_freq, rtol=0, atol=0)
    pos = torch.arange(8)[None]
    x = torch.zeros(1, 8, 16)
    for a, b in zip(got(x, pos), want(x, pos)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _target(tmp_path, rope: dict) -> Target:
    cfg = _draft_config(rope)
    cfg["architectures"] = ["LlamaForCausalLM"]
    return Target(tmp_path, cfg, "LlamaForCausalLM")


def _draft(rope: dict) -> Checkpoint:
    return Checkpoint(None, _draft_config(rope), {}, [], None)


def _codes(problems):
    return {p.code: p.message for p in problems}


@pytest.mark.parametrize(
    "draft_rope",
    [
        # rope_parameters agrees with the target, the rope_scaling transformers keeps does not
        {"rope_scaling": LINEAR, "rope_parameters": DEFAULT_1M},
        # a theta-less rope_scaling hides rope_parameters' theta: 10000 is built, not 1e6
        {"rope_scaling": {"rope_type": "default"}, "rope_parameters": DEFAULT_1M},
    ],
)
def test_rope_mismatch_reads_the_rope_scaling_transformers_keeps(tmp_path, draft_rope):
    found = _codes(
        check_target(
            _draft(draft_rope),
            PROFILE,
            _target(tmp_path, {"rope_parameters": DEFAULT_1M}),
            aux_capture=False,
        )
    )
    assert "ROPE_MISMATCH" in found
    assert "1000000.0, '{}'" in found["ROPE_MISMATCH"]


@pytest.mark.parametrize(
    "draft_rope",
    [
        # rope_parameters disagrees with the target, but transformers builds rope_scaling's RoPE
        {
            "rope_scaling": {**LINEAR, "rope_theta": 1000000.0},
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        # the legacy spelling of the same linear RoPE
        {"rope_theta": 1000000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
    ],
)
def test_rope_mismatch_quiet_when_the_built_rope_is_the_targets(tmp_path, draft_rope):
    target = _target(tmp_path, {"rope_parameters": {**LINEAR, "rope_theta": 1000000.0}})
    found = _codes(check_target(_draft(draft_rope), PROFILE, target, aux_capture=False))
    assert "ROPE_MISMATCH" not in found, found


@pytest.mark.parametrize("window", ["4096", 4096.0, -1, 0, True])
@pytest.mark.parametrize("prefix", ["", "transformer_layer_config."])
def test_sliding_window_not_a_positive_int_is_refused_naming_value_and_type(window, prefix):
    scope = {"use_sliding_window": True, "sliding_window": window}
    cfg = {"transformer_layer_config": scope} if prefix else scope
    found = check_sliding_window(cfg)
    assert [p.code for p in found] == ["SLIDING_WINDOW"]
    msg = found[0].message
    assert f"{prefix}sliding_window: expected a positive integer" in msg
    assert f"got {window!r} (a {type(window).__name__})" in msg
    assert all(v in msg for v in RELEASES)


@pytest.mark.parametrize(
    "scope",
    [
        {"use_sliding_window": False, "sliding_window": "4096"},  # off: the window is not used
        {"use_sliding_window": True, "sliding_window": None},  # on without a window
        {"sliding_window": None},
    ],
)
def test_sliding_window_controls_stay_quiet(scope):
    assert check_sliding_window(scope) == []


@pytest.mark.parametrize("prefix", ["", "transformer_layer_config."])
@pytest.mark.parametrize(
    "key,value", [("rope_parameters", "default"), ("rope_scaling", ["linear", 2.0])]
)
def test_rope_that_is_not_an_object_is_refused_naming_the_key(prefix, key, value):
    from eagle3.convert.draft_checks import check_rope_conflict

    cfg = {"rope_theta": 10000.0}
    if prefix:
        cfg.update(
            speculators_model_type="eagle3",
            transformer_layer_config={"rope_theta": 10000.0, key: value},
        )
    else:
        cfg[key] = value
    problems = check_rope_conflict(cfg)
    assert [p.code for p in problems] == ["ROPE_CONFLICT"]
    assert f"{prefix}{key}: expected a JSON object" in problems[0].message
    assert check_rope_conflict({"rope_theta": 10000.0, key: None}) == []
    assert check_rope_conflict({key: {"rope_type": "default", "rope_theta": 10000.0}}) == []
