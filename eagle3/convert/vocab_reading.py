"""The checks of a draft's vocabulary map, conversion's and training's (:func:`vocab_map_problems`),
and which reading of ``d2t`` the tensors support: offsets, as every engine reads them
(SGLang 0.5.16 and 0.5.23 ``srt/models/llama_eagle3.py``: ``hot_token_id = d2t + arange``, so
draft id ``i`` proposes target id ``i + d2t[i]``), or the target ids themselves stored by mistake.

The exporters (speculators, SpecForge, the EAGLE repository) sort the draft vocabulary by target
id and store ``d2t[i] = target_i - i``: the targets ``i + d2t[i]`` are strictly increasing and
below ``vocab_size``, and ``d2t`` is non-decreasing. A ``d2t`` holding target ids is strictly
increasing too, so for a small vocabulary both readings are often valid maps; the evidence used,
strongest first:

1. a ``t2d`` (bool ``[vocab_size]``, true at the target ids of the draft vocabulary): it marks
   exactly the offsets' targets or exactly ``d2t``'s values (decisive either way);
2. read as offsets the map breaks (a target ``>= vocab_size`` or two draft ids on one target)
   while read as target ids it is ``len(d2t)`` distinct ids in ``[0, vocab_size)``;
3. ``d2t == arange(n)``, or none of the many adjacent target ids a large vocabulary holds
   (:func:`absolute_d2t_reason`);
4. for any size: read as target ids, at least half of the neighbours are adjacent ids (a
   contiguous stretch such as ``c + arange(n)``), while read as offsets no two draft ids sit on
   adjacent targets and those neighbours are all exactly 2 apart (see
   :data:`ADJACENT_SHARE_MIN`);
5. for any size and any share: read as offsets, no two draft ids sit on adjacent targets while
   at least :data:`TWO_APART_MIN` pairs sit exactly 2 apart (a frequency-chosen vocabulary with
   gaps, read as ids, has adjacent pairs; read as offsets each of them becomes a gap of 2).

A sorted map with no contiguous stretch and no ``t2d`` (e.g. a few random target ids) is a valid
map under both readings and cannot be told apart; it is not flagged.
"""

from __future__ import annotations

import math

import torch

from eagle3.convert.checkpoint import Problem

# Rule 4. Natural-text vocabularies cluster (frequent tokens sit on neighbouring ids), so a correct
# map, read as offsets, has adjacent targets (equal neighbouring offsets) before it has targets
# exactly 2 apart. A map whose neighbours are, read as offsets, never adjacent but for at least
# ADJACENT_SHARE_MIN of them exactly 2 apart (at least ADJACENT_PAIRS_MIN pairs) is a contiguous
# stretch of target ids stored as ids. ADJACENT_FALSE_ALARM_MAX bounds the chance of that pattern
# for a vocabulary drawn at random (Poisson counts with mean (n - 1) * n / vocab_size).
ADJACENT_SHARE_MIN = 0.5
ADJACENT_PAIRS_MIN = 3
ADJACENT_FALSE_ALARM_MAX = 1e-6
# Rule 5. In a vocabulary chosen from text, whatever its clustering, two neighbouring target ids
# are adjacent at least as often as exactly 2 apart (gap 1 at least as likely as gap 2: random
# draws give slightly more gaps of 1, clustered ones many more). A neighbour pair known to sit 1
# or 2 apart then sits 2 apart with probability at most 1/2, so k such pairs, none adjacent, have
# probability at most 2**-k: TWO_APART_MIN is the least k with 2**-k <= ADJACENT_FALSE_ALARM_MAX.
TWO_APART_MIN = math.ceil(math.log2(1 / ADJACENT_FALSE_ALARM_MAX))
# Rule 3. An offset d2t is non-decreasing, equal at draft rows on adjacent target ids; a d2t of
# target ids is strictly increasing. n frequent ids of V hold about (n-1)·n/V adjacent pairs (more:
# text clusters); none while at least this many are expected (probability ~exp(-this)) reads as ids.
ADJACENT_PAIRS_EXPECTED_MIN = 20.0


