"""The "more data or longer training" decision, from a training history and acceptance figures.

Plain dicts in, a :class:`Decision` out (``flows/`` stores ``tags()`` and ``to_markdown()``).
Rules, in order; the first that fires decides:

1. **fix serving integration** — served − 1 < ``serving_gap_ratio`` (0.7) × (offline − 1) with
   offline − 1 ≥ ``min_offline_excess`` (0.05) (same draft and prompts;
   :func:`eagle3.measure.acceptance.serving_gap`); without offline, the same against simulated
   (1 + c0 + c0·c1 + … from training accuracies) at ``simulated_gap_ratio`` (0.5), low
   confidence. The engine feeds the draft wrongly (aux capture, keys, flags, layer ids, template).
2. **stop** — served ≥ ``acceptance.target``; or the last ``acceptance.history`` figure and served
   differ by < ``plateau_rel`` (2 %) while validation loss is flat.
3. **longer training** — val loss falling (least-squares slope over the last ``k`` = 3 evals / their
   mean < −``slope_eps`` = 0.5 %/eval), train/val gap < ``gap_max`` (10 % of train loss) and not
   growing, epochs < ``high_epochs`` (6). Under 2 evals: **more evidence needed**
   (``too_few_evaluations``), or more data (low confidence) if epochs ≥ ``high_epochs``.
4. **more data** — gap large or growing (> ``gap_growth`` = 2 points over the window, only while
   val > train); val flat or rising while train falls; epochs ≥ ``high_epochs``; or both flat.

A draft still improving on held-out data is under-trained; one that memorises or has seen its data
many times is data-limited. Acceptance was reported to peak at ~4.6 epochs while loss kept falling
(docs/ENGINE_FACTS.md §7): hence the epoch cap and judging by acceptance, not loss."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import linear_regression

from eagle3.errors import DataError
from eagle3.measure.acceptance import (MIN_OFFLINE_EXCESS, SERVING_EXCESS_RATIO,
                                      SERVING_FAULT_CHECKS, serving_gap)

OUTCOMES = ("more data", "longer training", "regenerate data", "fix serving integration", "stop",
            "more evidence needed")
DEV_KEY = "dev/acceptance_length"  # measured during training (eagle3.measure.dev_acceptance)


@dataclass(frozen=True)
class Thresholds:
    """Rule constants (see the module docstring). Relative slope/gap are fractions, not percent."""

    serving_gap_ratio: float = SERVING_EXCESS_RATIO
    simulated_gap_ratio: float = 0.5
    min_offline_excess: float = MIN_OFFLINE_EXCESS
    k: int = 3
    slope_eps: float = 0.005
    gap_max: float = 0.10
    gap_growth: float = 0.02
    high_epochs: float = 6.0
    plateau_rel: float = 0.02
    min_gain: float = 0.02


@dataclass
class Decision:
    """A recommendation (one of :data:`OUTCOMES`) with the rule that fired and its evidence."""

    recommendation: str
    rule: str
    reasons: list[str]
    evidence: dict = field(default_factory=dict)
    confidence: str = "high"

    def tags(self) -> dict[str, str]:
        """Flat string tags: ``decision``, ``decision.rule``, ``decision.<evidence key>``."""
        out = {"decision": self.recommendation, "decision.rule": self.rule,
               "decision.confidence": self.confidence}
        for k, v in self.evidence.items():
            if isinstance(v, (int, float, str, bool)) or v is None:
                out[f"decision.{k}"] = f"{v:.4g}" if isinstance(v, float) else str(v)
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    def to_markdown(self) -> str:
        """Markdown: recommendation, rule, evidence lines and a table of the numbers."""
        lines = [f"# Decision: **{self.recommendation}**", "",
                 f"Rule: `{self.rule}` (confidence: {self.confidence})", "", "## Evidence", ""]
        lines += [f"- {r}" for r in self.reasons]
        lines += ["", "| quantity | value |", "|---|---|"]
        for k, v in self.evidence.items():
            lines.append(f"| {k} | {f'{v:.4g}' if isinstance(v, float) else v} |")
        return "\n".join(lines) + "\n"


def _floats(history: dict, key: str) -> list[float]:
    v = history.get(key)
    vals = [] if v is None else v if isinstance(v, list) else [v]
    for x in vals:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise DataError(f"history[{key!r}]: expected finite numbers, got {x!r}")
    return [float(x) for x in vals]


def _relative_slope(ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` per evaluation / their mean; None with < 2 values or mean 0."""
    mean = abs(sum(ys) / len(ys)) if ys else 0.0
    if len(ys) < 2 or mean == 0:
        return None
    return linear_regression(range(len(ys)), ys).slope / mean


