"""The one reader of the target's config.json (eagle3.target_config): the text section of
multimodal configs, errors naming the file, and the lenient form the pre-checks use."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from eagle3.errors import DataError
from eagle3.extract.precheck import _known_layer_count
from eagle3.target_config import (
    target_architecture,
    target_config_json,
    target_text_config,
    text_config,
)


def _write(folder, conf) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(conf))


MULTIMODAL = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {"hidden_size": 64, "vocab_size": 1000, "num_hidden_layers": 9},
    "vision_config": {"hidden_size": 32},
}


def test_text_config_picks_the_nested_section_of_dicts_and_config_objects():
    assert text_config(MULTIMODAL)["num_hidden_layers"] == 9
    plain = {"hidden_size": 8}
    assert text_config(plain) is plain
    assert text_config({"hidden_size": 8, "text_config": None})["hidden_size"] == 8
    inner = SimpleNamespace(num_hidden_layers=4)
    assert text_config(SimpleNamespace(text_config=inner)) is inner
    flat = SimpleNamespace(num_hidden_layers=2)
    assert text_config(flat) is flat


def test_the_multimodal_target_is_read_through_its_text_config(tmp_path):
    _write(tmp_path, MULTIMODAL)
    assert target_text_config(tmp_path)["vocab_size"] == 1000
    assert target_config_json(tmp_path)["model_type"] == "gemma3"
    assert target_architecture(tmp_path) == "Gemma3ForConditionalGeneration"
    cfg = SimpleNamespace(
        target=SimpleNamespace(kind="hf", path=str(tmp_path)),
        paths=SimpleNamespace(resolved_cache_dir=lambda: tmp_path),
    )
    assert _known_layer_count(cfg) == 9


def test_errors_name_the_file_and_what_was_found(tmp_path):
    with pytest.raises(DataError, match=r"config\.json: target config\.json not found"):
        target_config_json(tmp_path)
    assert target_text_config(tmp_path) is None and target_text_config(None) is None
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(DataError, match="expected a JSON object, got list"):
        target_config_json(tmp_path)
    assert target_text_config(tmp_path) is None
    _write(tmp_path, {"architectures": []})
    with pytest.raises(DataError, match=r"'architectures' expected a non-empty list, got \[\]"):
        target_architecture(tmp_path)
