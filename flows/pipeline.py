"""The flow ``eagle3-pipeline`` and the one pipeline sequence every whole-pipeline flow runs.

extract → train (+ the untrained baseline) → convert+validate+equivalence → pre-flight →
deploy+bench (both drafts) → acceptance figures → decision → acceptance gate → registry.
:func:`run_sequence` takes a stage runner: :func:`local_runner` runs each stage's cached tasks in
this process (``eagle3 run``, this flow); flows/distributed.py's runs each stage as a flow run of
its deployment on a work pool. Every stage is cached, so re-running after a failure re-executes only
what failed and what depends on it.
"""

from __future__ import annotations

from typing import Any, Callable

from prefect import flow

from eagle3.config import RunConfig
from flows.common import (data_line, finished, flow_run_label, load_run_config, parent_run,
                          publish_summary)
from flows.stages import STEPS
from tasks import tracking
from tasks.bench import decision_task, gate_task
from tasks.registry import register_task
from tasks.results import AcceptanceFigures, StageResult

FLOW_NAME = "eagle3-pipeline"
Runner = Callable[..., dict]  # runner(stage, **inputs) -> {name: result}, the stage's results


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def local_runner(cfg: RunConfig, parent: str, record: dict,
                 extract_dir: str | None = None) -> Runner:
    """Each stage's step of flows/stages.py in this process; ``extract_dir``: where extraction
    writes."""
    def run(stage: str, **inputs: Any) -> dict:
        if stage == "extract" and extract_dir:
            inputs["out_dir"] = extract_dir
        return STEPS[stage](cfg, parent, record, **inputs)

    return run


def run_sequence(cfg: RunConfig, parent: str, record: dict, runner: Runner) -> dict:
    """The pipeline on ``cfg`` under the MLflow parent run ``parent``, each stage through
    ``runner``; ``record`` collects the summary's stage lines. The acceptance figures and the
    decision are recorded before the acceptance gate decides, so a run whose gate fails still has
    its decision in MLflow. Returns the summary (:func:`pipeline_summary`, plus
    ``registered_model``)."""
    data = runner("extract")["extract"]
    drafts = runner("train", data=data)
    serving = runner("convert", data=data, drafts=drafts)
    deployed = runner("deploy", data=data, servings=serving, train=drafts["trained"])
    figures = deployed["figures"]
    record["acceptance"] = f"served {_fmt(figures.served)}, offline {_fmt(figures.offline)}"
    decision = decision_task(cfg, drafts["trained"], figures, parent,
                             preflight=deployed["preflight"])
    record["decision"] = f"{decision.recommendation} (rule {decision.rule})"
    record["acceptance-gate"] = (f"passed (minimum {figures.minimum:g})" if figures.passed
                                 else "failed")
    gate_task(cfg, figures)
    reg = register_task(cfg, serving["trained"], drafts["trained"], figures, parent)
    record["register-draft"] = (f"{reg.ref} ({'new version' if reg.new else 'already registered'}"
                                f"; alias best = version {reg.best_version})")
    summary = pipeline_summary(cfg, parent, figures, decision, record, data)
    summary["registered_model"] = reg.ref
    return summary


@flow(name=FLOW_NAME, flow_run_name=flow_run_label, log_prints=False)
def eagle3_pipeline(config_path: str, overrides: list[str] | None = None,
                    extract_dir: str | None = None) -> dict:
    """The whole pipeline on one config, in this process. Returns the summary dict (acceptance
    lengths, decision, MLflow ids). Raises the first failing stage's error (``stage <name> failed:
    ...``); the MLflow parent run is then FAILED and no engine is left running. ``extract_dir``:
    where the extraction is written instead of ``<run_dir>/extract`` (a sweep shares one per data
    size, flows/sweep.py)."""
    cfg = load_run_config(config_path, overrides)
    record: dict[str, str] = {}
    with parent_run(cfg, FLOW_NAME, record) as parent:
        summary = run_sequence(cfg, parent, record, local_runner(cfg, parent, record, extract_dir))
        publish_summary(cfg, parent, f"{FLOW_NAME}: {cfg.name}", summary["markdown"])
    return finished(summary)  # the decision as the state's message; the result is the dict


def pipeline_summary(cfg: RunConfig, parent: str, figures: AcceptanceFigures, decision: Any,
                     record: dict, data: StageResult | None = None) -> dict:
    """The numbers a user wants at the end (the flow's result; its ``markdown`` lines are the
    Prefect artifact). ``decision`` is the ``eagle3.decide.Decision`` the decision task recorded."""
    _, exp_id = tracking.client_for(cfg)
    md = [f"## Decision: **{decision.recommendation}** (rule `{decision.rule}`, "
          f"confidence {decision.confidence})", "", *[f"- {r}" for r in decision.reasons], "",
          "| acceptance length (bonus token counted) | value |", "|---|---|",
          f"| served, trained draft | **{_fmt(figures.served)}** |",
          f"| offline, same draft and prompts | {_fmt(figures.offline)} |",
          f"| simulated, training validation | {_fmt(figures.simulated)} |",
          *([f"| measured in training, development prompts | {_fmt(figures.dev)} |"]
            if figures.dev is not None else []),
          f"| served, untrained baseline | {_fmt(figures.untrained)} |", "",
          "| stage | this run |", "|---|---|", *[f"| {k} | {v} |" for k, v in record.items()]]
    return {"config": cfg.name, "run_dir": str(cfg.run_dir()),
            "mlflow_uri": tracking.tracking_uri(cfg),
            "experiment_id": exp_id, "parent_run_id": parent, "stages": record,
            "acceptance_length": figures.served, "acceptance_length_untrained": figures.untrained,
            "acceptance_length_offline": figures.offline,
            "acceptance_length_simulated": figures.simulated,
            "acceptance_length_dev": figures.dev,
            "beats_baseline": figures.beats_baseline,
            "decision": decision.recommendation, "decision_rule": decision.rule, "markdown": md,
            "data": data_line(data.dir) if data else None}
