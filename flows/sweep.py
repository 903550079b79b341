"""Flow ``eagle3-sweep``: the pipeline over data sizes × training schedules, then ``sweep_decision``.

Each point is the whole pipeline as a subflow, on its own run directory (``<name>-n<size>-<schedule>``), with
its own MLflow parent run; the sweep's parent run holds the table of points, the data-scaling plot and the
decision ("more data" / "longer training" / "fix serving" / "stop"). A point that fails is recorded as failed
and left out of the decision (the sweep fails only when no point succeeded).
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from eagle3.artifacts import read_manifest
from eagle3.errors import DataError
from flows.common import load_run_config, parent_run, publish_summary
from flows.pipeline import eagle3_pipeline
from tasks import tracking

DEFAULT_SCHEDULES = {"epochs1": ["train.epochs=1"], "epochs3": ["train.epochs=3"]}


def point_result(summary: dict, size: int, schedule: str) -> dict:
    """One row for ``eagle3.decide.sweep_decision`` from a finished point's summary and its draft manifest."""
    m = read_manifest(Path(summary["run_dir"]) / "train")
    return {"data_size": size, "schedule": schedule, "unique_tokens": (m.get("counts") or {}).get("train_positions"),
            "acceptance_length": summary["acceptance_length"], "offline": summary.get("acceptance_length_offline"),
            "epochs": m.get("epochs_over_data"), "optimizer_steps": m.get("optimizer_steps"),
            "parent_run_id": summary["parent_run_id"]}


@flow(name="eagle3-sweep", log_prints=False)
def sweep_flow(config_path: str, overrides: list[str] | None = None, data_sizes: list[int] | None = None,
               schedules: dict[str, list[str]] | None = None, target_acceptance: float | None = None) -> dict:
    """Run the pipeline for every (data size in conversations, schedule name → overrides) pair and decide.

    Raises DataError when every point failed.
    """
    from eagle3.decide import sweep_decision

    cfg = load_run_config(config_path, overrides)
    sizes = list(data_sizes or [cfg.data.num_conversations // 2, cfg.data.num_conversations])
    scheds = dict(schedules or DEFAULT_SCHEDULES)
    results, failed = [], {}
    with parent_run(cfg, "eagle3-sweep") as parent:
        for size in sizes:
            for name, sched in scheds.items():
                point = [*(overrides or []), f"data.num_conversations={size}", *sched,
                         f"name={cfg.name}-n{size}-{name}", "bench.baseline_untrained=false"]
                state = eagle3_pipeline.with_options(flow_run_name=f"n{size}-{name}")(
                    config_path=config_path, overrides=point, return_state=True)
                if state.is_completed():
                    results.append(point_result(state.result(), size, name))
                else:
                    failed[f"n{size}-{name}"] = state.message or state.name
        tracking.log_parent_artifact(cfg, parent, {"results": results, "failed": failed}, "sweep.json")
        if not results:
            raise DataError(f"sweep {cfg.name}: every point failed: {failed}")
        plot = cfg.run_dir() / "sweep" / "data_scaling.png"
        plot.parent.mkdir(parents=True, exist_ok=True)
        decision = sweep_decision(results, plot_path=plot, target=target_acceptance)
        tracking.set_parent_tags(cfg, parent, {f"eagle3.{k}": v for k, v in decision.tags().items()})
        client, _ = tracking.client_for(cfg)
        client.log_text(parent, decision.to_markdown(), "decision.md")
        if plot.is_file():
            client.log_artifact(parent, str(plot))
        publish_summary(cfg, parent, f"eagle3-sweep: {cfg.name}", [
            "| data size | schedule | acceptance length |", "|---|---|---|",
            *[f"| {r['data_size']} | {r['schedule']} | {r['acceptance_length']:.3f} |" for r in results],
            *[f"| {k} | failed | {v} |" for k, v in failed.items()], "",
            f"- decision: **{decision.recommendation}** (rule `{decision.rule}`)"])
    return {"flow": "eagle3-sweep", "config": cfg.name, "run_dir": str(cfg.run_dir()),
            "mlflow_uri": tracking.tracking_uri(cfg), "parent_run_id": parent, "results": results, "failed": failed,
            "decision": decision.recommendation, "decision_rule": decision.rule,
            "experiment_id": tracking.client_for(cfg)[1], "stages": {}}
