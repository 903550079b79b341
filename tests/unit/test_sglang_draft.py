"""SGLangEagle3Draft: SGLang 0.5.23's loader rules and forward semantics (llama_eagle3.py), on small
random drafts."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from eagle3.engines.sglang.draft import SGLangEagle3Draft, rope_parameters
from eagle3.errors import CheckpointInvalid, EngineUnsupported
from refengine.specdec import crop_draft_cache
from testkit.sglang_drafts import draft_config, random_draft_tensors, write_draft

TARGET = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 256,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "num_hidden_layers": 6,
}


def _draft_dir(tmp_path, name="d", num_layers=1, **kw):
    cfg = draft_config(TARGET, aux_hf_ids=[2, 3, 4], draft_vocab_size=40, num_layers=num_layers)
    return write_draft(tmp_path / name, cfg, random_draft_tensors(cfg, seed=1, **kw)), cfg


def _inputs(t=5, width=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, 100, (t,), generator=g),
        torch.arange(t),
        torch.randn(t, width, generator=g),
    )


def test_loads_sglang_names_and_stacks_qkv_gate_up(tmp_path):
    d, cfg = _draft_dir(tmp_path, with_embed=True)
    draft = SGLangEagle3Draft.from_dir(d)
    t = load_file(str(d / "model.safetensors"))
    qkv = draft.model.layers[0].self_attn.qkv_proj.weight
    assert torch.equal(
        qkv,
        torch.cat(
            [
                t["layers.0.self_attn.q_proj.weight"],
                t["layers.0.self_attn.k_proj.weight"],
                t["layers.0.self_attn.v_proj.weight"],
            ]
        ),
    )
    assert qkv.shape == (8 * 8, 64)  # (4 + 2*2) heads x head_dim 8, input 2H
    gu = draft.model.layers[0].mlp.gate_up_proj.weight
    assert torch.equal(
        gu, torch.cat([t["layers.0.mlp.gate_proj.weight"], t["layers.0.mlp.up_proj.weight"]])
    )
    assert torch.equal(draft.hot_token_id, t["d2t"] + torch.arange(40))
    assert torch.equal(draft.to_target_ids(torch.tensor([0, 39])), draft.hot_token_id[[0, 39]])
    assert draft.load_report["embed_source"] == "draft checkpoint"
    assert draft.aux_layer_ids == [1, 2, 3]


def test_legacy_midlayer_names_give_the_same_model(tmp_path):
    new, _ = _draft_dir(tmp_path, "new")
    old, _ = _draft_dir(tmp_path, "old", legacy_midlayer=True)
    emb = torch.randn(100, 32)
    a = SGLangEagle3Draft.from_dir(new, target_embed=emb)
    b = SGLangEagle3Draft.from_dir(old, target_embed=emb)
    x = _inputs()
    assert torch.equal(a(*x)[0], b(*x)[0])


def test_unknown_and_missing_tensors_raise_by_name_or_are_recorded_in_sglang_mode(tmp_path):
    d, cfg = _draft_dir(tmp_path)
    t = load_file(str(d / "model.safetensors"))
    t["draft_model.fc.weight"] = t.pop("fc.weight")  # a prefix SGLang does not strip
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointInvalid, match=r"draft_model\.fc\.weight.*model\.fc\.weight"):
        SGLangEagle3Draft.from_dir(d, target_embed=torch.randn(100, 32))
    draft = SGLangEagle3Draft.from_dir(d, target_embed=torch.randn(100, 32), on_mismatch="sglang")
    assert draft.load_report["skipped"] == ["draft_model.fc.weight"]
    assert draft.load_report["unfilled"] == ["model.fc.weight"]
    # without a target embedding and without embed_tokens in the checkpoint the embedding stays
    # random
    with pytest.raises(CheckpointInvalid, match=r"model\.embed_tokens\.weight"):
        SGLangEagle3Draft.from_dir(_draft_dir(tmp_path, "noemb")[0])


def test_shape_mismatch_raises(tmp_path):
    d, _ = _draft_dir(tmp_path)
    t = load_file(str(d / "model.safetensors"))
    t["fc.weight"] = t["fc.weight"][:, :64].contiguous()  # 2 aux states where the config says 3
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointInvalid, match=r"fc\.weight has shape \(32, 64\).*\(32, 96\)"):
        SGLangEagle3Draft.from_dir(d, target_embed=torch.randn(100, 32))


def test_target_embedding_replaces_draft_embedding_unless_widths_differ(tmp_path):
    d, cfg = _draft_dir(tmp_path, with_embed=True)
    emb = torch.randn(100, 32)
    assert torch.equal(
        SGLangEagle3Draft.from_dir(d, target_embed=emb).model.embed_tokens.weight, emb
    )
    cfg["target_hidden_size"] = (
        48  # SGLang set_embed returns early: the draft keeps its own embedding
    )
    t = random_draft_tensors(cfg, seed=1, with_embed=True)
    d2 = write_draft(tmp_path / "wide", cfg, t)
    kept = SGLangEagle3Draft.from_dir(d2, target_embed=emb)
    assert torch.equal(kept.model.embed_tokens.weight, t["embed_tokens.weight"])
    assert kept.model.fc.in_features == 3 * 48


def test_wrong_architecture_refused(tmp_path):
    d, cfg = _draft_dir(tmp_path)
    cfg["architectures"] = ["Eagle3DraftModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EngineUnsupported, match="LlamaForCausalLMEagle3.*Eagle3DraftModel"):
        SGLangEagle3Draft.from_dir(d)


def _rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_single_token_forward_matches_hand_computation(tmp_path):
    """One position: attention reduces to o_proj(v); checks fc, cat order, residual from un-normed
    h, norms."""
    d, _ = _draft_dir(tmp_path)
    emb = torch.randn(100, 32)
    m = SGLangEagle3Draft.from_dir(d, target_embed=emb)
    ids, pos, hs = _inputs(t=1)
    logits, hidden = m(ids, pos + 7, hs)
    L = m.model.layers[0]
    h = hs @ m.model.fc.weight.T  # fc applied: width 96 != 32
    x = torch.cat([_rms(emb[ids], L.input_layernorm.weight), _rms(h, L.hidden_norm.weight)], -1)
    v = (x @ L.self_attn.qkv_proj.weight.T)[:, 48:64]  # [1, 2 kv heads * 8]
    attn = (
        torch.cat([v[:, :8], v[:, :8], v[:, 8:], v[:, 8:]], -1) @ L.self_attn.o_proj.weight.T
    )  # GQA
    res = h + attn  # residual = un-normed fc output
    y = L.mlp.down_proj(
        F.silu(L.mlp.gate_up_proj(_rms(res, L.post_attention_layernorm.weight))[:, :48])
        * L.mlp.gate_up_proj(_rms(res, L.post_attention_layernorm.weight))[:, 48:]
    )
    pre = res + y
    torch.testing.assert_close(hidden, pre, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        logits, _rms(pre, m.model.norm.weight) @ m.lm_head.weight.T, rtol=1e-5, atol=1e-5
    )


def test_fc_is_bypassed_exactly_when_width_equals_embedding_width(tmp_path):
    d, _ = _draft_dir(tmp_path)
    m = SGLangEagle3Draft.from_dir(d, target_embed=torch.randn(100, 32))
    ids, pos, h3 = _inputs(width=96)
    _, _, h1 = _inputs(width=32)
    base3, base1 = m(ids, pos, h3)[0], m(ids, pos, h1)[0]
    m.model.fc.weight.data.mul_(2.0)
    assert not torch.allclose(m(ids, pos, h3)[0], base3)  # aux states: fc used
    assert torch.equal(m(ids, pos, h1)[0], base1)  # one layer's width: fc silently skipped


@pytest.mark.parametrize("num_layers", [1, 2])
def test_kv_cache_steps_equal_full_extend_and_attention_is_causal(tmp_path, num_layers):
    d, _ = _draft_dir(tmp_path, num_layers=num_layers)
    m = SGLangEagle3Draft.from_dir(d, target_embed=torch.randn(100, 32))
    ids, pos, hs = _inputs(t=6)
    full_logits, full_h = m(ids, pos, hs)
    cache = m.new_cache()
    a = m(ids[:4], pos[:4], hs[:4], cache)
    b = m(ids[4:], pos[4:], hs[4:], cache)
    torch.testing.assert_close(torch.cat([a[0], b[0]]), full_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([a[1], b[1]]), full_h, rtol=1e-5, atol=1e-5)
    # speculative rows then crop: the cache is back to 4 positions and gives the same continuation
    m(ids[4:5], pos[4:5], torch.randn(1, 32), cache)
    crop_draft_cache(cache, 4)
    torch.testing.assert_close(m(ids[4:], pos[4:], hs[4:], cache)[0], b[0], rtol=1e-5, atol=1e-5)
    # causal: changing the last token leaves earlier rows unchanged
    ids2 = ids.clone()
    ids2[-1] = (ids2[-1] + 1) % 100
    changed = m(ids2, pos, hs)[0]
    assert torch.equal(changed[:-1], full_logits[:-1]) and not torch.equal(
        changed[-1], full_logits[-1]
    )


def test_rope_parameters_reads_both_config_styles():
    assert rope_parameters(
        {"rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}}
    ) == {
        "type": "linear",
        "rope_type": "linear",
        "factor": 2.0,
        "rope_theta": 5e5,
    }  # as LlamaConfig builds it
    assert rope_parameters({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}) == {
        "rope_type": "default",
        "rope_theta": 1e4,
    }
    assert rope_parameters({}) == {"rope_type": "default", "rope_theta": 10000.0}


def test_positions_change_the_output(tmp_path):
    d, _ = _draft_dir(tmp_path)
    m = SGLangEagle3Draft.from_dir(d, target_embed=torch.randn(100, 32))
    ids, pos, hs = _inputs(t=3)
    # RoPE is relative: a shift of all positions changes nothing, a change of distances changes the
    # last row
    torch.testing.assert_close(m(ids, pos, hs)[0], m(ids, pos + 5, hs)[0], rtol=1e-5, atol=1e-5)
    moved = m(ids, torch.tensor([0, 1, 9]), hs)[0]
    assert not torch.allclose(moved[2], m(ids, pos, hs)[0][2])
