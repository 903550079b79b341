"""The broken-checkpoint corpus: every file-checkable failure class is rejected with the right code
and the key/field named; the good checkpoint passes with the target and the extraction manifest
given."""

from __future__ import annotations

import json

import pytest

from eagle3.errors import DataError
from eagle3.convert.validate import Problem
from testkit.broken_corpus import CASES, build_corpus, good_data_manifest, good_pair, validate

FILE_CHECKABLE = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 22, 26}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tiny_target_dir):
    base = tmp_path_factory.getbasetemp() / "eagle3-good"
    _, serving = good_pair(base, tiny_target_dir)
    data = good_data_manifest(tiny_target_dir)
    cases = build_corpus(serving, tmp_path_factory.mktemp("corpus"), tiny_target_dir, data)
    return serving, data, {c.name: c for c in cases}


def test_good_checkpoint_passes(corpus, tiny_target_dir):
    serving, data, _ = corpus
    assert validate(serving, target_dir=tiny_target_dir, data_manifest=data) == []
    assert validate(serving) == []


def test_corpus_covers_every_file_checkable_class():
    assert {c.fclass for c in CASES} == FILE_CHECKABLE


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_broken_case_rejected(corpus, name):
    case = corpus[2][name]
    problems = validate(case.path, target_dir=case.target_dir, data_manifest=case.data_manifest)
    hits = [p for p in problems if p.code == case.code and case.needle in p.message]
    assert hits, (
        f"{name}: expected {case.code} naming {case.needle!r}, got {[str(p) for p in problems]}"
    )
    assert all(str(p).startswith(f"{p.code}: ") for p in problems)


def test_messages_name_both_values(corpus):
    cases = corpus[2]
    msg = {
        c: " ".join(map(str, validate(cases[c].path, target_dir=cases[c].target_dir)))
        for c in ("target_hidden_wrong", "short_context", "lm_head_rows")
    }
    assert "expected the target's hidden_size 64" in msg["target_hidden_wrong"]
    assert "got 128" in msg["target_hidden_wrong"]
    assert ">= the target's 2048" in msg["short_context"] and "got 512" in msg["short_context"]
    assert (
        "expected shape [256, 64]" in msg["lm_head_rows"] and "got [200, 64]" in msg["lm_head_rows"]
    )


def test_problem_str():
    assert str(Problem("MISSING_TENSOR", "x")) == "MISSING_TENSOR: x"


def test_unreadable_input_raises_data_error(tmp_path, corpus):
    with pytest.raises(DataError, match="not found"):
        validate(tmp_path / "missing")
    d = tmp_path / "corrupt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    (d / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(DataError, match="unreadable weights"):
        validate(d)
