"""Conversation readers, chat templating and assistant-only loss masks
(eagle3.extract.conversations) on real tokenizers."""

from __future__ import annotations

import json

import pytest

from eagle3.extract.conversations import (
    Conversation,
    assistant_char_spans,
    has_generation_markers,
    read_conversations,
    template_hash,
    template_switches,
    tokenize_conversation,
)
from eagle3.errors import DataError

CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another?"},
    {"role": "assistant", "content": "Green, or red.  \n"},
]

LLAMA3_TEMPLATE = (
    "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
CHATML_GENERATION_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}"
    "{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
THINKING_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)


@pytest.fixture
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def _segments(tok, sample) -> list[str]:
    """Decoded text of each run of consecutive loss-masked tokens."""
    segs, cur = [], []
    for t, m in zip(sample.input_ids + [None], sample.loss_mask + [0]):
        if m:
            cur.append(t)
        elif cur:
            segs.append(tok.decode(cur))
            cur = []
    return segs


# ------------------------------------------------------------------------------------------------
# readers


def test_reads_sharegpt_jsonl_and_counts_bad_lines(tmp_path):
    p = tmp_path / "c.jsonl"
    lines = [
        json.dumps(
            {
                "id": "a",
                "conversations": [
                    {"from": "human", "value": "hi"},
                    {"from": "gpt", "value": "hello"},
                ],
            }
        ),
        "{not json",
        json.dumps({"id": "b", "conversations": [{"from": "human", "value": "only a question"}]}),
        json.dumps(
            {
                "id": "c",
                "conversations": [{"from": "alien", "value": "x"}, {"from": "gpt", "value": "y"}],
            }
        ),
        "",
        json.dumps(
            {
                "id": "d",
                "conversations": [
                    {"from": "system", "value": "s"},
                    {"from": "human", "value": "q"},
                    {"from": "gpt", "value": "r"},
                ],
            }
        ),
    ]
    p.write_text("\n".join(lines) + "\n")
    convs, stats = read_conversations(p)
    assert [c.id for c in convs] == ["a", "d"]
    assert convs[1].messages[0] == {"role": "system", "content": "s"}
    assert stats.records == 5 and stats.usable == 2 and sum(stats.skipped.values()) == 3
    assert stats.skipped["malformed_json_line"] == 1 and stats.skipped["no_assistant_turn"] == 1
    assert stats.skipped["unknown_role ('alien')"] == 1
    assert "c.jsonl:2: malformed_json_line" in stats.examples


