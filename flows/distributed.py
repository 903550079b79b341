"""The pipeline spread over work pools (issue 16): one deployment per stage, each on the pool of the machines it needs.

    eagle3-distributed     the orchestrator: the MLflow parent run; runs the stage deployments below one after
                           the other (``run_deployment``, each a flow run of its own on its own pool), then
                           records the decision, enforces the acceptance gate, registers
                           the draft (flows/pipeline.py's order)                           prefect.yaml: eagle3-cpu
    eagle3-stage-extract   hidden states → <run_dir>/extract                                             eagle3-gpu
    eagle3-stage-train     trained + untrained drafts → <run_dir>/train, train-untrained                 eagle3-gpu
    eagle3-stage-convert   convert + validate + equivalence → <run_dir>/serving, serving-untrained       eagle3-cpu
    eagle3-stage-deploy    pre-flight, engine behind the readiness gate + bench (both drafts), the       eagle3-gpu
                           acceptance figures (offline decoding beside the served figure)

Placement is prefect.yaml's (each deployment's ``work_pool``); the flows do not know it. Stages hand each other
directories in the run directory, on storage that every worker mounts (``paths.runs_dir``; the worker image's
``runs`` is the volume at /runs). Each stage flow ends by writing ``<run_dir>/handover/<stage>.json``: its task
results (tasks/results.py types, written with their type name and every ``dir`` relative to the runs directory),
its flow run id and host; the orchestrator reads them back as the same types through its own mount of the same
directory, wherever that is. The pre-flight (tasks/preflight.py) is the deploy stage's first task: it checks the
machine that is about to start the engine (installed engine, GPU memory, environment), before any engine starts. The stage tasks are the cached tasks of the
one-process pipeline (flows/pipeline.py), their cache on the shared storage too (``PREFECT_LOCAL_STORAGE_PATH``),
so running the orchestrator again (``prefect deployment run`` or ``prefect flow-run retry``) re-executes only
what failed and what depends on it.

A stage flow run that does not complete (failed; crashed, e.g. its container was killed; cancelled; not finished
within its deadline) fails the orchestrator with :class:`StageRunFailed` naming the stage, the flow run, its work
pool and state; the stage's MLflow runs that a killed container left RUNNING are marked FAILED.
"""

from __future__ import annotations

import socket
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

from prefect import flow, get_run_logger
from prefect.runtime import deployment, flow_run

from eagle3.errors import ConfigError, DataError, Eagle3Error
from flows.common import (finished_output, load_run_config, parent_run, publish_summary, run_stage, stage_dirs,
                          untrained_config)
from tasks import caching, tracking
from tasks.bench import acceptance_task, decision_task, gate_task
from tasks.convert import convert_task
from tasks.deploy import deploy_task, deploy_timeout_s
from tasks.extract import TIMEOUT_S as EXTRACT_TIMEOUT_S
from tasks.extract import extract_task
from tasks.preflight import preflight_task
from tasks.registry import register_task
from tasks.results import AcceptanceFigures, StageResult
from tasks.train import TIMEOUT_S as TRAIN_TIMEOUT_S
from tasks.train import train_task

FLOW_NAME = "eagle3-distributed"
STAGES = ("extract", "train", "convert", "deploy")
QUEUE_SLACK_S = 3600.0  # seconds a stage flow run may wait for a worker, on top of its tasks' own timeouts


class StageRunFailed(Eagle3Error):
    """A stage's flow run (on another machine) did not complete; the message names stage, flow run, pool, state."""


def stage_flow_name(stage: str) -> str:
    """``eagle3-stage-<stage>``: the flow (and deployment prefix) of one stage."""
    return f"eagle3-stage-{stage}"


def _variants(cfg: Any) -> list[tuple[str, Any]]:
    return [("trained", cfg)] + ([("untrained", untrained_config(cfg))] if cfg.bench.baseline_untrained else [])


# ---- hand-over records ---------------------------------------------------------------------------------------

def handover_path(cfg: Any, stage: str) -> Path:
    """``<run_dir>/handover/<stage>.json``."""
    return cfg.run_dir() / "handover" / f"{stage}.json"


