"""``eagle3 run|extract|train|convert|deploy CONFIG``: a flow driven from the command line.

Runs the stage's Prefect flow on Prefect's ephemeral API (no server needed), prints the summary, and
turns a failed flow into its stage's error with advice on how to re-run only what failed. A
SIGTERM/SIGHUP ends the run as an interrupt, so every ``finally`` runs (engine process groups ended,
the ephemeral server stopped).
"""

from __future__ import annotations

import logging
import os
import signal
from contextlib import contextmanager
from typing import Any, Iterator

from eagle3.config import RunConfig
from flows.common import (SECRET_OVERRIDES_ENV, local_prefect, mlflow_ui, split_overrides,
                          stop_ephemeral_server)
from flows.stopping import (SignalRecord, ended_message, raise_if_terminated,
                            stop_grace_s, terminate_as_interrupt, terminating_signal)
from flows.summary import DECIDING_FLOWS, decide_command
from flows.pipeline import FLOW_NAME, eagle3_pipeline


def format_summary(summary: dict, cfg: RunConfig) -> str:
    """The text ``eagle3 run`` prints; it ends with the acceptance lengths, the MLflow location,
    the UI command and, for a flow that records a decision (``flows.summary.DECIDING_FLOWS``), the
    ``eagle3 decide`` command (with ``--tracking-uri`` for a store other than the default)."""
    fmt = (lambda v: "n/a" if v is None else f"{v:.3f}")
    link, cmd = mlflow_ui(cfg, summary.get("experiment_id"), summary.get("parent_run_id"))
    where = link or "open the UI with the command below"
    lines = [f"{summary.get('flow', FLOW_NAME)} finished: {summary['config']} "
             f"(run dir {summary['run_dir']})"]
    lines += [f"  {k:<28} {v}" for k, v in summary.get("stages", {}).items()]
    if summary.get("data"):
        lines.append(f"data: {summary['data']}")
    if summary.get("decision"):
        lines.append(f"decision: {summary['decision']} (rule {summary.get('decision_rule')})")
    if "acceptance_length" in summary:
        lines.append(f"acceptance length, trained draft:      {fmt(summary['acceptance_length'])}")
        lines.append("acceptance length, untrained baseline: "
                     f"{fmt(summary.get('acceptance_length_untrained'))}")
    lines.append(f"MLflow: {summary['mlflow_uri']}  experiment {summary.get('experiment_id')}  "
                 f"parent run {summary.get('parent_run_id')}  ({where})")
    lines.append(f"MLflow UI: {cmd or link}")
    if summary.get("flow", FLOW_NAME) in DECIDING_FLOWS and summary.get("parent_run_id"):
        lines.append("its decision in full: "
                     f"{decide_command(summary['mlflow_uri'], summary['parent_run_id'])}")
    return "\n".join(lines)


def _with_retry_hint(state: Any, stage: str, env: dict) -> BaseException:
    """The failed flow's exception, its message extended with how to re-run only what failed."""
    exc = state.result(raise_on_failure=False)
    if not isinstance(exc, BaseException):
        from eagle3.errors import Eagle3Error

        exc = Eagle3Error(f"flow run ended {state.name}: {state.message}")
    from eagle3.errors import (
        AcceptanceTooLow,
        CheckpointInvalid,
        ConfigError,
        DataError,
        EngineUnsupported,
        TrainingDiverged,
    )

    home = env.get("PREFECT_HOME")
    entry = ("flows/pipeline.py:eagle3_pipeline" if stage == "pipeline"
             else f"flows/stages.py:{stage}_flow")
    if isinstance(exc, (ConfigError, DataError, CheckpointInvalid, EngineUnsupported,
                        TrainingDiverged,
                        AcceptanceTooLow)):
        # permanent: the same inputs fail the same way, so a plain retry is no advice
        hint = (" — fix what is named above, then re-run the same command "
                "(finished stages are cached)")
    else:
        hint = (f" — re-run the same command (cached stages are skipped) or retry this flow run: "
                f"{'PREFECT_HOME=' + home + ' ' if home else ''}prefect flow-run retry "
                f"{state.state_details.flow_run_id} --entrypoint {entry}")
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (exc.args[0] + hint,) + tuple(exc.args[1:])
    return exc


