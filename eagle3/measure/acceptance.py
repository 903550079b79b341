"""SGLang's acceptance fields, every generation of them, in one shape (docs/ENGINE_FACTS.md §4).

Per request (``meta_info``): old builds send ``spec_verify_ct``; middle builds
``spec_accept_token_num`` (bonus excluded), ``spec_draft_token_num``, ``spec_accept_histogram``;
the profile's release (``managers/tokenizer_manager.py``) ``spec_verify_ct``,
``spec_accept_length``, ``spec_accept_rate``, ``spec_num_correct_drafts``,
``spec_num_proposed_drafts``, ``spec_correct_drafts_histogram`` (``h[j]``: passes accepting
exactly j). Server-wide: ``/get_server_info`` ``internal_states[i].avg_spec_accept_length``
(cumulative) and Prometheus ``sglang:spec_accept_length`` / ``spec_accept_rate`` (gauges),
``generation_tokens_total`` / ``spec_verify_calls_total`` (counters, differenced).

Convention (INTERNALS.md): acceptance length = 1 + accepted drafts / verify passes (bonus counted,
≤ num_steps + 1). SGLang's ``spec_accept_length`` also counts the prefill token (N/(N-1) when
nothing is accepted); kept as ``acceptance_length_sglang``. Without an accepted count: accepted =
completion_tokens - 1 - verify passes."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from itertools import zip_longest
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from eagle3.engines.sglang.profile import VERSION
from eagle3.errors import DataError

HISTOGRAM_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def exact_acceptance_length(accepted_drafts: int, verify_ct: int) -> float:
    """1 + accepted drafts / verify passes. Raises DataError for verify_ct <= 0."""
    if verify_ct <= 0:
        raise DataError(f"acceptance length: verify_ct expected > 0, got {verify_ct}")
    return 1.0 + accepted_drafts / verify_ct


@dataclass
class RequestAcceptance:
    """One request's acceptance (``verify_ct`` None: no speculation; drafts bonus excluded);
    ``generation``: "sglang-<VERSION>", "middle", "verify_ct-only" or "none"."""

    completion_tokens: int
    verify_ct: int | None = None
    accepted_drafts: int | None = None
    proposed_drafts: int | None = None
    histogram: list[int] | None = None
    server_accept_length: float | None = None
    server_accept_rate: float | None = None
    generation: str = "none"
    notes: list[str] = field(default_factory=list)

    @property
    def accepted_or_derived(self) -> int | None:
        """The server's count, else completion_tokens - 1 - verify_ct (>= 0)."""
        if not self.verify_ct:
            return None
        return (self.accepted_drafts if self.accepted_drafts is not None
                else max(self.completion_tokens - 1 - self.verify_ct, 0))

    @property
    def acceptance_length(self) -> float | None:
        """1 + accepted drafts / verify_ct (module docstring); None without speculation."""
        return (exact_acceptance_length(self.accepted_or_derived, self.verify_ct)
                if self.verify_ct else None)

    @property
    def sglang_accept_length(self) -> float | None:
        """completion_tokens / verify_ct: SGLang's ``spec_accept_length``."""
        return self.completion_tokens / self.verify_ct if self.verify_ct else None

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / proposed draft tokens (bonus excluded); the server's figure if it sent one."""
        if self.server_accept_rate is not None:
            return self.server_accept_rate
        if self.accepted_drafts is not None and self.proposed_drafts:
            return self.accepted_drafts / self.proposed_drafts
        return None

    def to_dict(self) -> dict:
        return {**asdict(self), "acceptance_length": self.acceptance_length,
                "acceptance_length_sglang": self.sglang_accept_length,
                "acceptance_rate": self.acceptance_rate}


def _number(meta: dict, key: str, integer: bool) -> float | int | None:
    """``meta[key]`` as an int >= 0 (``integer``) or a finite float; None when absent; DataError
    naming the key and the value otherwise."""
    value = meta.get(key)
    if value is None:
        return None
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if integer and not (ok and value >= 0 and value == int(value)):
        raise DataError(f"meta_info[{key!r}]: expected an int >= 0, got {value!r}")
    if not ok:
        raise DataError(f"meta_info[{key!r}]: expected a finite number, got {value!r}")
    return int(value) if integer else float(value)


