"""The flow ``eagle3-distributed``: flows/pipeline.py's sequence with each stage a flow run of its
own deployment, on the work pool of the machines it needs.

    eagle3-distributed   the orchestrator: the MLflow parent run; runs each stage's deployment
                         ``eagle3-<stage>/<stage>-<config>`` (flows/stages.py) one after the other,
                         then
                         the decision, the acceptance gate and the registry         prefect.yaml:
                         eagle3-cpu
    eagle3-extract       hidden states → <run_dir>/extract
    eagle3-gpu
    eagle3-train         trained + untrained drafts → <run_dir>/train, train-untrained
    eagle3-gpu
    eagle3-convert       convert + validate + equivalence → <run_dir>/serving, serving-untrained
    eagle3-cpu
    eagle3-deploy        pre-flight, engines behind the readiness gate + bench (both drafts), the
                         acceptance figures (offline decoding beside the served figure)
                         eagle3-gpu

Placement is prefect.yaml's (each deployment's ``work_pool``); the flows do not know it. Stages hand
each other directories in the run directory, on storage every worker mounts (``paths.runs_dir``; the
worker image's ``runs`` is the volume at /runs), and a hand-over record (flows/handover.py). The
stage tasks are the cached tasks of the one-process pipeline, their cache on the shared storage too
(``PREFECT_LOCAL_STORAGE_PATH``), so running the orchestrator again (``prefect deployment run`` or
``prefect flow-run retry``) re-executes only what failed and what depends on it.

A stage flow run that does not complete (failed; crashed, e.g. its container was killed; cancelled;
not finished within its deadline) fails the orchestrator with :class:`StageRunFailed` naming the
stage, the flow run, its work pool and state; the stage's MLflow runs that a killed container left
RUNNING are marked FAILED.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import deployment, flow_run

from eagle3.config import RunConfig
from eagle3.errors import ConfigError, Eagle3Error
from flows.common import finished, flow_run_label, load_run_config, parent_run, publish_summary
from flows.handover import portable, read_handover
from flows.pipeline import Runner, run_sequence
from flows.stages import flow_name
from tasks import tracking
from tasks.deploy import deploy_timeout_s
from tasks.extract import TIMEOUT_S as EXTRACT_TIMEOUT_S
from tasks.train import TIMEOUT_S as TRAIN_TIMEOUT_S

FLOW_NAME = "eagle3-distributed"
# seconds a stage flow run may wait for a worker, on top of its tasks' timeouts
QUEUE_SLACK_S = 3600.0


class StageRunFailed(Eagle3Error):
    """A stage's flow run (on another machine) did not complete; names stage, flow run, pool, state.
    """


def stage_deployment(stage: str, config_deployment: str) -> str:
    """``eagle3-<stage>/<stage>-<config deployment>``: the deployment that runs ``stage``."""
    return f"{flow_name(stage)}/{stage}-{config_deployment}"


def stage_deadline_s(cfg: RunConfig, stage: str) -> float:
    """Seconds the orchestrator waits for a stage's flow run: its tasks' timeouts (both variants) +
    queue slack (deploy: the pre-flight's 600 s, both deploy-bench runs, the acceptance figures'
    3600 s)."""
    tasks = {"extract": EXTRACT_TIMEOUT_S, "train": 2 * TRAIN_TIMEOUT_S, "convert": 2 * 3600.0,
             "deploy": 600.0 + 2 * deploy_timeout_s(cfg) + 3600.0}
    return tasks[stage] + QUEUE_SLACK_S


def _logger() -> Any:
    """The flow run's logger (to the Prefect API), or this module's outside a flow run."""
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


def fail_orphaned_stage_runs(cfg: RunConfig, stage_flow_run_id: str, why: str) -> list[str]:
    """Mark FAILED (tag ``eagle3.error`` = ``why``) the MLflow runs of a stage flow run still
    RUNNING: what a killed container leaves behind. Returns their ids."""
    client, exp_id = tracking.client_for(cfg)
    runs = client.search_runs([exp_id], filter_string=(
        f"tags.`{tracking.FLOW_RUN_TAG}` = '{stage_flow_run_id}' "
        "and attributes.status = 'RUNNING'"), max_results=1000)
    for r in runs:
        tracking.finish_run(cfg, r.info.run_id, error=StageRunFailed(why))
    return [r.info.run_id for r in runs]


def run_stage_deployment(cfg: RunConfig, stage: str, config_deployment: str, parameters: dict,
                         record: dict,
                         parent: str, placements: dict | None = None) -> dict:
    """Run ``stage``'s deployment (:func:`stage_deployment`) as a child flow run, wait for it (at
    most :func:`stage_deadline_s`) and return its hand-over results (localized). ``record`` gets its
    ran/cached lines, ``placements[stage]`` = ``{"flow_run_id", "work_pool", "host"}``, the parent
    MLflow run the tags ``eagle3.stage.<stage>.{flow_run_id,work_pool,host}``.

    Raises StageRunFailed when the flow run ends other than Completed (or is not finished at the
    deadline: it is then cancelled); DataError when it completed without a readable hand-over
    record."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    name = stage_deployment(stage, config_deployment)
    deadline = stage_deadline_s(cfg, stage)
    fr = run_deployment(name, parameters=parameters, timeout=deadline,
                        flow_run_name=f"{cfg.name}-{stage}")
    state = fr.state
    pool = fr.work_pool_name or "none (served by flows/serve.py)"
    tags = {f"eagle3.stage.{stage}.flow_run_id": str(fr.id),
            f"eagle3.stage.{stage}.work_pool": pool}
    if state is None or not state.is_completed():
        if state is None or not state.is_final():
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(
                    fr.id, Cancelling(message=f"not finished after {deadline:.0f} s"))
            now = "without a state" if state is None else "still " + state.name
            what = f"{now} after {deadline:.0f} s (cancelled)"
        else:
            what = f"{state.name}: {state.message or ''}".strip()
        why = (f"stage {stage} failed: flow run {fr.name!r} ({fr.id}) of deployment {name} "
               f"on work pool {pool!r} ended {what}")
        orphans = fail_orphaned_stage_runs(cfg, str(fr.id), why)
        tracking.set_parent_tags(cfg, parent, tags)
        if orphans:
            why += f" (its MLflow runs left RUNNING, now FAILED: {', '.join(orphans)})"
        raise StageRunFailed(why + f" — re-run: `prefect flow-run retry {flow_run.id}` or "
                                   f"`prefect deployment run '{FLOW_NAME}/{config_deployment}'` "
                                   "(finished stages are cached)")
    doc = read_handover(cfg, stage, str(fr.id))
    tags[f"eagle3.stage.{stage}.host"] = doc.get("host", "")
    tracking.set_parent_tags(cfg, parent, tags)
    if placements is not None:
        placements[stage] = {"flow_run_id": str(fr.id), "work_pool": pool, "host": doc.get("host")}
    record.update(doc.get("record") or {})
    _logger().info("stage %s: flow run %s on work pool %s, host %s: %s", stage, fr.name, pool,
                   doc.get("host"), doc.get("record"))
    return doc["results"]


