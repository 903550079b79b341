"""Conversion speculators / SpecForge / EAGLE → SGLang 0.5.23, and the `eagle3 convert|validate`
CLI."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from eagle3.artifacts import content_hash
from eagle3.convert.stage import convert
from eagle3.errors import CheckpointInvalid, ConfigError, EngineUnsupported
from testkit.broken_corpus import good_pair, validate


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target_dir):
    return good_pair(tmp_path_factory.getbasetemp() / "eagle3-good", tiny_target_dir)


def _cfg(d):
    return json.loads((d / "config.json").read_text())


def test_speculators_to_sglang(pair, tiny_target_dir, tmp_path):
    spec, _ = pair
    before = content_hash(spec)
    out = tmp_path / "serving"
    man = convert(spec, out, target_dir=tiny_target_dir)
    assert content_hash(spec) == before  # SRC untouched
    cfg, scfg, tcfg = _cfg(out), _cfg(spec), _cfg(tiny_target_dir)
    assert (
        cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["tie_word_embeddings"] is False
    )
    assert scfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # hf - 1
    assert "eagle_aux_hidden_state_layer_ids" not in cfg
    assert cfg["target_hidden_size"] == tcfg["hidden_size"] and cfg["draft_vocab_size"] == 256
    assert cfg["rope_parameters"] == tcfg["rope_parameters"]
    assert cfg["max_position_embeddings"] == tcfg["max_position_embeddings"]
    assert cfg["norm_before_residual"] is False
    src_t, out_t = (
        load_file(str(spec / "model.safetensors")),
        load_file(str(out / "model.safetensors")),
    )
    assert set(out_t) == set(src_t)
    assert all(torch.equal(src_t[k], out_t[k]) for k in out_t)
    assert man["kind"] == "serving_checkpoint" and man["aux_layer_ids_hf"] == [2, 4, 5]
    assert man["aux_layer_ids_engine"] == [1, 3, 4] and man["source_format"] == "speculators"
    assert man["vocab_map_hash"] and validate(out, target_dir=tiny_target_dir) == []


def _edit_copy(src, dst, **cfg_changes):
    shutil.copytree(src, dst)
    cfg = _cfg(dst)
    cfg.update(cfg_changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_unsupported_flag_is_an_error_and_nothing_written(pair, tmp_path, tiny_target_dir):
    src = _edit_copy(pair[0], tmp_path / "nbr", norm_before_residual=True)
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    assert [p.code for p in e.value.problems] == ["UNSUPPORTED_FLAG"]
    assert "norm_before_residual" in str(e.value) and "True" in str(e.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_qwen3_layer_rejected(pair, tmp_path):
    src = _edit_copy(pair[0], tmp_path / "q3")
    cfg = _cfg(src)
    cfg["transformer_layer_config"]["model_type"] = "qwen3"
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EngineUnsupported, match="qwen3"):
        convert(src, tmp_path / "out")


def test_missing_ids_need_target(pair, tmp_path, tiny_target_dir):
    src = _edit_copy(pair[0], tmp_path / "noids", eagle_aux_hidden_state_layer_ids=None)
    with pytest.raises(ConfigError, match="--target"):
        convert(src, tmp_path / "out")
    convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    assert _cfg(tmp_path / "out")["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        1,
        3,
        4,
    ]  # [2,4,5]-1


def test_broken_source_fails_atomically(pair, tmp_path, tiny_target_dir):
    src = _edit_copy(pair[0], tmp_path / "nan")
    t = load_file(str(src / "model.safetensors"))
    t["fc.weight"][0, 0] = float("nan")
    save_file(t, str(src / "model.safetensors"))
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    assert any(p.code == "NAN_INF" and "fc.weight" in p.message for p in e.value.problems)
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["nan"]


def _sglang_like(serving, dst, *, bin_file: bool):
    """A SpecForge-style (midlayer.*, safetensors, eagle_config) or EAGLE-repo-style (.bin, no
    embed) draft."""
    dst.mkdir()
    cfg = _cfg(serving)
    t = load_file(str(serving / "model.safetensors"))
    t = {k.replace("layers.0.", "midlayer."): v for k, v in t.items()}
    for k in (
        "target_hidden_size",
        "norm_before_fc",
        "fc_norm",
        "norm_output",
        "norm_before_residual",
    ):
        cfg.pop(k)
    if bin_file:
        t.pop("embed_tokens.weight")
        cfg.pop("eagle_config")
        torch.save(t, dst / "pytorch_model.bin")
    else:
        save_file(t, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("fmt", ["specforge", "eagle"])
def test_specforge_and_eagle_inputs(pair, tmp_path, tiny_target_dir, fmt):
    src = _sglang_like(pair[1], tmp_path / fmt, bin_file=fmt == "eagle")
    man = convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    assert man["source_format"] == fmt
    out_t = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "layers.0.self_attn.q_proj.weight" in out_t and not any(
        k.startswith("midlayer") for k in out_t
    )
    ids = _cfg(tmp_path / "out")["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == [
        1,
        3,
        4,
    ]  # kept (SpecForge) or the default rule [2, 4, 5] - 1 written out (EAGLE, L=8)
    assert validate(tmp_path / "out", target_dir=tiny_target_dir) == []


def test_cli_end_to_end(pair, tmp_path, tiny_target_dir):
    from cli.main import app

    runner = CliRunner()
    out = tmp_path / "cli-out"
    r = runner.invoke(
        app, ["convert", str(pair[0]), str(out), "--to", "sglang", "--target", str(tiny_target_dir)]
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["validate", str(out), "--target", str(tiny_target_dir)])
    assert r.exit_code == 0 and "valid for sglang" in r.output
    t = load_file(str(out / "model.safetensors"))
    t["draft_model.fc.weight"] = t.pop("fc.weight")
    save_file(t, str(out / "model.safetensors"))
    r = runner.invoke(app, ["validate", str(out)])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert "UNKNOWN_TENSOR: tensor 'draft_model.fc.weight'" in lines[0]
    assert any(line.startswith("MISSING_TENSOR: parameter model.fc.weight") for line in lines)
    assert runner.invoke(app, ["validate", str(tmp_path / "nowhere")]).exit_code == 2
    (out / "config.json").write_text("{not json")
    assert runner.invoke(app, ["validate", str(out)]).exit_code == 2


@pytest.mark.slow
def test_smollm2_round_trip(smollm2_dir, tmp_path):
    """speculators → SGLang format → validate passes → equivalent, on the real SmolLM2 target
    (30 layers)."""
    from eagle3.convert.equivalence import check_equivalence
    from testkit.broken_corpus import make_speculators_draft

    spec = make_speculators_draft(
        smollm2_dir, tmp_path / "spec", aux_ids=(2, 15, 27), draft_vocab=1024
    )
    man = convert(spec, tmp_path / "serving", target_dir=smollm2_dir)
    cfg = _cfg(tmp_path / "serving")
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert man["aux_layer_ids_hf"] == [2, 15, 27]
    assert cfg["target_hidden_size"] == 576 and cfg["rope_parameters"]["rope_theta"] == 100000.0
    assert validate(tmp_path / "serving", target_dir=smollm2_dir) == []
    r = check_equivalence(
        spec, tmp_path / "serving", target_dir=smollm2_dir, atol=1e-3, num_tokens=12
    )
    assert r["passed"] and r["engine_aux_hf"] == [2, 15, 27]


def test_destination_that_is_not_an_earlier_conversion_is_refused(tmp_path):
    from eagle3.convert.stage import check_destination
    from eagle3.errors import ConfigError

    src = tmp_path / "parent" / "draft"
    src.mkdir(parents=True)
    (tmp_path / "parent" / "other.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="contains SRC"):
        check_destination(src, tmp_path / "parent")
    with pytest.raises(ConfigError, match="inside SRC|outside SRC"):
        check_destination(src, src / "out")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="existing file"):
        check_destination(src, tmp_path / "file")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="non-empty directory.*got None"):
        check_destination(src, busy)
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "manifest.json").write_text('{"kind": "serving_checkpoint"}')
    check_destination(src, earlier)  # an earlier conversion may be replaced
    check_destination(src, tmp_path / "new")
    assert (tmp_path / "parent" / "other.txt").read_text() == "keep me"
