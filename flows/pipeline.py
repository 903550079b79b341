"""The flow ``eagle3-pipeline``: extract → train (+ the untrained baseline) → convert+validate+equivalence →
deploy+bench (both drafts) → acceptance gate → decision; and ``run_flow_cli`` behind ``eagle3 run|<stage>``.

Reads top to bottom like the recipe it is. Every stage is a cached task (``tasks/``): re-running this flow
after a failure re-executes only what failed and what depends on it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from prefect import flow

from flows.common import (SECRET_OVERRIDES_ENV, data_line, load_run_config, local_prefect, mlflow_ui, parent_run,
                          publish_summary, run_stage, split_overrides, stage_dirs, stop_ephemeral_server,
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


def format_summary(summary: dict, cfg: Any) -> str:
    """The text ``eagle3 run`` prints; it ends with the acceptance lengths, the MLflow location and the UI
    command."""
    fmt = (lambda v: "n/a" if v is None else f"{v:.3f}")
    link, cmd = mlflow_ui(cfg, summary.get("experiment_id"), summary.get("parent_run_id"))
    lines = [f"{summary.get('flow', FLOW_NAME)} finished: {summary['config']} (run dir {summary['run_dir']})"]
    lines += [f"  {k:<28} {v}" for k, v in summary.get("stages", {}).items()]
    if summary.get("data"):
        lines.append(f"data: {summary['data']}")
    if summary.get("decision"):
        lines.append(f"decision: {summary['decision']} (rule {summary.get('decision_rule')})")
    if "acceptance_length" in summary:
        lines.append(f"acceptance length, trained draft:      {fmt(summary['acceptance_length'])}")
        lines.append(f"acceptance length, untrained baseline: {fmt(summary.get('acceptance_length_untrained'))}")
    lines.append(f"MLflow: {summary['mlflow_uri']}  experiment {summary.get('experiment_id')}  "
                 f"parent run {summary.get('parent_run_id')}  ({link})")
    lines.append(f"MLflow UI: {cmd}")
    return "\n".join(lines)


def _with_retry_hint(state: Any, stage: str, env: dict) -> BaseException:
    """The failed flow's exception, its message extended with how to re-run only what failed."""
    exc = state.result(raise_on_failure=False)
    if not isinstance(exc, BaseException):
        from eagle3.errors import Eagle3Error

        exc = Eagle3Error(f"flow run ended {state.name}: {state.message}")
    from eagle3.errors import (AcceptanceTooLow, CheckpointInvalid, ConfigError, DataError, EngineUnsupported,
                               TrainingDiverged)

    home = env.get("PREFECT_HOME")
    entry = "flows/pipeline.py:eagle3_pipeline" if stage == "pipeline" else f"flows/stages.py:{stage}_flow"
    if isinstance(exc, (ConfigError, DataError, CheckpointInvalid, EngineUnsupported, TrainingDiverged,
                        AcceptanceTooLow)):
        # permanent: the same inputs fail the same way, so a plain retry is no advice
        hint = " — fix what is named above, then re-run the same command (finished stages are cached)"
    else:
        hint = (f" — re-run the same command (cached stages are skipped) or retry this flow run: "
                f"{'PREFECT_HOME=' + home + ' ' if home else ''}prefect flow-run retry "
                f"{state.state_details.flow_run_id} --entrypoint {entry}")
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (exc.args[0] + hint,) + tuple(exc.args[1:])
    return exc


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
    previous = _terminate_as_interrupt()
    _RECEIVED.clear()
    try:
        with local_prefect(cfg) as env, _quiet_known_tracebacks():
            state = flows[stage](config_path=str(config_path), overrides=public, return_state=True)
            if not state.is_completed():
                raise _with_retry_hint(state, stage, env)
            summary = state.result()
        _raise_if_terminated()
    finally:
        if secret and old is None:
            os.environ.pop(SECRET_OVERRIDES_ENV, None)
        elif secret:
            os.environ[SECRET_OVERRIDES_ENV] = old
        stop_ephemeral_server()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return format_summary(summary, cfg)


class _KnownErrorsWithoutTraceback(logging.Formatter):
    """Console formatter that leaves out the traceback of this project's own errors (``Eagle3Error``: their
    message names the file/key and both values, and the CLI prints it last), keeping it for anything else.
    Wraps the handler's formatter; the record itself is restored, so Prefect's API log keeps the traceback."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        from eagle3.errors import Eagle3Error

        if not (record.exc_info and isinstance(record.exc_info[1], Eagle3Error)):
            return self.inner.format(record)
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text = saved


@contextmanager
def _quiet_known_tracebacks() -> Iterator[None]:
    """Install :class:`_KnownErrorsWithoutTraceback` on Prefect's console handler(s) for the duration."""
    from prefect.logging.handlers import PrefectConsoleHandler

    handlers = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    saved = [h.formatter for h in handlers]
    for h in handlers:
        h.setFormatter(_KnownErrorsWithoutTraceback(h.formatter))
    try:
        yield
    finally:
        for h, f in zip(handlers, saved):
            h.setFormatter(f)


_RECEIVED: list[int] = []  # termination signals received during the current run


def _raise_if_terminated() -> None:
    """Raise KeyboardInterrupt when a SIGTERM/SIGHUP arrived during the run but its KeyboardInterrupt was lost.

    CPython swallows an exception raised by a signal handler inside an import's module-lock callback ("Exception
    ignored in ... _get_module_lock"), and Prefect's engine may catch one too; the run then goes on. A run that
    was told to stop must not then exit 0 as if nothing happened."""
    if _RECEIVED:
        names = ", ".join(signal.Signals(s).name for s in _RECEIVED)
        raise KeyboardInterrupt(f"received {names} during the run; the interrupt was lost inside the run, which "
                                "went on to its end: its outputs are complete, but it is reported as interrupted")


def _terminate_as_interrupt() -> dict:
    """Make SIGTERM/SIGHUP raise KeyboardInterrupt in the main thread, so a killed ``eagle3 run`` still runs
    every ``finally`` (engine process groups ended, the ephemeral Prefect server stopped) instead of dying
    with its children orphaned. Returns the previous handlers (empty outside the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def interrupt(signum, _frame):
        _RECEIVED.append(signum)
        raise KeyboardInterrupt(f"received signal {signal.Signals(signum).name}")

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, interrupt)
    return previous
