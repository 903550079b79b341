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

from eagle3.convert.vocab_reading import vocab_map_problems
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
    """DataError (failure class 7, docs/FAILURE_CLASSES.md) naming each broken invariant: those
    conversion checks (:func:`eagle3.convert.vocab_reading.vocab_map_problems`: ``d2t`` 1-D
    integer offsets, ``i + d2t[i]`` distinct in ``[0, vocab_size)``, ``t2d`` of length
    ``vocab_size`` true exactly there) and, as training writes the map, targets ascending."""
    problems = vocab_map_problems(d2t, t2d, d2t.numel(), vocab_size)
    if problems:
        raise DataError("vocab map: " + "; ".join(map(str, problems)))
    tid = d2t.to(torch.long) + torch.arange(d2t.numel(), dtype=torch.long)
    down = torch.nonzero(tid[1:] <= tid[:-1]).flatten()
    if down.numel():
        i = int(down[0]) + 1
        raise DataError(f"vocab map: i + d2t[i] expected ascending in i (the order training "
                        f"writes), got {int(tid[i - 1])} at draft id {i - 1}, {int(tid[i])} at {i}")


def vocab_map_hash(d2t: torch.Tensor, t2d: torch.Tensor) -> str:
    """sha256 (hex) of ``d2t`` as little-endian int64 bytes, then ``t2d`` as uint8 (any device or
    held dtype)."""
    h = hashlib.sha256()
    h.update(b"d2t:")
    h.update(d2t.detach().cpu().to(torch.int64).contiguous().numpy().astype("<i8").tobytes())
    h.update(b"t2d:")
    h.update(t2d.detach().cpu().to(torch.bool).to(torch.uint8).contiguous().numpy().tobytes())
    return h.hexdigest()


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
