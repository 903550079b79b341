"""Regeneration of assistant turns by the target itself (as EAGLE-3 and SpecForge do: it raises acceptance,
because the draft then learns the target's own token distribution rather than another model's).

Every assistant turn is replaced, in order, by the target's greedy answer to the conversation so far (with the
earlier turns already regenerated). Two ways:

- ``hf``: batched ``model.generate`` (left padding, greedy, ``max_new_tokens``), chat template of the target;
- ``openai``: any OpenAI-compatible endpoint (``POST {url}/chat/completions``, temperature 0) through httpx.

Extraction stores the regenerated conversations in ``<out>/.progress/regenerated.jsonl`` so a resumed run
reuses them instead of generating again.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle3.errors import ConfigError, DataError, TransientError
from eagle3.extract.conversations import Conversation


def _rounds(convs: list[Conversation]) -> int:
    return max((sum(m["role"] == "assistant" for m in c.messages or []) for c in convs), default=0)


def _turn_index(conv: Conversation, r: int) -> int | None:
    idx = [i for i, m in enumerate(conv.messages or []) if m["role"] == "assistant"]
    return idx[r] if r < len(idx) else None


def regenerate(convs: list[Conversation], answer_fn, batch_size: int) -> list[Conversation]:
    """Replace each assistant turn with ``answer_fn(list of message prefixes) -> list of answers``, round by round.

    Returns new Conversation objects (inputs untouched); plain-text records pass through unchanged.
    """
    out = [Conversation(c.id, [dict(m) for m in c.messages] if c.messages else None, c.text) for c in convs]
    for r in range(_rounds(out)):
        todo = [(c, i) for c in out if (i := _turn_index(c, r)) is not None]
        for b in range(0, len(todo), batch_size):
            chunk = todo[b: b + batch_size]
            answers = answer_fn([c.messages[:i] for c, i in chunk])
            for (c, i), a in zip(chunk, answers):
                c.messages[i]["content"] = a
    return out


def hf_answer_fn(model, tokenizer, max_new_tokens: int, template_kwargs: dict | None = None):
    """An ``answer_fn`` doing batched greedy ``generate`` with the target (left padding)."""
    kwargs = dict(template_kwargs or {})

    def answer(prefixes: list[list[dict]]) -> list[str]:
        prompts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True, **kwargs)
                   for p in prefixes]
        side = tokenizer.padding_side
        tokenizer.padding_side = "left"
        try:
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        finally:
            tokenizer.padding_side = side
        dev = next(model.parameters()).device
        with torch.inference_mode():
            gen = model.generate(**enc.to(dev), max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        new = gen[:, enc["input_ids"].shape[1]:]
        return [tokenizer.decode(row, skip_special_tokens=True).strip() for row in new]

    return answer


def openai_answer_fn(url: str, model: str | None, max_new_tokens: int, timeout_s: float = 600.0):
    """An ``answer_fn`` asking an OpenAI-compatible server (``{url}/chat/completions``, temperature 0).

    Raises TransientError for connection failures and 5xx answers, DataError for other non-200 answers.
    """
    import httpx

    def answer(prefixes: list[list[dict]]) -> list[str]:
        out = []
        with httpx.Client(timeout=timeout_s) as client:
            for msgs in prefixes:
                body = {"model": model or "default", "messages": msgs, "temperature": 0.0,
                        "max_tokens": max_new_tokens}
                try:
                    r = client.post(url.rstrip("/") + "/chat/completions", json=body)
                except httpx.TransportError as e:
                    raise TransientError(f"regeneration endpoint {url}: {e!r}") from e
                if r.status_code >= 500:
                    raise TransientError(f"regeneration endpoint {url}: HTTP {r.status_code}")
                if r.status_code != 200:
                    raise DataError(f"regeneration endpoint {url}: expected HTTP 200, got {r.status_code}: "
                                    f"{r.text[:200]}")
                out.append(r.json()["choices"][0]["message"]["content"].strip())
        return out

    return answer


def regenerate_for_plan(cfg, target_dir: Path, tokenizer, convs: list[Conversation], cache: Path) -> list:
    """Regenerate ``convs`` as ``cfg.data.regenerate`` says, reusing ``cache`` (JSONL) when it exists."""
    if cache.is_file():
        recs = [json.loads(line) for line in cache.read_text().splitlines() if line.strip()]
        if [r["id"] for r in recs] == [c.id for c in convs]:
            return [Conversation(r["id"], r.get("messages"), r.get("text")) for r in recs]
    mode = cfg.data.regenerate
    if mode == "hf":
        from eagle3.target_model import load_target

        model, _ = load_target(target_dir, cfg.target.dtype, cfg.extract.device, cfg.target.trust_remote_code)
        fn = hf_answer_fn(model, tokenizer, cfg.data.regenerate_max_new_tokens, cfg.data.chat_template_kwargs)
    elif mode == "openai":
        if not cfg.data.regenerate_url:
            raise ConfigError("data.regenerate_url: required when data.regenerate is 'openai' (got none)")
        fn = openai_answer_fn(cfg.data.regenerate_url, None, cfg.data.regenerate_max_new_tokens)
    else:
        raise ConfigError(f"data.regenerate: expected 'none', 'hf' or 'openai', got {mode!r}")
    out = regenerate(convs, fn, cfg.extract.batch_size)
    from eagle3.artifacts import atomic_write_bytes

    atomic_write_bytes(cache, "".join(json.dumps({"id": c.id, "messages": c.messages, "text": c.text}) + "\n"
                                      for c in out).encode())
    return out
