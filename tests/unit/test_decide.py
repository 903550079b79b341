"""The decision rules on constructed histories, one per outcome, plus the sweep decision."""

from __future__ import annotations

import numpy as np
import pytest

from eagle3.decide import (
    OUTCOMES,
    Decision,
    Thresholds,
    recommend,
    sweep_decision,
    training_signals,
)
from eagle3.errors import DataError

FALLING = {
    "val_loss": [3.0, 2.7, 2.45, 2.25],
    "train_loss": [2.95, 2.66, 2.41, 2.2],
    "epochs": 2.0,
    "unique_tokens": 40_000,
}
OVERFIT = {
    "val_loss": [2.5, 2.4, 2.41, 2.43],
    "train_loss": [2.4, 2.1, 1.85, 1.6],
    "epochs": 4.0,
    "unique_tokens": 5_666,
}
MANY_EPOCHS = {
    "val_loss": [2.4, 2.35, 2.3, 2.25],
    "train_loss": [2.38, 2.33, 2.28, 2.23],
    "epochs": 12.0,
}
FLAT = {"val_loss": [2.3, 2.3, 2.299, 2.3], "train_loss": [2.29, 2.29, 2.289, 2.29], "epochs": 3.0}


def test_signals_slope_and_gap():
    s = training_signals(FALLING)
    tail = FALLING["val_loss"][-3:]
    assert s["val_slope_rel"] == pytest.approx(((2.25 - 2.7) / 2) / (sum(tail) / 3))
    assert s["gap_rel"] == pytest.approx((2.25 - 2.2) / 2.2)
    assert s["gap_growth"] == pytest.approx((0.05 - 0.04) / 2.2)


def test_served_far_below_offline_is_a_serving_fault():
    d = recommend(FALLING, {"served": 1.01, "offline": 1.6, "simulated": 1.65})
    assert d.recommendation == "fix serving integration" and d.rule == "served_below_offline"
    assert "the target captures the aux layers" in d.to_markdown()


def test_fix_serving_carries_its_served_vs_offline_evidence_and_the_preflight():
    pre = {"aux_capture": "passed: LlamaForCausalLM captures aux states in SGLang 0.5.23"}
    d = recommend(FALLING, {"served": 1.05, "offline": 1.55, "simulated": 1.6, "preflight": pre})
    assert d.recommendation == "fix serving integration"
    ev = d.evidence
    assert ev["served_excess"] == pytest.approx(0.05) and ev["offline_excess"] == pytest.approx(
        0.55
    )
    assert ev["excess_ratio"] == pytest.approx(0.05 / 0.55) and ev["serving_gap_ratio"] == 0.7
    assert ev["preflight.aux_capture"].startswith("passed")
    tags = d.tags()
    assert tags["decision.excess_ratio"] == "0.09091" and "ratio 0.09" in d.to_markdown()
    near = recommend(
        FALLING, {"served": 1.45, "offline": 1.55, "simulated": 1.6}
    )  # within the ratio: no fault
    assert near.recommendation != "fix serving integration"


def test_served_below_simulated_without_offline_is_low_confidence_serving_fault():
    d = recommend(FALLING, {"served": 1.0, "offline": None, "simulated": 1.6})
    assert (d.recommendation, d.confidence) == ("fix serving integration", "low")


def test_val_loss_falling_small_gap_means_longer_training():
    d = recommend(FALLING, {"served": 1.3, "offline": 1.32, "simulated": 1.35})
    assert d.recommendation == "longer training" and d.rule == "val_loss_falling"
    assert d.tags()["decision"] == "longer training"
    assert float(d.tags()["decision.val_slope_rel"]) < 0


def test_overfitting_means_more_data():
    d = recommend(OVERFIT, {"served": 1.24, "offline": 1.25})
    assert d.recommendation == "more data" and d.rule == "overfitting"
    assert any("5,666 unique" in r for r in d.reasons)


def test_many_epochs_means_more_data_even_while_falling():
    d = recommend(MANY_EPOCHS, {"served": 1.3, "offline": 1.3})
    assert d.recommendation == "more data" and d.rule == "high_epochs"


