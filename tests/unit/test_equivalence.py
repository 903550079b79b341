"""Equivalence of the trained draft (speculators) and the served one (SGLang 0.5.23 semantics) on a
real forward of the tiny-random target: passes on a correct conversion, names the first diverging
component on a residual-order mismatch, a wrong aux width (fc bypassed / fewer aux states) and layer
ids off by one."""

from __future__ import annotations

import json
import shutil

import pytest

from eagle3.convert.stage import convert
from eagle3.convert.equivalence import check_equivalence
from eagle3.errors import CheckpointInvalid
from testkit.broken_corpus import good_pair, make_speculators_draft


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target_dir):
    return good_pair(tmp_path_factory.getbasetemp() / "eagle3-good", tiny_target_dir)


def _serving_variant(serving, dst, edit):
    shutil.copytree(serving, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_correct_conversion_passes(pair, tiny_target_dir):
    r = check_equivalence(*pair, target_dir=tiny_target_dir, atol=1e-4, num_tokens=16)
    assert r["passed"] and r["num_tokens"] == 16
    assert r["trained_aux_hf"] == r["engine_aux_hf"] == [2, 4, 5]
    assert max(r["max_abs_diff"].values()) < 1e-4 and r["argmax_agreement"] == 1.0
    assert set(r["max_abs_diff"]) == {"embeddings", "fc", "prenorm", "norm", "logits"}


def test_norm_before_residual_draft_served_with_sglang_order(tmp_path, tiny_target_dir):
    trained = make_speculators_draft(
        tiny_target_dir, tmp_path / "nbr", flags={"norm_before_residual": True}
    )
    naive = tmp_path / "naive"  # what a converter that drops the flag would serve
    shutil.copytree(trained, naive)
    cfg = json.loads((naive / "config.json").read_text())
    cfg["norm_before_residual"] = False
    (naive / "config.json").write_text(json.dumps(cfg))
    convert(naive, tmp_path / "serving", target_dir=tiny_target_dir)
    with pytest.raises(CheckpointInvalid) as e:
        check_equivalence(
            trained, tmp_path / "serving", target_dir=tiny_target_dir, atol=1e-3, num_tokens=16
        )
    msg = str(e.value)
    assert (
        "first diverging component layers" in msg and "fc 0" in msg
    )  # fc agrees, the layer does not


def test_fc_bypassed_when_aux_not_captured(pair, tmp_path, tiny_target_dir):
    served = _serving_variant(
        pair[1],
        tmp_path / "noaux",
        lambda c: c["eagle_config"].__setitem__("use_aux_hidden_state", False),
    )
    with pytest.raises(CheckpointInvalid, match=r"first diverging component fc: .*fc bypassed"):
        check_equivalence(pair[0], served, target_dir=tiny_target_dir, atol=1e-3, num_tokens=16)


def test_wrong_aux_width(pair, tmp_path, tiny_target_dir):
    served = _serving_variant(
        pair[1],
        tmp_path / "two",
        lambda c: c["eagle_config"].__setitem__("eagle_aux_hidden_state_layer_ids", [1, 3]),
    )
    with pytest.raises(CheckpointInvalid) as e:
        check_equivalence(pair[0], served, target_dir=tiny_target_dir, atol=1e-3, num_tokens=16)
    assert (
        "aux hidden states (fc input)" in str(e.value)
        and "width 192" in str(e.value)
        and "128" in str(e.value)
    )


def test_layer_ids_off_by_one(pair, tmp_path, tiny_target_dir):
    served = _serving_variant(
        pair[1],
        tmp_path / "hf",
        lambda c: c["eagle_config"].__setitem__("eagle_aux_hidden_state_layer_ids", [2, 4, 5]),
    )
    with pytest.raises(CheckpointInvalid, match=r"layer ids.*\[2, 4, 5\].*\[3, 5, 6\]"):
        check_equivalence(pair[0], served, target_dir=tiny_target_dir, atol=1e-3, num_tokens=16)


def test_two_layer_draft_equivalent(tmp_path, tiny_target_dir):
    """SGLang's layers >= 1 normalise with hidden_norm: conversion must carry input_layernorm
    there."""
    spec = make_speculators_draft(tiny_target_dir, tmp_path / "spec2", num_layers=2)
    convert(spec, tmp_path / "serving2", target_dir=tiny_target_dir)
    r = check_equivalence(
        spec, tmp_path / "serving2", target_dir=tiny_target_dir, atol=1e-4, num_tokens=16
    )
    assert r["passed"] and r["max_abs_diff"]["prenorm"] < 1e-4


def test_loaded_draft_runs_eager_when_speculators_compiled_its_forward(
    pair, monkeypatch, tiny_target_dir
):
    """speculators compiles ``Eagle3DraftModel.forward`` at import when CUDA is available; the
    checking side of conversion loads the draft on the CPU, where that compile failed on the H200
    machine: load_draft binds the plain forward, so no dynamo frame is compiled while the
    equivalence check runs."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    from eagle3.train.draft_model import load_draft

    calls = []

    def counting_backend(gm, example_inputs):
        calls.append(len(gm.graph.nodes))
        return gm.forward

    plain = Eagle3DraftModel.forward
    monkeypatch.setattr(Eagle3DraftModel, "forward", torch.compile(plain, backend=counting_backend))
    model = load_draft(pair[0], verifier_dir=tiny_target_dir)
    assert getattr(model.forward, "__func__", None) is plain
    torch._dynamo.reset()
    r = check_equivalence(*pair, target_dir=tiny_target_dir, atol=1e-4, num_tokens=16)
    assert r["passed"] and calls == []
