"""MLflow helpers of the pipeline: one parent run per pipeline run, one nested run per stage.

Everything goes through :class:`mlflow.MlflowClient` with explicit run ids (no fluent "active run"
state),
so tasks running in worker threads log to the right run. Layout of one pipeline run::

    parent run   tags prefect.flow_run_id, eagle3.pipeline_flow_run_id, prefect.flow_name,
    eagle3.config_name,
                 eagle3.decision, eagle3.auto_resolved (how each `auto` dtype/precision was
                 resolved, with the
                 measured bf16/float32 ratio: eagle3.precision)
                 params = flattened resolved config (every `auto` dtype/precision concrete;
                 secret-looking keys
                 redacted), artifact config.yaml
                 metrics acceptance_length, acceptance_length_untrained (copied from the bench
                 stages)
    └ nested run per stage (tag mlflow.parentRunId; eagle3.stage, eagle3.variant
    "trained"/"untrained")
                 step metrics through the stage's on_metrics callback, manifest.json as artifact,
                 counts.* / timings.* from the manifest; a cached stage's run has eagle3.cached =
                 "true"
                 and eagle3.produced_by_run_id = the nested run that produced the artifact.

Every run (parent and stage) also carries ``eagle3.config_name`` and its owner, ``eagle3.pid``,
``eagle3.host``, ``eagle3.pid_started``: the next run of the same name marks a run still RUNNING
whose owner is gone (``kill -9``) KILLED, with ``eagle3.killed_reason`` (:func:`close_stale_runs`).

Query a finished run with :func:`summarize_run` (docs/DESIGN.md, "Records")::

    from tasks.tracking import summarize_run
    summarize_run("<parent run id>", tracking_uri="sqlite:///runs/mlflow.db")

Errors: a connection failure or 5xx from a tracking server becomes
:class:`eagle3.errors.TransientError`.
"""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from eagle3.artifacts import read_manifest
from eagle3.redaction import flatten, redact
from eagle3.config import RunConfig
from eagle3.errors import DataError, TransientError
from tasks import mlflow_ui
from tasks.results import StageResult
from tasks.stage_config import STAGE_CONFIG, stage_sections

FLOW_RUN_TAG = "prefect.flow_run_id"  # on the parent and on every stage run
# on the parent run only: how a retried flow run finds it
PIPELINE_TAG = "eagle3.pipeline_flow_run_id"
PARENT_TAG = "mlflow.parentRunId"
_BATCH = 100  # MLflow's limit of params / tags per log_batch call
_TRANSIENT_CODES = {"TEMPORARILY_UNAVAILABLE", "INTERNAL_ERROR", "REQUEST_LIMIT_EXCEEDED"}


def _metric_key(key: str) -> str:
    """MLflow keys allow ``[A-Za-z0-9_\\-. /]``; anything else becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", str(key))


@contextmanager
def _transient() -> Iterator[None]:
    """Turn an unreachable/5xx tracking server into TransientError (retried by the task)."""
    try:
        yield
    except MlflowException as e:
        if getattr(e, "error_code", "") in _TRANSIENT_CODES:
            raise TransientError(f"MLflow tracking server: {e}") from e
        raise
    except (ConnectionError, OSError) as e:
        raise TransientError(f"MLflow tracking server unreachable: {e}") from e


def tracking_uri(cfg: RunConfig) -> str:
    """Where a run logs: ``tracking.mlflow_uri`` when the config sets it, else
    ``$MLFLOW_TRACKING_URI`` (set by ``infra/stack.sh``'s env.sh), else the local store
    ``sqlite:///<runs_dir>/mlflow.db``."""
    return cfg.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or cfg.mlflow_uri()


def client_for(cfg: RunConfig) -> tuple[MlflowClient, str]:
    """(client, experiment id) for a RunConfig: :func:`tracking_uri`, experiment
    ``cfg.tracking.experiment``.

    A new experiment on a local store keeps its artifacts under ``<runs_dir>/mlartifacts``. The
    experiment carries ``tasks.mlflow_ui.experiment_tags`` (model-training mode, the run list's
    columns).
    """
    uri = tracking_uri(cfg)
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=uri)
    with _transient():
        exp = client.get_experiment_by_name(cfg.tracking.experiment)
        if exp is None:
            location = None
            if not uri.startswith(("http://", "https://", "databricks")):
                location = (cfg.paths.resolved_runs_dir() / "mlartifacts").as_uri()
            try:
                client.create_experiment(cfg.tracking.experiment, artifact_location=location)
            except MlflowException:  # created concurrently by another process
                pass
            exp = client.get_experiment_by_name(cfg.tracking.experiment)
        # model-training mode, run list with the headline columns
        mlflow_ui.ensure_experiment_ui(client, exp)
        return client, exp.experiment_id


