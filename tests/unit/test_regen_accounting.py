"""Regeneration accounting (eagle3.extract.regen.regenerate_counted): every assistant turn asked
ends succeeded, failed or skipped, per turn and per conversation the counts add up to the input,
truncated answers are counted and marked, and a sizeable share not regenerated is logged loudly."""

from __future__ import annotations

import json
import logging

import pytest

from eagle3.extract.conversations import Conversation
from eagle3.extract.regen import regenerate_counted
from eagle3.extract.regen_answers import Failed, Truncated, hf_answer_fn


def _conv(cid: str, *turns: str) -> Conversation:
    msgs = []
    for n, t in enumerate(turns):
        msgs += [
            {"role": "user", "content": f"{cid}-q{n + 1}"},
            {"role": "assistant", "content": t},
        ]
    return Conversation(cid, msgs)


def _answers(prefixes):
    """Scripted by the question: ...-fail -> Failed, ...-long -> None (prompt too long), ...-cut ->
    Truncated, else an answer naming the context it saw."""
    out = []
    for p in prefixes:
        q, cid = p[-1]["content"], p[-1]["content"].split("-")[0]
        seen = "|".join(m["content"] for m in p if m["role"] == "assistant")
        out.append(
            {
                "A-q2": Failed("HTTP 400: context too long"),
                "C-q1": None,
                "B-q1": Truncated(f"cut {q}"),
            }.get(q, f"new {q} after [{seen}]")
        )
        del cid
    return out


def test_counts_add_up_with_a_failure_a_skip_a_truncation_per_turn_and_conversation(caplog):
    convs = [
        _conv("A", "a1", "a2"),
        _conv("B", "b1", "b2"),
        _conv("C", "c1"),
        Conversation("D", text="plain text"),
        _conv("E", "e1", "e2"),
    ]
    with caplog.at_level(logging.INFO, logger="eagle3.extract.regen"):
        out, counts = regenerate_counted(convs, _answers, batch_size=2)
    t, c = counts["turns"], counts["conversations"]
    assert t == {
        "input": 7,
        "succeeded": 5,
        "failed": 1,
        "skipped": 1,
        "truncated": 1,
        "empty": 0,
        "clean": 4,
    }
    assert c == {"input": 5, "succeeded": 2, "failed": 1, "skipped": 2, "truncated": 1}
    for level in [t, c] + counts["per_turn"]:
        assert level["succeeded"] + level["failed"] + level["skipped"] == level["input"]
    assert counts["per_turn"] == [
        {"turn": 1, "input": 4, "succeeded": 3, "failed": 0, "skipped": 1, "truncated": 1},
        {"turn": 2, "input": 3, "succeeded": 2, "failed": 1, "skipped": 0, "truncated": 0},
    ]
    assert counts["skipped_by_reason"] == {"prompt_too_long": 1, "no_assistant_turn": 1}
    assert counts["failed_examples"] == ["A turn 2: HTTP 400: context too long"]
    assert counts["truncated_turns"] == {"B": [1]}
    by_id = {x.id: [m["content"] for m in x.messages or []] for x in out}
    # each turn answered in context: turn 2 saw the regenerated turn 1, not the original
    assert by_id["E"] == ["E-q1", "new E-q1 after []", "E-q2", "new E-q2 after [new E-q1 after []]"]
    assert by_id["A"][3] == "a2" and by_id["C"][1] == "c1"  # failed / skipped keep the original
    assert by_id["B"][1] == "cut B-q1" and by_id["B"][3] == "new B-q2 after [cut B-q1]"
    loud = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        len(loud) == 1
        and "3 of 7 assistant turns (43%) truncated or not regenerated" in loud[0].getMessage()
        and "1 truncated" in loud[0].getMessage()
    )


def test_max_rounds_counts_only_the_turns_asked_and_a_clean_run_is_quiet(caplog):
    convs = [_conv("E", "e1", "e2", "e3"), _conv("F", "f1")]
    with caplog.at_level(logging.INFO, logger="eagle3.extract.regen"):
        out, counts = regenerate_counted(convs, _answers, batch_size=4, max_rounds=2)
    assert counts["turns"] == {
        "input": 3,
        "succeeded": 3,
        "failed": 0,
        "skipped": 0,
        "truncated": 0,
        "empty": 0,
        "clean": 3,
    }
    assert [p["input"] for p in counts["per_turn"]] == [2, 1]
    assert len(out[0].messages) == 4 and not caplog.records


