"""The draft vocabulary: token frequencies → ``d2t`` / ``t2d`` maps, invariants and hash.

Conventions (speculators 0.9.0, SGLang (profile.VERSION); docs/ENGINE_FACTS.md §2, §5): ``d2t``
int64 ``[draft_vocab_size]`` holds *offsets* (``target_id = i + d2t[i]``); ``t2d`` bool
``[vocab_size]`` is True exactly at target ids with a draft index; draft indices ascend by target
id (speculators' ``build_vocab_mappings_from_distribution``). The map is chosen by frequency over
loss-masked train tokens (``token_freq.pt``); too few distinct tokens raise unless ``pad`` (the
lowest unused target ids fill the rest: speculators' padding rule).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle3.errors import ConfigError, DataError


@dataclass(frozen=True)
class VocabMap:
    """d2t: int64 ``[draft_vocab_size]`` offsets; t2d: bool ``[vocab_size]``; num_from_data: slots
    filled from observed tokens; coverage: share (0..1) of loss-masked tokens in the vocabulary."""

    d2t: torch.Tensor
    t2d: torch.Tensor
    num_from_data: int
    coverage: float

    @property
    def draft_vocab_size(self) -> int:
        return int(self.d2t.numel())

    @property
    def vocab_size(self) -> int:
        return int(self.t2d.numel())

    def target_ids(self) -> torch.Tensor:
        """int64 ``[draft_vocab_size]``: the target id of each draft index."""
        return self.d2t + torch.arange(self.draft_vocab_size, dtype=torch.long)

    def hash(self) -> str:
        """See :func:`vocab_map_hash`."""
        return vocab_map_hash(self.d2t, self.t2d)


def load_token_freq(path: str | Path) -> dict[int, int]:
    """``token_freq.pt`` (``{token_id: count}``, ``torch.save``); DataError: missing, not a dict,
    a non-integer key/value, or a negative count."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: token frequency file not found (extraction writes token_freq.pt)")
    try:
        raw = torch.load(path, weights_only=True)
    except Exception as e:  # torch raises several unrelated types for a corrupt file
        raise DataError(f"{path}: not a readable torch file ({type(e).__name__}: {e})") from e
    if not isinstance(raw, dict):
        raise DataError(f"{path}: expected a dict {{token_id: count}}, got {type(raw).__name__}")
    freq: dict[int, int] = {}
    for k, v in raw.items():
        try:
            tid, cnt = int(k), int(v)
        except (TypeError, ValueError) as e:
            raise DataError(f"{path}: entry {k!r}: {v!r} is not an integer token id and "
                            "count") from e
        if cnt < 0:
            raise DataError(f"{path}: token {tid} has a negative count {cnt}")
        freq[tid] = freq.get(tid, 0) + cnt
    return freq


def check_draft_vocab_size(draft_vocab_size: int, vocab_size: int) -> None:
    """ConfigError unless ``2 <= draft_vocab_size < vocab_size`` (the target's vocabulary)."""
    if not 2 <= draft_vocab_size < vocab_size:
        raise ConfigError("train.draft_vocab_size: expected 2 <= value < target vocab_size "
                          f"{vocab_size}, got {draft_vocab_size}")


def build_vocab_map(token_freq: dict[int, int], draft_vocab_size: int, vocab_size: int, *,
                    pad: bool = False) -> VocabMap:
    """The ``draft_vocab_size`` most frequent target ids in ``token_freq`` ``{id: count}`` (ties:
    lower id first; ``pad``: missing slots get the lowest unused ids). ConfigError unless
    ``draft_vocab_size`` is in ``[2, vocab_size)`` (speculators stores no d2t/t2d for an equal
    size); DataError for an id outside ``[0, vocab_size)`` or too few distinct tokens."""
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    check_draft_vocab_size(draft_vocab_size, vocab_size)
    freq = {int(t): int(c) for t, c in token_freq.items() if int(c) > 0}
    bad = [t for t in freq if not 0 <= t < vocab_size]
    if bad:
        raise DataError(f"token_freq: {len(bad)} token ids outside [0, {vocab_size}) of the target "
                        f"vocabulary (e.g. {sorted(bad)[:5]}): data from another tokenizer?")
    distinct = len(freq)
    if distinct < draft_vocab_size and not pad:
        raise DataError(
            f"token_freq: the train split has {distinct} distinct loss-masked tokens, fewer than "
            f"train.draft_vocab_size={draft_vocab_size}; set train.draft_vocab_size<={distinct}, "
            f"add data, or set train.pad_draft_vocab=true to fill the rest with unused ids")
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size, vocab_size)
    d2t, t2d = d2t.to(torch.long), t2d.to(torch.bool)
    check_vocab_map(d2t, t2d, vocab_size)
    return VocabMap(d2t, t2d, num_from_data=min(distinct, draft_vocab_size),
                    coverage=vocab_coverage(d2t, freq)[0])


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int) -> None:
    """DataError unless (failure class 7, docs/FAILURE_CLASSES.md) ``len(t2d) == vocab_size``,
    ``t2d.sum() == len(d2t)`` and ``i + d2t[i]`` is strictly increasing in ``[0, vocab)`` and
    exactly the ids where ``t2d`` is True."""
    if d2t.dim() != 1 or t2d.dim() != 1:
        raise DataError(f"vocab map: d2t and t2d must be 1-D, got shapes {tuple(d2t.shape)}, "
                        f"{tuple(t2d.shape)}")
    if t2d.numel() != vocab_size:
        raise DataError(f"vocab map: len(t2d) expected {vocab_size} (target vocab), got "
                        f"{t2d.numel()}")
    n_true = int(t2d.to(torch.bool).sum())
    if n_true != d2t.numel():
        raise DataError(f"vocab map: t2d.sum() expected len(d2t)={d2t.numel()}, got {n_true}")
    tid = d2t.to(torch.long) + torch.arange(d2t.numel(), dtype=torch.long)
    if tid.numel() and (int(tid.min()) < 0 or int(tid.max()) >= vocab_size):
        raise DataError(f"vocab map: i + d2t[i] expected in [0, {vocab_size}), got range "
                        f"[{int(tid.min())}, {int(tid.max())}]")
    if not torch.equal(tid, torch.nonzero(t2d.to(torch.bool)).flatten()):
        raise DataError("vocab map: i + d2t[i] is not the ascending list of ids where t2d is True")