def config_params(cfg: RunConfig) -> dict[str, str]:
    """The resolved config flattened to ``section.key`` params, secret-looking values replaced by
    ``***``; ``extract.mode`` always (the config's dump leaves ``offline`` out, to keep the cache
    keys of configs that do not name it)."""
    return _with_mode(cfg, {k: str(v) for k, v in
                            flatten(redact(cfg.model_dump(mode="json"))).items()})


def _with_mode(cfg: RunConfig, params: dict[str, str]) -> dict[str, str]:
    """``params`` with ``extract.mode`` when they hold other ``extract.*`` keys."""
    if any(k.startswith("extract.") for k in params):
        params.setdefault("extract.mode", str(cfg.extract.mode))
    return params


def _log_batch(client: MlflowClient, run_id: str, *, metrics: list | None = None,
               params: dict | None = None,
               tags: dict | None = None) -> None:
    with _transient():
        for i in range(0, len(metrics or []), _BATCH * 10):
            client.log_batch(run_id, metrics=metrics[i:i + _BATCH * 10])
        items = list((params or {}).items())
        for i in range(0, len(items), _BATCH):
            client.log_batch(run_id, params=[Param(k, v[:6000]) for k, v in items[i:i + _BATCH]])
        titems = list((tags or {}).items())
        for i in range(0, len(titems), _BATCH):
            client.log_batch(run_id, tags=[RunTag(k, str(v)[:5000]) for k,
                                           v in titems[i:i + _BATCH]])


def numeric_leaves(prefix: str, d: dict | None) -> dict[str, float]:
    """Flatten the numeric leaves of ``d`` into ``prefix.key`` metrics (booleans and others
    skipped)."""
    out = {}
    for k, v in flatten(d or {}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}.{k}"] = float(v)
    return out


def chartable(summary: dict[str, float]) -> dict[str, float]:
    """``summary`` without the ``final.*`` keys (end-of-training copies of step metrics: kept in
    ``summary.json``, not charted twice)."""
    return {k: v for k, v in summary.items() if not k.startswith("final.")}


def log_metrics(client: MlflowClient, run_id: str, metrics: dict[str, float],
                step: int = 0) -> None:
    """Log numeric ``metrics`` at ``step`` (non-numeric values are an error: DataError naming the
    key)."""
    ts = int(time.time() * 1000)
    batch = []
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise DataError(f"metric {k!r}: expected a number, got {type(v).__name__} {v!r}")
        batch.append(Metric(_metric_key(k), float(v), ts, int(step)))
    _log_batch(client, run_id, metrics=batch)


OWNER_PID_TAG = "eagle3.pid"  # the process that created the run and would end it
OWNER_HOST_TAG = "eagle3.host"
OWNER_STARTED_TAG = "eagle3.pid_started"  # its start time (epoch seconds): a reused pid is no owner
KILLED_TAG = "eagle3.killed_reason"
CONFIG_TAG = "eagle3.config_name"


def owner_tags() -> dict[str, str]:
    """Tags naming the process that creates a run: ``eagle3.pid``, ``eagle3.host`` (the host name)
    and ``eagle3.pid_started`` (the process's start time, epoch seconds with 2 decimals, from
    psutil), so a later run can tell a run whose process is gone (``kill -9``) from one in
    progress (:func:`close_stale_runs`)."""
    import socket

    import psutil

    return {OWNER_PID_TAG: str(os.getpid()), OWNER_HOST_TAG: socket.gethostname(),
            OWNER_STARTED_TAG: f"{psutil.Process().create_time():.2f}"}


