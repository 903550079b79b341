"""lab/fidelity_compare.py: per-pass counts from SGLang's streamed counters, the first place two
engines part, and the rounding-or-real verdict (the comparison logic of lab/sglang_fidelity.py)."""

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO))
from lab.fidelity_compare import (  # noqa: E402
    compare_request,
    explain_margin,
    first_difference,
    pass_start_position,
    passes_from_stream,
    pooled,
)

sys.path.remove(str(REPO))


def _rec(out, counts):
    return {
        "output_ids": out,
        "accept_counts": counts,
        "verify_ct": len(counts),
        "accepted": sum(c for c in counts if c is not None),
    }


def test_passes_from_stream_reads_one_chunk_per_pass_and_cuts_the_last_at_the_budget():
    # prefill token, pass 0 accepts 2 (3 tokens), pass 1 accepts 0, pass 2 accepted 3 but only 2
    # tokens fit
    assert passes_from_stream([1, 4, 5, 7], verify_ct=3, correct_drafts=5) == [2, 0, 3]
    assert passes_from_stream([1, 4, 5, 7, 7], verify_ct=3, correct_drafts=5) == [
        2,
        0,
        3,
    ]  # a meta-only chunk
    # two passes coalesced into one chunk: no pass is known individually
    assert passes_from_stream([1, 5, 7], verify_ct=3, correct_drafts=5) == [None, None, None]
    assert passes_from_stream([1, 4, 8], verify_ct=2, correct_drafts=3) == [
        None,
        None,
    ]  # totals contradict
    with pytest.raises(ValueError, match="go backwards"):
        passes_from_stream([1, 4, 3], verify_ct=2, correct_drafts=1)


def test_first_difference_and_pass_start():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2
    assert pass_start_position([2, 0, 1], 0) == 1 and pass_start_position([2, 0, 1], 2) == 1 + 3 + 1


def test_identical_engines_agree_everywhere():
    tgt = [5, 6, 7, 8, 9, 10]
    c = compare_request(tgt, _rec(tgt, [2, 0, 1]), _rec(tgt, [2, 0, 1]))
    assert c["outputs"] == {
        "reference_equals_target": True,
        "sglang_equals_target": True,
        "engines_equal": True,
        "first_output_difference": None,
    }
    assert c["accept_counts_equal"] and c["first_pass_difference"] is None
    assert c["acceptance"] == {"reference": 2.0, "sglang": 2.0}


def test_a_pass_that_accepts_differently_is_located():
    tgt = [5, 6, 7, 8, 9, 10, 11]
    c = compare_request(tgt, _rec(tgt, [2, 0, 1, 0]), _rec(tgt, [2, 1, None, 0]))
    assert c["first_pass_difference"] == {
        "pass": 1,
        "position": 4,
        "reference": 0,
        "sglang": 1,
        "draft_step": 0,
    }
    assert c["acceptance"]["reference"] == pytest.approx(1 + 3 / 4)
    assert c["acceptance"]["sglang"] == pytest.approx(
        1 + 3 / 4
    )  # accepted counts the known passes only here


def test_an_output_that_leaves_the_target_is_named_with_its_position():
    tgt = [5, 6, 7, 8]
    c = compare_request(tgt, _rec(tgt, [1, 1]), _rec([5, 6, 3, 8], [1, 1]))
    assert c["outputs"]["first_output_difference"] == {
        "engine": "sglang",
        "position": 2,
        "expected": 7,
        "got": 3,
    }
    assert not c["outputs"]["sglang_equals_target"] and not c["outputs"]["engines_equal"]
    assert c["outputs"]["reference_equals_target"]


def test_pooled_is_token_weighted():
    p = pooled([_rec([1], [3, 3]), _rec([1], [0, 0, 0, 0, 0, 0])])
    assert p == {"verify_ct": 8, "accepted": 6, "acceptance": pytest.approx(1.75)}


def test_explain_margin_separates_a_rounding_tie_from_a_real_difference():
    assert "near-tie" in explain_margin(1e-5, 20.0, "x")
    assert "far above float32 rounding" in explain_margin(0.5, 20.0, "x")
    assert "outside the draft vocabulary" in explain_margin(None, 20.0, "x")


def test_diagnose_output_calls_a_runner_up_pick_a_tie_only_when_the_gap_is_tiny():
    sys.path.insert(0, str(REPO))
    try:
        from lab.sglang_fidelity import diagnose_output
    finally:
        sys.path.remove(str(REPO))
    margins = [
        {"top2": [7, 9], "gap": 2e-6, "scale": 30.0},
        {"top2": [4, 5], "gap": 3.0, "scale": 30.0},
    ]
    assert (
        "near-tie" in diagnose_output({"engine": "sglang", "position": 0, "got": 9}, margins)["why"]
    )
    assert (
        "far above float32 rounding"
        in diagnose_output({"engine": "sglang", "position": 1, "got": 5}, margins)["why"]
    )
    assert (
        "neither the target's top-1"
        in diagnose_output({"engine": "sglang", "position": 1, "got": 8}, margins)["why"]
    )
    assert (
        "length differs"
        in diagnose_output({"engine": "sglang", "position": 2, "got": None}, margins)["why"]
    )
