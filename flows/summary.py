"""What a person sees of a flow run in the Prefect UI and on the console of ``prefect deployment
run --watch``: its name, the MLflow parent run's id in its log, the library's log lines in the
task-run logs, its final state's message, and a markdown artifact with the figures and real links -
also for a run that failed.

- Flow run names come from :func:`flow_run_label` (Prefect's ``flow_run_name``): ``<config
  name>-<first 8 characters of the flow run id>`` — the MLflow parent run's name — plus the
  overrides, e.g. ``tiny-random-096d3bad [train.lr=1e-3]``.
- The MLflow parent run's id is logged to the flow run as soon as the parent run exists
  (:func:`announce_parent`): the first lines of the flow run's log, and of what ``prefect
  deployment run --watch`` prints; for a flow that records a decision (:data:`DECIDING_FLOWS`)
  with the ``eagle3 decide`` command (:func:`decide_command`: ``--tracking-uri URI`` whenever the
  store is not the one the command reads by default).
- A finished flow run's state message is the decision, the acceptance lengths and the parent run
  id (:func:`finished`): Prefect's "Finished in state Completed('...')" line and the flow run page.
- Log records of the library's loggers (``eagle3.*``: records skipped, samples truncated, ...) go
  to the current Prefect task or flow run (:func:`attach_library_logs`, what
  ``PREFECT_LOGGING_EXTRA_LOGGERS`` does, silent outside a run).
- Links: an MLflow tracking server's own URL; for a local SQLite store there is no server to link
  to, so the artifact gives the command that opens the UI, as plain text.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import textwrap
from pathlib import Path
from typing import Any

from prefect.artifacts import create_markdown_artifact
from prefect.states import Completed, State
from prefect.logging.handlers import APILogHandler

from eagle3.config import RunConfig
from tasks import mlflow_ui as ui
from tasks import tracking

LIBRARY_LOGGER = "eagle3"
# columns of the failure artifact's error block: what Prefect's artifact page shows without cutting
ERROR_WIDTH = 80
# the flows whose parent run gets a decision (eagle3.decision tags, decision.md) that
# `eagle3 decide` reads; the extract, train and convert stage flows record none
DECIDING_FLOWS = ("eagle3-pipeline", "eagle3-distributed", "eagle3-sweep", "eagle3-deploy")
DECISION_TAG = "eagle3.decision"


def decide_command(tracking_uri: str | None, run_id: str) -> str:
    """``eagle3 decide RUN_ID``, plus ``--tracking-uri URI`` unless ``tracking_uri`` is None (not
    known) or the store the command reads without it: ``sqlite:///<runs_dir>/mlflow.db`` of the
    default config (``eagle3.config.PathsConfig``, under the current directory), with
    ``$MLFLOW_TRACKING_URI`` unset or naming that same store. A store set by the config or by
    ``$MLFLOW_TRACKING_URI`` is spelled out, since the shell that reads the decision may lack the
    variable."""
    from eagle3.config import RunConfig

    env = os.environ.get("MLFLOW_TRACKING_URI")
    default = tracking_uri is None or (tracking_uri == RunConfig().mlflow_uri()
                                       and env in (None, "", tracking_uri))
    return f"eagle3 decide {run_id}" + ("" if default else
                                        f" --tracking-uri {shlex.quote(tracking_uri)}")


def has_decision(cfg: RunConfig, run_id: str) -> bool:
    """Whether the MLflow run ``run_id`` carries a recorded decision (the ``eagle3.decision`` tag
    that ``eagle3 decide`` reads)."""
    client, _ = tracking.client_for(cfg)
    return DECISION_TAG in client.get_run(run_id).data.tags


def flow_run_label() -> str:
    """The flow run's name, from its parameters (``config_path``, ``overrides``) and id: ``<config
    name>-<id[:8]>`` and the overrides in brackets. The config's ``name`` is read from the file (a
    file that does not load gives its stem; the flow then fails with the config's own error)."""
    from prefect.runtime import flow_run

    params = dict(flow_run.parameters or {})
    path, overrides = str(params.get("config_path") or "run"), list(params.get("overrides") or [])
    try:
        from eagle3.config import load_config

        name = load_config(path, overrides).name
    except Exception:  # noqa: BLE001 - a name is needed before the flow reports the config's error
        name = Path(path).stem
    label = f"{name}-{str(flow_run.id)[:8]}"
    return label + (f" [{' '.join(overrides)}]" if overrides else "")