def _histogram(meta: dict) -> list[int] | None:
    key = next((k for k in HISTOGRAM_KEYS if meta.get(k) is not None), None)
    if key is None:
        return None
    value = meta[key]
    if not isinstance(value, list) or not all(isinstance(v, int) and v >= 0 for v in value):
        raise DataError(f"meta_info[{key!r}]: expected a list of ints >= 0, got {value!r}")
    return list(value)


def parse_meta_info(meta: dict) -> RequestAcceptance:
    """``meta_info`` → :class:`RequestAcceptance`. verify_ct: ``spec_verify_ct``, else the
    histogram's sum, else ``completion_tokens - spec_accept_token_num``. Raises DataError for a
    non-mapping, missing ``completion_tokens`` or a wrongly typed field (key and value named)."""
    if not isinstance(meta, dict):
        raise DataError(f"meta_info: expected a JSON object, got {type(meta).__name__}")
    if meta.get("completion_tokens") is None:
        raise DataError("meta_info: key 'completion_tokens' expected (an int >= 0), got it "
                        f"missing; keys: {sorted(meta)}")
    n = {k: _number(meta, k, True) for k in (
        "completion_tokens", "spec_verify_ct", "spec_num_correct_drafts",
        "spec_num_proposed_drafts", "spec_accept_token_num", "spec_draft_token_num")}
    completion = n["completion_tokens"]
    rec = RequestAcceptance(completion_tokens=completion, verify_ct=n["spec_verify_ct"],
                            histogram=_histogram(meta),
                            server_accept_length=_number(meta, "spec_accept_length", False),
                            server_accept_rate=_number(meta, "spec_accept_rate", False))
    correct, proposed = n["spec_num_correct_drafts"], n["spec_num_proposed_drafts"]
    mid_accept, mid_draft = n["spec_accept_token_num"], n["spec_draft_token_num"]
    if correct is not None or rec.server_accept_length is not None:
        rec.generation = f"sglang-{VERSION}"
        rec.accepted_drafts, rec.proposed_drafts = correct, proposed
    elif mid_accept is not None or mid_draft is not None or "spec_accept_histogram" in meta:
        rec.generation = "middle"
        rec.accepted_drafts, rec.proposed_drafts = mid_accept, mid_draft
    elif rec.verify_ct is not None:
        rec.generation = "verify_ct-only"
    if rec.verify_ct is None and rec.histogram is not None:
        rec.verify_ct = sum(rec.histogram)
        rec.notes.append("verify_ct = sum(histogram)")
    if rec.verify_ct is None and rec.accepted_drafts is not None:
        rec.verify_ct = max(completion - rec.accepted_drafts, 0)
        rec.notes.append("verify_ct = completion_tokens - accepted drafts")
    if rec.accepted_drafts is None and rec.histogram is not None:
        rec.accepted_drafts = sum(j * n for j, n in enumerate(rec.histogram))
    if rec.verify_ct == 0 and completion > 0 and rec.generation != "none":
        rec.notes.append("spec fields present but 0 verify passes")
    if rec.server_accept_length is not None and rec.sglang_accept_length is not None:
        gap = abs(rec.server_accept_length - rec.sglang_accept_length)
        if gap > 1e-3 * max(1.0, rec.sglang_accept_length):
            rec.notes.append(f"server spec_accept_length {rec.server_accept_length:.4f} != "
                             f"completion/verify {rec.sglang_accept_length:.4f}")
    return rec


def per_position_from_histogram(histogram: list[int]) -> list[float]:
    """P(draft k accepted), k = 1..len(h)-1: ``sum_{j>=k} h[j] / sum(h)`` (chain); [] when empty."""
    total = sum(histogram)
    return [sum(histogram[k:]) / total for k in range(1, len(histogram))] if total > 0 else []


