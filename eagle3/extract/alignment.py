"""Are the stored hidden states aligned with their tokens? A cheap check with the target's head.

Slot -1 of row ``t`` holds the target's last decoder layer output at token ``t`` before the final
norm (docs/INTERNALS.md), so ``argmax(lm_head(norm(h_t)))`` agrees with token ``t + 1`` as often
as the target predicts the text; a store shifted by one agrees instead with token ``t`` or
``t + 2``. :func:`check_alignment` measures the three rates on up to :data:`POSITIONS` positions
per group of samples (a shard; :data:`MAX_POSITIONS` in all) and refuses the store
(``HS_MISALIGNED``) when the pooled rates, or a group's of at least :data:`MIN_GROUP` positions,
show a shifted rate of at least :data:`MIN_RATE` above the aligned one.

The earliest stored layer decides first (:func:`verdict`): it still carries its input token, so
the nearest embedding names the row's token in random and trained targets alike (a head copying
its input, as random tied targets do, is then not read as a shift). A target that predicts
nothing and whose early layer names no token is ``inconclusive``: recorded, never refused. Only the
final norm, LM head and embedding are read from the target's safetensors.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Sequence

import torch

from eagle3.errors import DataError
from eagle3.target_config import target_config_json, text_config

log = logging.getLogger(__name__)

POSITIONS = 64  # positions checked per group (shard)
MAX_POSITIONS = 8192  # in all: a store of many shards gets fewer per shard (at least MIN_GROUP)
MIN_GROUP = 32  # a single group is judged on its own only with at least this many positions
MIN_RATE = 0.2  # a shifted offset must agree at least this often to count as evidence
VOCAB_CHUNK = 16384  # LM-head rows multiplied at once (bounds the float32 copy)
NORM_KEYS = ("model.norm.weight", "model.language_model.norm.weight",
             "language_model.model.norm.weight", "norm.weight")
HEAD_KEYS = ("lm_head.weight", "language_model.lm_head.weight")
EMBED_KEYS = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
              "language_model.model.embed_tokens.weight", "embed_tokens.weight")
PLUS_ONE_NORMS = ("gemma", "gemma2", "gemma3", "gemma3_text")  # scale = 1 + weight


class Head:
    """The target's final RMS norm and LM head: :meth:`argmax` of ``[n, H]`` pre-norm states.
    ``norm`` ``[H]`` float32 (``1 + weight`` for Gemma-style norms), ``eps`` (``rms_norm_eps``,
    default 1e-6), ``lm_head`` ``[V, H]`` in the stored dtype (the embedding when tied)."""

    def __init__(self, norm: torch.Tensor, eps: float, lm_head: torch.Tensor,
                 embed: torch.Tensor | None = None):
        self.norm, self.eps, self.lm_head, self.embed = norm.float(), float(eps), lm_head, embed

    @torch.no_grad()
    def nearest_input(self, h: torch.Tensor) -> torch.Tensor:
        """Token ids ``[n]`` whose input embedding is nearest (cosine) to the early-layer states
        ``h [n, H]``; empty when the embedding was not found."""
        if self.embed is None:
            return torch.empty(0, dtype=torch.long)
        return _chunked_argmax(torch.nn.functional.normalize(h.float(), dim=-1), self.embed,
                               lambda w: torch.nn.functional.normalize(w, dim=-1))

    @torch.no_grad()
    def argmax(self, h: torch.Tensor) -> torch.Tensor:
        """Predicted next token ids ``[n]`` int64 of pre-norm last-layer states ``h [n, H]``."""
        x = h.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm
        return _chunked_argmax(x, self.lm_head, lambda w: w)


def _chunked_argmax(x: torch.Tensor, rows: torch.Tensor, prep) -> torch.Tensor:
    """``argmax(x @ prep(rows).T, -1)`` over :data:`VOCAB_CHUNK` float32 rows at a time."""
    best = torch.full((x.shape[0],), -float("inf"))
    ids = torch.zeros(x.shape[0], dtype=torch.long)
    for lo in range(0, rows.shape[0], VOCAB_CHUNK):
        val, idx = (x @ prep(rows[lo:lo + VOCAB_CHUNK].float()).T).max(-1)  # [n, chunk] → [n]
        better = val > best
        best, ids = torch.where(better, val, best), torch.where(better, idx + lo, ids)
    return ids


def load_head(target_dir: str | Path) -> Head | None:
    """The final norm and LM head of the HF folder ``target_dir``, read from its safetensors files
    (keys :data:`NORM_KEYS`, :data:`HEAD_KEYS`, else the tied embedding :data:`EMBED_KEYS`). None
    when a tensor is not found under those names (the check is then recorded as skipped)."""
    from safetensors import safe_open

    target_dir = Path(target_dir)
    text = text_config(target_config_json(target_dir))
    where: dict[str, Path] = {}
    for path in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            where.update({k: path for k in f.keys()})

    def first(keys: Sequence[str]) -> torch.Tensor | None:
        for k in keys:
            if k in where:
                with safe_open(str(where[k]), framework="pt") as f:
                    return f.get_tensor(k)
        return None

    norm, embed, head = first(NORM_KEYS), first(EMBED_KEYS), first(HEAD_KEYS)
    head = embed if head is None else head  # the embedding when tied
    if norm is None or head is None:
        return None
    if text.get("model_type") in PLUS_ONE_NORMS:
        norm = 1.0 + norm.float()
    return Head(norm, text.get("rms_norm_eps") or 1e-6, head, embed)


def _positions(lengths: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Up to ``budget`` ``(sample index in the group, t)`` with ``t + 2 < T``, spread evenly over
    the samples and over each sample's positions."""
    out: list[tuple[int, int]] = []
    usable = [(j, n - 2) for j, n in enumerate(lengths) if n >= 3]
    for k, (j, n) in enumerate(usable):
        want = min(n, (budget - len(out)) // max(1, len(usable) - k))
        step = n / max(1, want)
        out += [(j, int(i * step)) for i in range(want)]
    return out


def agreement(head: Head, samples: Sequence[tuple[torch.Tensor, torch.Tensor]],
              budget: int = POSITIONS) -> dict:
    """Agreement rates of one group: ``samples`` are ``(token_ids [T] int64, states [T, S, H])``
    (slot -1 the last layer, slot 0 the earliest stored layer). Returns ``{"positions": n,
    "previous", "next", "after_next"}``: how often ``argmax(lm_head(norm(h_t)))`` is token t, t+1,
    t+2, and ``"input": {"before", "own", "after"}``: how often the embedding nearest to slot 0 at
    row t is token t-1, t, t+1 (fractions 0..1; 0 with no position; ``{}`` without embedding)."""
    picks = _positions([int(ids.numel()) for ids, _ in samples], budget)
    if not picks:
        return {"positions": 0, "previous": 0.0, "next": 0.0, "after_next": 0.0, "input": {}}

    def rate(pred: torch.Tensor, off: int) -> float:
        tok = torch.tensor([int(samples[j][0][max(t + off, 0)]) for j, t in picks])
        return float((pred == tok).float().mean())

    pred = head.argmax(torch.stack([samples[j][1][t, -1] for j, t in picks]))
    near = head.nearest_input(torch.stack([samples[j][1][t, 0] for j, t in picks]))
    inputs = (("before", -1), ("own", 0), ("after", 1)) if near.numel() else ()
    return {"positions": len(picks),
            **{name: rate(pred, off) for name, off in (("previous", 0), ("next", 1),
                                                        ("after_next", 2))},
            "input": {name: rate(near, off) for name, off in inputs}}


def verdict(rates: dict) -> str:
    """``"misaligned"`` when a shifted rate is >= :data:`MIN_RATE` and above the aligned one,
    ``"aligned"`` when the aligned rate is >= :data:`MIN_RATE` and none beats it, else
    ``"inconclusive"``. The input evidence decides first: rows nearest to their own token are in
    place (a head matching token t copies its input), rows nearest to a neighbour's are shifted."""
    inp = rates.get("input") or {}
    if inp and max(inp.values()) >= MIN_RATE:
        if inp["own"] >= max(inp["before"], inp["after"]):
            return "aligned" if rates["next"] >= MIN_RATE else "inconclusive"
        return "misaligned"
    shifted = max(rates["previous"], rates["after_next"])
    if shifted >= MIN_RATE and shifted > rates["next"]:
        return "misaligned"
    return "aligned" if rates["next"] >= MIN_RATE else "inconclusive"


def _read_store(store_dir: str | Path, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_ids [T] int64, states [T, S, H])`` of sample ``i``; DataError when unreadable."""
    from eagle3.extract.store import load_sample

    try:
        s = load_sample(store_dir, i)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors' own error type for a damaged file
        raise DataError(f"{store_dir}/hidden_states: sample {i} unreadable "
                        f"({type(e).__name__}: {e})") from e
    return s["token_ids"].long(), s["hidden_states"]


def check_alignment(store_dir: str | Path, target_dir: str | Path,
                    groups: Sequence[Sequence[int]], *, budget: int = POSITIONS,
                    load: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None
                    ) -> dict:
    """Check every group of sample indices (a shard) of the hidden-states folder ``store_dir``
    against the target at ``target_dir``; ``load(i)`` reads sample ``i`` as ``(token_ids [T],
    states [T, S, H])`` (default: the store's files). Returns the manifest record ``{"status":
    "passed" | "skipped", "reason", "groups", "positions", "inconclusive" (groups), "rates"
    (pooled), "min_rate"}``. DataError ``HS_MISALIGNED`` naming the folder, the first misaligned
    group's samples and rates when a group of at least :data:`MIN_GROUP` positions, or the pool,
    is misaligned (:func:`verdict`)."""
    head = load_head(target_dir)
    budget = max(8, min(budget, MAX_POSITIONS // max(1, len(groups))))
    if head is None:
        log.warning("%s: hidden-state alignment not checked: no final norm / LM head found in "
                    "the safetensors of %s (names %s / %s)", store_dir, target_dir,
                    NORM_KEYS[0], HEAD_KEYS[0])
        return {"status": "skipped", "reason": f"no final norm or LM head in {target_dir}"}
    load = load or (lambda k: _read_store(store_dir, k))
    totals = {"previous": 0.0, "next": 0.0, "after_next": 0.0}
    inputs = {"before": 0.0, "own": 0.0, "after": 0.0}
    positions, inconclusive, bad = 0, 0, []
    for group in groups:
        r = agreement(head, [load(i) for i in group], budget)
        positions += r["positions"]
        for k in totals:
            totals[k] += r[k] * r["positions"]
        for k in r["input"]:
            inputs[k] += r["input"][k] * r["positions"]
        v = verdict(r)
        inconclusive += v == "inconclusive"
        if v == "misaligned" and r["positions"] >= MIN_GROUP:
            bad.append((list(group), r))
    rates = {k: v / max(1, positions) for k, v in totals.items()}
    rates["input"] = ({k: v / max(1, positions) for k, v in inputs.items()}
                      if head.embed is not None else {})
    if not bad and verdict(rates) == "misaligned":
        bad.append(([i for g in groups for i in g], {**rates, "positions": positions}))
    if bad:
        group, r = bad[0]
        span = f"{group[0]}..{group[-1]}" if group else "none"
        raise DataError(
            f"HS_MISALIGNED: {store_dir}/hidden_states: states shifted against their tokens "
            f"({len(bad)} finding(s) over {len(groups)} shards); samples {span}: "
            f"argmax(lm_head(norm(h_t))) matches token t+1 (aligned) at {r['next']:.1%}, token t "
            f"at {r['previous']:.1%}, token t+2 at {r['after_next']:.1%} of {r['positions']} "
            f"positions; the embedding nearest to the earliest stored layer is token t-1 / t / "
            f"t+1 at {_fmt(r.get('input'))}; expected the aligned rates highest (slot -1 of row t "
            "= last layer output at token t). Re-extract, or fix the tool that wrote the store")
    return {"status": "passed", "groups": len(groups), "positions": positions,
            "inconclusive": inconclusive, "rates": rates, "min_rate": MIN_RATE}


def _fmt(inp: dict | None) -> str:
    """``a% / b% / c%`` of the input rates (before, own, after), ``n/a`` without them."""
    return " / ".join(f"{inp[k]:.1%}" for k in ("before", "own", "after")) if inp else "n/a"
