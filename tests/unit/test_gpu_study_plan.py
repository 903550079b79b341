"""benchmarks/gpu_study.py's plan: a failed regen stage stops the sweep with its own message, not a config error."""

import argparse
import json

import pytest

from benchmarks.gpu_study import _plan


def _args(tmp_path, plan):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan))
    return argparse.Namespace(plan=str(f), tiny=False, all_size=100)


PLAN = {"data": {"as-is": [], "regenerated": ["data.source=file", "data.path={regen}"]},
        "schedules": {"c": ["train.epochs=1"]}, "points": [["regenerated", 0, "c"], ["as-is", 10, "c"]]}


def test_plan_without_a_regenerated_file_names_the_variants_that_need_it(tmp_path):
    with pytest.raises(RuntimeError, match=r"data variant\(s\) regenerated read the regenerated file"):
        _plan(_args(tmp_path, PLAN), "")


def test_plan_fills_in_the_regenerated_file_and_the_all_size(tmp_path):
    out = _plan(_args(tmp_path, PLAN), "/x/regen.jsonl")
    assert out["data"]["regenerated"] == ["data.source=file", "data.path=/x/regen.jsonl"]
    assert out["points"] == [["regenerated", 100, "c"], ["as-is", 10, "c"]]


def test_plan_without_regenerated_variants_needs_no_regen_file(tmp_path):
    plan = {"data": {"as-is": []}, "schedules": PLAN["schedules"], "points": [["as-is", 10, "c"]]}
    assert _plan(_args(tmp_path, plan), "")["points"] == [["as-is", 10, "c"]]


def _regen(tmp_path, n_lines=3, made_for=3, conversations=3):
    from benchmarks.gpu_study import _manifest_of

    src = tmp_path / "carried" / "regenerated.jsonl"
    src.parent.mkdir()
    rows = [json.dumps({"id": str(i), "messages": [{"role": "user", "content": f"q{i}"},
                                                   {"role": "assistant", "content": f"a{i}"}]}) for i in range(n_lines)]
    src.write_text("\n".join(rows) + "\n")
    _manifest_of(src).write_text(json.dumps({"kind": "regenerated_conversations", "seconds": 12.5,
                                             "settings": {"num_conversations": made_for},
                                             "counts": {"conversations": conversations, "answers": conversations}}))
    return src


def test_carried_back_regen_file_is_reused_byte_for_byte_from_its_xz_copy(tmp_path):
    from benchmarks.gpu_study import _manifest_of, carry_back_regen, reuse_regen

    src = _regen(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    carry_back_regen(src, out)
    xz = out / "regenerated.jsonl.xz"
    assert xz.stat().st_size > 0 and _manifest_of(xz).name == "regenerated.jsonl.manifest.json"
    got = reuse_regen(xz, 3, tmp_path / "work" / "regenerated.jsonl")
    assert (tmp_path / "work" / "regenerated.jsonl").read_bytes() == src.read_bytes()
    assert got["counts"]["conversations"] == 3 and got["seconds"] == 0.0 and got["reused_from"] == str(xz)
    assert json.loads(_manifest_of(tmp_path / "work" / "regenerated.jsonl").read_text())["reused_from"] == str(xz)


def test_regen_file_made_for_another_count_or_truncated_or_without_manifest_is_refused(tmp_path):
    from benchmarks.gpu_study import _manifest_of, reuse_regen

    src = _regen(tmp_path, n_lines=2, made_for=3, conversations=3)
    with pytest.raises(RuntimeError, match=r"num_conversations is 3, expected --regen 5"):
        reuse_regen(src, 5, tmp_path / "w.jsonl")
    with pytest.raises(RuntimeError, match=r"2 conversations in the file, its manifest's counts.conversations says 3"):
        reuse_regen(src, 3, tmp_path / "w.jsonl")
    _manifest_of(src).unlink()
    with pytest.raises(RuntimeError, match=r"expected its manifest .*regenerated.jsonl.manifest.json"):
        reuse_regen(src, 3, tmp_path / "w.jsonl")


def test_reused_regen_file_is_not_written_back_to_out(tmp_path, monkeypatch):
    """The device returns at most 8 files from --out: a run given --regen-file spends none on a copy of it."""
    import benchmarks.gpu_study as G

    src = _regen(tmp_path)
    first = tmp_path / "out1"
    first.mkdir()
    G.carry_back_regen(src, first)
    out = tmp_path / "out2"
    argv = ["--device", "cpu", "--work", str(tmp_path / "w2"), "--out", str(out), "--quiet",
            "--regen-file", str(first / "regenerated.jsonl.xz"), "--until", "regen", "--regen", "3"]
    monkeypatch.setattr(G, "prepare_target", lambda a, work: tmp_path)
    monkeypatch.setattr(G, "_cached_sharegpt", lambda work: str(src))
    monkeypatch.setattr(G, "base_overrides", lambda a, work, target, data: ["data.source=file"])
    assert G.main(argv) == 0
    assert (tmp_path / "w2" / "regenerated.jsonl").read_bytes() == src.read_bytes()
    assert not (out / "regenerated.jsonl.xz").exists()
