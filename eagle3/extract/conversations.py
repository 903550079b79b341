"""Conversation readers, chat templating with the target's tokenizer, and assistant-only loss masks.

Readers (:func:`read_conversations`) accept ShareGPT records ``{"id", "conversations": [{"from":
"human"|"gpt"|"system", "value": str}]}`` and OpenAI-style records ``{"messages" | "conversations":
[{"role": "user"|"assistant"|"system", "content": str}]}`` in JSONL or JSON (an array, or an object
holding one list), or ``.txt``: blank-line-separated documents, trained on in full (no template).
Unusable records are skipped and counted by reason in :class:`ReadStats`; an empty or entirely
unusable file is a :class:`~eagle3.errors.DataError`.

Loss mask (:func:`tokenize_conversation`): 1 on the assistant's content and end-of-turn token.
``{% generation %}`` templates use ``return_assistant_tokens_mask``; others are rendered prefix by
prefix and the assistant's character span mapped to tokens through offsets. Template text between
the assistant header and the content (e.g. Qwen3's empty ``<think>\n\n</think>\n\n``) and
whitespace after the end-of-turn marker are never trained on (the draft would learn the template).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from eagle3.errors import DataError

ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
            "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
            "system": "system"}
# Variables every chat template may read; anything else it reads is a "template switch"
_STANDARD_TEMPLATE_VARS = {"messages", "add_generation_prompt", "bos_token", "eos_token",
                           "pad_token", "unk_token", "tools", "documents", "raise_exception",
                           "strftime_now", "range", "namespace", "loop", "date_string",
                           "custom_tools", "tools_in_user_message", "builtin_tools",
                           "continue_final_message"}


@dataclass
class Conversation:
    """One usable record: ``messages`` (role/content dicts) or plain ``text``."""

    id: str
    messages: list[dict] | None = None
    text: str | None = None


# Unicode categories that draw nothing by themselves: format characters (zero-width space, soft
# hyphen, invisible separators), controls, separators, combining and enclosing marks (a variation
# selector), private use and unassigned code points
INVISIBLE_CATEGORIES = frozenset({"Cf", "Cc", "Zs", "Zl", "Zp", "Mn", "Me", "Co", "Cn"})
FILLERS = frozenset("\u115f\u1160\u3164\uffa0")  # Hangul fillers: letters that draw nothing


def is_blank(text: str) -> bool:
    """Whether ``text`` shows nothing: every character whitespace, in
    :data:`INVISIBLE_CATEGORIES` (``unicodedata.category``) or a filler of :data:`FILLERS`."""
    import unicodedata

    return all(ch.isspace() or ch in FILLERS or unicodedata.category(ch) in INVISIBLE_CATEGORIES
               for ch in text)


def answered(convs: list[Conversation]) -> tuple[list[Conversation], int]:
    """``(convs less those with a blank assistant turn, how many were left out)``, applied after
    regeneration: a blank turn (:func:`is_blank`) is the placeholder of a prompt whose answer
    failed or was skipped (``data.source: instructions``), or an answer that decoded to nothing
    (cut before any text, or a server answering ""). Training on it would teach an end-of-turn the
    target did not give there. Text documents are kept."""
    kept = [c for c in convs if not any(m["role"] == "assistant" and is_blank(m["content"])
                                        for m in c.messages or [])]
    return kept, len(convs) - len(kept)


@dataclass
class ReadStats:
    """``records`` read, ``usable``, and ``skipped`` by reason (with a few examples)."""

    records: int = 0
    usable: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        if len(self.examples) < 10:
            self.examples.append(f"{where}: {reason}")


@dataclass
class TokenizedSample:
    """A templated conversation: ``input_ids`` and ``loss_mask`` (int lists of equal length)."""

    id: str
    input_ids: list[int]
    loss_mask: list[int]
    truncated: bool = False
    num_tokens: int = 0  # tokens before truncation to max_seq_len


def _normalise(rec, where: str, stats: ReadStats) -> Conversation | None:
    """Record → Conversation, or None (counted in ``stats``) when unusable."""
    if isinstance(rec, str):
        return Conversation(id=where, text=rec) if rec.strip() else stats.skip("empty_text", where)
    if not isinstance(rec, dict):
        return stats.skip(f"record_not_an_object ({type(rec).__name__})", where)
    turns = rec.get("conversations", rec.get("messages"))
    if turns is None and isinstance(rec.get("text"), str):
        return Conversation(id=str(rec.get("id", where)), text=rec["text"])
    if not isinstance(turns, list) or not turns:
        return stats.skip("no_conversation_list", where)
    messages = []
    for t in turns:
        if not isinstance(t, dict):
            return stats.skip("turn_not_an_object", where)
        role = t.get("role", t.get("from"))
        content = t.get("content", t.get("value"))
        if role not in ROLE_MAP:
            return stats.skip(f"unknown_role ({role!r})", where)
        if not isinstance(content, str):
            return stats.skip("non_text_content", where)
        messages.append({"role": ROLE_MAP[role], "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        return stats.skip("no_assistant_turn", where)
    return Conversation(id=str(rec.get("id", where)), messages=messages)


def _iter_records(path: Path, stats: ReadStats) -> Iterator[tuple[object, str]]:
    text = path.read_text(encoding="utf-8-sig", errors="replace")  # a leading BOM dropped
    if not text.strip():
        raise DataError(f"{path}: empty file (expected conversations as JSON, JSONL or text)")
    suffix = path.suffix.lower()
    if suffix == ".txt":
        for n, doc in enumerate(re.split(r"\n\s*\n", text)):
            if doc.strip():
                yield doc.strip(), f"{path.name}#doc{n}"
        return
    whole = suffix == ".json" or text.lstrip()[:1] == "["
    if whole:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            if suffix == ".json":
                raise DataError(f"{path}: not valid JSON ({e}); expected an array of records") \
                    from e
            whole = False  # not one document: JSON Lines whose first line starts with "["
    if whole:
        if isinstance(obj, dict):
            lists = [v for v in obj.values() if isinstance(v, list)]
            single = "conversations" in obj or "messages" in obj or len(lists) != 1
            obj = [obj] if single else lists[0]
        if not isinstance(obj, list):
            raise DataError(f"{path}: expected a JSON array of records, got {type(obj).__name__}")
        for n, rec in enumerate(obj):
            yield rec, f"{path.name}[{n}]"
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line), f"{path.name}:{n}"
        except json.JSONDecodeError:
            stats.records += 1
            stats.skip("malformed_json_line", f"{path.name}:{n}")


def read_conversations(path: str | Path) -> tuple[list[Conversation], ReadStats]:
    """(usable conversations in file order, stats) of a JSONL, JSON or ``.txt`` file (format by
    suffix and content). DataError for a missing or empty file, invalid JSON in a ``.json`` file,
    or no usable record (the message lists skip reasons)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: conversations file not found")
    stats = ReadStats()
    out: list[Conversation] = []
    for rec, where in _iter_records(path, stats):
        stats.records += 1
        if (conv := _normalise(rec, where, stats)) is not None:
            out.append(conv)
    stats.usable = len(out)
    if not out:
        raise DataError(f"{path}: no usable conversation among {stats.records} records (skipped: "
                        f"{dict(stats.skipped)}; e.g. {stats.examples[:3]})")
    return out, stats


