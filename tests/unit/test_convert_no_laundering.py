"""What conversion must not launder: a source whose files no longer match its own manifest
(CONTENT_HASH_MISMATCH) or whose config states a flag otherwise than the manifest's trained_flags
(FLAG_MISMATCH) is refused, and the recorded source hash is one computed of the files read; a
known boolean key stated as a string or number is FLAG_TYPE in validate and convert. Each with a
control that passes."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from eagle3.artifacts import content_hash
from eagle3.convert.stage import convert
from eagle3.convert.validate import validate_report
from eagle3.errors import CheckpointInvalid
from testkit.broken_corpus import good_pair
from tests.support.handover import cli as _cli
from tests.support.handover import edit_config as _edit_config


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target_dir):
    return good_pair(tmp_path_factory.getbasetemp() / "eagle3-good", tiny_target_dir)


def _codes(problems):
    return [p.code for p in problems]


def _bump_fc(d):
    t = load_file(str(d / "model.safetensors"))
    t["fc.weight"] = t["fc.weight"] + 0.01
    save_file(t, str(d / "model.safetensors"))


# 1. a source edited after its manifest was written


def test_convert_refuses_a_source_edited_after_conversion(pair, tmp_path, tiny_target_dir):
    src = tmp_path / "tampered"
    shutil.copytree(pair[1], src)
    recorded = json.loads((src / "manifest.json").read_text())["content_hash"]
    _bump_fc(src)
    got = content_hash(src)
    out = tmp_path / "out"
    r = _cli("convert", src, out, "--to", "sglang", "--target", tiny_target_dir)
    assert r.exit_code == 1, r.output
    assert (
        f"CONTENT_HASH_MISMATCH: {src}/manifest.json content_hash: expected {recorded}, got "
        f"{got} (the weights or config changed after conversion)"
    ) in r.output
    assert not out.exists()


def test_convert_records_the_hash_it_computed_of_the_source(pair, tmp_path, tiny_target_dir):
    # control: an untouched serving draft converts, recording its own (recomputed) hash
    man = convert(pair[1], tmp_path / "again", target_dir=tiny_target_dir)
    recorded = json.loads((pair[1] / "manifest.json").read_text())["content_hash"]
    assert man["inputs"]["source"] == recorded == content_hash(pair[1])
    # a foreign draft (no manifest) edited: the recorded hash is of the edited files
    src = tmp_path / "foreign"
    shutil.copytree(pair[1], src)
    (src / "manifest.json").unlink()
    _bump_fc(src)
    man = convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    assert man["inputs"]["source"] == content_hash(src) != recorded


def test_convert_refuses_a_flag_edited_after_conversion(pair, tmp_path, tiny_target_dir):
    src = tmp_path / "flag"
    shutil.copytree(pair[1], src)
    _edit_config(src, norm_output=True)
    # the manifest's hash left out: the flag record alone must refuse it
    man = json.loads((src / "manifest.json").read_text())
    assert man["trained_flags"]["norm_output"] is False
    man.pop("content_hash")
    (src / "manifest.json").write_text(json.dumps(man))
    assert "FLAG_MISMATCH" in _codes(validate_report(src, target_dir=tiny_target_dir).problems)
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    assert _codes(e.value.problems) == ["FLAG_MISMATCH"]
    msg = str(e.value.problems[0])
    assert f"{src}/manifest.json trained_flags.norm_output" in msg
    assert "trained with norm_output=False" in msg and "states norm_output=True" in msg
    assert not (tmp_path / "out").exists()


def test_convert_names_what_changed_and_the_hash_mismatch(pair, tmp_path, tiny_target_dir):
    src = tmp_path / "both"
    shutil.copytree(pair[1], src)
    _edit_config(src, norm_output=True)
    r = _cli("convert", src, tmp_path / "out", "--to", "sglang", "--target", tiny_target_dir)
    assert r.exit_code == 1, r.output
    codes = [x.split(":")[0] for x in r.output.splitlines() if x[:1].isupper() and ":" in x]
    assert codes[:2] == ["FLAG_MISMATCH", "CONTENT_HASH_MISMATCH"], r.output
    assert not (tmp_path / "out").exists()


# 10. a known boolean key that is not a boolean


@pytest.mark.parametrize(
    "key,value,words,means",
    [
        ("norm_output", "false", "the string 'false'", "true"),
        ("norm_output", 1, "the number 1", "true"),
        ("tie_word_embeddings", "false", "the string 'false'", "true"),
        ("attention_bias", "false", "the string 'false'", "true"),
        ("norm_before_fc", 0, "the number 0", "false"),
    ],
)
def test_non_boolean_flag_is_flag_type_in_validate_and_convert(
    pair, tmp_path, tiny_target_dir, key, value, words, means
):
    d = tmp_path / "typed"
    shutil.copytree(pair[1], d)
    (d / "manifest.json").unlink()  # a foreign draft: no manifest record to compare with
    _edit_config(d, **{key: value})
    want = (
        f"FLAG_TYPE: config.json {key}: expected true or false, got {words} (read by "
        f"truthiness it means {means})"
    )
    r = _cli("validate", d, "--target", tiny_target_dir)
    assert r.exit_code == 1, r.output
    assert want in r.output.splitlines(), r.output
    # the file's value, not its truthiness, in every message about the key
    assert not any(key in x and "FLAG_TYPE" not in x for x in r.output.splitlines()), r.output
    out = tmp_path / "out"
    r = _cli("convert", d, out, "--to", "sglang", "--target", tiny_target_dir)
    assert r.exit_code == 1, r.output
    assert f"FLAG_TYPE: {d}/config.json {key}: expected true or false, got {words}" in r.output
    assert not out.exists()


def test_speculators_flag_type_is_refused_and_booleans_pass(pair, tmp_path, tiny_target_dir):
    src = tmp_path / "spec"
    shutil.copytree(pair[0], src)
    _edit_config(src, norm_before_residual="false")
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    assert _codes(e.value.problems) == ["FLAG_TYPE"]
    assert "norm_before_residual: expected true or false, got the string 'false'" in str(e.value)
    _edit_config(src, norm_before_residual=False)
    convert(src, tmp_path / "ok", target_dir=tiny_target_dir)
    found = validate_report(tmp_path / "ok", target_dir=tiny_target_dir)
    assert found.problems == []