def training_signals(history: dict, th: Thresholds = Thresholds()) -> dict:
    """Rule inputs from ``history`` = ``{"val_loss": [per eval], "train_loss": float|[per eval],
    "epochs": float, "unique_tokens": int, "train_val_gap": float|[per eval] (else val − train)}``:
    relative val/train slopes over the last ``k`` evals (None with < 2), last relative gap
    ((val − train) / train), its growth over the window, epochs and unique tokens; with
    ``"dev_acceptance": [per eval]`` (measured, train.select_best_by=measured) its last value and
    relative slope too."""
    val, train, dev, gaps = (_floats(history, k) for k in
                             ("val_loss", "train_loss", "dev_acceptance", "train_val_gap"))
    if not gaps and val and train:
        pairs = zip(val, train) if len(train) == len(val) else [(val[-1], train[-1])]
        gaps = [v - t for v, t in pairs]
    ref = train[-1] if train else (val[-1] if val else 1.0)
    rel = [g / abs(ref) if ref else g for g in gaps]
    return {"num_evals": len(val), "val_loss_last": val[-1] if val else None,
            "train_loss_last": train[-1] if train else None,
            "val_slope_rel": _relative_slope(val[-th.k:]),
            "train_slope_rel": _relative_slope(train[-th.k:]),
            "gap_rel": rel[-1] if rel else None,
            "gap_growth": rel[-1] - rel[-min(th.k, len(rel))] if len(rel) >= 2 else None,
            "epochs": history.get("epochs"), "unique_tokens": history.get("unique_tokens"),
            **({"dev_acceptance_last": dev[-1], "dev_acceptance_slope_rel":
                _relative_slope(dev[-th.k:])} if dev else {})}


def history_from_metrics(rows: list[dict], *, epochs: float | None = None,
                         unique_tokens: int | None = None, val_key: str = "val/loss",
                         train_key: str = "train/loss") -> dict:
    """A :func:`recommend` ``history`` from ``metrics.jsonl`` rows (``{"step", key: value}``):
    ``val_loss`` = ``val_key`` values in step order; ``train_loss`` = per eval, the latest finite
    ``train_key`` value at or before its step (evals before any are skipped for the gap);
    ``dev_acceptance`` = the measured ``dev/acceptance_length`` values, where logged."""
    val, train, last_train, dev = [], [], None, []
    for r in sorted(rows, key=lambda r: r.get("step", 0)):
        # a logging window without a loss position has a NaN loss: the last finite one stands
        if isinstance(r.get(train_key), (int, float)) and math.isfinite(r[train_key]):
            last_train = float(r[train_key])
        if isinstance(r.get(val_key), (int, float)):
            val.append(float(r[val_key]))
            train.append(last_train)
        if isinstance(r.get(DEV_KEY), (int, float)):
            dev.append(float(r[DEV_KEY]))
    hist: dict = {"val_loss": val, "epochs": epochs, "unique_tokens": unique_tokens,
                  **({"dev_acceptance": dev} if dev else {})}
    if train and None not in train:
        hist["train_loss"] = train
    elif last_train is not None:
        hist["train_loss"] = last_train
    return hist


def read_training_history(train_dir: str | Path) -> dict:
    """:func:`history_from_metrics` over ``<train_dir>/metrics.jsonl`` ("train" rows:
    ``train/loss``, "eval" rows: ``val/loss``); epochs = manifest ``epochs_over_data``, unique
    tokens = ``counts.train_positions``. DataError: no draft manifest, or a bad JSON row (file and
    line named)."""
    from eagle3.artifacts import read_jsonl, read_manifest

    manifest = read_manifest(train_dir)
    path = Path(train_dir) / "metrics.jsonl"
    return history_from_metrics(read_jsonl(path) if path.is_file() else [],
                                epochs=manifest.get("epochs_over_data"),
                                unique_tokens=(manifest.get("counts") or {}).get("train_positions"))