def portable(cfg: Any, result: Any) -> dict:
    """The JSON form of a stage task's result in a hand-over record (or a flow parameter): ``{"type": name, ...}``
    with a :class:`StageResult`'s ``dir`` relative to the runs directory (``tasks.caching.run_relative``); an
    :class:`AcceptanceFigures` as its fields; a plain dict (the pre-flight report) as ``{"type": "dict",
    "value": ...}``. Raises DataError for any other type (nothing is dropped silently)."""
    if isinstance(result, StageResult):
        return {"type": "StageResult", **asdict(result), "dir": caching.run_relative(result.dir, cfg)}
    if isinstance(result, AcceptanceFigures):
        return {"type": "AcceptanceFigures", **asdict(result)}
    if isinstance(result, dict):
        return {"type": "dict", "value": result}
    raise DataError(f"hand-over: a result of type StageResult, AcceptanceFigures or dict expected, got "
                    f"{type(result).__name__}: {result!r:.200}")


def localized(cfg: Any, doc: dict) -> Any:
    """The inverse of :func:`portable` on this machine: the typed result, a relative ``dir`` joined to this
    machine's runs directory. Raises DataError for an unknown ``type`` or fields that do not fit it."""
    kind = doc.get("type") if isinstance(doc, dict) else None
    fields = {k: v for k, v in doc.items() if k != "type"} if kind else {}
    try:
        if kind == "StageResult":
            d = Path(fields.pop("dir"))
            return StageResult(dir=d if d.is_absolute() else cfg.paths.resolved_runs_dir() / d, **fields)
        if kind == "AcceptanceFigures":
            return AcceptanceFigures(**fields)
        if kind == "dict":
            return fields["value"]
    except (KeyError, TypeError) as e:
        raise DataError(f"hand-over: {kind} fields {sorted(fields)} do not make a {kind} ({e})") from e
    raise DataError(f"hand-over: type StageResult, AcceptanceFigures or dict expected, got {kind!r} "
                    f"(a record written by an older version of flows/distributed.py? re-run the stage)")


def write_handover(cfg: Any, stage: str, record: dict, results: dict) -> dict:
    """Write the hand-over record of this stage flow run (see the module doc); returns it."""
    from eagle3.artifacts import atomic_write_json, utc_now

    doc = {"stage": stage, "config": cfg.name, "flow_run_id": str(flow_run.id), "host": socket.gethostname(),
           "written_at": utc_now(), "record": dict(record),
           "results": {k: portable(cfg, v) for k, v in results.items()}}
    atomic_write_json(handover_path(cfg, stage), doc)
    return doc


def read_handover(cfg: Any, stage: str, flow_run_id: str) -> dict:
    """The hand-over record ``stage``'s flow run ``flow_run_id`` wrote, its results localized to this machine.

    Raises DataError when the file is missing or unreadable, or was written by another flow run."""
    import json

    path = handover_path(cfg, stage)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise DataError(f"{path}: no hand-over record; expected stage {stage}'s flow run {flow_run_id} to write it "
                        f"(is {cfg.paths.resolved_runs_dir()} the storage the stage's worker mounts?)") from e
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: unreadable hand-over record ({type(e).__name__}: {e})") from e
    if doc.get("flow_run_id") != flow_run_id:
        raise DataError(f"{path}: flow_run_id expected {flow_run_id} (the stage run just finished), got "
                        f"{doc.get('flow_run_id')!r}: a record of another run (does the stage's worker mount "
                        f"another runs directory than {cfg.paths.resolved_runs_dir()}?)")
    doc["results"] = {k: localized(cfg, v) for k, v in (doc.get("results") or {}).items()}
    return doc


@contextmanager
def _parent(cfg: Any, parent_run_id: str | None, flow_name: str) -> Iterator[str]:
    """The orchestrator's MLflow parent run (which it finishes or fails), else one of this stage flow's own."""
    if parent_run_id:
        yield parent_run_id
        return
    with parent_run(cfg, flow_name) as parent:
        yield parent


