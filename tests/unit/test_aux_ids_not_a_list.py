"""Aux layer ids that are no JSON list of integers (a string such as "1,4,7" or "[1, 4, 7]", a
list holding a string, a float or a boolean): `eagle3 validate` and `eagle3 convert` name them
AUX_IDS_INVALID with the file, the key, the expected "list of integers" and the value with its
type, instead of counting a string's characters as ids or ending on a raw ValueError. The good
drafts are the controls."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from eagle3.convert.stage import convert
from eagle3.errors import CheckpointInvalid
from testkit.broken_corpus import good_pair, validate

TOP_KEY = "eagle_aux_hidden_state_layer_ids"
ENGINE_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"
BAD = [
    ("1,4,7", "string"),
    ("[1, 4, 7]", "string"),
    ([1, "4", 7], "string"),
    ([1.5], "float"),
    ([True, 2, 3], "boolean"),
    (7, "number"),
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target_dir):
    return good_pair(tmp_path_factory.getbasetemp() / "eagle3-good", tiny_target_dir)


def _with_ids(src, dst, ids, nested):
    """A copy of draft ``src`` whose aux ids (``eagle_config``'s if ``nested``) are ``ids``."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (cfg["eagle_config"] if nested else cfg)[TOP_KEY] = ids
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _assert_named(msg, key, ids, type_name, file):
    assert key in msg and file in msg and "expected a list of integers" in msg, msg
    assert repr(ids) in msg and f"(a {type_name}" in msg, msg


@pytest.mark.parametrize("ids,type_name", BAD)
def test_validate_names_ids_that_are_no_list_of_integers(pair, tmp_path, ids, type_name):
    bad = _with_ids(pair[1], tmp_path / "bad", ids, nested=True)
    codes = [p.code for p in validate(bad)]
    # the config was edited after conversion: the content hash says so, last
    assert codes == ["AUX_IDS_INVALID", "CONTENT_HASH_MISMATCH"], codes  # no SHAPE_MISMATCH
    msg = validate(bad)[0].message
    _assert_named(msg, ENGINE_KEY, ids, type_name, f"{bad}/config.json")


@pytest.mark.parametrize("ids,type_name", BAD)
def test_convert_of_a_speculators_draft_names_them(pair, tmp_path, tiny_target_dir, ids, type_name):
    src = _with_ids(pair[0], tmp_path / "src", ids, nested=False)
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    assert [p.code for p in e.value.problems] == ["AUX_IDS_INVALID"]
    _assert_named(str(e.value), TOP_KEY, ids, type_name, f"{src}/config.json")
    assert not (tmp_path / "out").exists()


def test_convert_of_a_serving_layout_draft_names_them(pair, tmp_path, tiny_target_dir):
    src = _with_ids(pair[1], tmp_path / "src", "1,4,7", nested=True)
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    _assert_named(str(e.value), ENGINE_KEY, "1,4,7", "string", f"{src}/config.json")


def test_training_manifest_ids_that_are_no_list_are_named(pair, tmp_path, tiny_target_dir):
    src = _with_ids(pair[0], tmp_path / "src", None, nested=False)
    (src / "manifest.json").write_text(
        json.dumps(
            {
                "kind": "draft_checkpoint",
                "aux_layer_ids": "2,4,5",
                "layer_id_convention": "hf_hidden_states_index",
            }
        )
    )
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    _assert_named(str(e.value), "aux_layer_ids", "2,4,5", "string", f"{src}/manifest.json")


def test_cli_convert_exits_1_with_the_code_not_a_raw_value_error(pair, tmp_path, tiny_target_dir):
    from cli.main import app

    src = _with_ids(pair[0], tmp_path / "src", "[1, 4, 7]", nested=False)
    r = CliRunner().invoke(
        app, ["convert", str(src), str(tmp_path / "out"), "--target", str(tiny_target_dir)]
    )
    assert r.exit_code == 1, r.output
    assert "AUX_IDS_INVALID" in r.output and TOP_KEY in r.output, r.output
    assert "ValueError" not in r.output and "unreadable draft" not in r.output, r.output


def test_cli_validate_prints_the_code(pair, tmp_path):
    from cli.main import app

    bad = _with_ids(pair[1], tmp_path / "bad", "1,4,7", nested=True)
    r = CliRunner().invoke(app, ["validate", str(bad)])
    assert r.exit_code != 0 and "AUX_IDS_INVALID" in r.output, r.output
    assert "SHAPE_MISMATCH" not in r.output, r.output


def test_lists_of_integers_are_no_finding(pair, tmp_path, tiny_target_dir):
    assert validate(pair[1]) == []
    man = convert(pair[0], tmp_path / "out", target_dir=tiny_target_dir)
    assert man["aux_layer_ids_hf"] == json.loads((pair[0] / "config.json").read_text())[TOP_KEY]
