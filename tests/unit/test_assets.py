import json

import pytest

from eagle3.assets import iter_json_array_tolerant, mtbench_questions, package_file
from eagle3.errors import DataError


def test_smollm2_is_a_real_instruct_model(smollm2_dir):
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert (
        cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576 and cfg["vocab_size"] == 49152
    )
    assert cfg["tie_word_embeddings"] is True
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2 and tok.pad_token_id == 2
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")


def test_sharegpt_reader_keeps_clean_conversations(sharegpt_path):
    lines = sharegpt_path.read_text().splitlines()
    assert len(lines) > 8000
    rec = json.loads(lines[0])
    roles = {t["from"] for t in rec["conversations"]}
    assert roles <= {"human", "gpt"} and rec["conversations"][0]["from"] == "human"


def test_tolerant_reader_stops_at_cut(tmp_path):
    p = tmp_path / "cut.json"
    p.write_text('[{"a": 1}, {"a": 2}, {"a": ')
    assert list(iter_json_array_tolerant(p)) == [{"a": 1}, {"a": 2}]


def test_mtbench_has_80_questions_in_8_categories():
    qs = mtbench_questions()
    assert len(qs) == 80
    assert len({q["category"] for q in qs}) == 8
    assert all(len(q["turns"]) == 2 for q in qs)


def test_missing_package_is_named():
    with pytest.raises(DataError, match="not-a-real-package"):
        package_file("not-a-real-package", "x")
