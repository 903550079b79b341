"""The sweep's decision from its measured points (``eagle3.decide.sweep_decision``), the evidence
beside it (failed, pending and not-evaluated points, training curves) and what it logs on the
sweep's MLflow run: the decision, the comparison table, the data-scaling and training-length plots,
and the Prefect summary."""

from __future__ import annotations

from flows.common import publish_summary
from tasks import tracking
from tasks.reports import format_table
from tasks.stage_config import latest_output


def _shorten(text: str, limit: int = 400) -> str:
    """``text`` cut to ``limit`` characters at a word boundary, marked with an ellipsis."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " …"


def decision_rows(rows: list[dict]) -> list[dict]:
    """:func:`tasks.reports.sweep_table` rows as ``eagle3.decide.sweep_decision`` results: the
    acceptance length judged is the offline MT-Bench figure (``offline_eval``, all prompts) where a
    point has one, else served."""
    out = []
    for r in rows:
        best = r.get("offline_eval") if r.get("offline_eval") is not None else r.get("served")
        out.append({**r, "acceptance_length": best, "served": r.get("served"),
                    "offline": r.get("offline"),
                    "epochs": r.get("epochs_over_data"),
                    "figure": "offline_eval" if r.get("offline_eval") else "served"})
    return [r for r in out if r["acceptance_length"] is not None]


def decide_and_plot(cfg, parent: str, rows: list[dict], target: float | None, pending: list[str],
                    not_evaluated: dict[str, str] | None = None,
                    failed: dict[str, str] | None = None):
    """``sweep_decision`` over the table, the data-scaling and training-length plots, all logged on
    the sweep run; points that failed (``failed``: point → why), not run yet (``pending``), not
    evaluated offline (``not_evaluated``: point → why) or without a training curve are named among
    the decision's reasons, and a "stop" with failed or pending points has low confidence (a
    lever they would have measured may pay). Returns the Decision."""
    from eagle3.decide import sweep_decision
    from eagle3.measure.plots import plot_training_length

    out_dir = cfg.run_dir() / "sweep" / parent  # one folder per sweep run: never overwritten
    out_dir.mkdir(parents=True, exist_ok=True)
    uri = tracking.tracking_uri(cfg)
    curves = training_curves(rows, lambda r, key: tracking.stage_metric_history(
        r["run_id"], "train", key, uri) if r.get("run_id") else [])
    decision = sweep_decision(decision_rows(rows), plot_path=out_dir / "data_scaling.png",
                              target=target, curves=curves)
    if failed:
        decision.reasons.append(f"{len(failed)} point(s) failed: "
                                + "; ".join(f"{k}: {_shorten(str(v))}"
                                            for k, v in failed.items())
                                + " - this decision covers the finished points only")
    if pending:
        decision.reasons.append(f"{len(pending)} point(s) not run yet: {', '.join(pending)} - this "
                                "decision covers the finished points only")
    if (failed or pending) and decision.recommendation == "stop":
        decision.confidence = "low"
    offline = {r.get("point") for r in rows if r.get("offline_eval") is not None}
    for key, why in (not_evaluated or {}).items():
        judged = ("its earlier offline figure" if key in offline else "its served figure")
        decision.reasons.append(f"{key} is not evaluated offline: {why} (it is judged by "
                                f"{judged})")
    drawn = {c["label"] for c in curves}
    no_curve = [r.get("point") for r in rows if r.get("point") not in drawn]
    if no_curve:
        decision.reasons.append(f"no training curve for {', '.join(map(str, no_curve))}: "
                                "neither its train folder's metrics.jsonl nor an MLflow "
                                "history of its train stage")
    client, _ = tracking.client_for(cfg)
    if curves:
        client.log_artifact(parent, str(plot_training_length(curves,
                                                             out_dir / "training_length.png")))
    tracking.set_parent_tags(cfg, parent, {f"eagle3.{k}": v for k, v in decision.tags().items()})
    tracking.set_parent_tags(cfg, parent, {"eagle3.sweep.pending": str(len(pending)),
                                           "eagle3.sweep.failed": str(len(failed or {}))})
    client.log_text(parent, decision.to_markdown(), "decision.md")
    client.log_text(parent, format_table(rows), "sweep_table.md")
    if (out_dir / "data_scaling.png").is_file():
        client.log_artifact(parent, str(out_dir / "data_scaling.png"))
    return decision


CURVE_KEYS = ("dev/acceptance_length", "val/simulated_acceptance_length")  # measured first


def training_curves(rows: list[dict], history=None) -> list[dict]:
    """Acceptance length (bonus token counted) at every evaluation of each point's training,
    against optimizer steps, from ``<run_dir>/train/metrics.jsonl``: the measured
    ``dev/acceptance_length`` where the training logged it, else the simulated one (validation):
    ``[{"label", "steps", "acceptance", "kind"}]``. A point whose file is not on this machine
    (trained on another one, its folders gone) is read with ``history(row, key)`` → ``[(step,
    value)]`` when given (:func:`tasks.tracking.stage_metric_history`: what its train stage
    logged to MLflow); a point with neither has no curve."""
    from eagle3.artifacts import read_jsonl

    curves = []
    for r in rows:
        path = latest_output(r.get("run_dir") or "", "train") / "metrics.jsonl"
        points: list[tuple[int, float]] = []
        if r.get("run_dir") and path.is_file():
            logged = read_jsonl(path)
            for key in CURVE_KEYS:
                points = [(int(x["step"]), x[key]) for x in logged
                          if isinstance(x.get(key), float)]
                if points:
                    break
        elif history is not None:
            for key in CURVE_KEYS:
                if points := history(r, key):
                    break
        if points:
            curves.append({"label": r.get("point") or f"{r['data_size']}-{r['schedule']}",
                           "steps": [int(s) for s, _ in points],
                           "acceptance": [float(v) for _, v in points],
                           "kind": "measured" if key == CURVE_KEYS[0] else "simulated"})
    return curves


def publish_points(cfg, parent: str, rows: list[dict], failed: dict, pending: list[str],
                   decision) -> None:
    """The sweep's Prefect summary: each point's figures, failed and pending points, the
    decision."""
    fmt = (lambda v: "n/a" if v is None else f"{v:.3f}")
    publish_summary(cfg, parent, f"eagle3-sweep: {cfg.name}", [
        "| point | served | offline (bench prompts) | offline (eval sets) | development | "
        "simulated |",
        "|---|---|---|---|---|---|",
        *[f"| {r.get('point')} | {fmt(r['served'])} | {fmt(r['offline'])} | "
          f"{fmt(r.get('offline_eval'))} | {fmt(r.get('dev'))} | {fmt(r['simulated'])} |"
          for r in rows],
        *[f"| {k} | failed: {v} | | | | |" for k, v in failed.items()],
        *[f"| {k} | pending | | | | |" for k in pending], "",
        f"- decision: **{decision.recommendation}** (rule `{decision.rule}`)"])
