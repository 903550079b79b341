"""Prefect tasks, one module per stage: retries (transient errors only), timeouts, cache keys,
MLflow logging.

No domain logic lives here: every task calls one library function of ``eagle3`` (imported lazily
inside the task, so these modules import while a stage is still missing) and records what it
returned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3.errors import TransientError
from tasks.results import StageResult

RETRIES = 2
RETRY_DELAYS_S = [5, 30]  # seconds between attempts


def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry only when the task failed with :class:`TransientError`.

    Every other error (ConfigError, DataError, CheckpointInvalid, GateFailed, AcceptanceTooLow,
    timeouts) is a fact about the inputs and is never retried (docs/INTERNALS.md, "Errors").
    """
    exc = state.data if isinstance(state.data, BaseException) else None
    if exc is None:
        try:
            exc = state.result(raise_on_failure=False)
        except Exception as e:  # the stored result itself could not be read
            exc = e
    return isinstance(exc, TransientError)


def task_options(timeout_s: float) -> dict:
    """Keyword arguments shared by every stage task: transient-only retries, a timeout (seconds),
    persisted results (needed for caching; stored under the project-configured
    PREFECT_LOCAL_STORAGE_PATH)."""
    return {"retries": RETRIES, "retry_delay_seconds": RETRY_DELAYS_S,
            "retry_condition_fn": retry_if_transient,
            "timeout_seconds": timeout_s, "persist_result": True}


def prefect_tags() -> dict[str, str]:
    """``prefect.flow_run_id`` / ``prefect.task_run_id`` of the current run, for the stage's MLflow
    run."""
    from prefect.context import FlowRunContext, TaskRunContext

    tags = {}
    tctx, fctx = TaskRunContext.get(), FlowRunContext.get()
    if tctx is not None:
        tags["prefect.task_run_id"] = str(tctx.task_run.id)
    if fctx is not None and fctx.flow_run is not None:
        tags["prefect.flow_run_id"] = str(fctx.flow_run.id)
    return tags


def stage_result(stage: str, out_dir: Any, manifest: dict, mlflow_run_id: str,
                 metrics: dict | None = None,
                 variant: str = "trained", acceptance_length: float | None = None) -> StageResult:
    """The value every stage task returns (and Prefect caches): where the output is and what it was.
    """
    return StageResult(stage, Path(out_dir), manifest["content_hash"], mlflow_run_id,
                       dict(metrics or {}), variant,
                       acceptance_length)