def _command(stage: str, config_path: str, overrides: list[str] | None) -> str:
    """What makes ``stage``'s output: its deployment, or the whole pipeline (finished stages are cached)."""
    return (f"prefect deployment run '{stage_flow_name(stage)}/<deployment>' (or the whole pipeline, "
            f"'{FLOW_NAME}/<deployment>') for config {config_path} with overrides {list(overrides or [])}")


# ---- stage flows (one deployment each) ------------------------------------------------------------------------

@flow(name=stage_flow_name("extract"), log_prints=False)
def extract_stage(config_path: str, overrides: list[str] | None = None, parent_run_id: str | None = None,
                  refresh: bool = False) -> dict:
    """Hidden-state extraction into ``<run_dir>/extract``; hand-over ``{"extract": StageResult}``."""
    cfg = load_run_config(config_path, overrides)
    record: dict = {}
    with _parent(cfg, parent_run_id, stage_flow_name("extract")) as parent:
        data = run_stage(extract_task, cfg=cfg, parent=parent, stage="extract",
                         out_dir=stage_dirs(cfg)["extract"], refresh=refresh, record=record)
        return write_handover(cfg, "extract", record, {"extract": data})


@flow(name=stage_flow_name("train"), log_prints=False)
def train_stage(config_path: str, overrides: list[str] | None = None, parent_run_id: str | None = None,
                refresh: bool = False) -> dict:
    """The trained and the untrained draft on ``<run_dir>/extract``; hand-over ``{variant: StageResult}``."""
    cfg = load_run_config(config_path, overrides)
    data = finished_output(stage_dirs(cfg)["extract"], "extract", _command("extract", config_path, overrides))
    record: dict = {}
    with _parent(cfg, parent_run_id, stage_flow_name("train")) as parent:
        results = {v: run_stage(train_task, cfg=c, parent=parent, stage="train", variant=v, data=data,
                                out_dir=stage_dirs(c, v)["train"], refresh=refresh, record=record)
                   for v, c in _variants(cfg)}
        return write_handover(cfg, "train", record, results)


@flow(name=stage_flow_name("convert"), log_prints=False)
def convert_stage(config_path: str, overrides: list[str] | None = None, parent_run_id: str | None = None,
                  refresh: bool = False) -> dict:
    """Convert + validate + equivalence-check both drafts into ``<run_dir>/serving*``; hand-over ``{variant:
    StageResult}``."""
    cfg = load_run_config(config_path, overrides)
    data = finished_output(stage_dirs(cfg)["extract"], "extract", _command("extract", config_path, overrides))
    record: dict = {}
    with _parent(cfg, parent_run_id, stage_flow_name("convert")) as parent:
        results = {}
        for v, c in _variants(cfg):
            d = stage_dirs(c, v)
            draft = finished_output(d["train"], "train", _command("train", config_path, overrides))
            results[v] = run_stage(convert_task, cfg=c, parent=parent, stage="convert", variant=v, draft=draft,
                                   data=data, out_dir=d["serving"], refresh=refresh, record=record)
        return write_handover(cfg, "convert", record, results)