def _serving_rule(acc: dict, th: Thresholds) -> Decision | None:
    served, offline, sim = acc.get("served"), acc.get("offline"), acc.get("simulated")
    if served is None:
        return None
    ev = {"served": served, "offline": offline, "simulated": sim}
    if serving_gap(served, offline, th.serving_gap_ratio, th.min_offline_excess):
        ratio = (served - 1.0) / (offline - 1.0)  # offline − 1 ≥ min_offline_excess > 0 here
        ev.update(served_excess=served - 1.0, offline_excess=offline - 1.0, excess_ratio=ratio,
                  serving_gap_ratio=th.serving_gap_ratio,
                  **{f"preflight.{k}": v for k, v in (acc.get("preflight") or {}).items()})
        return Decision("fix serving integration", "served_below_offline", [
            f"served acceptance {served:.3f}: served − 1 < {th.serving_gap_ratio} × (offline "
            f"{offline:.3f} − 1) for the same draft and prompts (accepted drafts per verify pass "
            f"{served - 1:.3f} served vs {offline - 1:.3f} offline, ratio {ratio:.2f}): the draft "
            f"accepts tokens in-process but not as served",
            f"check {SERVING_FAULT_CHECKS}"], ev)
    if offline is None and serving_gap(served, sim, th.simulated_gap_ratio, th.min_offline_excess):
        return Decision("fix serving integration", "served_below_simulated", [
            f"served acceptance {served:.3f}: served − 1 < {th.simulated_gap_ratio} × (simulated "
            f"{sim:.3f} − 1) (from training accuracies); no offline figure, so confirm with "
            "eagle3.measure.offline.offline_acceptance"], ev, "low")
    return None


def recommend(history: dict, acceptance: dict, thresholds: Thresholds | None = None) -> Decision:
    """One of :data:`OUTCOMES` by the module docstring's rules. ``history``:
    :func:`training_signals`. ``acceptance``: ``{"served", "offline", "simulated"}`` (lengths, bonus
    counted; any may be None) plus optional ``"target"``, ``"history"`` (earlier served figures,
    oldest first) and ``"preflight"`` (``{check: "status: detail"}``). Raises DataError for
    non-numeric history values."""
    th = thresholds or Thresholds()
    if (serving := _serving_rule(acceptance, th)) is not None:
        return serving
    s = training_signals(history, th)
    ev = {k: v for k, v in {**s, **{k: acceptance.get(k) for k in
          ("served", "offline", "simulated", "target")}}.items() if v is not None}
    served, target = acceptance.get("served"), acceptance.get("target")
    vs, ts, gap, growth, epochs = (s["val_slope_rel"], s["train_slope_rel"], s["gap_rel"],
                                   s["gap_growth"], s["epochs"])
    val_flat = vs is not None and vs >= -th.slope_eps
    if served is not None and target is not None and served >= target:
        return Decision("stop", "target_reached",
                        [f"served acceptance {served:.3f} ≥ target {target:.3f}"], ev)
    last = float((acceptance.get("history") or [math.nan])[-1])  # NaN: no earlier figure
    if served is not None and val_flat and abs(served - last) < th.plateau_rel * last:
        return Decision("stop", "acceptance_plateau", [
            f"served acceptance {served:.3f} within {th.plateau_rel:.0%} of the previous "
            f"{last:.3f} and validation loss flat (slope {vs:+.2%}/eval): more of the same "
            "will not pay"], ev)
    high_epochs = epochs is not None and epochs >= th.high_epochs
    if vs is None:
        reason = "fewer than 2 evaluations: no validation-loss trend; evaluate more often"
        if high_epochs:
            return Decision("more data", "high_epochs",
                            [reason, f"{epochs:g} epochs ≥ {th.high_epochs:g}"], ev, "low")
        return Decision("more evidence needed", "too_few_evaluations", [
            reason, f"{s['num_evals']} validation loss value(s) decide neither way: set "
            "train.eval_every so that training evaluates at least twice (more is better: the "
            f"trend is fitted over the last {th.k})"], ev, "low")
    gap_ok = gap is None or gap < th.gap_max
    growing = growth is not None and growth > th.gap_growth and gap is not None and gap > 0
    if vs < -th.slope_eps and gap_ok and not growing and not high_epochs:
        return Decision("longer training", "val_loss_falling", [
            f"validation loss still falling: {vs:+.2%} per eval over the last "
            f"{min(th.k, s['num_evals'])} evals (threshold −{th.slope_eps:.1%})",
            f"train/val gap {0.0 if gap is None else gap:.1%} < {th.gap_max:.0%} and not growing; "
            f"{'unknown' if epochs is None else f'{epochs:g}'} epochs < {th.high_epochs:g}"], ev)
    memorising = growing or not gap_ok
    diverging = val_flat and ts is not None and ts < -th.slope_eps
    reasons = []
    if memorising:
        reasons.append(f"train/val gap {gap:.1%} (growth {0.0 if growth is None else growth:+.1%} "
                       "over the window): the draft is memorising its data")
    if diverging:
        reasons.append(f"validation loss flat/rising ({vs:+.2%}/eval) while train loss falls "
                       f"({ts:+.2%}/eval)")
    if high_epochs:
        reasons.append(f"{epochs:g} epochs over the data ≥ {th.high_epochs:g}")
    if not reasons:
        reasons.append(f"both losses flat (val {vs:+.2%}/eval, train "
                       f"{'n/a' if ts is None else f'{ts:+.2%}'}/eval): the schedule is exhausted")
    if s["unique_tokens"] is not None:
        reasons.append(f"{s['unique_tokens']:,} unique training tokens")
    rule = ("overfitting" if memorising or diverging
            else "high_epochs" if high_epochs else "losses_flat")
    return Decision("more data", rule, reasons, ev, "high" if rule != "losses_flat" else "low")


