"""The flow ``eagle3-pipeline``: extract → train (+ the untrained baseline) → convert+validate+equivalence →
pre-flight → deploy+bench (both drafts) → acceptance figures → decision → acceptance gate → registry. ``eagle3 run`` drives it from ``cli/run.py``.

Reads top to bottom like the recipe it is. Every stage is a cached task (``tasks/``): re-running this flow
after a failure re-executes only what failed and what depends on it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from prefect import flow

from flows.common import (
    data_line,
    flow_run_label,
    load_run_config,
    parent_run,
    publish_summary,
    run_concurrently,
    run_stage,
    stage_dirs,
    untrained_config,
)
from tasks import tracking
from tasks.bench import acceptance_task, decision_task, gate_task, prefetch_offline_figure
from tasks.convert import convert_task
from tasks.deploy import deploy_task
from tasks.extract import extract_task
from tasks.preflight import preflight_task
from tasks.registry import register_task
from tasks.results import AcceptanceFigures, StageResult
from tasks.train import train_task

FLOW_NAME = "eagle3-pipeline"


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


@flow(name=FLOW_NAME, flow_run_name=flow_run_label, log_prints=False)
def eagle3_pipeline(config_path: str, overrides: list[str] | None = None, extract_dir: str | None = None) -> dict:
    """The whole pipeline on one config. Returns the summary dict (acceptance lengths, decision, MLflow ids).

    Stage by stage; the untrained baseline (``train.max_steps=0``) goes through every stage after extraction
    next to the trained draft. The acceptance figures and the decision are recorded before the acceptance gate
    decides, so a run whose gate fails still has its decision in MLflow. Raises the first failing stage's error
    (its message starts ``stage <name> failed:``); the MLflow parent run is then FAILED and no engine is left
    running. ``extract_dir``: where the extraction is written instead of ``<run_dir>/extract`` (a sweep shares
    one per data size, flows/sweep.py).
    """
    cfg = load_run_config(config_path, overrides)
    lines = [("trained", cfg)] + ([("untrained", untrained_config(cfg))] if cfg.bench.baseline_untrained else [])
    record: dict[str, str] = {}
    with parent_run(cfg, FLOW_NAME, record) as parent:
        data = run_stage(extract_task, cfg=cfg, parent=parent, stage="extract",
                         out_dir=Path(extract_dir) if extract_dir else stage_dirs(cfg)["extract"], record=record)
        drafts = {v: run_stage(train_task, cfg=c, parent=parent, stage="train", variant=v, record=record,
                               data=data, out_dir=stage_dirs(c, v)["train"]) for v, c in lines}
        serving = {v: run_stage(convert_task, cfg=c, parent=parent, stage="convert", variant=v, record=record,
                                draft=drafts[v], data=data, out_dir=stage_dirs(c, v)["serving"]) for v, c in lines}
        # before any engine starts: aux capture of the target's class, memory, settings, environment, template
        pre = run_stage(preflight_task, cfg=cfg, parent=parent, stage="preflight", record=record,
                        serving=serving["trained"], data=data)
        # both drafts served at once: each engine decodes on one thread (serve.cpu_threads), so on a 2-core CPU
        # the pair takes about as long as one; the record keeps the trained-then-untrained order. In a worker
        # thread Prefect's task timeout cannot interrupt anything (it warns): the stage is bounded by its own
        # deadlines instead — the readiness gate's, each request's and the watchdog's (what deploy_timeout_s sums)
        calls = {v: functools.partial(
            run_stage, deploy_task, cfg=c, parent=parent, stage="deploy-bench", variant=v, record=record,
            serving=serving[v], deploy_dir=stage_dirs(c, v)["deploy"], bench_dir=stage_dirs(c, v)["bench"],
            timeout_s=0) for v, c in lines}
        # the offline figure (in-process decoding of the same prompts, one thread) beside them; the acceptance task
        # below reads it from its memo, or computes it there when this attempt failed
        calls["offline"] = functools.partial(prefetch_offline_figure, cfg, serving["trained"].dir)
        bench = run_concurrently(calls)
        order = [("deploy-bench" if v == "trained" else f"deploy-bench ({v})") for v, _ in lines]
        record.update({k: record.pop(k) for k in order if k in record})
        figures = acceptance_task(cfg, bench["trained"], bench.get("untrained"), serving["trained"], parent,
                                  train=drafts["trained"])
        record["acceptance"] = f"served {_fmt(figures.served)}, offline {_fmt(figures.offline)}"
        decision = decision_task(cfg, drafts["trained"], figures, parent, preflight=pre)
        record["decision"] = f"{decision.recommendation} (rule {decision.rule})"
        record["acceptance-gate"] = "failed" if not figures.passed else f"passed (minimum {figures.minimum:g})"
        gate_task(cfg, figures)
        registered = register_task(cfg, serving["trained"], drafts["trained"], figures, parent)
        record["register-draft"] = (f"{registered.ref} ({'new version' if registered.new else 'already registered'}"
                                    f"; alias best = version {registered.best_version})")
        summary = pipeline_summary(cfg, parent, figures, decision, record, data)
        summary["registered_model"] = registered.ref
        publish_summary(cfg, parent, f"{FLOW_NAME}: {cfg.name}", summary["markdown"])
    return summary


def pipeline_summary(cfg: Any, parent: str, figures: AcceptanceFigures, decision: Any, record: dict,
                     data: StageResult | None = None) -> dict:
    """The numbers a user wants at the end, as a dict (the flow's result; also the lines of the Prefect markdown
    artifact). ``decision`` is the ``eagle3.decide.Decision`` the decision task recorded."""
    _, exp_id = tracking.client_for(cfg)
    fmt = _fmt
    md = [f"## Decision: **{decision.recommendation}** (rule `{decision.rule}`, confidence {decision.confidence})",
          "", *[f"- {r}" for r in decision.reasons], "",
          "| acceptance length (bonus token counted) | value |", "|---|---|",
          f"| served, trained draft | **{fmt(figures.served)}** |",
          f"| offline, same draft and prompts | {fmt(figures.offline)} |",
          f"| simulated, training validation | {fmt(figures.simulated)} |",
          f"| served, untrained baseline | {fmt(figures.untrained)} |", "",
          "| stage | this run |", "|---|---|", *[f"| {k} | {v} |" for k, v in record.items()]]
    return {"config": cfg.name, "run_dir": str(cfg.run_dir()), "mlflow_uri": tracking.tracking_uri(cfg),
            "experiment_id": exp_id, "parent_run_id": parent, "stages": record,
            "acceptance_length": figures.served, "acceptance_length_untrained": figures.untrained,
            "acceptance_length_offline": figures.offline, "acceptance_length_simulated": figures.simulated,
            "beats_baseline": figures.beats_baseline, "decision": decision.recommendation,
            "decision_rule": decision.rule, "markdown": md, "data": data_line(data.dir) if data else None}