def template_hash(tokenizer) -> str:
    """sha256 (hex) of the tokenizer's chat template text ("" when it has none)."""
    return hashlib.sha256((tokenizer.chat_template or "").encode()).hexdigest()


def tokenizer_hash(tokenizer) -> str:
    """sha256 (hex) over the tokenizer's vocabulary (token to id, sorted) and its special tokens."""
    payload = json.dumps({"vocab": sorted(tokenizer.get_vocab().items()),
                          "special": tokenizer.special_tokens_map}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def template_switches(tokenizer, kwargs: dict | None = None) -> dict:
    """The chat template's non-standard variables (e.g. ``enable_thinking``, found by jinja2's
    undeclared-variable analysis) with the values used (None = unset)."""
    import jinja2
    from jinja2 import meta

    src = tokenizer.chat_template or ""
    names = meta.find_undeclared_variables(jinja2.Environment().parse(src)) if src else set()
    kwargs = dict(kwargs or {})
    switches = {n: kwargs.get(n) for n in sorted(names - _STANDARD_TEMPLATE_VARS)}
    switches.update({k: v for k, v in kwargs.items() if k not in switches})
    return switches


def has_generation_markers(tokenizer) -> bool:
    """True when the chat template marks assistant text with ``{% generation %}``."""
    return bool(re.search(r"\{%-?\s*generation\s*-?%\}", tokenizer.chat_template or ""))


def _render(tokenizer, messages, add_generation_prompt: bool, kwargs: dict) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kwargs)