def all_positions_acceptance_length(histogram: list[int]) -> float | None:
    """The acceptance length averaged over every position a verify pass could start at, not only
    the positions decoding visits: ``sum_a (a + 1) h[a] / sum_a h[a]`` with ``h[a]`` the number of
    such positions whose chain would accept exactly ``a`` drafts (bonus counted, as
    :func:`exact_acceptance_length`). This is the average a teacher-forced simulated figure takes
    (every loss position is a start). Decoding jumps ``a + 1`` tokens after a pass, so a run of easy
    positions gets fewer passes than its length: with acceptance correlated along the text this
    figure exceeds the per-pass one. None for an empty histogram."""
    total = sum(histogram)
    return sum((a + 1) * n for a, n in enumerate(histogram)) / total if total > 0 else None


def sum_lists(lists: list[list[int]]) -> list[int]:
    """Element-wise sums of lists of unequal lengths (missing entries count 0)."""
    return [sum(col) for col in zip_longest(*lists, fillvalue=0)]


def aggregate(records: list[RequestAcceptance]) -> dict:
    """Acceptance over many requests, token-weighted as SGLang's server-wide figure (None where
    unknown); ``mean_request_acceptance_length`` unweighted; ``per_position`` from the summed
    ``histogram``; counts and the ``generations`` seen."""
    spec = [r for r in records if r.verify_ct]
    total_verify = sum(r.verify_ct for r in spec)
    with_rate = [r for r in spec if r.accepted_drafts is not None and r.proposed_drafts]
    hist = sum_lists([r.histogram for r in spec if r.histogram])
    rate = None
    if with_rate:
        rate = sum(r.accepted_drafts for r in with_rate) / sum(r.proposed_drafts for r in with_rate)
    elif spec and all(r.server_accept_rate is not None for r in spec):
        rate = sum(r.server_accept_rate * r.verify_ct for r in spec) / total_verify
    return {"acceptance_length": exact_acceptance_length(
                sum(r.accepted_or_derived for r in spec), total_verify) if spec else None,
            "acceptance_length_sglang":
                sum(r.completion_tokens for r in spec) / total_verify if spec else None,
            "acceptance_rate": rate,
            "mean_request_acceptance_length":
                sum(r.acceptance_length for r in spec) / len(spec) if spec else None,
            "per_position": per_position_from_histogram(hist), "histogram": hist,
            "num_requests": len(records), "num_speculative_requests": len(spec),
            "completion_tokens": sum(r.completion_tokens for r in records),
            "verify_ct": total_verify, "generations": sorted({r.generation for r in records})}


def parse_server_info(info: Any) -> dict:
    """``/get_server_info`` → ``{"avg_spec_accept_length", "per_dp"}``; DataError if malformed."""
    if not isinstance(info, dict):
        raise DataError(f"server_info: expected a JSON object, got {type(info).__name__}")
    states = info.get("internal_states", [])
    if not isinstance(states, list):
        raise DataError("server_info['internal_states']: expected a list, got "
                        f"{type(states).__name__}")
    values = [st.get("avg_spec_accept_length") if isinstance(st, dict) else None for st in states]
    bad = next(((i, v) for i, v in enumerate(values) if v is not None
                and (isinstance(v, bool) or not isinstance(v, (int, float)))), None)
    if bad is not None:
        raise DataError(f"server_info internal_states[{bad[0]}].avg_spec_accept_length: "
                        f"expected a number, got {bad[1]!r}")
    values = [float(v) for v in values if v is not None]
    return {"avg_spec_accept_length": (sum(values) / len(values)) if values else None,
            "per_dp": values}


def parse_prometheus(text: str) -> dict:
    """Prometheus ``/metrics`` text → ``spec_accept_length``, ``spec_accept_rate`` (gauges, averaged
    over label sets), ``generation_tokens_total``, ``spec_verify_calls_total`` (counters, summed);
    None where absent. Raises DataError for text not in the exposition format."""
    wanted = {"sglang:spec_accept_length": "spec_accept_length",
              "sglang:spec_accept_rate": "spec_accept_rate",
              "sglang:generation_tokens": "generation_tokens_total",
              "sglang:spec_verify_calls": "spec_verify_calls_total"}
    acc: dict[str, list[float]] = {v: [] for v in wanted.values()}
    try:
        for fam in text_string_to_metric_families(text):
            key = wanted.get(fam.name) or wanted.get(fam.name.removesuffix("_total"))
            if key is not None:
                acc[key] += [float(s.value) for s in fam.samples
                             if not s.name.endswith("_created")]
    except ValueError as e:
        raise DataError(f"/metrics: not Prometheus text format ({e})") from e
    return {key: None if not vals else sum(vals) / (1 if key.endswith("_total") else len(vals))
            for key, vals in acc.items()}


