"""Repetition in answers (eagle3.extract.repetition): the n-gram flags by hand, the summary's
buckets and looping count, the regenerated turns it reads, and the warning it logs."""

from __future__ import annotations

import logging

import pytest

from eagle3.extract.conversations import Conversation
from eagle3.extract.repetition import (regenerated_answers, repeated_flags, repetition_summary,
                                       log_repetition)


def test_a_token_repeats_when_its_ngram_occurred_earlier():
    #          0  1  2  3  4  5  6  7
    ids = [1, 2, 3, 1, 2, 3, 1, 2]
    assert repeated_flags(ids, 3) == [False, False, False, False, False, True, True, True]
    assert repeated_flags(ids, 1) == [False, False, False, True, True, True, True, True]
    assert repeated_flags([5] * 4, 2) == [False, False, True, True]
    assert repeated_flags([], 9) == []
    with pytest.raises(ValueError, match="n: expected >= 1, got 0"):
        repeated_flags(ids, 0)


def test_the_summary_counts_by_position_and_names_looping_answers():
    loop = [7, 8] * 150  # 300 tokens: from the fourth on, every 2-gram repeats
    fresh = list(range(100))
    s = repetition_summary([loop, fresh, []], n=2)
    assert s["answers"] == 3 and s["tokens"] == 400 and s["ngram"] == 2
    assert s["repeated_share"] == round(297 / 400, 4)
    assert s["looping_answers"] == 1
    first, middle, rest = s["by_position"]
    assert (first["from"], first["to"], first["tokens"]) == (0, 64, 128)
    assert first["repeated_share"] == round(61 / 128, 4)
    assert (middle["tokens"], middle["repeated_share"]) == (192 + 36, round(192 / 228, 4))
    assert (rest["from"], rest["to"], rest["tokens"], rest["repeated_share"]) == (256, None, 44,
                                                                                  1.0)
    empty = repetition_summary([])
    assert empty["repeated_share"] is None and empty["by_position"][0]["repeated_share"] is None


class _Tok:
    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[ord(ch) for ch in t] for t in texts]}


def test_only_the_regenerated_turns_are_read():
    conv = Conversation("a", [{"role": "user", "content": "q"},
                              {"role": "assistant", "content": "xy"},
                              {"role": "user", "content": "q2"},
                              {"role": "assistant", "content": "kept"}])
    assert regenerated_answers(_Tok(), [conv], {"a": [2]}) == [[ord("x"), ord("y")]]
    assert regenerated_answers(_Tok(), [conv], {"a": [1, 2]}) == []
    assert regenerated_answers(_Tok(), [Conversation("t", None, "plain text")], {}) == []


def test_a_loud_share_is_a_warning_naming_the_file_and_the_positions(caplog):
    s = repetition_summary([[7, 8] * 150])
    with caplog.at_level(logging.INFO, logger="eagle3.extract.repetition"):
        log_repetition(s, "r.jsonl")
        log_repetition(repetition_summary([list(range(50))]), "fresh.jsonl")
        log_repetition(repetition_summary([]), "none.jsonl")
    loud, quiet = caplog.records
    assert loud.levelno == logging.WARNING and quiet.levelno == logging.INFO
    assert "97% of the 300 tokens of 1 answers in r.jsonl repeat an earlier 9-gram" in loud.message
    assert "tokens 0-63: 84%, tokens 64-255: 100%, tokens 256-: 100%" in loud.message
    assert "1 answers loop" in loud.message and "fresh.jsonl" in quiet.message