def _run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The flow run's logger (to the Prefect API and the console), or this module's outside a run.
    """
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


def announce_parent(cfg: RunConfig, parent: str, decides: bool = True) -> str:
    """Log (INFO, to the flow run) the MLflow parent run's id, where it is, and, when the flow
    records a decision (``decides``), the command that reads it: what a ``prefect deployment run``
    user needs for ``eagle3 decide``. Returns the line."""
    link, cmd = mlflow_ui(cfg, tracking.client_for(cfg)[1], parent)
    where = f"MLflow UI: {link}" if link else f"open the MLflow UI with: {cmd}"
    uri = tracking.tracking_uri(cfg)
    decide = f"its decision: `{decide_command(uri, parent)}`; " if decides else ""
    line = f"MLflow parent run {parent} (store {uri}); {decide}{where}"
    _run_logger().info(line)
    return line


def _fmt(v: Any) -> str:
    return "n/a" if v is None else f"{float(v):.3f}"


def headline(summary: dict) -> str:
    """One line from a pipeline summary (``flows.pipeline.pipeline_summary``): the decision and its
    rule, the acceptance lengths (AL, bonus token counted) served / untrained / offline to 3
    decimals, the MLflow parent run id with the ``eagle3 decide`` command
    (:func:`decide_command` on ``summary["mlflow_uri"]``) when the summary holds a decision."""
    parent = summary.get("parent_run_id")
    line = (f"decision: {summary.get('decision')} (rule {summary.get('decision_rule')}); "
            f"AL served {_fmt(summary.get('acceptance_length'))}, untrained "
            f"{_fmt(summary.get('acceptance_length_untrained'))}, offline "
            f"{_fmt(summary.get('acceptance_length_offline'))}; MLflow parent run {parent}")
    if summary.get("decision"):
        line += f": {decide_command(summary.get('mlflow_uri'), parent)}"
    return line


def finished(summary: dict) -> State:
    """The flow's return value: Completed with :func:`headline` as its message and ``summary`` as
    its result (a caller's ``flow(...)`` and ``state.result()`` still get the dict). The headline is
    also logged to the flow run."""
    line = headline(summary)
    _run_logger().info(line)
    return Completed(message=line, data=summary)


class _RunLogHandler(APILogHandler):
    """Prefect's API log handler, silent where there is no run (the library also logs outside
    flows)."""

    def emit(self, record: logging.LogRecord) -> None:
        from prefect.context import FlowRunContext, TaskRunContext

        if FlowRunContext.get() is None and TaskRunContext.get() is None:
            return
        super().emit(record)


def attach_library_logs(name: str = LIBRARY_LOGGER, level: int = logging.INFO) -> logging.Logger:
    """Send records of logger ``name`` (and its children) at ``level`` or above to the Prefect run
    they happen in; idempotent. Records still reach the other handlers (the console, the deployment
    server's log)."""
    logger = logging.getLogger(name)
    if not any(isinstance(h, _RunLogHandler) for h in logger.handlers):
        handler = _RunLogHandler()
        handler.setLevel(level)
        logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)
    return logger


def mlflow_ui(cfg: RunConfig, experiment_id: str | None = None,
              run_id: str | None = None) -> tuple[str | None, str | None]:
    """(URL of the run in the MLflow UI, None) on a tracking server; (None, the command that opens
    the UI) on a local store."""
    uri = tracking.tracking_uri(cfg)
    base = ui.ui_base(uri)
    if base is None:
        return None, ui.ui_command(uri)
    if experiment_id and run_id:
        return ui.run_url(base, experiment_id, run_id), None
    return base, None


def _links(cfg: RunConfig, exp_id: str, parent: str) -> list[str]:
    """The MLflow lines of an artifact; the ``eagle3 decide`` line only when ``parent`` carries a
    decision (:func:`has_decision`: a stage flow's run has none)."""
    uri = tracking.tracking_uri(cfg)
    base = ui.ui_base(uri)
    decide = ([f"- its decision from the command line: `{decide_command(uri, parent)}`"]
              if has_decision(cfg, parent) else [])
    if base is None:
        return [f"- MLflow: local store {uri}, parent run {parent}; open the UI with: "
                f"{ui.ui_command(uri)}", *decide]
    return [f"- MLflow run: [{cfg.name} ({parent[:8]})]({ui.run_url(base, exp_id, parent)})",
            f"- all runs of the experiment, with acceptance and decision columns: "
            f"[{cfg.tracking.experiment}]({ui.experiment_url(base, exp_id)})", *decide]


