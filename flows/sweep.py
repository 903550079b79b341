"""Flow ``eagle3-sweep``: the pipeline over data sizes × training schedules, then ``sweep_decision``.

Each point is the whole pipeline as a subflow, on its own run directory (``<name>-n<size>-<schedule>``), with
its own MLflow parent run tagged ``eagle3.sweep_run_id`` (and the point's data size, schedule, unique tokens,
epochs over the data, optimizer steps as tags/metrics), so the comparison table is read back from MLflow
(``tasks.reports.sweep_table``). The points of one data size share one extraction (``<sweep run dir>/extract-n<size>``:
the extraction cache key does not depend on the training schedule, so the second schedule finds it cached).
The sweep's parent run holds ``sweep.json``, the table (``sweep_table.md``), the data-scaling plot and the
decision ("more data" / "longer training" / "fix serving integration" / "stop"). A point that fails is
recorded as failed and left out of the decision (the sweep fails only when no point succeeded).

Command line (Prefect's ephemeral API, like ``eagle3 run``)::

    python -m flows.sweep configs/smollm2-cpu.yaml --size 64 --size 128 -o paths.runs_dir=/tmp/sweep-runs
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from eagle3.artifacts import read_manifest
from eagle3.errors import DataError
from flows.common import load_run_config, parent_run, publish_summary
from flows.pipeline import eagle3_pipeline
from tasks import tracking
from tasks.reports import SWEEP_TAG, format_table, sweep_report, sweep_table

# schedule name → train overrides: (a) a few epochs with cosine decay, (b) a long constant-LR run with
# evaluations every 50 optimizer steps (best-by-simulated-acceptance export picks the checkpoint).
DEFAULT_SCHEDULES = {"epochs3-cosine": ["train.schedule=epochs", "train.epochs=3"],
                     "constant-long": ["train.schedule=constant", "train.epochs=6", "train.eval_every=50"]}


def point_result(summary: dict, size: int, schedule: str) -> dict:
    """One row for ``eagle3.decide.sweep_decision`` from a finished point's summary and its draft manifest
    (``<run_dir>/train/manifest.json``): data size (conversations), unique tokens (``counts.train_positions``),
    epochs over the data, optimizer steps, and the served / offline / simulated acceptance lengths."""
    m = read_manifest(Path(summary["run_dir"]) / "train")
    return {"data_size": size, "schedule": schedule, "unique_tokens": (m.get("counts") or {}).get("train_positions"),
            "acceptance_length": summary["acceptance_length"], "offline": summary.get("acceptance_length_offline"),
            "simulated": summary.get("acceptance_length_simulated"),
            "epochs": m.get("epochs_over_data"), "optimizer_steps": m.get("optimizer_steps"),
            "parent_run_id": summary["parent_run_id"], "registered_model": summary.get("registered_model")}


def tag_point(cfg, sweep_run_id: str, row: dict) -> None:
    """Link a point's parent run to the sweep (tag :data:`SWEEP_TAG`) and store its sweep coordinates:
    tags ``eagle3.sweep.data_size``/``eagle3.sweep.schedule``, metrics ``sweep.unique_tokens``,
    ``sweep.epochs_over_data``, ``sweep.optimizer_steps``."""
    run = row["parent_run_id"]
    tracking.set_parent_tags(cfg, run, {SWEEP_TAG: sweep_run_id, "eagle3.sweep.data_size": row["data_size"],
                                        "eagle3.sweep.schedule": row["schedule"]})
    tracking.log_parent_metrics(cfg, run, {"sweep.unique_tokens": row["unique_tokens"],
                                           "sweep.epochs_over_data": row["epochs"],
                                           "sweep.optimizer_steps": row["optimizer_steps"]})


def _point_overrides(base: list[str], cfg_name: str, size: int, name: str, sched: list[str]) -> list[str]:
    return [*base, f"data.num_conversations={size}", *sched, f"name={cfg_name}-n{size}-{name}",
            "bench.baseline_untrained=false"]


def _publish(cfg, parent: str, results: list[dict], failed: dict, decision) -> None:
    fmt = (lambda v: "n/a" if v is None else f"{v:.3f}")
    publish_summary(cfg, parent, f"eagle3-sweep: {cfg.name}", [
        "| data size | schedule | served | offline | simulated |", "|---|---|---|---|---|",
        *[f"| {r['data_size']} | {r['schedule']} | {fmt(r['acceptance_length'])} | {fmt(r['offline'])} | "
          f"{fmt(r['simulated'])} |" for r in results],
        *[f"| {k} | failed | {v} | | |" for k, v in failed.items()], "",
        f"- decision: **{decision.recommendation}** (rule `{decision.rule}`)"])


@flow(name="eagle3-sweep", log_prints=False)
def sweep_flow(config_path: str, overrides: list[str] | None = None, data_sizes: list[int] | None = None,
               schedules: dict[str, list[str]] | None = None, target_acceptance: float | None = None) -> dict:
    """Run the pipeline for every (data size in conversations, schedule name → overrides) pair and decide.

    Defaults: sizes = half and all of ``data.num_conversations``; schedules = :data:`DEFAULT_SCHEDULES`.
    Raises DataError when every point failed.
    """
    from eagle3.decide import sweep_decision

    cfg = load_run_config(config_path, overrides)
    sizes = list(data_sizes or [cfg.data.num_conversations // 2, cfg.data.num_conversations])
    scheds = dict(schedules or DEFAULT_SCHEDULES)
    results, failed = [], {}
    with parent_run(cfg, "eagle3-sweep") as parent:
        tracking.set_parent_tags(cfg, parent, {"eagle3.sweep.sizes": ",".join(map(str, sizes)),
                                               "eagle3.sweep.schedules": ",".join(scheds)})
        for size in sizes:
            shared_extract = str(cfg.run_dir() / f"extract-n{size}")
            for name, sched in scheds.items():
                point = _point_overrides(list(overrides or []), cfg.name, size, name, sched)
                state = eagle3_pipeline.with_options(flow_run_name=f"n{size}-{name}")(
                    config_path=config_path, overrides=point, extract_dir=shared_extract, return_state=True)
                if state.is_completed():
                    results.append(point_result(state.result(), size, name))
                    tag_point(cfg, parent, results[-1])
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
        client.log_text(parent, format_table(sweep_table(parent, tracking.tracking_uri(cfg))), "sweep_table.md")
        if plot.is_file():
            client.log_artifact(parent, str(plot))
        _publish(cfg, parent, results, failed, decision)
    return {"flow": "eagle3-sweep", "config": cfg.name, "run_dir": str(cfg.run_dir()),
            "mlflow_uri": tracking.tracking_uri(cfg), "parent_run_id": parent, "results": results, "failed": failed,
            "decision": decision.recommendation, "decision_rule": decision.rule, "plot": str(plot),
            "experiment_id": tracking.client_for(cfg)[1], "stages": {}}


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.sweep CONFIG [--size N ...] [-o key=value ...] [--target X]``: run the sweep on
    Prefect's ephemeral API, print the table, the decision and the MLflow ids. Returns the exit status."""
    import argparse

    from flows.common import local_prefect, stop_ephemeral_server

    ap = argparse.ArgumentParser(prog="python -m flows.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--size", type=int, action="append", help="data size in conversations (repeatable)")
    ap.add_argument("-o", "--override", action="append", default=[], help="section.key=value (repeatable)")
    ap.add_argument("--target", type=float, default=None, help="acceptance length at which to stop")
    ap.add_argument("--report", metavar="SWEEP_RUN_ID", help="print the markdown report of a finished sweep "
                    "(tracking store of CONFIG + overrides) instead of running one")
    ap.add_argument("--plot-copy", default=None, help="with --report: copy the data-scaling plot here")
    a = ap.parse_args(argv)
    cfg = load_run_config(a.config, a.override)
    if a.report:
        print(sweep_report(a.report, tracking.tracking_uri(cfg), a.plot_copy))
        return 0
    try:
        with local_prefect(cfg):
            state = sweep_flow(config_path=a.config, overrides=a.override, data_sizes=a.size,
                               target_acceptance=a.target, return_state=True)
            if not state.is_completed():
                print(f"sweep failed: {state.message}")
                return 1
            out = state.result()
    finally:
        stop_ephemeral_server()
    print(format_table(sweep_table(out["parent_run_id"], out["mlflow_uri"])))
    print(f"failed points: {out['failed'] or 'none'}")
    print(f"decision: {out['decision']} (rule {out['decision_rule']}); plot {out['plot']}")
    print(f"MLflow: {out['mlflow_uri']} sweep parent run {out['parent_run_id']}  "
          f"(eagle3 decide {out['parent_run_id']} with MLFLOW_TRACKING_URI={out['mlflow_uri']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
