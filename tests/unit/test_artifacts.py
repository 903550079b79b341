import json

import pytest

from eagle3.artifacts import (
    atomic_directory,
    atomic_write_json,
    content_hash,
    read_jsonl,
    read_manifest,
    write_manifest,
)
from eagle3.errors import DataError


def test_content_hash_changes_with_content_and_ignores_manifest(tmp_path):
    (tmp_path / "a.txt").write_text("one")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"\x00\x01")
    h1 = content_hash(tmp_path)
    write_manifest(tmp_path, "test")
    assert content_hash(tmp_path) == h1
    (tmp_path / "a.txt").write_text("two")
    assert content_hash(tmp_path) != h1


def test_manifest_roundtrip_and_kind_check(tmp_path):
    m = write_manifest(tmp_path, "hidden_states", counts={"samples": 3}, config={"x": 1})
    assert read_manifest(tmp_path, "hidden_states")["counts"] == {"samples": 3}
    assert m["content_hash"] == content_hash(tmp_path)
    with pytest.raises(DataError, match="kind expected 'draft_checkpoint', got 'hidden_states'"):
        read_manifest(tmp_path, "draft_checkpoint")
    with pytest.raises(DataError, match="manifest not found"):
        read_manifest(tmp_path / "nowhere")


def test_manifest_that_is_not_a_json_object_is_a_named_data_error(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps([{"kind": "hidden_states"}]))
    for kind in ("hidden_states", None):
        with pytest.raises(DataError) as e:
            read_manifest(tmp_path, kind)
        assert str(tmp_path / "manifest.json") in str(e.value)
        assert "expected a JSON object" in str(e.value) and "got a list" in str(e.value)
    (tmp_path / "manifest.json").write_text("3")
    with pytest.raises(DataError, match="expected a JSON object.*got a number"):
        read_manifest(tmp_path, "hidden_states")


def test_atomic_directory_removes_half_made_output(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_directory(final) as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise RuntimeError("boom")
    assert not final.exists()
    assert [p for p in tmp_path.iterdir()] == []


def test_atomic_directory_replaces_only_when_complete(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "old").write_text("old")
    with atomic_directory(final) as tmp:
        (tmp / "new").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["new"]


def test_atomic_write_json(tmp_path):
    p = atomic_write_json(tmp_path / "x" / "m.json", {"b": 1, "a": [1, 2]})
    assert json.loads(p.read_text()) == {"a": [1, 2], "b": 1}
    assert [q.name for q in p.parent.iterdir()] == ["m.json"]


def test_outputs_are_readable_by_others(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "out") as tmp:
            atomic_write_json(tmp / "m.json", {})
        assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755
        assert stat.S_IMODE((tmp_path / "out" / "m.json").stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_read_jsonl_reads_every_row_and_names_a_bad_line(tmp_path):
    rows = [
        {"step": i, "train/loss": 3 - 0.1 * i, "train/full_acc_0": 0.1 + 0.02 * i}
        for i in range(10)
    ]
    rows += [{"step": 5, "val/loss": 2.6}, {"step": 9, "val/loss": 2.3}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert len(read_jsonl(path)) == 12
    path.write_text("{not json\n")
    with pytest.raises(DataError, match=":1:"):
        read_jsonl(path)
