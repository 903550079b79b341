"""Spread of an acceptance length over prompts: a seeded percentile bootstrap of the ratio of sums.

Statistic: 1 + Σ accepted / Σ verify passes (bonus counted; INTERNALS.md). Method (Efron &
Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13): resample units with replacement,
report the ``(1-c)/2`` and ``(1+c)/2`` quantiles (numpy linear). The unit is the *conversation*
(``unit_key``; MT-Bench turns share turn 1: a cluster bootstrap); PCG64 seeded with ``seed``. It
measures prompt choice, not decoding noise (greedy has none) nor training noise."""

from __future__ import annotations

import numpy as np

from eagle3.errors import DataError

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95
METHOD = ("percentile bootstrap over conversations (both turns of an MT-Bench question drawn "
          "together) of 1 + sum(accepted drafts) / sum(verify passes)")


def _units(rows: list[dict], unit_key: str) -> tuple[np.ndarray, np.ndarray]:
    units: dict[str, list[int]] = {}
    for r in rows:
        u = units.setdefault(str(r.get(unit_key, r.get("id"))), [0, 0])
        u[0] += int(sum(r["accepted_per_position"]))
        u[1] += int(r["verify_ct"])
    both = np.array(list(units.values()), dtype=np.float64).reshape(-1, 2)
    return both[:, 0], both[:, 1]


def bootstrap_acceptance(rows: list[dict], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                         confidence: float = DEFAULT_CONFIDENCE, unit_key: str = "conversation",
                         chunk: int = 500) -> dict:
    """Percentile-bootstrap interval of ``rows``' acceptance length: ``{"low", "high", "confidence",
    "resamples", "seed", "units", "method"}``. Raises DataError for no rows, a row without verify
    passes, ``resamples < 1000`` or a confidence outside (0, 1)."""
    if not rows:
        raise DataError("bootstrap: expected at least one request row, got none")
    if resamples < 1000 or not 0.0 < confidence < 1.0:
        raise DataError("bootstrap: expected resamples >= 1000 and 0 < confidence < 1, got "
                        f"{resamples}, {confidence}")
    bad = [r.get("id") for r in rows if int(r["verify_ct"]) <= 0]
    if bad:
        raise DataError(f"bootstrap: rows {bad[:5]} have verify_ct <= 0 (expected > 0)")
    acc, ver = _units(rows, unit_key)
    rng = np.random.Generator(np.random.PCG64(seed))
    stats = []
    for start in range(0, resamples, chunk):
        pick = rng.integers(0, acc.size, size=(min(chunk, resamples - start), acc.size))
        stats.append(1.0 + acc[pick].sum(1) / ver[pick].sum(1))
    low, high = np.quantile(np.concatenate(stats), [(1 - confidence) / 2, (1 + confidence) / 2])
    return {"low": float(low), "high": float(high), "confidence": confidence,
            "resamples": resamples, "seed": seed, "units": int(acc.size), "method": METHOD}