def check_target(cfg: RunConfig) -> None:
    """Refuse, before Prefect starts, a config whose target cannot be found or whose inputs a stage
    would refuse at its start: for ``target.kind: hf``, the same check as ``eagle3 prepare`` and
    ``eagle3 preflight`` (``eagle3.assets.resolve_target``, the one home of it); for every kind,
    :func:`eagle3.config_checks.before_run_problems` (data, dev prompts and bench prompts files,
    aux layer ids, the draft vocabulary against the target's config), so a missing dev prompts
    file fails now rather than after extraction. The built-in kinds (``smollm2``,
    ``tiny-random``) are prepared by the extraction stage: their cached folder is read when it is
    there already (``eagle3.assets.prepared_target``), never prepared here. With ``serve.engine:
    auto`` resolving to the reference engine on this machine, the settings it cannot honour are
    refused too (:func:`eagle3.config_checks.reference_problem`; config load refuses them for
    ``serve.engine: reference``). Raises ConfigError naming ``target.path`` (the expected HF
    folder with config.json and what is there), or one ``CODE: message`` line per problem.
    """
    from eagle3.assets import prepared_target
    from eagle3.config_checks import before_run_problems, reference_problem
    from eagle3.errors import ConfigError

    if cfg.target.kind == "hf":
        from eagle3.assets import resolve_target

        target = resolve_target(cfg)
    else:
        target = prepared_target(cfg)
    problems = before_run_problems(cfg, target)
    refused = reference_problem(cfg.serve) if cfg.serve.engine == "auto" else None
    if refused:
        from eagle3.serve.launcher import resolve_engine

        if resolve_engine(cfg) == "reference":
            problems.append(refused)
    if problems:
        raise ConfigError("\n".join(problems))


def run_flow_cli(stage: str, config_path: str, overrides: list[str]) -> str:
    """Run ``stage`` ("pipeline", "extract", "train", "convert", "deploy") as its Prefect flow on
    Prefect's ephemeral API (no server needed) and return the printed summary.

    Secret-looking overrides are passed through the environment, never as flow parameters. The
    ephemeral Prefect server is stopped before returning. Raises ConfigError for an unknown stage,
    the stage's errors.
    """
    from eagle3.config import load_config
    from eagle3.errors import ConfigError
    from flows.stages import STAGE_FLOWS

    flows = {"pipeline": eagle3_pipeline, **STAGE_FLOWS}
    if stage not in flows:
        raise ConfigError(f"stage {stage!r}: expected one of {sorted(flows)}")
    cfg = load_config(config_path, overrides)
    check_target(cfg)
    public, secret = split_overrides(list(overrides))
    old = os.environ.get(SECRET_OVERRIDES_ENV)
    if secret:
        import json

        os.environ[SECRET_OVERRIDES_ENV] = json.dumps(secret)
    grace_s = stop_grace_s()
    previous = terminate_as_interrupt()
    record = SignalRecord(grace_s)
    record.install()
    ended_by: int | None = None
    try:
        with local_prefect(cfg) as env, _quiet_known_tracebacks():
            state = flows[stage](config_path=str(config_path), overrides=public, return_state=True)
            raise_if_terminated(record)
            if not state.is_completed():
                raise _with_retry_hint(state, stage, env)
            summary = state.result()
    except KeyboardInterrupt:
        ended_by = terminating_signal(record)
        if ended_by is None:  # Ctrl-C: Python's own exit for an interrupt (130)
            raise
    finally:
        record.uninstall()
        if secret and old is None:
            os.environ.pop(SECRET_OVERRIDES_ENV, None)
        elif secret:
            os.environ[SECRET_OVERRIDES_ENV] = old
        stop_ephemeral_server()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if ended_by is not None:
        import sys

        print(ended_message(stage, ended_by), file=sys.stderr, flush=True)
        raise SystemExit(128 + ended_by)
    return format_summary(summary, cfg)


class _KnownErrorsWithoutTraceback(logging.Formatter):
    """Console formatter that leaves out the traceback of this project's own errors
    (``Eagle3Error``: their message names the file/key and both values, and the CLI prints it last),
    keeping it for anything else. Wraps the handler's formatter; the record itself is restored, so
    Prefect's API log keeps the traceback."""

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
    """Install :class:`_KnownErrorsWithoutTraceback` on Prefect's console handler(s) for the
    duration."""
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