def _poisson_at_least(k: int, lam: float) -> float:
    """P(X >= k) for X ~ Poisson(lam), summed in log space."""
    if k <= 0:
        return 1.0
    if lam <= 0:
        return 0.0
    total = 0.0
    for j in range(k, k + 400):
        term = math.exp(j * math.log(lam) - lam - math.lgamma(j + 1))
        total += term
        if j > lam and term < 1e-18 * max(total, 1e-300):
            break
    return min(total, 1.0)


def _marks_exactly(mask: torch.Tensor, ids: torch.Tensor) -> bool:
    """True when bool ``mask`` ``[vocab]`` is true exactly at the distinct ids ``ids``."""
    vocab = mask.numel()
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab:
        return False
    return (int(ids.unique().numel()) == ids.numel() and bool(mask[ids].all())
            and int(mask.sum()) == ids.numel())


def absolute_d2t_reason(d2t: torch.Tensor, vocab_size: int) -> str | None:
    """Rule 3: why ``d2t`` (int ``[draft_vocab_size]``) looks like absolute target ids rather than
    the offsets every engine reads, or None. Absolute: a valid map read as ids (in ``[0,
    vocab_size)``, strictly increasing) that equals ``arange(n)`` (n >= 3) or has no adjacent pair
    while at least :data:`ADJACENT_PAIRS_EXPECTED_MIN` are expected."""
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


def absolute_reason(d2t: torch.Tensor, t2d: torch.Tensor | None, vocab_size: int) -> str | None:
    """Why ``d2t`` (integer ``[n]``) holds target ids rather than offsets, else None (module
    docstring, rules 1-5). ``t2d`` (bool or 0/1 ``[vocab_size]``) is used only at that length.
    Raises nothing."""
    n = int(d2t.numel())
    if d2t.dim() != 1 or n < 2 or d2t.is_floating_point() or d2t.dtype == torch.bool:
        return None
    a = d2t.to(torch.long)
    targets = a + torch.arange(n, dtype=torch.long)
    if t2d is not None and t2d.dim() == 1 and t2d.numel() == vocab_size:
        mask = t2d.to(torch.bool)
        if not _marks_exactly(mask, targets) and _marks_exactly(mask, a):
            return (f"t2d is true exactly at d2t's {n} values, not at i + d2t[i] (range "
                    f"[{int(targets.min())}, {int(targets.max())}]): the map was written as ids")
        return None
    if int(a.min()) < 0 or int(a.max()) >= vocab_size or int(a.unique().numel()) != n:
        return None
    if int(targets.max()) >= vocab_size:
        return (f"read as offsets, i + d2t[i] reaches {int(targets.max())} >= vocab_size "
                f"{vocab_size}; read as target ids, d2t is {n} distinct ids in [0, {vocab_size})")
    if int(targets.unique().numel()) != n:
        return (f"read as offsets, {n - int(targets.unique().numel())} draft ids share a target id "
                f"i + d2t[i]; read as target ids, d2t is {n} distinct ids in [0, {vocab_size})")
    steps = a[1:] - a[:-1]
    if not bool((steps > 0).all()):
        return None  # unsorted: a valid offset map under the engine's reading; undecidable here
    reason = absolute_d2t_reason(d2t, vocab_size)
    if reason is not None:
        return reason
    adjacent = int((steps == 1).sum())
    lam = (n - 1) * n / vocab_size
    chance = math.exp(-lam) * _poisson_at_least(adjacent, lam)
    if (adjacent >= ADJACENT_PAIRS_MIN and adjacent >= ADJACENT_SHARE_MIN * (n - 1)
            and chance <= ADJACENT_FALSE_ALARM_MAX):
        return (f"read as target ids, {adjacent} of the {n - 1} neighbours are adjacent ids "
                f"(range [{int(a.min())}, {int(a.max())}]); read as offsets, no two draft ids "
                f"sit on adjacent targets and those {adjacent} neighbours sit exactly 2 apart "
                f"(chance {chance:.1g} for a random vocabulary of {n} of {vocab_size} ids)")
    if adjacent >= TWO_APART_MIN:
        return (f"read as offsets, no two of the {n} draft ids sit on adjacent target ids while "
                f"{adjacent} neighbours sit exactly 2 apart (chance at most 2^-{adjacent} = "
                f"{0.5 ** adjacent:.1g} for a vocabulary chosen from text, where adjacent ids are "
                f"at least as common as ids 2 apart); read as target ids, d2t is {n} distinct ids "
                f"in [{int(a.min())}, {int(a.max())}] with {adjacent} adjacent pairs")
    return None