def owner_gone(tags: dict[str, str]) -> bool:
    """True when the run's owner (:func:`owner_tags`) ran on this host and is no longer running:
    no process has its pid, or the process with that pid started at another time (the pid was
    reused). False for a run without owner tags or one made on another host (nothing here can
    tell)."""
    import socket

    import psutil

    pid, host = tags.get(OWNER_PID_TAG, ""), tags.get(OWNER_HOST_TAG)
    if not pid.isdigit() or host != socket.gethostname():
        return False
    try:
        started = psutil.Process(int(pid)).create_time()
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False  # exists but cannot be read (another user): taken as alive
    recorded = tags.get(OWNER_STARTED_TAG)
    try:
        return recorded is not None and abs(float(recorded) - started) > 1.0
    except ValueError:
        return False


def close_stale_runs(cfg: RunConfig, client: MlflowClient | None = None,
                     exp_id: str | None = None) -> list[str]:
    """Mark KILLED every run of this config (tag ``eagle3.config_name`` = ``cfg.name``: parent and
    stage runs) that is still RUNNING although its owning process is gone (:func:`owner_gone`:
    a run ended by ``kill -9`` or a power cut never finishes its MLflow runs). Each gets the tag
    ``eagle3.killed_reason`` naming the pid, host and this process, and a warning is logged.
    Returns their run ids. Runs of other hosts, and runs without owner tags, are left as they are.
    """
    import logging
    import socket

    if client is None or exp_id is None:
        client, exp_id = client_for(cfg)
    name = cfg.name.replace("'", "\\'")
    with _transient():
        running = client.search_runs([exp_id], filter_string=(
            f"attributes.status = 'RUNNING' and tags.`{CONFIG_TAG}` = '{name}'"), max_results=1000)
    killed = []
    for r in running:
        tags = r.data.tags
        if not owner_gone(tags):
            continue
        reason = (f"process {tags.get(OWNER_PID_TAG)} on {tags.get(OWNER_HOST_TAG)} that ran it is "
                  f"gone (killed or crashed without finishing the run); found by the run of "
                  f"process {os.getpid()} on {socket.gethostname()}")
        with _transient():
            client.set_tag(r.info.run_id, KILLED_TAG, reason)
            client.set_terminated(r.info.run_id, status="KILLED")
        logging.getLogger(__name__).warning("MLflow run %s (%s) was still RUNNING: marked KILLED, "
                                            "%s", r.info.run_id, r.info.run_name, reason)
        killed.append(r.info.run_id)
    return killed


def start_pipeline_run(cfg: RunConfig, *, flow_run_id: str, flow_name: str,
                       config_file: Path | None = None) -> str:
    """Create the parent run of a pipeline run, or reuse the one already tagged with
    ``flow_run_id``.

    A retried Prefect flow run keeps its id, so its retry logs into the same parent run. Returns the
    MLflow run id.
    """
    client, exp_id = client_for(cfg)
    close_stale_runs(cfg, client, exp_id)
    with _transient():
        found = client.search_runs([exp_id],
                                   filter_string=f"tags.`{PIPELINE_TAG}` = '{flow_run_id}'",
                                   max_results=1)
        if found:
            run_id = found[0].info.run_id
            client.update_run(run_id, status="RUNNING")
            for k, v in owner_tags().items():
                client.set_tag(run_id, k, v)
            client.set_tag(run_id, "eagle3.attempts",
                           str(int(found[0].data.tags.get("eagle3.attempts", "1")) + 1))
            return run_id
        run = client.create_run(exp_id, run_name=f"{cfg.name}-{flow_run_id[:8]}", tags={
            FLOW_RUN_TAG: flow_run_id, PIPELINE_TAG: flow_run_id, "prefect.flow_name": flow_name,
            CONFIG_TAG: cfg.name, **owner_tags(),
            "eagle3.run_dir": str(cfg.run_dir()), "eagle3.attempts": "1"})
    run_id = run.info.run_id
    _log_batch(client, run_id, params=config_params(cfg))
    auto = getattr(cfg, "auto_resolved", {})
    # how each `auto` dtype/precision was resolved here (the params carry the resolved values)
    if auto:
        from eagle3.precision import summary_line

        with _transient():
            client.set_tag(run_id, "eagle3.auto_resolved", summary_line(auto)[:5000])
    if config_file is not None:
        with _transient():
            client.log_artifact(run_id, str(config_file))
    return run_id