def test_hf_answers_that_hit_max_new_tokens_are_truncated_and_finished_ones_are_not(
    tiny_target_dir,
):
    """The tiny random target never emits EOS: every answer is cut at max_new_tokens; with its
    usual token made the EOS, answers end at once and are whole."""
    from eagle3.target_model import load_target

    model, tok = load_target(tiny_target_dir, dtype="float32", device="cpu")
    prefixes = [[{"role": "user", "content": q}] for q in ("Hello there", "What is 2 + 2?")]
    cut = hf_answer_fn(model, tok, 4)(prefixes)
    assert all(isinstance(a, Truncated) for a in cut)
    enc = tok.apply_chat_template(
        prefixes[0], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    first = int(model.generate(**enc, max_new_tokens=1, do_sample=False)[0, -1])
    tok.eos_token = tok.convert_ids_to_tokens(first)
    whole = hf_answer_fn(model, tok, 4)(prefixes[:1])
    assert not isinstance(whole[0], Truncated)


@pytest.mark.slow
def test_regenerate_file_records_the_counts_and_marks_truncated_turns(
    tiny_cfg, tiny_target_dir, tmp_path
):
    from eagle3.extract.regen import regenerate_file
    from tests.unit.test_extract import file_cfg, write_convs

    cfg = file_cfg(
        tiny_cfg,
        write_convs(tmp_path / "c.jsonl", 4),
        n=3,
        regenerate="hf",
        regenerate_max_new_tokens=5,
        regenerate_batch_size=2,
        # a random target's answers often decode to nothing: left out, not a stop
        regenerate_max_failed_share=1.0,
    )
    m = regenerate_file(cfg, tmp_path / "regen.jsonl", progress=False)
    r = m["regeneration"]
    lines = [json.loads(x) for x in (tmp_path / "regen.jsonl").read_text().splitlines()]
    # answers that decoded to nothing leave their conversation out, counted
    assert len(lines) == m["counts"]["conversations"] == 3 - m["counts"]["unanswered_left_out"]
    # one turn a conversation, each regenerated: the file holds one regenerated answer a line
    assert m["counts"]["regenerated_in_file"] == len(lines)
    assert r["conversations"]["input"] == 3 and r["turns"]["input"] == 3
    assert r["turns"]["empty"] == m["counts"]["unanswered_left_out"]
    assert all(x["messages"][-1]["content"].strip() for x in lines)
    assert (
        r["turns"]["succeeded"] + r["turns"]["failed"] + r["turns"]["skipped"]
        == r["turns"]["input"]
    )
    # 5 tokens never reach EOS here (an answer of special tokens only decodes to nothing)
    assert r["turns"]["truncated"] == r["turns"]["succeeded"] == 3 and r["turns"]["clean"] == 0
    assert {x["id"]: x["truncated_turns"] for x in lines if "truncated_turns" in x} == {
        k: v for k, v in r["truncated_turns"].items() if k in {x["id"] for x in lines}
    }
    assert len(r["truncated_turns"]) == r["conversations"]["truncated"]


def test_openai_answers_cut_by_the_length_limit_are_truncated(monkeypatch):
    import httpx

    from eagle3.extract.regen_answers import openai_answer_fn

    def reply(request):
        body = json.loads(request.content)
        q = body["messages"][-1]["content"]
        return httpx.Response(
            200,
            json={
                "choices": [
                    {
                        "message": {"content": f"to {q}"},
                        "finish_reason": "length" if q == "long" else "stop",
                    }
                ]
            },
        )

    real = httpx.AsyncClient
    monkeypatch.setattr(
        httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(reply), **kw)
    )
    got = openai_answer_fn("http://127.0.0.1:9/v1", "m", 8)(
        [[{"role": "user", "content": q}] for q in ("long", "short")]
    )
    assert got == ["to long", "to short"]
    assert isinstance(got[0], Truncated) and not isinstance(got[1], Truncated)


def _two_turns(path):
    """Three two-turn conversations (about rain, snow and wind) in ShareGPT form."""
    path.write_text("".join(json.dumps({"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"Question {i} about {w}"}, {"from": "gpt", "value": "Yes."},
        {"from": "human", "value": "And then?"}, {"from": "gpt", "value": "Then no."}]}) + "\n"
        for i, w in enumerate(["rain", "snow", "wind"])))
    return path