def test_reads_openai_messages_json_array_and_wrapped_object(tmp_path):
    recs = [
        {"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]},
        {
            "id": "x",
            "conversations": [
                {"role": "user", "content": "q2"},
                {"role": "assistant", "content": "a2"},
            ],
        },
        {
            "messages": [
                {"role": "user", "content": [{"type": "image"}]},
                {"role": "assistant", "content": "?"},
            ]
        },
    ]
    p = tmp_path / "c.json"
    p.write_text(json.dumps(recs))
    convs, stats = read_conversations(p)
    assert [c.messages[1]["content"] for c in convs] == ["a1", "a2"]
    assert convs[1].id == "x" and stats.skipped["non_text_content"] == 1
    q = tmp_path / "w.json"
    q.write_text(json.dumps({"version": 1, "data": recs[:2]}))
    assert len(read_conversations(q)[0]) == 2


def test_reads_plain_text_documents(tmp_path, tok):
    p = tmp_path / "t.txt"
    p.write_text("First document.\nStill first.\n\n\nSecond document.\n")
    convs, _ = read_conversations(p)
    assert [c.text for c in convs] == ["First document.\nStill first.", "Second document."]
    s = tokenize_conversation(tok, convs[1], 64)
    assert s.loss_mask == [1] * len(s.input_ids) and tok.decode(s.input_ids) == "Second document."


@pytest.mark.parametrize(
    "content, match",
    [
        ("", "empty file"),
        ("  \n", "empty file"),
        ("[1, 2", "not valid JSON"),
        ('{"conversations": [{"from": "human", "value": "q"}]}\n', "no usable conversation"),
    ],
)
def test_bad_files_raise_data_error(tmp_path, content, match):
    p = tmp_path / ("bad.json" if content.startswith("[") else "bad.jsonl")
    p.write_text(content)
    with pytest.raises(DataError, match=match):
        read_conversations(p)
    with pytest.raises(DataError, match="not found"):
        read_conversations(tmp_path / "missing.jsonl")


def test_a_bom_is_dropped_and_jsonl_starting_with_a_bracket_is_read_by_line(tmp_path):
    conv = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
    p = tmp_path / "bom.jsonl"
    p.write_text("\ufeff" + "\n".join(json.dumps(conv) for _ in range(3)), encoding="utf-8")
    convs, stats = read_conversations(p)
    assert len(convs) == 3 and not stats.skipped
    (tmp_path / "bom.json").write_text("\ufeff" + json.dumps([conv, conv]), encoding="utf-8")
    assert len(read_conversations(tmp_path / "bom.json")[0]) == 2
    # lines that are JSON arrays: records that are not objects, not "expected an array"
    p.write_text('[{"role": "user", "content": "q"}]\n[{"role": "user", "content": "r"}]\n')
    with pytest.raises(DataError, match=r"no usable conversation among 2 records .*"
                                        r"record_not_an_object \(list\)"):
        read_conversations(p)
    (tmp_path / "cut.json").write_text("[1, 2")  # a .json file stays one document
    with pytest.raises(DataError, match="not valid JSON"):
        read_conversations(tmp_path / "cut.json")


# ----------------------------------------------------------------------------------------------
# loss masks


def test_chatml_mask_covers_exactly_assistant_turns(tok):
    assert not has_generation_markers(tok)
    s = tokenize_conversation(tok, Conversation("c", CONV), 512)
    assert len(s.input_ids) == len(s.loss_mask) and not s.truncated
    assert (
        s.input_ids == tok.apply_chat_template(CONV, tokenize=True, return_dict=True)["input_ids"]
    )
    assert _segments(tok, s) == ["Blue.<|im_end|>", "Green, or red.  \n<|im_end|>"]


def test_llama3_style_template_mask(tok):
    tok.add_tokens(["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], special_tokens=True)
    tok.chat_template = LLAMA3_TEMPLATE
    s = tokenize_conversation(tok, Conversation("c", CONV), 512)
    text = tok.decode(s.input_ids)
    assert text.startswith(tok.bos_token + "<|start_header_id|>system")
    assert _segments(tok, s) == [
        "Blue.<|eot_id|>",
        "Green, or red.<|eot_id|>",
    ]  # template trims content


def test_generation_marker_template_agrees_with_prefix_diff(tok):
    plain = tokenize_conversation(tok, Conversation("c", CONV), 512)
    tok.chat_template = CHATML_GENERATION_TEMPLATE
    assert has_generation_markers(tok)
    marked = tokenize_conversation(
        tok, Conversation("c", CONV), 512
    )  # tokenizer's assistant_masks path
    tok.chat_template = CHATML_GENERATION_TEMPLATE.replace("{% generation %}", "").replace(
        "{% endgeneration %}", ""
    )
    diffed = tokenize_conversation(tok, Conversation("c", CONV), 512)
    assert marked.input_ids == diffed.input_ids
    assert marked.loss_mask == diffed.loss_mask
    assert sum(marked.loss_mask) > 0
    # the same as the built-in template, whose system prompt differs only when there is no system
    # turn
    assert marked.loss_mask == plain.loss_mask


def test_truncation_is_flagged_and_cut(tok):
    s = tokenize_conversation(tok, Conversation("c", CONV), 20)
    assert s.truncated and len(s.input_ids) == 20 == len(s.loss_mask)


def test_not_prefix_stable_template_is_a_clear_error(tok):
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] + ':' + m['content'] + ('|' if loop.last else ';') }}"
        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )
    with pytest.raises(DataError, match="not prefix-stable at message 2"):
        assistant_char_spans(tok, CONV)


def test_template_hash_and_switches(tok):
    h0 = template_hash(tok)
    assert template_switches(tok) == {}
    tok.chat_template = THINKING_TEMPLATE
    assert template_hash(tok) != h0 and len(h0) == 64
    assert template_switches(tok) == {"enable_thinking": None}
    assert template_switches(tok, {"enable_thinking": False}) == {"enable_thinking": False}
    msgs = CONV[1:3]
    on = tokenize_conversation(tok, Conversation("c", msgs), 512)
    off = tokenize_conversation(tok, Conversation("c", msgs), 512, {"enable_thinking": False})
    assert on.input_ids == off.input_ids  # the switch only changes the generation prompt
    assert _segments(tok, on) == _segments(tok, off) == ["Blue.<|im_end|>"]
    assert "<think>" in tok.apply_chat_template(
        msgs[:1], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