def _error_text(error: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(error))


def finish_run(cfg: RunConfig, run_id: str, *, error: BaseException | None = None) -> None:
    """Mark a run FINISHED, or FAILED with tag ``eagle3.error`` = ``"<Type>: <message>"``, the
    artifact ``error.txt`` (the traceback) and the error on top of the run's description (a decision
    already there stays below it)."""
    client, _ = client_for(cfg)
    with _transient():
        if error is not None:
            client.set_tag(run_id, "eagle3.error", f"{type(error).__name__}: {error}"[:5000])
            client.log_text(run_id, _error_text(error), "error.txt")
            # e.g. the decision: kept below
            before = client.get_run(run_id).data.tags.get(mlflow_ui.NOTE_TAG)
            # plain text first: the run list shows the description as text
            note = (f"FAILED — {type(error).__name__}: {error}"[:3000]
                    + "\n\nTraceback: artifact `error.txt`.")
            client.set_tag(run_id, mlflow_ui.NOTE_TAG,
                           note + (f"\n\n---\n\n{before}" if before else ""))
        client.set_terminated(run_id, status="FAILED" if error is not None else "FINISHED")


def record_failure(cfg: RunConfig, run_id: str, error: BaseException) -> None:
    """Mark ``run_id`` FAILED with ``error``; if MLflow itself fails meanwhile (e.g. its SQLite file
    is on the disk that just filled up), the stage's own error stays the one raised, with a note
    about MLflow."""
    try:
        finish_run(cfg, run_id, error=error)
    except Exception as mlflow_error:  # noqa: BLE001 - never let bookkeeping hide the cause
        error.add_note(f"(recording this failure in MLflow run {run_id} failed too: "
                       f"{type(mlflow_error).__name__}: {mlflow_error})")


