"""Drafts that conversion and validation used to pass silently: d2t holding target ids, an
identity-prefix vocabulary and its coverage of the data, two RoPE thetas or a trained theta unlike
the target's, aux ids lost from the config, a sliding-window draft, and fc width conflicts that
name the aux ids key. Each case asserts the code and the named key; good drafts are the controls."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from eagle3.convert.draft_checks import COVERAGE_REFUSE, COVERAGE_WARN, sglang_theta
from eagle3.convert.stage import convert
from eagle3.convert.validate import validate_report
from eagle3.errors import CheckpointInvalid
from eagle3.convert.vocab_reading import absolute_d2t_reason
from testkit.broken_corpus import good_pair, make_speculators_draft, validate

AUX_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target_dir):
    return good_pair(tmp_path_factory.getbasetemp() / "eagle3-good", tiny_target_dir)


def _cfg(d):
    return json.loads((d / "config.json").read_text())


def _copy(src, dst, config=None, tensors=None, drop=()):
    """A copy of draft ``src`` with ``config`` keys set and ``tensors`` replaced / ``drop``ped."""
    shutil.copytree(src, dst)
    cfg = _cfg(dst)
    cfg.update(config or {})
    (dst / "config.json").write_text(json.dumps(cfg))
    if tensors or drop:
        t = load_file(str(dst / "model.safetensors"))
        t.update(tensors or {})
        for k in drop:
            t.pop(k)
        save_file(t, str(dst / "model.safetensors"))
    return dst


def _codes(problems):
    return {p.code: p.message for p in problems}


# -- 1. d2t holding absolute target ids ------------------------------------------------------------


def test_d2t_holding_target_ids_without_t2d_is_refused(pair, tmp_path):
    dv = _cfg(pair[1])["draft_vocab_size"]
    bad = _copy(pair[1], tmp_path / "abs", tensors={"d2t": torch.arange(dv)}, drop=("t2d",))
    found = _codes(validate(bad))
    assert "VOCAB_MAP_ABSOLUTE" in found, found
    assert found["VOCAB_MAP_ABSOLUTE"].startswith("d2t:") and "2i" in found["VOCAB_MAP_ABSOLUTE"]


def test_absolute_rule_on_large_maps_and_no_false_alarm_on_offsets():
    vocab, n = 8000, 2000
    g = torch.Generator().manual_seed(0)
    ids = torch.sort(torch.randperm(vocab, generator=g)[:n]).values
    assert absolute_d2t_reason(ids, vocab) is not None  # target ids: strictly increasing
    assert absolute_d2t_reason(ids - torch.arange(n), vocab) is None  # the same map as offsets
    for seed in range(5):  # the project's tiny drafts: random ids, few adjacent pairs expected
        small = torch.sort(
            torch.randperm(49152, generator=torch.Generator().manual_seed(seed))[:256]
        ).values
        assert absolute_d2t_reason(small - torch.arange(256), 49152) is None


def test_absolute_ids_with_a_t2d_that_agrees_with_them_are_named(pair, tmp_path):
    cfg = _cfg(pair[1])
    dv, vocab = cfg["draft_vocab_size"], cfg["vocab_size"]
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:dv] = True
    bad = _copy(pair[1], tmp_path / "abs_t2d", tensors={"d2t": torch.arange(dv), "t2d": t2d})
    found = _codes(validate(bad))
    assert "VOCAB_MAP_ABSOLUTE" in found and "t2d is true" in found["VOCAB_MAP_ABSOLUTE"]


# -- 2. identity-prefix vocabulary, coverage of the data ------------------------------------------


def _prefix_draft(pair, path):
    cfg = _cfg(pair[1])
    dv, vocab = cfg["draft_vocab_size"], cfg["vocab_size"]
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:dv] = True
    out = _copy(pair[1], path, tensors={"d2t": torch.zeros(dv, dtype=torch.long), "t2d": t2d})
    (out / "manifest.json").unlink()  # a foreign draft: no recorded map hash to differ from
    return out, dv


def test_identity_prefix_is_a_named_warning_and_coverage_decides(pair, tmp_path):
    bad, dv = _prefix_draft(pair, tmp_path / "prefix")
    found = validate_report(bad)
    assert found.problems == []
    warn = _codes(found.warnings)
    assert "VOCAB_MAP_PREFIX" in warn and f"[0, {dv})" in warn["VOCAB_MAP_PREFIX"]
    # 30 % of the data's tokens below dv: refused; 70 %: warned; 95 %: only the prefix warning
    for inside, code in ((30, "VOCAB_COVERAGE_LOW"), (70, "VOCAB_COVERAGE"), (95, None)):
        counts = {1: 10 * inside, dv + 5: 10 * (100 - inside)}  # 1000 tokens: enough to judge
        found = validate_report(bad, token_counts=counts)
        assert found.figures["vocab_coverage"] == pytest.approx(inside / 100)
        codes = _codes(found.problems) | _codes(found.warnings)
        if code is None:
            assert set(codes) == {"VOCAB_MAP_PREFIX"}
        else:
            assert code in codes and "draft vocabulary" in codes[code]
            assert f"{inside:.1f}%" in codes[code]
        assert ("VOCAB_COVERAGE_LOW" in _codes(found.problems)) == (inside / 100 < COVERAGE_REFUSE)
    assert COVERAGE_REFUSE < COVERAGE_WARN


def test_good_draft_full_coverage_has_no_warning(pair):
    d2t = load_file(str(pair[1] / "model.safetensors"))["d2t"]
    ids = (d2t + torch.arange(d2t.numel())).tolist()
    found = validate_report(pair[1], token_counts={t: 3 for t in ids})
    assert found.problems == [] and found.warnings == []
    assert found.figures["vocab_coverage"] == 1.0


def test_cli_validate_data_conversations_file_and_extraction_folder(
    pair, tmp_path, tiny_target_dir
):
    from cli.main import app

    bad, _ = _prefix_draft(pair, tmp_path / "prefix")
    conv = tmp_path / "conv.jsonl"
    conv.write_text(
        "\n".join(
            json.dumps(
                {
                    "conversations": [
                        {"from": "human", "value": f"Tell me about topic number {i}."},
                        {
                            "from": "gpt",
                            "value": f"Topic {i} is about gardens, rivers and mountains.",
                        },
                    ]
                }
            )
            for i in range(40)
        )
    )  # about 480 target tokens: enough to judge coverage
    r = CliRunner().invoke(
        app, ["validate", str(bad), "--data", str(conv), "--target", str(tiny_target_dir)]
    )
    assert r.exit_code == 1, r.output
    assert "VOCAB_COVERAGE_LOW: draft vocabulary" in r.output and "vocab coverage:" in r.output
    assert "warning: VOCAB_MAP_PREFIX: d2t" in r.output
    # a conversations file needs the target's tokenizer
    r = CliRunner().invoke(app, ["validate", str(bad), "--data", str(conv)])
    assert r.exit_code == 2 and "--target" in r.output
    # an extraction folder: its token_freq.pt
    ext = tmp_path / "extract"
    ext.mkdir()
    (ext / "manifest.json").write_text(json.dumps({"kind": "hidden_states"}))
    d2t = load_file(str(pair[1] / "model.safetensors"))["d2t"]
    torch.save(
        {int(t): 2 for t in (d2t + torch.arange(d2t.numel())).tolist()}, ext / "token_freq.pt"
    )
    r = CliRunner().invoke(app, ["validate", str(pair[1]), "--data", str(ext)])
    assert r.exit_code == 0, r.output
    assert "vocab coverage: 100.0%" in r.output
    r = CliRunner().invoke(app, ["validate", str(pair[1]), "--data", str(tmp_path / "absent")])
    assert r.exit_code == 2 and "absent" in r.output


def test_cli_convert_prints_and_records_the_prefix_warning(pair, tmp_path, tiny_target_dir):
    from cli.main import app

    cfg = _cfg(pair[0])
    dv, vocab = cfg["draft_vocab_size"], cfg["transformer_layer_config"]["vocab_size"]
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:dv] = True
    src = _copy(
        pair[0], tmp_path / "prefix", tensors={"d2t": torch.zeros(dv, dtype=torch.long), "t2d": t2d}
    )
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["convert", str(src), str(out), "--target", str(tiny_target_dir)])
    assert r.exit_code == 0, r.output
    assert "warning: VOCAB_MAP_PREFIX: d2t" in r.output
    warnings = json.loads((out / "manifest.json").read_text())["validation"]["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith("VOCAB_MAP_PREFIX: d2t")


# -- 3. RoPE: two thetas in one config; a trained theta unlike the target's ------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        {
            "rope_theta": 500000.0,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        {"rope_theta": 500000.0, "rope_parameters": {"rope_type": "default"}},
        {
            "rope_theta": 5.0,
            "rope_scaling": {"rope_theta": 7.0, "rope_type": "default"},
            "rope_parameters": {"rope_theta": 9.0, "rope_type": "default"},
        },
        {"rope_theta": 123.0},
    ],
)
def test_sglang_theta_order_is_what_transformers_5_builds(cfg):
    from transformers import LlamaConfig

    built = LlamaConfig.from_dict(json.loads(json.dumps(cfg))).rope_parameters["rope_theta"]
    assert sglang_theta(cfg)[1] == float(built)


def test_two_thetas_in_a_serving_config_are_refused_naming_both(pair, tmp_path):
    bad = _copy(
        pair[1],
        tmp_path / "two",
        config={
            "rope_theta": 500000.0,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    )
    msg = _codes(validate(bad))["ROPE_CONFLICT"]
    assert "rope_theta=500000" in msg and "rope_parameters.rope_theta=10000" in msg
    assert "SGLang 0.5.16 and 0.5.23 read rope_parameters.rope_theta=10000" in msg
    assert "delete the others (rope_theta if rope_parameters.rope_theta is the trained one)" in msg


def test_two_thetas_in_a_speculators_draft_refuse_conversion(pair, tmp_path, tiny_target_dir):
    cfg = _cfg(pair[0])
    cfg["transformer_layer_config"]["rope_theta"] = 500000.0
    src = _copy(pair[0], tmp_path / "two", config=cfg)
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    msg = _codes(e.value.problems)["ROPE_CONFLICT"]
    assert "transformer_layer_config.rope_theta=500000" in msg
    assert not (tmp_path / "out").exists()


def test_equal_thetas_in_both_layouts_are_no_conflict(pair, tmp_path, tiny_target_dir):
    cfg = _cfg(pair[0])
    theta = cfg["transformer_layer_config"]["rope_parameters"]["rope_theta"]
    cfg["transformer_layer_config"]["rope_theta"] = theta
    src = _copy(pair[0], tmp_path / "same", config=cfg)
    man = convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    assert man["validation"]["warnings"] == []


def test_draft_trained_at_another_theta_than_the_target_is_refused(pair, tmp_path, tiny_target_dir):
    cfg = _cfg(pair[0])
    cfg["transformer_layer_config"]["rope_parameters"]["rope_theta"] = 500000.0
    src = _copy(pair[0], tmp_path / "theta", config=cfg)
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    msg = _codes(e.value.problems)["ROPE_TRAINED_MISMATCH"]
    assert "transformer_layer_config.rope_parameters.rope_theta" in msg and "500000" in msg
    assert "10000" in msg and not (tmp_path / "out").exists()


# -- 4. aux ids lost from the config of the project's own draft -----------------------------------


def _trained_on(tmp_path, target, ids, config_ids):
    src = make_speculators_draft(target, tmp_path / "own", aux_ids=tuple(ids))
    (src / "manifest.json").write_text(
        json.dumps(
            {
                "kind": "draft_checkpoint",
                "aux_layer_ids": list(ids),
                "layer_id_convention": "hf_hidden_states_index",
            }
        )
    )
    cfg = _cfg(src)
    cfg["eagle_aux_hidden_state_layer_ids"] = config_ids
    (src / "config.json").write_text(json.dumps(cfg))
    return src


def test_lost_aux_ids_come_from_the_training_manifest(tmp_path, tiny_target_dir):
    src = _trained_on(tmp_path, tiny_target_dir, [1, 3, 6], None)
    man = convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    assert man["aux_layer_ids_hf"] == [1, 3, 6]  # not the default rule [2, 4, 5]
    assert "manifest.json" in man["aux_ids_from"]
    assert _cfg(tmp_path / "out")["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 5]


def test_aux_ids_unlike_the_training_manifest_are_refused_naming_both(tmp_path, tiny_target_dir):
    src = _trained_on(tmp_path, tiny_target_dir, [1, 3, 6], [2, 4, 5])
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    msg = _codes(e.value.problems)["AUX_IDS_MISMATCH"]
    assert "eagle_aux_hidden_state_layer_ids=[2, 4, 5]" in msg
    assert "aux_layer_ids=[1, 3, 6]" in msg and not (tmp_path / "out").exists()


# -- 5. sliding-window drafts ---------------------------------------------------------------------


def test_sliding_window_draft_is_refused_not_served_with_full_attention(
    pair, tmp_path, tiny_target_dir
):
    cfg = _cfg(pair[0])
    cfg["transformer_layer_config"].update(
        layer_types=["sliding_attention"], sliding_window=4, use_sliding_window=True
    )
    src = _copy(pair[0], tmp_path / "swa", config=cfg)
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    msg = _codes(e.value.problems)["SLIDING_WINDOW"]
    assert "transformer_layer_config.layer_types" in msg and "sliding_window=4" in msg
    assert "--speculative-draft-window-size" in msg and not (tmp_path / "out").exists()


def test_sliding_window_in_a_serving_config_is_reported(pair, tmp_path):
    bad = _copy(
        pair[1],
        tmp_path / "swa",
        config={"layer_types": ["sliding_attention"], "sliding_window": 4},
    )
    assert "layer_types" in _codes(validate(bad))["SLIDING_WINDOW"]


# -- 6. fc width conflicts name the aux ids key ---------------------------------------------------


def test_fc_width_conflict_names_the_aux_ids_key(pair, tmp_path):
    fc = load_file(str(pair[1] / "model.safetensors"))["fc.weight"]
    narrow = fc[:, : fc.shape[1] * 2 // 3].contiguous()
    bad = _copy(pair[1], tmp_path / "fc", tensors={"fc.weight": narrow})
    found = _codes(validate(bad))
    assert AUX_KEY in found["AUX_IDS_COUNT"] and "fc.weight" in found["AUX_IDS_COUNT"]
    assert AUX_KEY in found["SHAPE_MISMATCH"] and "fc.weight" in found["SHAPE_MISMATCH"]