def vocab_map_hash(d2t: torch.Tensor, t2d: torch.Tensor) -> str:
    """sha256 (hex) of ``d2t`` as little-endian int64 bytes, then ``t2d`` as uint8 (any device or
    held dtype)."""
    h = hashlib.sha256()
    h.update(b"d2t:")
    h.update(d2t.detach().cpu().to(torch.int64).contiguous().numpy().astype("<i8").tobytes())
    h.update(b"t2d:")
    h.update(t2d.detach().cpu().to(torch.bool).to(torch.uint8).contiguous().numpy().tobytes())
    return h.hexdigest()


# An offset d2t is non-decreasing, equal at draft rows on adjacent target ids; a d2t of target ids
# is strictly increasing. n frequent ids of V hold about (n-1)·n/V adjacent pairs (more: text
# clusters); none while at least this many are expected (probability ~exp(-this)) reads as ids.
ADJACENT_PAIRS_EXPECTED_MIN = 20.0


def absolute_d2t_reason(d2t: torch.Tensor, vocab_size: int) -> str | None:
    """Why ``d2t`` (int ``[draft_vocab_size]``) looks like absolute target ids rather than the
    offsets every engine reads (SGLang 0.5.23 ``llama_eagle3.py``: ``hot_token_id = d2t +
    arange``), or None. Absolute: a valid map read as ids (in ``[0, vocab_size)``, strictly
    increasing) that equals ``arange(n)`` (n >= 3) or has no adjacent pair while at least
    :data:`ADJACENT_PAIRS_EXPECTED_MIN` are expected."""
    n = int(d2t.numel())
    if d2t.dim() != 1 or n < 3 or d2t.is_floating_point():
        return None
    d = d2t.to(torch.long)
    if int(d.min()) < 0 or int(d.max()) >= vocab_size or not bool((d[1:] > d[:-1]).all()):
        return None
    if torch.equal(d, torch.arange(n, dtype=torch.long)):
        return (f"d2t[i] == i for all {n} draft ids (a list of target ids, not offsets): the "
                "engine reads target = i + d2t[i], so draft id i would propose target id 2i")
    expected = (n - 1) * n / vocab_size
    if expected >= ADJACENT_PAIRS_EXPECTED_MIN:
        return (f"d2t strictly increasing at every one of its {n} entries (range [{int(d.min())}, "
                f"{int(d.max())}]): offsets repeat wherever two draft ids sit on adjacent target "
                f"ids, about {expected:.0f} such pairs expected for {n} of {vocab_size} ids, none "
                "found: these are target ids, and the engine reads target = i + d2t[i]")
    return None


def is_identity_prefix(d2t: torch.Tensor, vocab_size: int) -> bool:
    """True when ``d2t`` is all zeros with fewer draft ids than ``vocab_size``: the draft
    vocabulary is the first ``len(d2t)`` target ids, whatever the data's frequent tokens are."""
    return (d2t.dim() == 1 and 0 < d2t.numel() < vocab_size
            and not bool(d2t.to(torch.long).any()))


def vocab_coverage(d2t: torch.Tensor, token_counts: dict[int, int]) -> tuple[float, int, int]:
    """``(share 0..1, covered, total)`` of the tokens counted in ``token_counts`` ``{target id:
    count}`` whose id is in the draft vocabulary ``{i + d2t[i]}``; share 0.0 for an empty count."""
    ids = set((d2t.to(torch.long) + torch.arange(d2t.numel(), dtype=torch.long)).tolist())
    total = sum(int(c) for c in token_counts.values())
    covered = sum(int(c) for t, c in token_counts.items() if int(t) in ids)
    return (covered / total if total else 0.0), covered, total
