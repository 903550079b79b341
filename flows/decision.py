"""``eagle3 decide RUN_ID``: the recorded recommendation of a pipeline (parent) run or a sweep, from MLflow.

The decision step of a flow stores ``Decision.tags()`` as ``eagle3.decision*`` tags and ``decision.md`` /
``decision.json`` as artifacts of the parent run; this reads them back. The tracking store is
``$MLFLOW_TRACKING_URI`` when set, else the default local store ``sqlite:///<runs_dir>/mlflow.db`` of the
default config (``runs/`` under the working directory).
"""

from __future__ import annotations

import os
from pathlib import Path

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from eagle3.config import RunConfig
from eagle3.errors import DataError


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else ``RunConfig().mlflow_uri()`` (``sqlite:///<cwd>/runs/mlflow.db``)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or RunConfig().mlflow_uri()


def _check_store(uri: str) -> None:
    """Refuse, with the URI named and what was expected, a store that cannot answer: a plain path (MLflow would
    treat it as its retired file store), a SQLite file that does not exist (MLflow would create an empty one),
    an HTTP server that does not answer within 5 s (MLflow would retry for minutes)."""
    if "://" not in uri:
        hint = f"sqlite:///{Path(uri).expanduser().resolve()}" if uri.endswith(".db") else "sqlite:///<path>/mlflow.db"
        raise DataError(f"MLflow store {uri!r}: expected a URI such as {hint} or http://host:port, got a plain path")
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        # MLflow would create an empty store there and then report the run as unknown
        raise DataError(f"MLflow store {uri}: no such database file; expected the store the pipeline printed "
                        f"(--tracking-uri or MLFLOW_TRACKING_URI), e.g. sqlite:///<project>/runs/mlflow.db")
    if uri.startswith(("http://", "https://")):
        import httpx

        try:
            httpx.get(uri.rstrip("/") + "/health", timeout=5.0)
        except httpx.HTTPError as e:
            raise DataError(f"MLflow server {uri}: not reachable ({type(e).__name__}: {e}); expected a running "
                            f"tracking server (e.g. `make stack-up`)") from e


def decision_text(run_id: str, tracking_uri: str | None = None) -> str:
    """The decision of ``run_id`` as text: the recommendation, its rule, the evidence (``decision.md``) and the
    acceptance lengths on the run (served, untrained, offline, simulated); for a sweep run also the table of its
    points (flows.sweep.sweep_table). Raises DataError when the run is unknown or has no decision yet."""
    uri = tracking_uri or default_tracking_uri()
    _check_store(uri)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a text command: no progress bars
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as e:
        raise DataError(f"MLflow run {run_id!r} not found in {uri} (set MLFLOW_TRACKING_URI?): {e}") from e
    tags = run.data.tags
    if "eagle3.decision" not in tags:
        parent = tags.get("mlflow.parentRunId")
        if tags.get("eagle3.stage") and parent:
            raise DataError(f"MLflow run {run_id} is the {tags['eagle3.stage']} stage run of pipeline run {parent}; "
                            f"expected a pipeline (parent) or sweep run id: eagle3 decide {parent}")
        raise DataError(f"MLflow run {run_id} in {uri} has no eagle3.decision tag (status {run.info.status}; "
                        f"error: {tags.get('eagle3.error', 'none')}): the flow did not reach its decision step")
    try:
        body = client.download_artifacts(run_id, "decision.md")
        text = open(body).read().rstrip()
    except (MlflowException, OSError):
        text = f"# Decision: **{tags['eagle3.decision']}**\n\nRule: `{tags.get('eagle3.decision.rule')}`"
    m = run.data.metrics
    lines = [text, ""]
    for key, label in (("acceptance_length", "trained draft"), ("acceptance_length_untrained", "untrained baseline"),
                       ("acceptance_length_offline", "offline (in-process)"),
                       ("acceptance_length_simulated", "simulated (training validation)")):
        if key in m:
            lines.append(f"acceptance length, {label}: {m[key]:.3f}")
    if tags.get("prefect.flow_name") == "eagle3-sweep":
        from flows.sweep import format_table, sweep_table

        lines += ["", "Sweep points (from MLflow; acceptance lengths count the bonus token):", "",
                  format_table(sweep_table(run_id, uri)), ""]
    lines.append(f"MLflow run {run_id} ({run.info.status}) in {uri}")
    return "\n".join(lines)