def test_target_reached_or_plateau_means_stop():
    assert (
        recommend(FALLING, {"served": 2.1, "offline": 2.1, "target": 2.0}).rule == "target_reached"
    )
    d = recommend(FLAT, {"served": 1.50, "offline": 1.52, "history": [1.2, 1.49]})
    assert d.recommendation == "stop" and d.rule == "acceptance_plateau"
    # same flat losses but acceptance still moving: not a plateau → both losses flat → more data
    # (low confidence)
    d2 = recommend(FLAT, {"served": 1.50, "offline": 1.52, "history": [1.2, 1.3]})
    assert (d2.recommendation, d2.rule, d2.confidence) == ("more data", "losses_flat", "low")


def test_thresholds_change_the_outcome():
    # with a very strict epsilon, FALLING no longer counts as "still falling" -> not longer training
    d = recommend(FALLING, {"served": 1.3}, Thresholds(slope_eps=0.5))
    assert d.recommendation != "longer training"


def test_too_few_evals_and_bad_values():
    d = recommend({"val_loss": [2.0], "train_loss": 1.9}, {"served": 1.2})
    # one evaluation is no trend: say so rather than pick an answer the evidence does not support
    assert (d.recommendation, d.rule, d.confidence) == (
        "more evidence needed",
        "too_few_evaluations",
        "low",
    )
    assert "fewer than 2 evaluations" in d.reasons[0] and "train.eval_every" in d.reasons[1]
    assert d.tags()["decision"] == "more evidence needed"
    d = recommend({"val_loss": [2.0], "train_loss": 1.9, "epochs": 8.0}, {"served": 1.2})
    assert (d.recommendation, d.rule, d.confidence) == ("more data", "high_epochs", "low")
    with pytest.raises(DataError, match="val_loss"):
        recommend({"val_loss": [2.0, "x"]}, {"served": 1.2})


def test_markdown_lists_evidence():
    md = recommend(OVERFIT, {"served": 1.24, "offline": 1.25}).to_markdown()
    assert md.startswith("# Decision: **more data**")
    assert "| served | 1.24 |" in md and "| epochs | 4 |" in md
    assert all(o in OUTCOMES for o in ("more data", "stop"))
    assert isinstance(Decision("stop", "r", []).to_dict(), dict)


def _sweep(acc):
    """Results for sizes 128/256 × schedules; acc(size, schedule) gives the acceptance length."""
    out = []
    for size, uniq in ((128, 5000), (256, 9000), (512, 16000)):
        for sched, epochs, steps in (("cosine-3ep", 3, 3 * size), ("constant-long", 8, 8 * size)):
            out.append(
                {
                    "data_size": size,
                    "schedule": sched,
                    "unique_tokens": uniq,
                    "epochs": epochs,
                    "optimizer_steps": steps,
                    "acceptance_length": acc(size, sched),
                    "offline": None,
                }
            )
    return out


def test_sweep_data_dominates(tmp_path):
    res = _sweep(
        lambda n, s: 1.1 + 0.1 * {128: 0, 256: 1, 512: 2}[n] + (0.02 if s == "constant-long" else 0)
    )
    d = sweep_decision(res, plot_path=tmp_path / "scaling.png")
    assert d.recommendation == "more data"
    xs = np.log2([5000, 9000, 16000])
    assert d.evidence["data_gain_per_doubling"] == pytest.approx(
        np.polyfit(xs, [1.1, 1.2, 1.3], 1)[0]
    )
    assert (tmp_path / "scaling.png").stat().st_size > 1000


def test_sweep_schedule_dominates_and_plateau_and_serving():
    res = _sweep(
        lambda n, s: 1.1 + 0.01 * {128: 0, 256: 1, 512: 2}[n] + (0.2 if s == "constant-long" else 0)
    )
    d = sweep_decision(res)
    assert (
        d.recommendation == "longer training" and d.evidence["longest_schedule"] == "constant-long"
    )
    flat = sweep_decision(_sweep(lambda n, s: 1.2))
    assert flat.recommendation == "stop" and flat.rule == "sweep_plateau"
    broken = _sweep(lambda n, s: 1.3)
    broken[2]["acceptance_length"], broken[2]["offline"] = 1.0, 1.4
    assert sweep_decision(broken).recommendation == "fix serving integration"
    with pytest.raises(DataError, match="unique_tokens"):
        sweep_decision([{"data_size": 1, "schedule": "a", "acceptance_length": 1.0}])


