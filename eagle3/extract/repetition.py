"""How much of an answer repeats itself: the loops a small target's greedy answers fall into.

A token *repeats* when the n-gram ending at it (:data:`REPEAT_NGRAM` tokens: the token and the
ones before it) already occurred earlier in the same answer. A greedy answer that loops (the same
sentence again until ``max_new_tokens``) is mostly such tokens. A draft predicts them easily, so a
validation split of looping answers makes the simulated acceptance length run far above what the
first tokens of an answer reach; they also add few new tokens to train on. The counts are kept by
position in the answer (:data:`BUCKETS`), since the development and benchmark measurements read
only an answer's first 64 or 256 tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

log = logging.getLogger(__name__)

REPEAT_NGRAM = 9  # 8 tokens of context and the token
# an answer loops when at least this share of its tokens repeats; one shorter than
# 2 * REPEAT_NGRAM tokens cannot (its first REPEAT_NGRAM - 1 tokens never repeat)
LOOPING_SHARE = 0.5
LOUD_SHARE = 0.25  # a warning when this share of all answer tokens repeats, or more
BUCKETS = ((0, 64), (64, 256), (256, None))  # token positions in an answer, [from, to)


def repeated_flags(ids: Sequence[int], n: int = REPEAT_NGRAM) -> list[bool]:
    """``flags[i]``: whether the ``n``-gram ``ids[i-n+1 : i+1]`` occurs earlier in ``ids`` (ending
    before ``i``). The first ``n - 1`` tokens never repeat. ValueError when ``n < 1``."""
    if n < 1:
        raise ValueError(f"n: expected >= 1, got {n}")
    seen: set[tuple[int, ...]] = set()
    flags = []
    for i in range(len(ids)):
        if i < n - 1:
            flags.append(False)
            continue
        gram = tuple(ids[i - n + 1:i + 1])
        flags.append(gram in seen)
        seen.add(gram)
    return flags


def repetition_summary(answers: Iterable[Sequence[int]], n: int = REPEAT_NGRAM) -> dict:
    """Counts over ``answers`` (token ids, one list per answer): ``{"ngram", "answers", "tokens",
    "repeated_share", "looping_answers" (:data:`LOOPING_SHARE` of their tokens or more repeat),
    "by_position": [{"from", "to" (None: the end), "tokens", "repeated_share"}]}``; shares are
    None where there is no token."""
    tot = rep = looping = count = 0
    per = [[0, 0] for _ in BUCKETS]
    for ids in answers:
        flags = repeated_flags(ids, n)
        count += 1
        tot, rep = tot + len(flags), rep + sum(flags)
        looping += bool(flags) and sum(flags) >= LOOPING_SHARE * len(flags)
        for b, (lo, hi) in enumerate(BUCKETS):
            part = flags[lo:hi]
            per[b][0] += len(part)
            per[b][1] += sum(part)
    return {"ngram": n, "answers": count, "tokens": tot,
            "repeated_share": round(rep / tot, 4) if tot else None,
            "looping_answers": looping,
            "by_position": [{"from": lo, "to": hi, "tokens": t,
                             "repeated_share": round(r / t, 4) if t else None}
                            for (lo, hi), (t, r) in zip(BUCKETS, per)]}


def regenerated_answers(tokenizer, convs, kept_turns: dict[str, list[int]]) -> list[list[int]]:
    """The token ids of the assistant turns of ``convs`` (``Conversation``, ``messages`` form)
    that were regenerated: all but those ``kept_turns`` (``{id: [1-based turns]}``, the
    regeneration's counts) lists as kept with their original answer. The ids are the tokenizer's
    for the answer's text, as training reads it, not the ids the target generated (a text may
    tokenize back otherwise). ValueError when ``kept_turns`` is not such a mapping."""
    if not isinstance(kept_turns, dict) or not all(
            isinstance(v, list) for v in kept_turns.values()):
        raise ValueError(f"kept_turns: expected {{conversation id: [1-based turns]}}, got "
                         f"{str(kept_turns)[:80]}")
    texts = []
    for c in convs:
        kept = set(kept_turns.get(c.id, []))
        turns = [m for m in (c.messages or []) if m.get("role") == "assistant"]
        texts += [m.get("content") or "" for r, m in enumerate(turns, 1) if r not in kept]
    return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []


def log_repetition(summary: dict, where: str) -> None:
    """One line on ``summary`` (:func:`repetition_summary`) of the answers in ``where``; a warning
    at :data:`LOUD_SHARE` of the tokens repeated or more."""
    share = summary["repeated_share"]
    if share is None:
        return
    parts = ", ".join(f"tokens {b['from']}-{'' if b['to'] is None else b['to'] - 1}: "
                      f"{100 * b['repeated_share']:.0f}%" for b in summary["by_position"]
                      if b["tokens"])
    log.log(logging.WARNING if share >= LOUD_SHARE else logging.INFO,
            "repetition: %.0f%% of the %d tokens of %d answers in %s repeat an earlier %d-gram "
            "of their answer (%s); %d answers loop (%.0f%% of their tokens or more repeat). A "
            "validation split of such text puts the simulated acceptance length above what an "
            "answer's first tokens reach (the development and benchmark figures)", 100 * share,
            summary["tokens"], summary["answers"], where, summary["ngram"], parts,
            summary["looping_answers"], 100 * LOOPING_SHARE)
