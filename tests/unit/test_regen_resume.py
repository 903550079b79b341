"""Resumable regeneration (eagle3.extract.regen.regenerate_resumable): finished chunks are saved as
they end, a run stopped mid-way goes on from the last finished chunk with the same conversations
and counts as an uninterrupted run, a line cut short by a kill is redone, and a progress file of
another selection is refused."""

from __future__ import annotations

import json

import pytest

import eagle3.extract.regen as R
from eagle3.errors import DataError
from eagle3.extract.conversations import Conversation


def _conv(cid: str, *turns: str) -> Conversation:
    msgs = []
    for n, t in enumerate(turns):
        msgs += [
            {"role": "user", "content": f"{cid}-q{n + 1}"},
            {"role": "assistant", "content": t},
        ]
    return Conversation(cid, msgs)


CONVS = [
    _conv("A", "a1", "a2"),
    _conv("B", "b1"),
    _conv("C", "c1", "c2", "c3"),
    _conv("D", "d1"),
    _conv("E", "e1", "e2"),
]


class Answers:
    """Answers naming the question and the context seen; ``B-q1`` is truncated and ``C-q2``
    failed (so the counts have every kind); raises once ``stop_at`` is asked (a kill)."""

    def __init__(self, stop_at: str | None = None):
        self.asked: list[str] = []
        self.stop_at = stop_at

    def __call__(self, prefixes):
        out = []
        for p in prefixes:
            q = p[-1]["content"]
            if q == self.stop_at:
                raise KeyboardInterrupt(q)
            self.asked.append(q)
            seen = "|".join(m["content"] for m in p if m["role"] == "assistant")
            out.append(
                {"B-q1": R.Truncated("cut"), "C-q2": R.Failed("HTTP 500")}.get(
                    q, f"new {q} after [{seen}]"
                )
            )
        return out


def _plain(convs):
    return [(c.id, c.messages, c.text) for c in convs]


def test_a_stopped_run_goes_on_from_its_last_finished_chunk(monkeypatch, tmp_path):
    monkeypatch.setattr(R, "RESUME_CHUNK", 2)
    progress = tmp_path / "regenerated-x.chunks.jsonl"
    first = Answers(stop_at="E-q1")  # chunks (A, B) and (C, D) finish; chunk (E) is cut
    with pytest.raises(KeyboardInterrupt):
        R.regenerate_resumable(CONVS, lambda: first, 2, None, progress)
    assert len(progress.read_text().splitlines()) == 2
    second = Answers()
    out, counts = R.regenerate_resumable(CONVS, lambda: second, 2, None, progress)
    assert second.asked == ["E-q1", "E-q2"]  # only the unfinished chunk
    whole_answers = Answers()
    whole, whole_counts = R.regenerate_counted(CONVS, whole_answers, 2)
    assert _plain(out) == _plain(whole)
    assert counts.pop("this_call") == {"chunks": 1, "turns": 2}  # the earlier chunks were read
    assert counts == whole_counts
    assert counts["turns"]["input"] == 9 and counts["turns"]["truncated"] == 1
    assert counts["turns"]["failed"] == 1 and counts["truncated_turns"] == {"B": [1]}


def test_every_chunk_done_loads_no_target_and_the_bar_counts_the_saved_answers(
    monkeypatch, tmp_path
):
    monkeypatch.setattr(R, "RESUME_CHUNK", 2)
    progress = tmp_path / "p.chunks.jsonl"
    R.regenerate_resumable(CONVS, Answers, 2, None, progress)

    def no_target():
        raise AssertionError("the answer function was built with nothing left to do")

    seen = []
    out, counts = R.regenerate_resumable(CONVS, no_target, 2, None, progress, seen.append)
    assert [c.id for c in out] == ["A", "B", "C", "D", "E"]
    assert sum(seen) == counts["turns"]["input"] == 9


def test_a_line_cut_short_by_a_kill_is_redone(monkeypatch, tmp_path):
    monkeypatch.setattr(R, "RESUME_CHUNK", 2)
    progress = tmp_path / "p.chunks.jsonl"
    R.regenerate_resumable(CONVS, Answers, 2, None, progress)
    lines = progress.read_text().splitlines()
    progress.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])
    again = Answers()
    out, _ = R.regenerate_resumable(CONVS, lambda: again, 2, None, progress)
    assert again.asked == ["C-q1", "D-q1", "C-q2", "C-q3", "E-q1", "E-q2"]
    assert [c.id for c in out] == ["A", "B", "C", "D", "E"]
    assert [json.loads(x)["ids"] for x in progress.read_text().splitlines()] == [
        ["A", "B"],
        ["C", "D"],
        ["E"],
    ]