def server_window(before: dict, after: dict) -> dict:
    """The server's own acceptance length over a run from before/after ``{"server_info",
    "metrics"}``: (1) Δgeneration_tokens_total / Δspec_verify_calls_total; (2) else
    ``avg_spec_accept_length`` if no spec traffic before; (3) else that ratio after, flagged not
    differenced. Returns ``{"server_acceptance_length", "method", ...}``."""
    before, after = before or {}, after or {}
    m0, m1 = before.get("metrics") or {}, after.get("metrics") or {}
    g1, v1 = m1.get("generation_tokens_total"), m1.get("spec_verify_calls_total")
    if None not in (g1, v1):
        dg = g1 - (m0.get("generation_tokens_total") or 0.0)
        dv = v1 - (m0.get("spec_verify_calls_total") or 0.0)
        if dv > 0:
            return {"server_acceptance_length": dg / dv, "method": "prometheus_counter_difference",
                    "delta_generation_tokens": dg, "delta_verify_calls": dv}
    s0 = (before.get("server_info") or {}).get("avg_spec_accept_length")
    s1 = (after.get("server_info") or {}).get("avg_spec_accept_length")
    if s1 is None:
        if m1.get("spec_accept_length") is not None:
            return {"server_acceptance_length": m1["spec_accept_length"],
                    "method": "prometheus_gauge_last_interval"}
        return {"server_acceptance_length": None, "method": "unavailable",
                "reason": "no avg_spec_accept_length in server_info and no spec counters in "
                          "/metrics"}
    if s0 is None:
        return {"server_acceptance_length": s1, "method": "server_info_since_start", "before": None,
                "after": s1}
    return {"server_acceptance_length": s1, "method": "server_info_cumulative_not_differenced",
            "before": s0, "after": s1,
            "reason": "avg_spec_accept_length is a cumulative ratio and the server had spec "
                      "traffic before the run; without counts it cannot be differenced"}


SERVING_EXCESS_RATIO = 0.7
MIN_OFFLINE_EXCESS = 0.05
# What to check when served ≪ offline (the gate's diagnosis, the decision's "fix serving" advice).
SERVING_FAULT_CHECKS = ("that the target captures the aux layers (fc is applied only to inputs of "
                        "the aux width), the tensor names the engine loaded, the speculative "
                        "flags, eagle_aux_hidden_state_layer_ids (output-of-layer convention) and "
                        "the chat template")


def serving_gap(served: float | None, offline: float | None, ratio: float = SERVING_EXCESS_RATIO,
                min_excess: float = MIN_OFFLINE_EXCESS) -> bool:
    """"Served ≪ offline": ``served − 1 < ratio × (offline − 1)`` (excess over the bonus
    token), only if ``offline − 1 ≥ min_excess``; ``served`` None counts as 1.0. 0.7 leaves 30 %
    for engine drift; a SmolLM2 draft without its aux states measured 0.073 vs 0.140 (ratio
    0.52)."""
    if offline is None or offline - 1.0 < min_excess:
        return False
    return (1.0 if served is None else served) - 1.0 < ratio * (offline - 1.0)


# The acceptance-length convention every report states (settings['convention'])
ACCEPTANCE_CONVENTION = (
    "acceptance_length = 1 + accepted draft tokens / verify passes (counts the bonus token; 1.0 = "
    "nothing accepted). acceptance_length_sglang = completion tokens / verify passes, SGLang "
    f"{VERSION}'s spec_accept_length, which also counts the first output token (made by the "
    "prefill pass, not a verify pass): N/(N-1) for a never-accepted draft, 1.016 at 64")