class StageRun:
    """A nested MLflow run of one stage; use through :func:`stage_run`."""

    def __init__(self, client: MlflowClient, run_id: str):
        self.client = client
        self.run_id = run_id

    def on_metrics(self, metrics: dict[str, float], step: int) -> None:
        """The ``on_metrics(metrics, step)`` callback the library stages accept (step = optimizer
        step)."""
        log_metrics(self.client, self.run_id, metrics, step)

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        log_metrics(self.client, self.run_id, metrics, step)

    def set_tags(self, tags: dict[str, Any]) -> None:
        _log_batch(self.client, self.run_id, tags=tags)

    def log_dict(self, obj: Any, name: str) -> None:
        """Store ``obj`` as the JSON artifact ``name``."""
        with _transient():
            self.client.log_text(self.run_id, json.dumps(obj, indent=2, sort_keys=True,
                                                         default=str), name)

    def log_path(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Store a file or a whole folder as artifacts (missing paths are skipped: optional plots).
        """
        p = Path(path)
        with _transient():
            if p.is_dir():
                self.client.log_artifacts(self.run_id, str(p), artifact_path)
            elif p.is_file():
                self.client.log_artifact(self.run_id, str(p), artifact_path)

    def log_manifest(self, directory: str | Path) -> dict:
        """Store ``manifest.json`` of a stage output and log its counts and timings as metrics."""
        m = read_manifest(directory)
        self.log_path(Path(directory) / "manifest.json")
        self.log_metrics({**numeric_leaves("counts", m.get("counts")),
                          **numeric_leaves("timings", m.get("timings"))})
        self.set_tags({"eagle3.output_dir": str(directory),
                       "eagle3.content_hash": m.get("content_hash", "")})
        return m

    def log_dataset(self, directory: str | Path, context: str) -> None:
        """``tasks.datasets.log_hidden_states`` into this run (the hidden states as an MLflow
        dataset input)."""
        from tasks.datasets import log_hidden_states

        with _transient():
            log_hidden_states(self.client, self.run_id, directory, context)


def stage_params(cfg: RunConfig, stage: str) -> dict[str, str]:
    """The config sections ``stage`` reads (``tasks.stage_config.STAGE_CONFIG``) as ``section.key``
    params (the train run shows ``train.lr``, ...; secret-looking values redacted); none for a stage
    not there."""
    if stage not in STAGE_CONFIG:
        return {}
    return _with_mode(cfg, {k: str(v) for k, v in
                            flatten(redact(stage_sections(cfg, stage))).items()})


def stage_run_name(stage: str, variant: str, cached: bool, attempt: int) -> str:
    """``train``, ``train-untrained``, ``extract (cached)``, ``deploy-bench #2`` (the second attempt
    under the same parent run: a Prefect retry or a retried flow run; a cached stage is no attempt
    and is never numbered)."""
    name = stage if variant == "trained" else f"{stage}-{variant}"
    return name + (" (cached)" if cached else "") + (f" #{attempt}" if attempt > 1 else "")


def _announce(cfg: RunConfig, exp_id: str, info: Any) -> None:
    """Inside a Prefect task: a task-run log line linking the stage's MLflow run (its URL on a
    tracking server, its id and store otherwise)."""
    from prefect.context import TaskRunContext

    if TaskRunContext.get() is None:
        return
    from prefect import get_run_logger

    uri = tracking_uri(cfg)
    base = mlflow_ui.ui_base(uri)
    where = mlflow_ui.run_url(base, exp_id, info.run_id) if base else f"{info.run_id} in {uri}"
    get_run_logger().info("MLflow run %s: %s", info.run_name, where)


def _attempt(client: MlflowClient, exp_id: str, parent_run_id: str, stage: str,
             variant: str) -> int:
    """1 + the runs of this stage and variant that ran (not served from the cache) under
    ``parent_run_id``."""
    with _transient():
        earlier = client.search_runs([exp_id], filter_string=(
            f"tags.`{PARENT_TAG}` = '{parent_run_id}' and tags.`eagle3.stage` = '{stage}' and "
            f"tags.`eagle3.variant` = '{variant}' and tags.`eagle3.cached` = 'false'"),
            max_results=1000)
    return len(earlier) + 1


@contextmanager
def stage_run(cfg: RunConfig, parent_run_id: str, stage: str, variant: str = "trained",
              tags: dict[str, Any] | None = None) -> Iterator[StageRun]:
    """A nested run under ``parent_run_id`` for ``stage``; FINISHED on success, FAILED (with the
    error) else."""
    client, exp_id = client_for(cfg)
    tags = {"eagle3.cached": "false", **{k: str(v) for k, v in (tags or {}).items()}}
    cached = tags["eagle3.cached"] == "true"
    attempt = 1 if cached else _attempt(client, exp_id, parent_run_id, stage, variant)
    with _transient():
        run = client.create_run(exp_id, run_name=stage_run_name(stage, variant, cached, attempt),
                                tags={
            PARENT_TAG: parent_run_id, "eagle3.stage": stage, "eagle3.variant": variant,
            "eagle3.attempt": str(attempt), CONFIG_TAG: cfg.name, **owner_tags(), **tags})
    sr = StageRun(client, run.info.run_id)
    _log_batch(client, sr.run_id, params=stage_params(cfg, stage))
    _announce(cfg, exp_id, run.info)
    try:
        yield sr
    except BaseException as e:
        record_failure(cfg, sr.run_id, e)
        raise
    finish_run(cfg, sr.run_id)


def record_cached_stage(cfg: RunConfig, parent_run_id: str, stage: str, variant: str,
                        result: StageResult, tags: dict[str, Any] | None = None) -> str:
    """A nested run for a stage Prefect served from its cache, pointing to the run that made the
    artifact.

    ``result`` is the cached task result. Returns the new run id.
    """
    with stage_run(cfg, parent_run_id, stage, variant, tags={
            **(tags or {}), "eagle3.cached": "true",
            "eagle3.produced_by_run_id": result.mlflow_run_id, "eagle3.output_dir": str(result.dir),
            "eagle3.content_hash": result.content_hash}) as sr:
        if chartable(result.metrics or {}):
            sr.log_metrics(chartable(result.metrics))
        if stage == "extract" and (result.dir / "manifest.json").is_file():
            # the dataset this pipeline run uses, also when it was reused from the cache
            sr.log_dataset(result.dir, "extraction")
    return sr.run_id


def log_parent_metrics(cfg: RunConfig, run_id: str, metrics: dict[str, float]) -> None:
    """Headline numbers on the parent run (e.g. ``acceptance_length``,
    ``acceptance_length_untrained``)."""
    client, _ = client_for(cfg)
    log_metrics(client, run_id, {k: v for k, v in metrics.items() if v is not None})


def set_parent_tags(cfg: RunConfig, run_id: str, tags: dict[str, Any]) -> None:
    client, _ = client_for(cfg)
    _log_batch(client, run_id, tags=tags)


def log_parent_artifact(cfg: RunConfig, run_id: str, obj: Any, name: str) -> None:
    client, _ = client_for(cfg)
    StageRun(client, run_id).log_dict(obj, name)


def summarize_run(parent_run_id: str, tracking_uri: str | None = None) -> dict:
    """What MLflow holds for one pipeline run: the parent and its nested stage runs, in start order.

    The query: ``client.get_run(parent)``, then ``client.search_runs([experiment],
    "tags.mlflow.parentRunId = '<parent>'", order_by=["attributes.start_time ASC"])``. Returns
    ``{"run_id", "status", "flow_run_id", "params": int (how many), "metrics": {...}, "tags":
    {eagle3.*}, "stages": [{"stage", "variant", "run_id", "status", "cached", "produced_by",
    "metrics", "datasets": [{"name", "digest", "source", "context"}]}]}``. Raises DataError if the
    run does not exist.
    """
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        parent = client.get_run(parent_run_id)
    except MlflowException as e:
        raise DataError(f"MLflow run {parent_run_id!r} not found at "
                        f"{tracking_uri or 'the default store'}: {e}") from e
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
                                  order_by=["attributes.start_time ASC"], max_results=1000)
    stages = [{"stage": c.data.tags.get("eagle3.stage"),
               "variant": c.data.tags.get("eagle3.variant"),
               "run_id": c.info.run_id, "status": c.info.status,
               "cached": c.data.tags.get("eagle3.cached") == "true",
               "produced_by": c.data.tags.get("eagle3.produced_by_run_id"),
               "metrics": dict(c.data.metrics),
               "datasets": [{"name": d.dataset.name, "digest": d.dataset.digest,
                             "source": d.dataset.source,
                             "context": {t.key: t.value for t in d.tags}.get("mlflow.data.context")}
                            for d in (c.inputs.dataset_inputs if c.inputs else [])]}
              for c in children]
    return {"run_id": parent_run_id, "status": parent.info.status,
            "flow_run_id": parent.data.tags.get(FLOW_RUN_TAG),
            "params": len(parent.data.params), "metrics": dict(parent.data.metrics),
            "tags": {k: v for k,
                     v in parent.data.tags.items() if k.startswith("eagle3.")}, "stages": stages}


def metric_history(run_id: str, key: str,
                   tracking_uri: str | None = None) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric of one run (e.g. a train run's ``loss``), by step."""
    client = MlflowClient(tracking_uri=tracking_uri)
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def stage_metric_history(parent_run_id: str, stage: str, key: str,
                         tracking_uri: str | None = None) -> list[tuple[int, float]]:
    """(step, value) pairs of ``key`` as the latest stage run of ``stage`` (variant ``trained``)
    under ``parent_run_id`` logged them, by step. A stage served from the cache logged no history:
    its run's ``eagle3.produced_by_run_id``, the stage run that computed the artifact, is read
    instead. ``[]`` when there is no such run, the producing run is not in this store, or it has no
    such metric. What a pipeline run's stage logged stays readable here after its folders are gone
    (another machine)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    with _transient():
        exp = client.get_run(parent_run_id).info.experiment_id
        runs = client.search_runs([exp], filter_string=(
            f"tags.`{PARENT_TAG}` = '{parent_run_id}' and tags.`eagle3.stage` = '{stage}' and "
            "tags.`eagle3.variant` = 'trained'"),
            order_by=["attributes.start_time DESC"], max_results=10)
    for r in runs:
        run_id = r.info.run_id
        if r.data.tags.get("eagle3.cached") == "true":
            run_id = r.data.tags.get("eagle3.produced_by_run_id") or ""
        try:
            history = client.get_metric_history(run_id, key) if run_id else []
        except MlflowException:  # the producing run is in another store
            history = []
        if history:
            return sorted((m.step, m.value) for m in history)
    return []


OnMetrics = Callable[[dict, int], None]