def test_a_progress_file_of_other_conversations_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(R, "RESUME_CHUNK", 2)
    progress = tmp_path / "p.chunks.jsonl"
    R.regenerate_resumable(CONVS, Answers, 2, None, progress)
    with pytest.raises(
        DataError,
        match=r"REGEN_PROGRESS_MISMATCH: .*p.chunks.jsonl line 1: "
        r"expected the conversations of chunk 0",
    ):
        R.regenerate_resumable(CONVS[1:], Answers, 2, None, progress)
    progress.write_text("not json\n" + progress.read_text())
    with pytest.raises(DataError, match="line 1: expected a JSON chunk record"):
        R.regenerate_resumable(CONVS, Answers, 2, None, progress)


def test_chunks_file_sits_beside_the_regenerated_file(tmp_path):
    assert R.chunks_path(tmp_path / "regenerated-ab.jsonl").name == "regenerated-ab.chunks.jsonl"
    assert R.chunks_path(tmp_path / "regen.jsonl.xz").name == "regen.jsonl.xz.chunks.jsonl"


def test_a_resume_with_other_settings_is_refused_naming_them(monkeypatch, tmp_path):
    monkeypatch.setattr(R, "RESUME_CHUNK", 2)
    progress = tmp_path / "regenerated-x.chunks.jsonl"
    with pytest.raises(KeyboardInterrupt):
        R.regenerate_resumable(CONVS, lambda: Answers(stop_at="E-q1"), 2, None, progress,
                               settings={"mode": "hf", "max_new_tokens": 8})
    with pytest.raises(DataError, match=r"REGEN_PROGRESS_MISMATCH: .* line 1: .*other settings "
                       r".*'max_new_tokens': \(8, 16\)"):
        R.regenerate_resumable(CONVS, Answers, 2, None, progress,
                               settings={"mode": "hf", "max_new_tokens": 16})
    out, _ = R.regenerate_resumable(CONVS, Answers, 2, None, progress,
                                    settings={"mode": "hf", "max_new_tokens": 8})
    assert len(out) == len(CONVS)


def test_a_chunk_with_too_many_failed_turns_stops_unsaved_and_is_asked_again(monkeypatch,
                                                                            tmp_path):
    monkeypatch.setattr(R, "RESUME_CHUNK", 2)
    progress = tmp_path / "regenerated-x.chunks.jsonl"
    # chunk 2 (C, D) holds the failed turn C-q2: 1 of 4 turns > 0.2 of them
    with pytest.raises(DataError, match=r"REGEN_FAILED: .*1 of 4 assistant turns of chunk 2 "
                       r"failed \(1, e.g. \[.*C turn 2: HTTP 500.*\]\) or came back blank \(0\), "
                       r"above data.regenerate_max_failed_share=0.2"):
        R.regenerate_resumable(CONVS, Answers, 2, None, progress, max_failed_share=0.2)
    assert len(progress.read_text().splitlines()) == 1  # chunk 1 kept, chunk 2 not saved
    again = Answers()
    _, counts = R.regenerate_resumable(CONVS, lambda: again, 2, None, progress,
                                       max_failed_share=0.5)
    assert "C-q1" in again.asked and "A-q1" not in again.asked
    assert counts["turns"]["failed"] == 1 and counts["kept_turns"] == {"C": [2]}


def test_blank_answers_count_toward_the_failed_share_and_a_stop_saves_nothing(monkeypatch,
                                                                              tmp_path):
    monkeypatch.setattr(R, "RESUME_CHUNK", 2)
    progress = tmp_path / "regenerated-x.chunks.jsonl"

    class Blank(Answers):  # D-q1 answers zero-width characters only: shows nothing
        def __call__(self, prefixes):
            return ["\u200b \ufeff" if p[-1]["content"] == "D-q1" else a
                    for p, a in zip(prefixes, super().__call__(prefixes))]

    with pytest.raises(DataError, match=r"REGEN_FAILED: .*2 of 4 assistant turns of chunk 2 "
                       r"failed \(1, .*\) or came back blank \(1\), above "
                       r"data.regenerate_max_failed_share=0.3"):
        R.regenerate_resumable(CONVS, Blank, 2, None, progress, max_failed_share=0.3)
    assert len(progress.read_text().splitlines()) == 1
    _, counts = R.regenerate_resumable(CONVS, Blank, 2, None, progress, max_failed_share=0.5)
    assert counts["turns"]["empty"] == 1 and counts["turns"]["failed"] == 1


def _blank_first(x):
    x["records"][0]["messages"][1]["content"] = "\u200b"


