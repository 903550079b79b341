"""Loss masks never supervise text the chat template injects (a Qwen3-style empty reasoning block
after the assistant header), and conversations dropped because a template is not prefix-stable are
counted, shared out, recorded and refused above data.max_unstable_template_share. A tiny
character-level tokenizer and a Qwen3-like template are built here."""

from __future__ import annotations

import json
import logging
import string

import pytest

from eagle3.config import load_config
from eagle3.errors import DataError
from eagle3.extract.conversations import Conversation, TemplateUnstable, tokenize_conversation
from eagle3.extract.plan import UNSTABLE, build_plan
from eagle3.extract.stage import warn_unstable

SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# Qwen3's rule, reduced: an assistant turn after the last user turn that is the last message gets
# an empty reasoning block; the generation prompt carries it only with enable_thinking false.
QWEN3_LIKE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if loop.index0 > ns.last_query and loop.last %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{{- m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
CHATML = QWEN3_LIKE.replace(
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{{- m.content", "{%- endif %}{{- m.content"
)


def _tokenizer(template: str):
    """A fast tokenizer with one token per character and the ChatML/think specials."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable))
    vocab = {c: i for i, c in enumerate(["[UNK]", *chars])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="<|im_end|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    tok.chat_template = template
    return tok


def _supervised(tok, sample) -> list[str]:
    """The supervised text, one string per run of masked tokens."""
    runs, cur = [], []
    for t, m in zip(tok.convert_ids_to_tokens(sample.input_ids), sample.loss_mask):
        if m:
            cur.append(t)
        elif cur:
            runs, cur = runs + ["".join(cur)], []
    return runs + (["".join(cur)] if cur else [])


TURN = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]
MULTI = TURN + [{"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Green."}]


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": True}, {"enable_thinking": False}])
def test_injected_empty_think_block_is_not_supervised(kwargs):
    tok = _tokenizer(QWEN3_LIKE)
    text = tok.apply_chat_template(TURN, tokenize=False, **kwargs)
    assert "<|im_start|>assistant\n<think>\n\n</think>\n\nBlue.<|im_end|>" in text  # injected
    s = tokenize_conversation(tok, Conversation("c", TURN), 512, kwargs)
    assert _supervised(tok, s) == ["Blue.<|im_end|>"]
    think = set(tok.convert_tokens_to_ids(["<think>", "</think>"]))
    assert not [i for i, m in zip(s.input_ids, s.loss_mask) if m and i in think]


def test_template_without_boilerplate_keeps_its_mask():
    tok = _tokenizer(CHATML)
    s = tokenize_conversation(tok, Conversation("c", MULTI), 512)
    assert _supervised(tok, s) == ["Blue.<|im_end|>", "Green.<|im_end|>"]


def test_reasoning_the_assistant_wrote_stays_supervised():
    tok = _tokenizer(CHATML)
    own = "<think>\nsky</think>\n\nBlue."
    s = tokenize_conversation(
        tok, Conversation("c", [TURN[0], {"role": "assistant", "content": own}]), 512
    )
    assert _supervised(tok, s) == [own + "<|im_end|>"]


def test_multi_turn_on_an_unstable_template_is_a_named_error():
    tok = _tokenizer(QWEN3_LIKE)
    with pytest.raises(TemplateUnstable, match="not prefix-stable at message 1"):
        tokenize_conversation(tok, Conversation("c", MULTI), 512)


def _plan(tmp_path, monkeypatch, n_multi: int, n_single: int, *overrides: str):
    path = tmp_path / "convs.jsonl"
    rows = [{"id": f"m{i}", "messages": MULTI} for i in range(n_multi)]
    rows += [{"id": f"s{i}", "messages": TURN} for i in range(n_single)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(
        None,
        [
            "data.source=file",
            f"data.path={path}",
            f"data.num_conversations={n_multi + n_single}",
            *overrides,
        ],
    )
    return build_plan(cfg, _tokenizer(QWEN3_LIKE)), path


def test_unstable_drop_is_counted_with_its_shares(tmp_path, monkeypatch, caplog):
    plan, path = _plan(tmp_path, monkeypatch, 1, 39)
    u = plan.unstable
    assert plan.skipped[UNSTABLE] == 1 and len(plan.ids) == 39
    tok = _tokenizer(QWEN3_LIKE)
    multi_tokens = len(tok(tok.apply_chat_template(MULTI, tokenize=False))["input_ids"])
    assert (u["conversations"], u["tried"], u["tokens"]) == (1, 40, multi_tokens)
    assert u["share_conversations"] == pytest.approx(1 / 40)
    assert u["share_tokens"] == pytest.approx(multi_tokens / u["tried_tokens"])
    assert u["share_tokens"] > u["share_conversations"] and u["threshold"] == 0.05
    with caplog.at_level(logging.WARNING, logger="eagle3.extract.stage"):
        warn_unstable(u, str(path))
    assert "1 of 40 conversations (2.5%)" in caplog.text
    assert "data.max_unstable_template_share=0.05" in caplog.text


def test_unstable_drop_above_the_threshold_is_refused(tmp_path, monkeypatch):
    with pytest.raises(
        DataError,
        match=r"^TEMPLATE_UNSTABLE: .*convs.jsonl: 3 of 10 conversations "
        r"\(30.0%\).*data.max_unstable_template_share=0.05",
    ):
        _plan(tmp_path, monkeypatch, 3, 7)
    plan, _ = _plan(tmp_path, monkeypatch, 3, 7, "data.max_unstable_template_share=0.5")
    assert plan.unstable["conversations"] == 3 and len(plan.ids) == 7


def test_stable_data_records_no_drop(tmp_path, monkeypatch, caplog):
    plan, path = _plan(tmp_path, monkeypatch, 0, 5)
    assert plan.unstable["conversations"] == 0 and UNSTABLE not in plan.skipped
    with caplog.at_level(logging.WARNING, logger="eagle3.extract.stage"):
        warn_unstable(plan.unstable, str(path))
    assert caplog.text == ""


def test_extract_task_records_the_drop_as_mlflow_metrics_and_tag(tmp_path, monkeypatch):
    from contextlib import contextmanager

    import tasks.extract as task

    logged: dict = {"metrics": {}, "tags": {}}

    class Run:
        run_id = "r"

        def log_manifest(self, _d): ...

        def log_dataset(self, _d, _c): ...

        def log_metrics(self, m, step=0):
            logged["metrics"].update(m)

        def set_tags(self, t):
            logged["tags"].update(t)

    @contextmanager
    def stage_run(*_a, **_k):
        yield Run()

    unstable = {
        "conversations": 3,
        "tokens": 300,
        "share_conversations": 0.03,
        "share_tokens": 0.06,
        "tried": 100,
        "tried_tokens": 5000,
        "threshold": 0.1,
    }
    monkeypatch.setattr(task.tracking, "stage_run", stage_run)
    monkeypatch.setattr(
        task,
        "extract_superseding",
        lambda cfg, out: {"content_hash": "h", "counts": {}, "template_unstable": unstable},
    )
    task.extract_task.fn(load_config(None, []), tmp_path, "parent")
    assert logged["metrics"]["template_unstable.conversations"] == 3.0
    assert logged["metrics"]["template_unstable.share_tokens"] == 0.06
    assert logged["tags"]["eagle3.template_unstable"] == (
        "3 of 100 conversations, 6.0% of tokens dropped"
    )
