"""The flow ``eagle3-pipeline``: extract → train (+ the untrained baseline) → convert+validate+equivalence →
deploy+bench (both drafts) → acceptance gate → decision; and ``run_flow_cli`` behind ``eagle3 run|<stage>``.

Reads top to bottom like the recipe it is. Every stage is a cached task (``tasks/``): re-running this flow
after a failure re-executes only what failed and what depends on it.
"""

from __future__ import annotations

import os
from typing import Any

from prefect import flow

from flows.common import (load_run_config, local_prefect, mlflow_ui, parent_run, publish_summary, run_stage,
                          split_overrides, stage_dirs, stop_ephemeral_server, untrained_config,
                          SECRET_OVERRIDES_ENV)
from tasks import tracking
from tasks.bench import decision_task, gate_task
from tasks.convert import convert_task
from tasks.deploy import deploy_task, deploy_timeout_s
from tasks.extract import extract_task
from tasks.train import train_task

FLOW_NAME = "eagle3-pipeline"


def draft_line(cfg: Any, parent: str, data: dict, variant: str, record: dict) -> dict:
    """train → convert+validate+equivalence → deploy+bench for one variant (trained, or untrained baseline)."""
    d = stage_dirs(cfg, variant)
    common = {"cfg": cfg, "parent": parent, "variant": variant, "record": record}
    draft = run_stage(train_task, stage="train", data_dir=data["dir"], out_dir=str(d["train"]), **common)
    serving = run_stage(convert_task, stage="convert", draft_dir=draft["dir"], data_dir=data["dir"],
                        out_dir=str(d["serving"]), **common)
    bench = run_stage(deploy_task, stage="deploy-bench", serving_dir=serving["dir"], deploy_dir=str(d["deploy"]),
                      bench_dir=str(d["bench"]), timeout_s=deploy_timeout_s(cfg), **common)
    return {"train": draft, "serving": serving, "bench": bench}


@flow(name=FLOW_NAME, log_prints=False)
def eagle3_pipeline(config_path: str, overrides: list[str] | None = None) -> dict:
    """The whole pipeline on one config. Returns the summary dict (acceptance lengths, decision, MLflow ids).

    Raises the first stage's error (its message starts ``stage <name> failed:``); nothing is left running.
    """
    cfg = load_run_config(config_path, overrides)
    record: dict[str, str] = {}
    with parent_run(cfg, FLOW_NAME) as parent:
        data = run_stage(extract_task, cfg=cfg, parent=parent, stage="extract", out_dir=str(stage_dirs(cfg)["extract"]),
                         record=record)
        trained = draft_line(cfg, parent, data, "trained", record)
        untrained = (draft_line(untrained_config(cfg), parent, data, "untrained", record)
                     if cfg.bench.baseline_untrained else None)
        gate = gate_task.with_options(task_run_name="acceptance-gate")(
            cfg, trained["bench"], untrained["bench"] if untrained else None, trained["serving"]["dir"], parent)
        decision = decision_task(cfg, trained["train"]["dir"], trained["train"], gate, parent)
        summary = pipeline_summary(cfg, parent, gate, decision, record)
        publish_summary(cfg, parent, f"{FLOW_NAME}: {cfg.name}", summary["markdown"])
    return summary


def pipeline_summary(cfg: Any, parent: str, gate: dict, decision: dict, record: dict) -> dict:
    """The numbers a user wants at the end, as a dict (also the lines of the Prefect markdown artifact)."""
    _, exp_id = tracking.client_for(cfg)
    fmt = (lambda v: "n/a" if v is None else f"{v:.3f}")
    md = ["| stage | this run |", "|---|---|", *[f"| {k} | {v} |" for k, v in record.items()], "",
          f"- acceptance length, trained draft: **{fmt(gate.get('served'))}**",
          f"- acceptance length, untrained baseline: **{fmt(gate.get('untrained'))}**",
          f"- decision: **{decision.get('recommendation')}** (rule `{decision.get('rule')}`)"]
    return {"config": cfg.name, "run_dir": str(cfg.run_dir()), "mlflow_uri": cfg.mlflow_uri(),
            "experiment_id": exp_id, "parent_run_id": parent, "stages": record,
            "acceptance_length": gate.get("served"), "acceptance_length_untrained": gate.get("untrained"),
            "acceptance_length_offline": gate.get("offline"), "beats_baseline": gate.get("beats_baseline"),
            "decision": decision.get("recommendation"), "decision_rule": decision.get("rule"), "markdown": md}


def format_summary(summary: dict, cfg: Any) -> str:
    """The text ``eagle3 run`` prints; it ends with the acceptance lengths, the MLflow location and the UI
    command."""
    fmt = (lambda v: "n/a" if v is None else f"{v:.3f}")
    link, cmd = mlflow_ui(cfg, summary.get("experiment_id"), summary.get("parent_run_id"))
    lines = [f"{summary.get('flow', FLOW_NAME)} finished: {summary['config']} (run dir {summary['run_dir']})"]
    lines += [f"  {k:<28} {v}" for k, v in summary.get("stages", {}).items()]
    if summary.get("decision"):
        lines.append(f"decision: {summary['decision']} (rule {summary.get('decision_rule')})")
    if "acceptance_length" in summary:
        lines.append(f"acceptance length, trained draft:      {fmt(summary['acceptance_length'])}")
        lines.append(f"acceptance length, untrained baseline: {fmt(summary.get('acceptance_length_untrained'))}")
    lines.append(f"MLflow: {summary['mlflow_uri']}  experiment {summary.get('experiment_id')}  "
                 f"parent run {summary.get('parent_run_id')}  ({link})")
    lines.append(f"MLflow UI: {cmd}")
    return "\n".join(lines)


def run_flow_cli(stage: str, config_path: str, overrides: list[str]) -> str:
    """Run ``stage`` ("pipeline", "extract", "train", "convert", "deploy") as its Prefect flow on Prefect's
    ephemeral API (no server needed) and return the printed summary.

    Secret-looking overrides are passed through the environment, never as flow parameters. The ephemeral
    Prefect server is stopped before returning. Raises ConfigError for an unknown stage, the stage's errors.
    """
    from eagle3.config import load_config
    from eagle3.errors import ConfigError
    from flows.stages import STAGE_FLOWS

    flows = {"pipeline": eagle3_pipeline, **STAGE_FLOWS}
    if stage not in flows:
        raise ConfigError(f"stage {stage!r}: expected one of {sorted(flows)}")
    cfg = load_config(config_path, overrides)
    public, secret = split_overrides(list(overrides))
    old = os.environ.get(SECRET_OVERRIDES_ENV)
    if secret:
        import json

        os.environ[SECRET_OVERRIDES_ENV] = json.dumps(secret)
    try:
        with local_prefect(cfg):
            summary = flows[stage](config_path=str(config_path), overrides=public)
    finally:
        if secret:
            os.environ.pop(SECRET_OVERRIDES_ENV, None) if old is None else os.environ.update({SECRET_OVERRIDES_ENV: old})
        stop_ephemeral_server()
    return format_summary(summary, cfg)