# what decision rows' "figure" names (flows.sweep_decision.decision_rows)
FIGURES = {"offline_eval": "offline evaluation sets", "served": "served"}


def _variant(r: dict) -> str:
    return r.get("data") or "as-is"


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _data_gain(results: list[dict]) -> float | None:
    """Mean least-squares acceptance gain per doubling of unique tokens (lines with ≥ 2 sizes)."""
    gains = []
    for line in dict.fromkeys((_variant(r), r["schedule"]) for r in results):
        sel = [r for r in results if (_variant(r), r["schedule"]) == line]
        xs = [math.log2(r["unique_tokens"]) for r in sel]
        if len(set(xs)) >= 2:
            gains.append(linear_regression(xs, [r["acceptance_length"] for r in sel]).slope)
    return _mean(gains)


def _schedule_gain(results: list[dict]) -> tuple[float | None, str | None]:
    """Mean acceptance gain, longest schedule over shortest (by optimizer steps, then epochs), per
    data variant and size; schedules of equal length at a size are no comparison. The name of the
    longest schedule, or the names joined by "/" where sizes disagree."""
    gains, longest = [], []
    length = lambda r: (r.get("optimizer_steps") or 0, r.get("epochs") or 0)  # noqa: E731
    for key in dict.fromkeys((_variant(r), r["data_size"]) for r in results):
        sel = sorted((r for r in results if (_variant(r), r["data_size"]) == key), key=length)
        if len(sel) >= 2 and length(sel[0]) != length(sel[-1]):
            gains.append(sel[-1]["acceptance_length"] - sel[0]["acceptance_length"])
            longest.append(sel[-1]["schedule"])
    return _mean(gains), "/".join(dict.fromkeys(longest)) or None


def steps_gain(steps: list[int], acceptance: list[float]) -> dict | None:
    """What the last doubling of optimizer steps bought along one training curve: the
    least-squares slope of acceptance length (bonus token counted) against log2(step) over the
    evaluations at steps >= half the last one: the gain per doubling of steps, read as what the
    next doubling is expected to buy. ``steps``: optimizer steps of the evaluations (ints > 0,
    any order); ``acceptance``: their figures, same length. Returns ``{"gain", "from_step",
    "to_step", "evaluations"}``, or None with fewer than 2 evaluations in that window. DataError:
    lengths differ or a step ≤ 0."""
    if len(steps) != len(acceptance):
        raise DataError(f"steps_gain: expected as many steps as figures, got {len(steps)} steps "
                        f"and {len(acceptance)} figures")
    if any(int(s) <= 0 for s in steps):
        raise DataError(f"steps_gain: expected optimizer steps > 0, got {sorted(steps)[:3]}")
    pts = sorted(zip((int(s) for s in steps), (float(a) for a in acceptance)))
    if not pts:
        return None
    window = [(s, a) for s, a in pts if s >= pts[-1][0] / 2]
    if len({s for s, _ in window}) < 2:
        return None
    slope = linear_regression([math.log2(s) for s, _ in window], [a for _, a in window]).slope
    return {"gain": slope, "from_step": window[0][0], "to_step": window[-1][0],
            "evaluations": len(window)}