def deployment_runner(cfg: RunConfig, parent: str, record: dict, config_path: str,
                      overrides: list[str], config_deployment: str, placements: dict) -> Runner:
    """Each stage as a flow run of its deployment; the stage flow reads its inputs from the run
    directory, except the trained draft's train result, which the deploy stage gets as a parameter.
    """
    common = {"config_path": config_path, "overrides": list(overrides), "parent_run_id": parent}

    def run(stage: str, train: Any = None, **_from_run_dir: Any) -> dict:
        params = {**common, "train_result": portable(cfg, train)} if stage == "deploy" else common
        return run_stage_deployment(cfg, stage, config_deployment, params, record, parent,
                                    placements)

    return run


@flow(name=FLOW_NAME, flow_run_name=flow_run_label, log_prints=False)
def distributed_pipeline(config_path: str, overrides: list[str] | None = None,
                         stage_deployment: str | None = None) -> dict:
    """The whole pipeline, each stage a flow run of its own deployment (see the module doc). Returns
    the summary of flows/pipeline.py's ``run_sequence`` plus ``stage_flow_runs``.

    ``stage_deployment``: the config part of the stage deployments' names (default: this flow run's
    own deployment name, e.g. ``tiny-random`` runs ``eagle3-extract/extract-tiny-random``, ...).
    Raises StageRunFailed (``stage <name> failed: ...``) for a stage that did not complete,
    AcceptanceTooLow (after the decision is recorded) when the acceptance gate fails; the MLflow
    parent run is then FAILED.
    """
    cfg = load_run_config(config_path, overrides)
    name = stage_deployment or deployment.name
    if not name:
        raise ConfigError("stage_deployment: expected the config part of the stage deployments' "
                          "names (e.g. 'tiny-random') when eagle3-distributed runs outside a "
                          "deployment, got none")
    record: dict[str, str] = {}
    placed: dict[str, dict] = {}
    with parent_run(cfg, FLOW_NAME, record) as parent:
        runner = deployment_runner(cfg, parent, record, config_path, list(overrides or []), name,
                                   placed)
        summary = run_sequence(cfg, parent, record, runner)
        summary["stage_flow_runs"] = placed
        summary["markdown"] += ["", "| stage | work pool | host | flow run |", "|---|---|---|---|",
                                *[f"| {k} | {v['work_pool']} | {v['host']} | {v['flow_run_id']} |"
                                  for k, v in placed.items()]]
        publish_summary(cfg, parent, f"{FLOW_NAME}: {cfg.name}", summary["markdown"])
    return finished(summary)  # the decision as the state's message; the result is the dict
