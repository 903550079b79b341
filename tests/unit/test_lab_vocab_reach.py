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


@pytest.mark.parametrize("args, message", [
    (["--sizes", "abc"], "--sizes: expected integers separated by commas"),
    (["--sizes", "0,8"], "--sizes: expected draft vocabulary sizes >= 2"),
    (["--draft", "x"], "--draft: expected NAME=SGLang serving folder, got 'x'"),
    (["--draft", "=/tmp"], "--draft: expected NAME=SGLang serving folder"),
    (["--conversations", "-3"], "--conversations: expected an integer >= 1, got -3"),
    (["--num-steps", "0"], "--num-steps: expected an integer >= 1"),
    (["--out", "/no/such/folder/x.json"], "a missing folder /no/such/folder"),
    (["--out", "/tmp"], "expected a file path in an existing folder, got a folder"),
])
def test_bad_arguments_are_refused_before_anything_loads(args, message, capsys):
    from lab.vocab_reach import main

    argv = ["--out", "/tmp/vocab-reach-test.json", *args]
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == 2 and message in capsys.readouterr().err


def test_an_unknown_prompt_set_is_named_before_the_target_loads(capsys, monkeypatch):
    import eagle3.assets
    from lab.vocab_reach import main

    monkeypatch.setattr(eagle3.assets, "resolve_target", lambda cfg: pytest.fail("loaded"))
    assert main(["--sets", "zzbogus", "--out", "/tmp/vocab-reach-test.json"]) == 2
    assert "zzbogus" in capsys.readouterr().err