def _curve_gain(best: dict, curves: list[dict] | None) -> dict | None:
    """:func:`steps_gain` of ``best``'s measured development curve (``curves`` as
    ``flows.sweep_decision.training_curves`` gives them, matched by ``label`` = the row's
    ``point``)."""
    for c in curves or []:
        if c.get("kind") == "measured" and c.get("label") == best.get("point"):
            g = steps_gain(c["steps"], c["acceptance"])
            return None if g is None else {**g, "point": c["label"]}
    return None


def _variant_gain(results: list[dict]) -> tuple[float | None, str | None]:
    """(gain, name) of the best other data variant over the first, at equal size and schedule."""
    variants = list(dict.fromkeys(_variant(r) for r in results))
    cell = lambda r: (r["data_size"], r["schedule"])  # noqa: E731
    base = {cell(r): r["acceptance_length"] for r in results if _variant(r) == variants[0]}
    gains = [(g, v) for v in variants[1:] if (g := _mean([
        r["acceptance_length"] - base[cell(r)] for r in results
        if _variant(r) == v and cell(r) in base])) is not None]
    return max(gains, key=lambda gv: gv[0], default=(None, None))


def sweep_decision(results: list[dict], *, plot_path: str | Path | None = None,
                   target: float | None = None, thresholds: Thresholds | None = None,
                   curves: list[dict] | None = None) -> Decision:
    """The decision over a sweep of data variants × sizes × schedules, plus the data-scaling plot.

    ``results``: per run ``{"data_size": int (conversations), "schedule": str, "unique_tokens": int,
    "acceptance_length": float (offline on the full set where measured, else served), "offline":
    float|None, "served": float|None, "data": str (variant), "epochs": float, "optimizer_steps":
    int}``. Served ≪ offline → fix serving; best ≥ ``target`` → stop; else the largest lever ≥
    ``min_gain`` (gain per data doubling; longest vs shortest schedule; best other data variant)
    decides "more data", "longer training" or "regenerate data" (variant ``regen…``); all below →
    stop; none measurable → "more evidence needed". ``curves`` (``[{"label", "steps",
    "acceptance", "kind"}]``, label = a result's ``point``): the best point's measured development
    curve gives the gain of the next doubling of optimizer steps (:func:`steps_gain`), a
    "longer training" lever beside the schedules'. DataError: empty sweep, missing key."""
    th = thresholds or Thresholds()
    if not results:
        raise DataError("sweep_decision: expected at least one result, got none")
    for i, r in enumerate(results):
        if missing := [k for k in ("data_size", "schedule", "unique_tokens", "acceptance_length")
                       if r.get(k) is None]:
            raise DataError(f"sweep_decision: results[{i}] lacks {missing} (keys: {sorted(r)})")
    ev: dict = {"runs": len(results)}
    if plot_path is not None:
        from eagle3.measure.plots import plot_data_scaling

        ev["plot"] = str(plot_data_scaling(results, plot_path))
    for r in results:
        d = _serving_rule(
            {"served": r.get("served", r["acceptance_length"]), "offline": r.get("offline")}, th)
        if d is not None:
            d.reasons.insert(0, f"run data={_variant(r)} data_size={r['data_size']} "
                                f"schedule={r['schedule']}")
            d.evidence.update(ev)
            return d
    best = max(results, key=lambda r: r["acceptance_length"])
    ev.update(best_acceptance=best["acceptance_length"], best_data_size=best["data_size"],
              best_schedule=best["schedule"], best_data=_variant(best))
    if target is not None and best["acceptance_length"] >= target:
        return Decision("stop", "target_reached",
                        [f"best {best['acceptance_length']:.3f} ≥ target {target:.3f}"], ev)
    if best["acceptance_length"] < 1.0 + th.min_gain:  # no draft token accepted anywhere
        return Decision("more evidence needed", "nothing_accepted", [
            f"best acceptance length {best['acceptance_length']:.3f} "
            f"({FIGURES.get(best.get('figure'), 'acceptance length')}): no run's draft gets tokens "
            "accepted, so no lever's gain says anything — check the draft against its target "
            "(eagle3 validate) and train on more or longer data before comparing levers"],
            ev, "low")
    dg, (sg, longest), (vg, variant) = (_data_gain(results), _schedule_gain(results),
                                        _variant_gain(results))
    cg = _curve_gain(best, curves)
    ev.update(data_gain_per_doubling=dg, schedule_gain=sg, longest_schedule=longest,
              data_variant_gain=vg, data_variant=variant,
              steps_gain_per_doubling=cg and cg["gain"])
    fmt = (lambda v: "n/a" if v is None else f"{v:+.3f}")  # noqa: E731
    figures = ", ".join(sorted({FIGURES.get(r.get("figure"), "acceptance length")
                                for r in results}))
    lines = [f"acceptance gain per doubling of unique tokens ({figures}): {fmt(dg)} — what the "
             "next doubling of data is expected to buy",
             (f"acceptance gain per doubling of optimizer steps along {cg['point']}'s measured "
              f"development curve, steps {cg['from_step']} to {cg['to_step']} "
              f"({cg['evaluations']} evaluations): {fmt(cg['gain'])} — what the next doubling of "
              "steps is expected to buy" if cg else
              "acceptance gain per doubling of optimizer steps: n/a (no measured development "
              "curve of the best point with 2 evaluations in its last doubling)"),
             f"acceptance gain of the longest schedule ({longest}) over the shortest at equal "
             f"data: {fmt(sg)}" + (" (evidence only: the measured curve above weighs longer "
                                   "training)" if cg and sg is not None else ""),
             (f"acceptance gain of data variant {variant} over {_variant(results[0])} at equal "
              f"size and schedule: {fmt(vg)}" if variant else
              "acceptance gain of another data variant: n/a (one variant)"),
             f"best run: {_variant(best)}, {best['data_size']} conversations, {best['schedule']}: "
             f"{best['acceptance_length']:.3f}"]
    # longer training: what the next doubling of steps buys along the best point's measured
    # curve where there is one; the schedules' past gain otherwise
    levers = [("more data", "data_gain_dominates", dg),
              ("longer training", "schedule_gain_dominates", None if cg else sg),
              ("regenerate data" if (variant or "").startswith("regen") else "more data",
               "data_variant_gain_dominates", vg),
              ("longer training", "steps_gain_dominates", cg and cg["gain"])]
    if not (known := [lv for lv in levers if lv[2] is not None]):
        return Decision("more evidence needed", "no_lever_measured", lines + [
            "one data size, one schedule and one data variant: no lever can be compared — add a "
            "second size, a longer schedule or a regenerated data set"], ev, "low")
    lever, rule, gain = max(known, key=lambda lv: lv[2])
    if gain < th.min_gain:
        return Decision("stop", "sweep_plateau",
                        lines + [f"every measured gain < {th.min_gain}: no lever pays"], ev)
    what = {"data_gain_dominates": "more data", "schedule_gain_dominates": "a longer schedule",
            "steps_gain_dominates": "more optimizer steps",
            "data_variant_gain_dominates":
                f"data variant {variant}" if variant else "another data variant"}
    # longer training is measured by a longer schedule or by the best point's own curve
    unmeasured = [name for name, gains in (("more data", [dg]),
                                           ("a longer schedule", [sg, cg and cg["gain"]]),
                                           (what["data_variant_gain_dominates"], [vg]))
                  if all(g is None for g in gains)]
    if not unmeasured:
        return Decision(lever, rule, lines + [
            f"{what[rule]} raised acceptance more than the other levers did"], ev)
    # one lever measured and paying is a recommendation, not a comparison
    return Decision(lever, rule, lines + [
        f"{what[rule]} raised acceptance by {gain:+.3f}; not measured in this sweep: "
        f"{', '.join(unmeasured)} — this recommendation does not weigh them"], ev, "medium")