def _key(cfg: RunConfig, suffix: str = "") -> str:
    return re.sub(r"[^a-z0-9-]", "-", f"eagle3-{cfg.name}{suffix}".lower())


def publish_summary(cfg: RunConfig, parent: str, title: str, lines: list[str]) -> None:
    """A Prefect markdown artifact (key ``eagle3-<config name>``) with the run's numbers and links.
    """
    _, exp_id = tracking.client_for(cfg)
    md = "\n".join([f"# {title}", "", *lines, "", *_links(cfg, exp_id, parent),
                    f"- run directory: {cfg.run_dir()}"])
    create_markdown_artifact(markdown=md, key=_key(cfg), description=title)


def failed_stage(error: BaseException) -> str | None:
    """The stage named by ``flows.common.run_stage``'s prefix ``stage <label> failed:``, else None.
    """
    m = re.match(r"stage (.+?) failed:", str(error.args[0]) if error.args else "")
    return m.group(1) if m else None


def _failed_run(cfg: RunConfig, exp_id: str, parent: str) -> Any | None:
    """The newest FAILED nested run of ``parent`` (the stage that failed), if any."""
    client, _ = tracking.client_for(cfg)
    runs = client.search_runs([exp_id],
                              filter_string=f"tags.`{tracking.PARENT_TAG}` = '{parent}' and "
                              "attributes.status = 'FAILED'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def error_block(message: str, width: int = ERROR_WIDTH) -> list[str]:
    """``message`` as the lines of a code block at most ``width`` columns wide (Prefect's markdown
    shows a code block unwrapped, so one long line is cut off at the page's edge): its own line
    breaks kept, long lines wrapped at spaces; a single word longer than ``width`` (a path, a URL)
    is cut into ``width``-column pieces."""
    out: list[str] = []
    for line in message.splitlines() or [""]:
        out += textwrap.wrap(line, width, break_on_hyphens=False, replace_whitespace=False,
                             drop_whitespace=True) or [""]
    return out


def failure_lines(cfg: RunConfig, exp_id: str, parent: str, error: BaseException) -> list[str]:
    """What failed and where to look: the stage, the error, the stage's MLflow run (its
    ``error.txt`` and logged files: the engine log of deploy-bench), its Prefect task-run log."""
    stage = failed_stage(error) or "the flow itself (before any stage)"
    message = f"{type(error).__name__}: {str(error)[:3000]}"
    lines = [f"**Failed stage: {stage}**", "", "```", *error_block(message), "```", ""]
    run = _failed_run(cfg, exp_id, parent)
    base = ui.ui_base(tracking.tracking_uri(cfg))
    if run is not None and base is not None:
        url = ui.run_url(base, exp_id, run.info.run_id)
        arts = ui.run_url(base, exp_id, run.info.run_id, "artifacts")
        lines += [f"- its MLflow run: [{run.info.run_name}]({url}); its log and error: "
                  f"[artifacts (error.txt, logs)]({arts})"]
    elif run is not None:
        lines += [f"- its MLflow run: {run.info.run_name} ({run.info.run_id}), error in its "
                  "artifact error.txt"]
    task_run = run.data.tags.get("prefect.task_run_id") if run is not None else None
    prefect_base = ui.prefect_ui_base()
    if task_run and prefect_base:
        lines += [f"- its Prefect task-run log: [{stage}]({prefect_base}/runs/task-run/{task_run})"]
    return lines


def publish_failure(cfg: RunConfig, parent: str, title: str, error: BaseException,
                    record: dict) -> None:
    """A Prefect markdown artifact for a failed flow run (key ``eagle3-<config name>-failed``): the
    failed stage, its error, links to its MLflow run and log, what ran before. Never raises (the
    flow's own error is what the run reports)."""
    try:
        _, exp_id = tracking.client_for(cfg)
        table = ["| stage | this run |", "|---|---|", *[f"| {k} | {v} |" for k,
                                                        v in record.items()]]
        stage = failed_stage(error)
        if stage and stage not in record:
            table.append(f"| {stage} | **failed** |")
        md = "\n".join([f"# {title} — failed", "", *failure_lines(cfg, exp_id, parent, error), "",
                        *table, "",
                        *_links(cfg, exp_id, parent), f"- run directory: {cfg.run_dir()}"])
        create_markdown_artifact(markdown=md, key=_key(cfg, "-failed"),
                                 description=f"{title}: failed")
    except Exception as e:  # noqa: BLE001 - bookkeeping must not hide the stage's error
        error.add_note(f"(the failure artifact could not be written: {type(e).__name__}: {e})")
