"""lab/vocab_reach.py: the vocabulary-only draft proposes the target's next token wherever the draft
vocabulary holds it, and its figures follow by hand."""

from __future__ import annotations

import pytest

from eagle3.measure.replay import Request


def test_the_vocabulary_only_draft_accepts_up_to_the_first_token_outside():
    from lab.vocab_reach import vocabulary_only

    # prompt [0]; continuation 1..9; token 6 cannot be proposed
    req = Request("r", "c", "s", 1, "r", [0], list(range(1, 10)))
    got = vocabulary_only([req], reach=set(range(10)) - {6}, num_steps=3, stops=set(),
                          max_new_tokens=9)
    # passes: t=0 proposes 2,3,4 -> 3; t=4 proposes 6 (outside) -> 0; t=5 proposes 7,8,9 -> 3
    assert got["acceptance_length"] == pytest.approx(1 + 6 / 3)
    assert got["out_of_draft_vocab_share"] == pytest.approx(1 / 9)
    # every position t=0..7 accepts 3, 3, 2 (4,5 then 6), 1, 0, 3, 2 (the end), 1
    assert got["acceptance_length_all_positions"] == pytest.approx(23 / 8)
    # a token outside that a pass's bonus covers costs nothing: 5 is emitted by the target
    got = vocabulary_only([req], reach=set(range(10)) - {5}, num_steps=3, stops=set(),
                          max_new_tokens=9)
    assert got["acceptance_length"] == pytest.approx(4.0)