@pytest.mark.parametrize("damage, why", [
    (lambda x: x.pop("raw"), "a chunk record with 'raw' tallies"),
    (lambda x: x.pop("records"), "a chunk record with 'raw' tallies"),
    (lambda x: x["raw"].update(empty="1"), "a chunk record with 'raw' tallies"),
    (lambda x: x["raw"].update(outcomes=None), "a chunk record with 'raw' tallies"),
    (lambda x: x.update(records=x["records"][:1]), "2 records and outcome lists, one per id"),
    (lambda x: x["records"][1].update(id="zz"), "2 records and outcome lists, one per id"),
    (lambda x: x["raw"]["outcomes"][0].append("succeeded"), "outcomes of .* for the assistant"),
    (lambda x: x["raw"]["outcomes"][0].__setitem__(0, "fine"), "outcomes of .* for the assistant"),
    (_blank_first, "'empty' to count the 1 blank answers its records hold, got 0"),
])
def test_a_progress_line_that_does_not_add_up_is_refused_by_line(monkeypatch, tmp_path, damage,
                                                                   why):
    monkeypatch.setattr(R, "RESUME_CHUNK", 2)
    progress = tmp_path / "regenerated-x.chunks.jsonl"
    R.regenerate_resumable(CONVS, Answers, 2, None, progress)
    lines = progress.read_text().splitlines()
    first = json.loads(lines[0])
    damage(first)
    progress.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(DataError, match=r"REGEN_PROGRESS_MISMATCH: .*line 1: expected " + why):
        R.regenerate_resumable(CONVS, Answers, 2, None, progress)


def test_nothing_regenerated_is_an_error_not_a_file(tmp_path):
    with pytest.raises(DataError, match=r"REGEN_NOTHING: .*none of 9 assistant turns .*"
                       r"skipped 9: \{'prompt_too_long': 9\}"):
        R.regenerate_resumable(CONVS, lambda: (lambda ps: [None] * len(ps)), 2, None,
                               tmp_path / "p.chunks.jsonl")


def test_a_turn_with_no_user_message_before_it_is_skipped_not_sent():
    conv = Conversation("s", [{"role": "assistant", "content": "hello first"},
                              {"role": "user", "content": "q"},
                              {"role": "assistant", "content": "old"}])
    asked = []
    out, counts = R.regenerate_counted(
        [conv], lambda ps: asked.extend(ps) or ["new"] * len(ps), 4)
    assert [m["content"] for m in out[0].messages] == ["hello first", "q", "new"]
    assert len(asked) == 1 and counts["skipped_by_reason"] == {"no_user_turn_before": 1}
    assert counts["kept_turns"] == {"s": [1]} and counts["turns"]["skipped"] == 1


def test_a_chunk_with_no_answer_is_never_saved_even_when_failures_are_allowed(tmp_path):
    from eagle3.extract.regen_answers import Failed

    progress = tmp_path / "p.chunks.jsonl"
    refused = lambda: (lambda ps: [Failed("HTTP 400: no") for _ in ps])  # noqa: E731
    with pytest.raises(DataError, match=r"REGEN_NOTHING: .*chunk 1 got no non-empty answer "
                                        r".*not saved"):
        R.regenerate_resumable(CONVS, refused, 2, None, progress, max_failed_share=1.0)
    assert not progress.exists()
    again = Answers()
    out, counts = R.regenerate_resumable(CONVS, lambda: again, 2, None, progress,
                                         max_failed_share=1.0)
    assert again.asked and counts["turns"]["succeeded"] >= 1


def test_a_resume_against_a_server_now_serving_another_model_is_refused(monkeypatch, tiny_cfg,
                                                                        tmp_path):
    import eagle3.extract.regen_answers as RA

    cfg = tiny_cfg.model_copy(update={"data": tiny_cfg.data.model_copy(
        update={"regenerate": "openai", "regenerate_url": "http://127.0.0.1:9/v1"})})
    monkeypatch.setattr(RA, "served_model", lambda mode, url, timeout_s=30.0: "model-A")
    monkeypatch.setattr(R, "served_model", RA.served_model)
    monkeypatch.setattr(R, "RESUME_CHUNK", 2)
    progress = tmp_path / "p.chunks.jsonl"
    with pytest.raises(KeyboardInterrupt):
        R.regenerate_resumable(CONVS, lambda: Answers(stop_at="E-q1"), 2, None, progress,
                               settings=R.answer_settings(cfg, tmp_path))
    monkeypatch.setattr(R, "served_model", lambda mode, url, timeout_s=30.0: "model-B")
    with pytest.raises(DataError, match=r"'served_model': \('model-A', 'model-B'\)"):
        R.regenerate_resumable(CONVS, Answers, 2, None, progress,
                               settings=R.answer_settings(cfg, tmp_path))