def test_a_file_whose_every_conversation_has_a_blank_answer_is_an_error_not_an_empty_file(
    tiny_cfg, tmp_path, monkeypatch
):
    import contextlib

    import eagle3.extract.regen as R
    from eagle3.errors import DataError
    from tests.unit.test_extract import file_cfg

    src = _two_turns(tmp_path / "c.jsonl")

    @contextlib.contextmanager
    def second_answers_blank(*_):  # every chunk has a non-blank answer, every conversation not
        yield lambda prefixes: ["  \u200b\n" if len(p) > 2 else "Fine." for p in prefixes]

    monkeypatch.setattr(R, "answer_source", second_answers_blank)
    cfg = file_cfg(tiny_cfg, src, n=3, regenerate="sglang", regenerate_max_failed_share=1.0)
    with pytest.raises(DataError, match=r"REGEN_NOTHING: regeneration: all 3 conversations "
                                        r"have a blank assistant turn, none is left to write"):
        R.regenerate_file(cfg, tmp_path / "regen.jsonl", progress=False)
    assert not (tmp_path / "regen.jsonl").exists()


@pytest.mark.parametrize("text, blank", [
    ("", True), (" \n", True), ("\u200b \u200b \u200b", True), ("\u200b\n\u200b", True),
    ("\u00ad", True), ("\u2063", True), ("\u3164", True), ("\ufe0f", True),
    ("a", False), (" x\u200b", False), ("日本", False), ("\U0001f44d", False),
])
def test_an_answer_is_blank_when_no_character_draws_anything(text, blank):
    from eagle3.extract.conversations import is_blank

    assert is_blank(text) is blank


def test_out_must_be_a_regular_file_in_a_writable_folder(tiny_cfg, tmp_path):
    import eagle3.extract.regen as R
    from eagle3.errors import ConfigError
    from tests.unit.test_extract import file_cfg, write_convs

    cfg = file_cfg(tiny_cfg, write_convs(tmp_path / "c.jsonl", 3), n=3, regenerate="hf")
    (tmp_path / "real.jsonl").write_text("")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "real.jsonl")
    for out, why in ((tmp_path, "a folder"), (tmp_path / "link.jsonl", "a symbolic link"),
                     (__import__("pathlib").Path("/dev/null"), "a device or other entry"),
                     (tmp_path / "real.jsonl" / "x.jsonl", "a path under .*, which is a file")):
        with pytest.raises(ConfigError, match=f"--out .*: expected a regular file to write, "
                                              f"got {why}"):
            R.regenerate_file(cfg, out, progress=False)
    assert (tmp_path / "link.jsonl").is_symlink()


def test_conversations_sharing_an_id_are_refused_before_any_answer(tiny_cfg, tmp_path):
    import eagle3.extract.regen as R
    from eagle3.errors import DataError
    from tests.unit.test_extract import file_cfg, write_convs

    src = write_convs(tmp_path / "c.jsonl", 3)
    src.write_text(src.read_text() * 2)
    cfg = file_cfg(tiny_cfg, src, n=6, regenerate="hf")
    with pytest.raises(DataError, match=r"expected one conversation per id, got 3 ids more than "
                                        r"once \(e.g. \[.*\]\); give each"):
        R.regenerate_file(cfg, tmp_path / "regen.jsonl", progress=False)


def test_the_answers_in_the_file_leave_out_those_of_conversations_left_out(tiny_cfg, tmp_path,
                                                                           monkeypatch):
    import contextlib

    import eagle3.extract.regen as R
    from tests.unit.test_extract import file_cfg

    src = _two_turns(tmp_path / "c.jsonl")

    @contextlib.contextmanager
    def rain_blank_then(*_):  # the rain conversation's second answer is blank
        yield lambda prefixes: [" " if "rain" in p[0]["content"] and len(p) > 2 else "Fine."
                                for p in prefixes]

    monkeypatch.setattr(R, "answer_source", rain_blank_then)
    cfg = file_cfg(tiny_cfg, src, n=3, regenerate="sglang", regenerate_max_failed_share=1.0)
    c = R.regenerate_file(cfg, tmp_path / "regen.jsonl", progress=False)["counts"]
    assert (c["regenerated"], c["regenerated_in_file"], c["unanswered_left_out"]) == (5, 4, 1)
    assert c["conversations"] == 2 and c["answers"] == 4