def test_a_sweep_where_no_draft_token_is_accepted_asks_for_evidence_not_a_stop():
    d = sweep_decision(_sweep(lambda n, s: 1.0))
    assert (d.recommendation, d.rule, d.confidence) == ("more evidence needed",
                                                        "nothing_accepted", "low")
    one = sweep_decision([r for r in _sweep(lambda n, s: 1.2) if r["schedule"] == "cosine-3ep"])
    assert "another data variant: n/a (one variant)" in "\n".join(one.reasons)
    assert "variant None" not in "\n".join(one.reasons)


def test_history_from_metrics_aligns_train_loss_with_evals():
    from eagle3.decide import history_from_metrics

    rows = [{"step": s, "train/loss": 3.0 - 0.1 * s} for s in range(1, 9)]
    rows += [{"step": 4, "val/loss": 2.8}, {"step": 8, "val/loss": 2.5}]
    h = history_from_metrics(rows, epochs=2.0, unique_tokens=1234)
    assert h["val_loss"] == [2.8, 2.5]
    assert h["train_loss"] == pytest.approx([2.6, 2.2])
    assert (h["epochs"], h["unique_tokens"]) == (2.0, 1234)


def test_gap_growth_below_zero_is_not_overfitting():
    """Measured on SmolLM2 (64 conversations, 1.5 epochs): val below train, train falling faster
    early on."""
    hist = {"val_loss": [13.26, 12.93], "train_loss": [17.78, 14.2], "epochs": 1.5}
    d = recommend(hist, {"served": 1.14, "offline": 1.14, "simulated": 1.21})
    assert d.recommendation == "longer training"


def test_a_loss_of_exactly_zero_gives_no_slope_instead_of_dividing_by_zero():
    zero = {"val_loss": [0.0, 0.0, 0.0], "train_loss": [0.0, 0.0, 0.0], "epochs": 1.0}
    s = training_signals(zero)
    assert s["val_slope_rel"] is None and s["train_slope_rel"] is None
    assert (
        recommend(zero, {"served": 1.0, "offline": 1.0, "simulated": 1.0}).recommendation
        in OUTCOMES
    )


def test_sweep_regenerated_data_dominates_and_one_point_is_too_little_evidence():
    res = _sweep(lambda n, s: 1.1 + 0.02 * {128: 0, 256: 1, 512: 2}[n])
    regen = [
        {**r, "data": "regenerated", "acceptance_length": r["acceptance_length"] + 0.5} for r in res
    ]
    d = sweep_decision([{**r, "data": "as-is"} for r in res] + regen)
    assert (d.recommendation, d.rule) == ("regenerate data", "data_variant_gain_dominates")
    assert d.evidence["data_variant"] == "regenerated" and d.evidence[
        "data_variant_gain"
    ] == pytest.approx(0.5)
    one = sweep_decision([res[0]])
    assert (one.recommendation, one.rule, one.confidence) == (
        "more evidence needed",
        "no_lever_measured",
        "low",
    )


def test_one_measured_lever_recommends_it_at_medium_confidence_and_names_the_levers_not_weighed():
    """Two data sizes of one variant and one schedule (lab/NOTEBOOK.md, "Sweeps")."""
    rows = [
        {
            "data": "regenerated",
            "data_size": 1000,
            "schedule": "cosine-3ep",
            "unique_tokens": 565_513,
            "acceptance_length": 1.379,
        },
        {
            "data": "regenerated",
            "data_size": 3000,
            "schedule": "cosine-3ep",
            "unique_tokens": 1_634_591,
            "acceptance_length": 1.543,
        },
    ]
    d = sweep_decision(rows)
    assert (d.recommendation, d.rule, d.confidence) == (
        "more data",
        "data_gain_dominates",
        "medium",
    )
    assert d.evidence["data_gain_per_doubling"] == pytest.approx(
        (1.543 - 1.379) / np.log2(1_634_591 / 565_513)
    )
    assert "not measured in this sweep: a longer schedule, another data variant" in d.reasons[-1]
    full = _sweep(lambda n, s: 1.1 + 0.1 * {128: 0, 256: 1, 512: 2}[n])
    regen = [
        {**r, "data": "regenerated", "acceptance_length": r["acceptance_length"] + 0.01}
        for r in full
    ]
    both = sweep_decision([{**r, "data": "as-is"} for r in full] + regen)
    assert (both.recommendation, both.confidence) == ("more data", "high")
    assert "raised acceptance more than the other levers did" in both.reasons[-1]