@flow(name=stage_flow_name("deploy"), log_prints=False)
def deploy_stage(config_path: str, overrides: list[str] | None = None, parent_run_id: str | None = None,
                 train_result: dict | None = None, refresh: bool = False) -> dict:
    """Pre-flight (on this machine, before any engine starts), serve + benchmark both drafts behind the readiness
    gate, then the acceptance figures (``train_result``: the trained draft's train result in :func:`portable`
    form, for the simulated figure). Hand-over ``{variant: StageResult, "figures": AcceptanceFigures,
    "preflight": report}``; the orchestrator records the decision and then enforces the acceptance gate."""
    cfg = load_run_config(config_path, overrides)
    dirs = stage_dirs(cfg)
    data = finished_output(dirs["extract"], "extract", "") if (dirs["extract"] / "manifest.json").is_file() else None
    train = localized(cfg, train_result) if train_result else None
    record: dict = {}
    with _parent(cfg, parent_run_id, stage_flow_name("deploy")) as parent:
        servings = {v: finished_output(stage_dirs(c, v)["serving"], "convert", _command("convert", config_path,
                                                                                         overrides))
                    for v, c in _variants(cfg)}
        pre = run_stage(preflight_task, cfg=cfg, parent=parent, stage="preflight", record=record,
                        serving=servings["trained"], data=data)
        results = {}
        for v, c in _variants(cfg):
            d = stage_dirs(c, v)
            results[v] = run_stage(deploy_task, cfg=c, parent=parent, stage="deploy-bench", variant=v,
                                   serving=servings[v], deploy_dir=d["deploy"], bench_dir=d["bench"],
                                   timeout_s=deploy_timeout_s(c), refresh=refresh, record=record)
        figures = acceptance_task(cfg, results["trained"], results.get("untrained"), servings["trained"], parent,
                                  train=train)
        return write_handover(cfg, "deploy", record, {**results, "figures": figures, "preflight": pre})


STAGE_FLOWS = {"extract": extract_stage, "train": train_stage, "convert": convert_stage, "deploy": deploy_stage}


# ---- the orchestrator -----------------------------------------------------------------------------------------

def stage_deadline_s(cfg: Any, stage: str) -> float:
    """Seconds the orchestrator waits for a stage's flow run: its tasks' timeouts (both variants) + queue slack
    (deploy: the pre-flight's 600 s, both deploy-bench runs, the acceptance figures' 3600 s)."""
    tasks = {"extract": EXTRACT_TIMEOUT_S, "train": 2 * TRAIN_TIMEOUT_S, "convert": 2 * 3600.0,
             "deploy": 600.0 + 2 * deploy_timeout_s(cfg) + 3600.0}
    return tasks[stage] + QUEUE_SLACK_S


def _logger() -> Any:
    """The flow run's logger (to the Prefect API), or this module's outside a flow run."""
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        import logging

        return logging.getLogger(__name__)


def fail_orphaned_stage_runs(cfg: Any, stage_flow_run_id: str, why: str) -> list[str]:
    """Mark FAILED (tag ``eagle3.error`` = ``why``) the MLflow runs of a stage flow run still RUNNING: what a
    killed container leaves behind. Returns their ids."""
    client, exp_id = tracking.client_for(cfg)
    runs = client.search_runs([exp_id], filter_string=f"tags.`{tracking.FLOW_RUN_TAG}` = '{stage_flow_run_id}' "
                                                      "and attributes.status = 'RUNNING'", max_results=1000)
    for r in runs:
        tracking.finish_run(cfg, r.info.run_id, error=StageRunFailed(why))
    return [r.info.run_id for r in runs]