def vocab_map_problems(d2t: torch.Tensor, t2d: torch.Tensor | None, draft_vocab: int,
                       vocab: int) -> list[Problem]:
    """The broken invariants of a vocabulary map (failure class 7): ``d2t`` (int64
    ``[draft_vocab]`` offsets, target id ``i + d2t[i]``) of length ``draft_vocab``, of an integer
    dtype, holding offsets rather than target ids (``VOCAB_MAP_ABSOLUTE``, :func:`absolute_reason`),
    with ``draft_vocab`` distinct targets in ``[0, vocab)``; ``t2d`` (bool ``[vocab]``, optional)
    of length ``vocab``, true at exactly those targets. ``VOCAB_MAP_INVALID`` otherwise, each
    naming the tensor, the expected and the actual value; ``[]`` for a valid map."""

    def bad(msg: str) -> Problem:
        return Problem("VOCAB_MAP_INVALID", msg)

    if d2t.dim() != 1 or d2t.numel() != draft_vocab:
        return [bad(f"d2t: expected length draft_vocab_size={draft_vocab}, got shape "
                    f"{list(d2t.shape)}")]
    out = []
    if d2t.is_floating_point() or d2t.dtype == torch.bool:
        out.append(bad(f"d2t: expected an integer dtype (int64), got {d2t.dtype}"))
    tid = d2t.to(torch.long) + torch.arange(draft_vocab)
    reason = absolute_reason(d2t, t2d, vocab)  # target ids stored instead of offsets
    if reason is not None:
        return out + [Problem("VOCAB_MAP_ABSOLUTE", "d2t: expected offsets (target id = i + "
                              f"d2t[i]), got absolute target ids: {reason}")]
    lo, hi = (int(tid.min()), int(tid.max())) if tid.numel() else (0, -1)
    if lo < 0 or hi >= vocab:
        return out + [bad(f"d2t: i + d2t[i] expected in [0, {vocab}), got range [{lo}, {hi}]")]
    distinct = int(tid.unique().numel())
    if distinct != draft_vocab:
        out.append(bad(f"d2t: expected {draft_vocab} distinct target ids i + d2t[i], got "
                       f"{distinct} (two draft rows map to one target token)"))
    if t2d is None:
        return out
    if t2d.dim() != 1 or t2d.numel() != vocab:
        return out + [bad(f"t2d: expected length vocab_size={vocab}, got shape {list(t2d.shape)}")]
    n_true = int(t2d.to(torch.bool).sum())
    if n_true != draft_vocab:
        out.append(bad(f"t2d: sum expected draft_vocab_size={draft_vocab}, got {n_true}"))
    off = int((~t2d.to(torch.bool)[tid]).sum())
    if off:
        out.append(bad("d2t/t2d: expected t2d[i + d2t[i]] true for every draft index, got "
                       f"{off} of {draft_vocab} false"))
    return out


def offset_t2d(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The ``t2d`` (bool ``[vocab_size]``, true at ``i + d2t[i]``) of an offset map ``d2t``, as
    :func:`eagle3.train.vocab.build_vocab_map` builds it; ValueError naming the range when a
    target is outside ``[0, vocab_size)``."""
    targets = d2t.to(torch.long) + torch.arange(d2t.numel(), dtype=torch.long)
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab_size):
        raise ValueError(f"d2t: i + d2t[i] expected in [0, {vocab_size}), got range "
                         f"[{int(targets.min())}, {int(targets.max())}]")
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[targets] = True
    return mask


__all__ = ["ADJACENT_FALSE_ALARM_MAX", "ADJACENT_PAIRS_EXPECTED_MIN", "ADJACENT_PAIRS_MIN",
           "ADJACENT_SHARE_MIN", "TWO_APART_MIN", "absolute_d2t_reason", "absolute_reason",
           "offset_t2d", "vocab_map_problems"]
