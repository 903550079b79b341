"""What a converted draft handed over must not hide: files edited after conversion
(CONTENT_HASH_MISMATCH), source values the target's replaced (REPLACED_FROM_TARGET), refusals with
a code and exit 1 (UNSUPPORTED_FLAG, DUPLICATE_TENSOR), and a draft given as the target
(TARGET_IS_DRAFT). Each with a control that passes."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from eagle3.artifacts import content_hash
from eagle3.convert.stage import convert
from eagle3.convert.validate import validate_report
from eagle3.errors import CheckpointInvalid
from testkit.broken_corpus import good_pair, validate
from tests.support.handover import cli as _cli
from tests.support.handover import edit_config as _edit_config


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target_dir):
    return good_pair(tmp_path_factory.getbasetemp() / "eagle3-good", tiny_target_dir)


def _codes(problems):
    return [p.code for p in problems]


# 1. the files against manifest.json content_hash


def test_fresh_conversion_passes_the_content_hash(pair, tiny_target_dir):
    found = validate_report(pair[1], target_dir=tiny_target_dir)
    assert found.problems == [] and "CONTENT_UNCHECKED" not in _codes(found.warnings)
    r = _cli("validate", pair[1], "--target", tiny_target_dir)
    assert r.exit_code == 0 and "valid for sglang" in r.output


@pytest.mark.parametrize("edit", ["swap_k_v", "eps"])
def test_weights_or_config_edited_after_conversion_are_named(pair, tmp_path, edit):
    d = tmp_path / "edited"
    shutil.copytree(pair[1], d)
    recorded = json.loads((d / "manifest.json").read_text())["content_hash"]
    if edit == "swap_k_v":  # same shapes: no other check can see it
        t = load_file(str(d / "model.safetensors"))
        k, v = "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight"
        t[k], t[v] = t[v], t[k]
        save_file(t, str(d / "model.safetensors"))
    else:
        _edit_config(d, rms_norm_eps=1e-5)
    got = content_hash(d)
    assert got != recorded
    assert _codes(validate(d)) == ["CONTENT_HASH_MISMATCH"]
    r = _cli("validate", d)
    assert r.exit_code == 1
    assert (
        f"CONTENT_HASH_MISMATCH: {d}/manifest.json content_hash: expected {recorded}, got "
        f"{got} (the weights or config changed after conversion)"
    ) in r.output


def test_no_manifest_is_no_error_and_a_manifest_without_hash_is_a_warning(pair, tmp_path):
    d = tmp_path / "foreign"
    shutil.copytree(pair[1], d)
    _edit_config(d, rms_norm_eps=1e-5)
    man = json.loads((d / "manifest.json").read_text())
    man.pop("content_hash")
    (d / "manifest.json").write_text(json.dumps(man))
    found = validate_report(d)
    assert found.problems == []
    assert "CONTENT_UNCHECKED" in _codes(found.warnings)
    (d / "manifest.json").unlink()
    found = validate_report(d)
    assert found.problems == [] and "CONTENT_UNCHECKED" not in _codes(found.warnings)


# 2. a source value the target's replaced is said, and recorded


def test_replaced_target_hidden_size_is_warned_and_recorded(pair, tmp_path, tiny_target_dir):
    hidden = json.loads((tiny_target_dir / "config.json").read_text())["hidden_size"]
    src = tmp_path / "wrong_hidden"
    shutil.copytree(pair[0], src)
    _edit_config(src, target_hidden_size=2 * hidden)
    r = _cli("convert", src, tmp_path / "out", "--to", "sglang", "--target", tiny_target_dir)
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if "REPLACED_FROM_TARGET" in x)
    assert line.startswith("warning: REPLACED_FROM_TARGET: ") and "target_hidden_size" in line
    assert f"states {2 * hidden}" in line and f"hidden_size {hidden}" in line
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert man["replaced_from_target"]["target_hidden_size"] == {
        "source": 2 * hidden,
        "target": hidden,
    }
    assert any("REPLACED_FROM_TARGET" in w for w in man["validation"]["warnings"])
    # control: the good draft states no value the target replaces
    control = json.loads((pair[1] / "manifest.json").read_text())
    assert control["replaced_from_target"] == {}
    assert not any("REPLACED_FROM_TARGET" in w for w in control["validation"]["warnings"])


# 3. refusals with a code and exit 1


def test_unsupported_flag_in_convert_has_validates_code_and_exit_1(pair, tmp_path, tiny_target_dir):
    src = tmp_path / "nbr"
    shutil.copytree(pair[0], src)
    _edit_config(src, norm_before_residual=True)
    r = _cli("convert", src, tmp_path / "out", "--to", "sglang", "--target", tiny_target_dir)
    assert r.exit_code == 1, r.output
    assert any(
        x.startswith("UNSUPPORTED_FLAG: ") and "norm_before_residual" in x
        for x in r.output.splitlines()
    )
    assert not (tmp_path / "out").exists()
    served = tmp_path / "served"
    shutil.copytree(pair[1], served)
    _edit_config(served, norm_before_residual=True)
    (served / "manifest.json").unlink()
    r = _cli("validate", served)
    assert r.exit_code == 1 and "UNSUPPORTED_FLAG: " in r.output


def _split_with_duplicate(src, dst, name):
    """``src``'s weights in two files, ``name`` in both."""
    shutil.copytree(src, dst)
    (dst / "manifest.json").unlink(missing_ok=True)
    t = load_file(str(dst / "model.safetensors"))
    (dst / "model.safetensors").unlink()
    keys = sorted(t)
    half = {k: t[k] for k in keys[: len(keys) // 2]}
    rest = {k: t[k] for k in keys[len(keys) // 2 :]}
    half[name], rest[name] = t[name], t[name]
    save_file(half, str(dst / "model-00001-of-00002.safetensors"))
    save_file(rest, str(dst / "model-00002-of-00002.safetensors"))
    return dst


def test_tensor_in_two_weight_files_is_duplicate_tensor_exit_1(pair, tmp_path, tiny_target_dir):
    d = _split_with_duplicate(pair[1], tmp_path / "two_st", "d2t")
    r = _cli("validate", d)
    assert r.exit_code == 1, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("DUPLICATE_TENSOR: "))
    assert "'d2t'" in line and "model-00001-of-00002.safetensors" in line
    assert "model-00002-of-00002.safetensors" in line
    src = _split_with_duplicate(pair[0], tmp_path / "two_spec", "d2t")
    r = _cli("convert", src, tmp_path / "out", "--to", "sglang", "--target", tiny_target_dir)
    assert r.exit_code == 1 and "DUPLICATE_TENSOR: tensor 'd2t'" in r.output
    assert not (tmp_path / "out").exists()
    # control: the same split without a repeat is valid
    ok = tmp_path / "split_ok"
    shutil.copytree(d, ok)
    t = load_file(str(ok / "model-00002-of-00002.safetensors"))
    first = load_file(str(ok / "model-00001-of-00002.safetensors"))
    save_file(
        {k: v for k, v in t.items() if k not in first}, str(ok / "model-00002-of-00002.safetensors")
    )
    assert validate(ok, target_dir=tiny_target_dir) == []


# 4. a draft given as the target


def test_draft_folder_as_target_is_named(pair, tmp_path, tiny_target_dir):
    r = _cli("validate", pair[1], "--target", pair[1])
    assert r.exit_code == 1
    assert (
        f"TARGET_IS_DRAFT: --target {pair[1]}: expected the target (verifier) model folder, "
        "got an EAGLE-3 draft (architectures ['LlamaForCausalLMEagle3']"
    ) in r.output
    assert "AUX_IDS_RANGE" not in r.output
    for folder in (pair[0], pair[1]):  # speculators format too
        with pytest.raises(CheckpointInvalid) as e:
            convert(pair[0], tmp_path / "out", target_dir=folder)
        assert _codes(e.value.problems) == ["TARGET_IS_DRAFT"]
    assert not (tmp_path / "out").exists()
    # control: the real target
    assert validate(pair[1], target_dir=tiny_target_dir) == []