def run_stage_deployment(cfg: Any, stage: str, deployment_name: str, parameters: dict, record: dict,
                         parent: str, placements: dict | None = None) -> dict:
    """Run stage ``stage``'s deployment ``eagle3-stage-<stage>/<deployment_name>`` as a child flow run, wait for it
    (at most :func:`stage_deadline_s`), and return its hand-over results (localized); ``record`` gets its
    ran/cached lines, ``placements[stage]`` = ``{"flow_run_id", "work_pool", "host"}``, the parent MLflow run the
    tags ``eagle3.stage.<stage>.{flow_run_id,work_pool,host}``.

    Raises StageRunFailed when the flow run ends other than Completed (or is still not finished at the deadline:
    it is then cancelled); DataError when it completed without a readable hand-over record."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    name = f"{stage_flow_name(stage)}/{deployment_name}"
    deadline = stage_deadline_s(cfg, stage)
    fr = run_deployment(name, parameters=parameters, timeout=deadline, flow_run_name=f"{cfg.name}-{stage}")
    state = fr.state
    pool = fr.work_pool_name or "none (served by flows/serve.py)"
    tags = {f"eagle3.stage.{stage}.flow_run_id": str(fr.id), f"eagle3.stage.{stage}.work_pool": pool}
    if state is None or not state.is_completed():
        if state is None or not state.is_final():
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(fr.id, Cancelling(message=f"not finished after {deadline:.0f} s"))
            what = f"{'without a state' if state is None else 'still ' + state.name} after {deadline:.0f} s (cancelled)"
        else:
            what = f"{state.name}: {state.message or ''}".strip()
        why = (f"stage {stage} failed: flow run {fr.name!r} ({fr.id}) of deployment {name} on work pool {pool!r} "
               f"ended {what}")
        orphans = fail_orphaned_stage_runs(cfg, str(fr.id), why)
        tracking.set_parent_tags(cfg, parent, tags)
        if orphans:
            why += f" (its MLflow runs left RUNNING, now FAILED: {', '.join(orphans)})"
        raise StageRunFailed(why + f" — re-run: `prefect flow-run retry {flow_run.id}` or `prefect deployment run "
                                   f"'{FLOW_NAME}/{deployment_name}'` (finished stages are cached)")
    doc = read_handover(cfg, stage, str(fr.id))
    tags[f"eagle3.stage.{stage}.host"] = doc.get("host", "")
    tracking.set_parent_tags(cfg, parent, tags)
    if placements is not None:
        placements[stage] = {"flow_run_id": str(fr.id), "work_pool": pool, "host": doc.get("host")}
    record.update(doc.get("record") or {})
    _logger().info("stage %s: flow run %s on work pool %s, host %s: %s", stage, fr.name, pool, doc.get("host"),
                   doc.get("record"))
    return doc["results"]


@flow(name=FLOW_NAME, log_prints=False)
def distributed_pipeline(config_path: str, overrides: list[str] | None = None,
                         stage_deployment: str | None = None) -> dict:
    """The whole pipeline, each stage a flow run of its own deployment (see the module doc). Returns the summary of
    flows/pipeline.py's ``eagle3_pipeline`` plus ``stage_flow_runs``.

    ``stage_deployment``: the deployment name of the stage flows (default: this flow run's own deployment name,
    e.g. ``tiny-random``). Raises StageRunFailed (message ``stage <name> failed: ...``) for a stage that did not
    complete, AcceptanceTooLow (after the decision is recorded) when the acceptance gate fails; the MLflow parent
    run is then FAILED.
    """
    from flows.pipeline import pipeline_summary

    cfg = load_run_config(config_path, overrides)
    name = stage_deployment or deployment.name
    if not name:
        raise ConfigError("stage_deployment: expected the deployment name of the eagle3-stage-* flows (e.g. "
                          "'tiny-random') when eagle3-distributed runs outside a deployment, got none")
    record: dict[str, str] = {}
    placed: dict[str, dict] = {}
    with parent_run(cfg, FLOW_NAME) as parent:
        common = {"config_path": config_path, "overrides": list(overrides or []), "parent_run_id": parent}

        def stage(name_: str, **extra: Any) -> dict:
            return run_stage_deployment(cfg, name_, name, {**common, **extra}, record, parent, placed)

        data = stage("extract")["extract"]
        drafts = stage("train")
        serving = stage("convert")
        deployed = stage("deploy", train_result=portable(cfg, drafts["trained"]))
        figures = deployed["figures"]
        # flows/pipeline.py's order: the decision is recorded before the acceptance gate decides, pass or fail
        decision = decision_task(cfg, drafts["trained"], figures, parent, preflight=deployed["preflight"])
        gate_task(cfg, figures)
        registered = register_task(cfg, serving["trained"], drafts["trained"], figures, parent)
        summary = pipeline_summary(cfg, parent, figures, decision, record, data)
        summary["registered_model"] = registered.ref
        summary["stage_flow_runs"] = placed
        summary["markdown"] += ["", "| stage | work pool | host | flow run |", "|---|---|---|---|",
                                *[f"| {k} | {v['work_pool']} | {v['host']} | {v['flow_run_id']} |"
                                  for k, v in placed.items()]]
        publish_summary(cfg, parent, f"{FLOW_NAME}: {cfg.name}", summary["markdown"])
    return summary