def assistant_char_spans(tokenizer, messages: list[dict],
                         kwargs: dict | None = None) -> tuple[str, list]:
    """(rendered text, [(start, end) character span of each assistant turn]): ``render(messages[:
    i+1])`` minus ``render(messages[:i], add_generation_prompt=True)`` (:func:`_assistant_start`),
    from the message's stripped content to the trailing whitespace. TemplateUnstable (a DataError
    naming the message index and the template hash) when the template is not prefix-stable."""
    kwargs = dict(kwargs or {})
    full = _render(tokenizer, messages, False, kwargs)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        upto = _render(tokenizer, messages[: i + 1], False, kwargs)
        start = _assistant_start(tokenizer, messages, i, upto, kwargs)
        if start is None or not full.startswith(upto):
            raise TemplateUnstable(f"chat template {template_hash(tokenizer)[:12]}: rendering is "
                                   f"not prefix-stable at message {i} (assistant); cannot derive "
                                   "the loss mask without generation markers")
        start = _content_start(upto, start, m["content"])
        spans.append((start, max(len(upto.rstrip()), start)))
    return full, spans


class TemplateUnstable(DataError):
    """The chat template renders an earlier turn differently once later turns follow (e.g. an
    empty reasoning block only on the last assistant turn): no loss mask can be derived."""


def _content_start(upto: str, start: int, content: str) -> int:
    """Where the stripped ``content`` first occurs in ``upto`` at or after ``start``; ``start``
    when it is empty or the template rewrote it."""
    needle = content.strip()
    found = upto.find(needle, start) if needle else -1
    return start if found < 0 else found


def _assistant_start(tokenizer, messages, i: int, upto: str, kwargs: dict) -> int | None:
    """Offset in ``upto`` where assistant message ``i`` starts (None: not found): the length of
    the generation-prompt render of ``messages[:i]``, else its text after the history's render."""
    before = _render(tokenizer, messages[:i], True, kwargs) if i else ""
    if upto.startswith(before):
        return len(before)
    history = _render(tokenizer, messages[:i], False, kwargs) if i else ""
    needle = messages[i]["content"].strip()
    found = upto.find(needle, len(history)) if upto.startswith(history) and needle else -1
    return None if found < 0 else found


def tokenize_conversation(tokenizer, conv: Conversation, max_seq_len: int,
                          template_kwargs: dict | None = None) -> TokenizedSample:
    """Template and tokenize one conversation, cut to ``max_seq_len`` tokens (``truncated`` set).
    Plain text is tokenized as is (special tokens added), every token in the loss. DataError for
    a conversation and a tokenizer without a chat template."""
    kwargs = dict(template_kwargs or {})
    if conv.text is not None:
        ids = tokenizer(conv.text, add_special_tokens=True)["input_ids"]
        mask = [1] * len(ids)
    elif not tokenizer.chat_template:
        raise DataError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')}: no chat_template, "
                        "cannot template conversations")
    elif has_generation_markers(tokenizer):
        enc = tokenizer.apply_chat_template(conv.messages, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True, **kwargs)
        ids, mask = list(enc["input_ids"]), [int(x) for x in enc["assistant_masks"]]
    else:
        text, spans = assistant_char_spans(tokenizer, conv.messages, kwargs)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        mask = [int(end > start and any(s <= start < e for s, e in spans))
                for start, end in enc["offset_mapping"]]
    return TokenizedSample(conv.id, ids[:max_seq_len], mask[:max_seq_len], len(ids) > max_seq_len,
                           len(ids))


def rendered_tokens(tokenizer, conv: Conversation, template_kwargs: dict | None = None) -> int:
    """Tokens of ``conv`` rendered in full (no loss mask needed: sizes a dropped conversation)."""
    if conv.text is not None:
        return len(tokenizer(conv.text, add_special_tokens=True)["input_ids"])
    text = _render(tokenizer, conv.messages, False, dict(template_kwargs or {}))
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])
