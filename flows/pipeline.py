"""The flow ``eagle3-pipeline``: extract → train (+ the untrained baseline) → convert+validate+equivalence →
deploy+bench (both drafts) → acceptance gate → decision. ``eagle3 run`` drives it from ``cli/run.py``.

Reads top to bottom like the recipe it is. Every stage is a cached task (``tasks/``): re-running this flow
after a failure re-executes only what failed and what depends on it.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.common import (data_line, load_run_config, parent_run, publish_summary, run_stage, stage_dirs,
                          untrained_config)
from tasks import tracking
from tasks.bench import decision_task, gate_task
from tasks.convert import convert_task
from tasks.deploy import deploy_task, deploy_timeout_s
from tasks.extract import extract_task
from tasks.registry import register_task
from tasks.train import train_task

FLOW_NAME = "eagle3-pipeline"


@flow(name=FLOW_NAME, log_prints=False)
def eagle3_pipeline(config_path: str, overrides: list[str] | None = None, extract_dir: str | None = None) -> dict:
    """The whole pipeline on one config. Returns the summary dict (acceptance lengths, decision, MLflow ids).

    Stage by stage; the untrained baseline (``train.max_steps=0``) goes through every stage after extraction
    next to the trained draft. Raises the first failing stage's error (its message starts ``stage <name>
    failed:``); the MLflow parent run is then FAILED and no engine is left running. ``extract_dir``: where the
    extraction is written instead of ``<run_dir>/extract`` (a sweep shares one per data size, flows/sweep.py).
    """
    cfg = load_run_config(config_path, overrides)
    lines = [("trained", cfg)] + ([("untrained", untrained_config(cfg))] if cfg.bench.baseline_untrained else [])
    record: dict[str, str] = {}
    with parent_run(cfg, FLOW_NAME) as parent:
        data = run_stage(extract_task, cfg=cfg, parent=parent, stage="extract",
                         out_dir=extract_dir or str(stage_dirs(cfg)["extract"]), record=record)
        drafts = {v: run_stage(train_task, cfg=c, parent=parent, stage="train", variant=v, record=record,
                               data_dir=data["dir"], out_dir=str(stage_dirs(c, v)["train"])) for v, c in lines}
        serving = {v: run_stage(convert_task, cfg=c, parent=parent, stage="convert", variant=v, record=record,
                                draft_dir=drafts[v]["dir"], data_dir=data["dir"],
                                out_dir=str(stage_dirs(c, v)["serving"])) for v, c in lines}
        bench = {v: run_stage(deploy_task, cfg=c, parent=parent, stage="deploy-bench", variant=v, record=record,
                              serving_dir=serving[v]["dir"], deploy_dir=str(stage_dirs(c, v)["deploy"]),
                              bench_dir=str(stage_dirs(c, v)["bench"]), timeout_s=deploy_timeout_s(c))
                 for v, c in lines}
        gate = gate_task(cfg, bench["trained"], bench.get("untrained"), serving["trained"]["dir"], parent,
                         train_result=drafts["trained"])
        registered = register_task(cfg, serving["trained"], drafts["trained"], gate, parent)
        decision = decision_task(cfg, drafts["trained"]["dir"], drafts["trained"], gate, parent)
        summary = pipeline_summary(cfg, parent, gate, decision, record, data)
        summary["registered_model"] = f"{registered['name']}/{registered['version']}"
        publish_summary(cfg, parent, f"{FLOW_NAME}: {cfg.name}", summary["markdown"])
    return summary


def pipeline_summary(cfg: Any, parent: str, gate: dict, decision: dict, record: dict, data: dict | None = None) -> dict:
    """The numbers a user wants at the end, as a dict (also the lines of the Prefect markdown artifact)."""
    _, exp_id = tracking.client_for(cfg)
    fmt = (lambda v: "n/a" if v is None else f"{v:.3f}")
    md = ["| stage | this run |", "|---|---|", *[f"| {k} | {v} |" for k, v in record.items()], "",
          f"- acceptance length, trained draft: **{fmt(gate.get('served'))}**",
          f"- acceptance length, untrained baseline: **{fmt(gate.get('untrained'))}**",
          f"- decision: **{decision.get('recommendation')}** (rule `{decision.get('rule')}`)"]
    return {"config": cfg.name, "run_dir": str(cfg.run_dir()), "mlflow_uri": tracking.tracking_uri(cfg),
            "experiment_id": exp_id, "parent_run_id": parent, "stages": record,
            "acceptance_length": gate.get("served"), "acceptance_length_untrained": gate.get("untrained"),
            "acceptance_length_offline": gate.get("offline"),
            "acceptance_length_simulated": gate.get("simulated"), "beats_baseline": gate.get("beats_baseline"),
            "decision": decision.get("recommendation"), "decision_rule": decision.get("rule"), "markdown": md,
            "data": data_line(data["dir"]) if data else None}
