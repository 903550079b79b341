"""Parsing of every generation of SGLang's acceptance fields, on recorded-shape responses written
here as small JSON fixtures (field names and formulas from sglang 0.5.23's tokenizer_manager.py /
metrics_collector.py)."""

from __future__ import annotations

import json

import pytest

from eagle3.measure.acceptance import (
    aggregate,
    parse_meta_info,
    parse_prometheus,
    parse_server_info,
    per_position_from_histogram,
    server_window,
)
from eagle3.errors import DataError

# /generate responses, one per field generation (num_steps 3 → 3 proposed drafts per verify pass).
# In the 0.5.23 one, 69 completion tokens = 1 (prefill) + 38 accepted drafts + 30 bonus tokens (one
# per verify pass).
OLD_VERIFY_ONLY = json.loads("""{"text": "Paris is the capital.", "meta_info": {"id": "a1",
  "finish_reason": {"type": "length", "length": 64}, "prompt_tokens": 31, "completion_tokens": 64,
  "cached_tokens": 0, "spec_verify_ct": 40}}""")
SGLANG_0_5_23 = json.loads("""{"text": "...", "meta_info": {"id": "b2", "prompt_tokens": 40,
  "completion_tokens": 69, "spec_accept_rate": 0.4222222, "spec_accept_length": 2.3,
  "spec_num_correct_drafts": 38, "spec_num_proposed_drafts": 90, "spec_verify_ct": 30,
  "spec_correct_drafts_histogram": [10, 8, 6, 6]}}""")
MIDDLE_BUILD = json.loads("""{"text": "...", "meta_info": {"id": "c3", "prompt_tokens": 12,
  "completion_tokens": 50, "spec_accept_token_num": 20, "spec_draft_token_num": 90,
  "spec_accept_histogram": [15, 10, 5]}}""")
MIDDLE_NO_HIST = json.loads("""{"meta_info": {"completion_tokens": 50, "spec_accept_token_num": 20,
  "spec_draft_token_num": 90}}""")
NO_SPEC = json.loads(
    """{"text": "...", "meta_info": {"prompt_tokens": 12, "completion_tokens": 64}}"""
)

SERVER_INFO = json.loads("""{"model_path": "/m", "version": "0.5.23",
  "internal_states": [{"avg_spec_accept_length": 2.5, "last_gen_throughput": 10.0},
                      {"avg_spec_accept_length": 1.5}]}""")

METRICS_TEXT = """# HELP sglang:spec_accept_length The average acceptance length of speculative \
decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m",engine_type="unified"} 2.25
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m",is_streaming="true"} 300.0
sglang:generation_tokens_total{model_name="m",is_streaming="false"} 100.0
sglang:generation_tokens_created{model_name="m",is_streaming="true"} 1.7e9
# HELP sglang:spec_verify_calls_total Number of verify calls.
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{model_name="m"} 160.0
"""


def test_old_verify_ct_only():
    r = parse_meta_info(OLD_VERIFY_ONLY["meta_info"])
    assert r.generation == "verify_ct-only"
    assert r.acceptance_length == pytest.approx(1 + (64 - 1 - 40) / 40)  # accepted derived: 23
    assert r.sglang_accept_length == pytest.approx(64 / 40)
    assert r.acceptance_rate is None and r.histogram is None


def test_sglang_0_5_23_fields_and_histogram():
    r = parse_meta_info(SGLANG_0_5_23["meta_info"])
    assert r.generation == "sglang-0.5.23"
    assert r.acceptance_length == pytest.approx(1 + 38 / 30)  # 1.0 would be nothing accepted
    assert r.sglang_accept_length == pytest.approx(
        2.3
    )  # SGLang's figure also counts the prefill token
    assert r.acceptance_rate == pytest.approx(38 / 90)
    assert (r.accepted_drafts, r.proposed_drafts) == (38, 90)
    assert r.notes == []  # server's spec_accept_length agrees with completion / verify
    # position k accepted in passes with >= k accepted drafts: (8+6+6)/30, (6+6)/30, 6/30
    assert per_position_from_histogram(r.histogram) == pytest.approx([20 / 30, 12 / 30, 6 / 30])


def test_middle_build_with_histogram():
    r = parse_meta_info(MIDDLE_BUILD["meta_info"])
    assert r.generation == "middle"
    assert r.verify_ct == 30  # sum of the histogram
    assert r.acceptance_length == pytest.approx(1 + 20 / 30)
    assert r.acceptance_rate == pytest.approx(20 / 90)


def test_middle_build_without_histogram_derives_verify_passes():
    r = parse_meta_info(MIDDLE_NO_HIST["meta_info"])
    assert (
        r.verify_ct == 30
    )  # 50 completion tokens - 20 accepted drafts = 30 passes (one bonus each)
    assert "completion_tokens - accepted" in r.notes[0]


def test_no_speculation_is_reported_not_invented():
    r = parse_meta_info(NO_SPEC["meta_info"])
    assert r.generation == "none" and r.verify_ct is None and r.acceptance_length is None
    agg = aggregate([r])
    assert agg["acceptance_length"] is None and agg["num_speculative_requests"] == 0