def test_steps_gain_reads_the_last_doubling_of_a_curve():
    from eagle3.decide import steps_gain

    steps = [500, 1000, 2000, 4000, 6000, 8000]
    acc = [1.0, 1.1, 1.2, 1.3, 1.35, 1.4]
    g = steps_gain(steps, acc)
    window = [(4000, 1.3), (6000, 1.35), (8000, 1.4)]
    assert g["gain"] == pytest.approx(
        np.polyfit(np.log2([s for s, _ in window]), [a for _, a in window], 1)[0]
    )
    assert (g["from_step"], g["to_step"], g["evaluations"]) == (4000, 8000, 3)
    assert steps_gain(list(reversed(steps)), list(reversed(acc))) == g  # any order
    assert steps_gain([8000], [1.4]) is None and steps_gain([], []) is None
    assert steps_gain([100, 1000], [1.0, 1.2]) is None  # one evaluation in the last doubling
    with pytest.raises(DataError, match="as many steps as figures"):
        steps_gain([1, 2], [1.0])
    with pytest.raises(DataError, match="steps > 0"):
        steps_gain([0, 2], [1.0, 1.1])


def test_the_best_points_measured_curve_gives_the_next_doubling_of_steps():
    """Two sizes at equal steps, one schedule (a study at equal optimizer steps): the best point's
    development curve measures what more steps buy, so both levers are compared."""
    rows = [
        {"point": "small", "data_size": 100, "schedule": "constant", "unique_tokens": 120_000,
         "acceptance_length": 1.36},
        {"point": "large", "data_size": 1000, "schedule": "constant", "unique_tokens": 1_200_000,
         "acceptance_length": 1.91},
    ]
    rising = {"label": "large", "kind": "measured", "steps": [2500, 5000, 7500, 10000],
              "acceptance": [1.3, 1.5, 1.8, 2.1]}
    d = sweep_decision(rows, curves=[rising])
    assert (d.recommendation, d.rule, d.confidence) == (
        "longer training", "steps_gain_dominates", "medium")
    assert d.evidence["steps_gain_per_doubling"] > d.evidence["data_gain_per_doubling"]
    text = "\n".join(d.reasons)
    assert "large's measured development curve, steps 5000 to 10000 (3 evaluations)" in text
    assert "not measured in this sweep: another data variant" in d.reasons[-1]
    flat = {**rising, "acceptance": [1.3, 1.7, 1.71, 1.7]}
    d = sweep_decision(rows, curves=[flat])
    assert (d.recommendation, d.rule) == ("more data", "data_gain_dominates")
    # a simulated curve, or another point's, does not count
    for other in ({**rising, "kind": "simulated"}, {**rising, "label": "small"}):
        d = sweep_decision(rows, curves=[other])
        assert d.evidence["steps_gain_per_doubling"] is None
        assert "optimizer steps: n/a" in "\n".join(d.reasons)


def test_the_curve_weighs_longer_training_where_it_exists_and_ties_are_no_schedule_gain():
    """A longer schedule that gained +0.6 while the best point's curve has flattened: the next
    doubling of steps is what is weighed, and the schedules' gain is shown as evidence only."""
    rows = [
        {"point": f"n{n}-{s}", "data_size": n, "schedule": s, "unique_tokens": 1000 * n,
         "optimizer_steps": steps, "acceptance_length": acc, "figure": "served"}
        for n, s, steps, acc in ((4, "short", 9, 1.0), (4, "long", 16, 1.6),
                                 (8, "short", 16, 1.05), (8, "long", 16, 1.65))
    ]
    flat = {"label": "n8-long", "kind": "measured", "steps": [4, 8, 12, 16],
            "acceptance": [1.2, 1.6, 1.6, 1.6]}
    d = sweep_decision(rows, curves=[flat])
    assert d.evidence["schedule_gain"] == pytest.approx(0.6)  # the 8s are equally long: no pair
    assert d.evidence["longest_schedule"] == "long"
    assert d.rule != "schedule_gain_dominates"
    text = "\n".join(d.reasons)
    assert "evidence only: the measured curve above weighs longer training" in text
    assert "acceptance gain per doubling of unique tokens (served)" in text
    d = sweep_decision(rows)  # no curve: the schedules' gain decides
    assert (d.recommendation, d.rule) == ("longer training", "schedule_gain_dominates")