def test_inconsistent_server_length_is_noted():
    meta = dict(SGLANG_0_5_23["meta_info"], spec_accept_length=3.0)  # not 69 / 30
    assert "!=" in parse_meta_info(meta).notes[0]


@pytest.mark.parametrize(
    "meta, key",
    [
        ({}, "completion_tokens"),
        ({"completion_tokens": "5"}, "completion_tokens"),
        ({"completion_tokens": 5, "spec_verify_ct": -1}, "spec_verify_ct"),
        ({"completion_tokens": 5, "spec_accept_histogram": [1, "x"]}, "spec_accept_histogram"),
    ],
)
def test_bad_fields_raise_naming_the_key(meta, key):
    with pytest.raises(DataError, match=key):
        parse_meta_info(meta)


def test_aggregate_is_token_weighted_across_generations():
    recs = [
        parse_meta_info(x["meta_info"])
        for x in (OLD_VERIFY_ONLY, SGLANG_0_5_23, MIDDLE_BUILD, NO_SPEC)
    ]
    agg = aggregate(recs)
    assert agg["acceptance_length"] == pytest.approx(1 + (23 + 38 + 20) / (40 + 30 + 30))
    assert agg["acceptance_length_sglang"] == pytest.approx((64 + 69 + 50) / (40 + 30 + 30))
    assert agg["mean_request_acceptance_length"] == pytest.approx(
        (1 + 23 / 40 + 1 + 38 / 30 + 1 + 20 / 30) / 3
    )
    assert agg["acceptance_rate"] == pytest.approx((38 + 20) / (90 + 90))
    assert agg["histogram"] == [25, 18, 11, 6]
    assert agg["generations"] == ["middle", "none", "sglang-0.5.23", "verify_ct-only"]


def test_server_info_mean_over_dp_ranks():
    assert parse_server_info(SERVER_INFO)["avg_spec_accept_length"] == pytest.approx(2.0)
    assert parse_server_info({"internal_states": [{}]})["avg_spec_accept_length"] is None
    with pytest.raises(DataError, match="internal_states"):
        parse_server_info({"internal_states": {"a": 1}})


def test_prometheus_parsing_sums_counters_and_skips_created():
    m = parse_prometheus(METRICS_TEXT)
    assert m["spec_accept_length"] == pytest.approx(2.25)
    assert m["generation_tokens_total"] == pytest.approx(400.0)
    assert m["spec_verify_calls_total"] == pytest.approx(160.0)
    assert m["spec_accept_rate"] is None


def test_server_window_prefers_counter_difference():
    before = {
        "metrics": {"generation_tokens_total": 100.0, "spec_verify_calls_total": 100.0},
        "server_info": {"avg_spec_accept_length": 1.0},
    }
    after = {
        "metrics": parse_prometheus(METRICS_TEXT),
        "server_info": parse_server_info(SERVER_INFO),
    }
    w = server_window(before, after)
    assert w["method"] == "prometheus_counter_difference"
    assert w["server_acceptance_length"] == pytest.approx(300 / 60)


def test_server_window_from_server_info():
    after = {"server_info": {"avg_spec_accept_length": 2.2}, "metrics": None}
    w = server_window({"server_info": {"avg_spec_accept_length": None}}, after)
    assert (w["method"], w["server_acceptance_length"]) == ("server_info_since_start", 2.2)
    w = server_window({"server_info": {"avg_spec_accept_length": 1.5}}, after)
    assert w["method"] == "server_info_cumulative_not_differenced" and w["before"] == 1.5
    assert server_window({}, {})["server_acceptance_length"] is None


def test_serving_gap_compares_accepted_drafts_not_lengths():
    from eagle3.measure.acceptance import serving_gap

    assert serving_gap(
        1.00, 1.24
    )  # collapse of a weak-but-working draft: 0.00 vs 0.24 accepted/pass
    assert not serving_gap(1.22, 1.24)  # served ≈ offline
    assert not serving_gap(1.00, 1.03)  # offline accepts ~nothing: no evidence of a serving fault
    assert serving_gap(None, 1.5)  # no speculative fields at all while offline accepts
    assert serving_gap(1.9, 3.0) and not serving_gap(2.5, 3.0)


def test_a_never_accepted_draft_reads_exactly_one():
    """64 new tokens, nothing accepted: 1 prefill token + 63 verify passes of one bonus token
    each."""
    meta = {
        "completion_tokens": 64,
        "spec_verify_ct": 63,
        "spec_num_correct_drafts": 0,
        "spec_num_proposed_drafts": 189,
        "spec_accept_length": 64 / 63,
        "spec_accept_rate": 0.0,
    }
    r = parse_meta_info(meta)
    assert r.acceptance_length == 1.0 and r.notes == []
    assert r.sglang_accept_length == pytest.approx(1.015873)
    without_count = parse_meta_info(
        {"completion_tokens": 64, "spec_verify_ct": 63}
    )  # old build: derived
    assert without_count.acceptance_length == 1.0
    assert aggregate([r, without_count])["acceptance_length"] == 1.0
