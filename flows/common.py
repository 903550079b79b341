"""What every flow shares: loading the config, the run's directories, the MLflow parent run, calling
a stage task with cache checks, and the local (ephemeral) Prefect settings; the run names, the
library's logs in Prefect and the markdown artifacts come from ``flows.summary``."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml
from prefect import get_run_logger
from prefect.runtime import flow_run

from eagle3.config import RunConfig, load_config
from eagle3.redaction import is_secret_key, redact
from eagle3.errors import ConfigError, DataError
# unused here (F401): flow_run_label, mlflow_ui, publish_summary: for the flows and the CLI
from flows.summary import (  # noqa: F401
    DECIDING_FLOWS,
    announce_parent,
    attach_library_logs,
    finished,
    flow_run_label,
    mlflow_ui,
    publish_failure,
    publish_summary,
)
from tasks import caching, tracking
from tasks.results import StageResult

# the library's warnings (records skipped, samples truncated) in the task-run logs
attach_library_logs()

# JSON list of overrides kept out of flow parameters
SECRET_OVERRIDES_ENV = "EAGLE3_SECRET_OVERRIDES"
VARIANTS = ("trained", "untrained")


def is_secret_override(item: str) -> bool:
    """True for ``-o`` overrides whose key looks like a secret (token, key, password, ...)."""
    return is_secret_key(item.split("=", 1)[0].strip())


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(public, secret) overrides: only the public ones become Prefect flow parameters."""
    return ([o for o in overrides if not is_secret_override(o)],
            [o for o in overrides if is_secret_override(o)])


def load_run_config(config_path: str, overrides: list[str] | None) -> RunConfig:
    """The validated RunConfig of a flow run: the file, the flow's overrides, then secret overrides
    passed through ``$EAGLE3_SECRET_OVERRIDES`` (never a flow parameter). Raises ConfigError."""
    secret = json.loads(os.environ.get(SECRET_OVERRIDES_ENV, "[]") or "[]")
    return load_config(config_path, list(overrides or []) + list(secret))


def untrained_config(cfg: RunConfig) -> RunConfig:
    """The baseline: the same config with ``train.max_steps = 0`` (an untrained draft), served on
    a port of its own: ``serve.port = None`` (the launcher picks a free port and retries another
    when the one it picked is taken meanwhile), since both drafts are served at the same time
    (flows/stages.py, ``deploy_step``) and a user-given ``serve.port`` can be bound by one engine
    only. The trained draft keeps the user's port."""
    base = cfg.model_copy(deep=True)
    base.train.max_steps = 0
    base.serve.port = None
    return base


def stage_dirs(cfg: RunConfig, variant: str = "trained") -> dict[str, Path]:
    """Output folders of one run (docs/INTERNALS.md): extract, and train, serving, deploy, bench
    (+ ``-untrained``) each in a folder of its settings (``tasks.stage_config.output_dirs``:
    ``<run_dir>/train/<settings digest>``), so outputs of other settings stay beside them."""
    from tasks.stage_config import output_dirs

    return output_dirs(cfg, variant)


def finished_output(directory: Path, stage: str, command: str) -> StageResult:
    """The finished stage output in ``directory`` as a stage result (read from its manifest; the
    MLflow run that made it is not known here), else DataError telling which command makes it."""
    from eagle3.artifacts import read_manifest

    if not (directory / "manifest.json").is_file():
        raise DataError(f"{directory}: no finished {stage} output (manifest.json missing); "
                        f"run `{command}` first")
    manifest = read_manifest(directory)
    return StageResult(stage, directory, manifest.get("content_hash", ""), "")


def save_resolved_config(cfg: RunConfig) -> Path:
    """``<run_dir>/config.yaml`` with secret-looking values redacted (it is also logged to MLflow).
    """
    rd = cfg.run_dir()
    rd.mkdir(parents=True, exist_ok=True)
    path = rd / "config.yaml"
    path.write_text(yaml.safe_dump(redact(cfg.model_dump(mode="json")), sort_keys=False))
    return path


def _name_error(exc: BaseException, label: str) -> None:
    """Prefix the error message with the stage that failed (type kept, so callers can still catch
    it)."""
    if exc.args and isinstance(exc.args[0], str) and not exc.args[0].startswith("stage "):
        exc.args = (f"stage {label} failed: {exc.args[0]}",) + tuple(exc.args[1:])


def run_stage(task: Any, *, cfg: RunConfig, parent: str, stage: str, variant: str = "trained",
              refresh: bool = False, timeout_s: float | None = None, record: dict | None = None,
              **params: Any) -> StageResult:
    """Run one stage task and return its result; the single place where caching is handled.

    - A cached result made where the runs directory is mounted at another path (another worker of a
      pool) is
      re-pointed at this machine's path of its output folder (``out_dir`` / ``bench_dir``).
    - A cached result whose output folder no longer matches it (deleted, rebuilt) is recomputed.
    - A cached stage gets a nested MLflow run pointing at the run that produced the artifact.
    - ``record`` (optional) collects ``{label: "ran" | "cached"}`` for the summary.
    - A failure is re-raised with ``stage <name> (<variant>) failed:`` in front of its message.
    """
    label = stage if variant == "trained" else f"{stage} ({variant})"
    opts: dict = {"refresh_cache": True} if refresh else {}
    # 0: none (a stage run in a worker thread, bounded by its own deadlines instead)
    if timeout_s is not None:
        opts["timeout_seconds"] = timeout_s  # Prefect's Task turns 0 into "no timeout"
    t = task.with_options(task_run_name=label, **opts)
    try:
        state = t(cfg=cfg, parent_run_id=parent, variant=variant, **params, return_state=True)
        result = state.result()
        cached = state.name == "Cached"
        local_dir = params.get("out_dir", params.get("bench_dir"))
        # made on a machine that mounts the runs directory elsewhere
        if cached and local_dir is not None:
            result = caching.relocate(result, local_dir)
        if cached and not caching.output_matches(result):
            get_run_logger().warning("%s: cached result no longer matches %s; recomputing", label,
                                     getattr(result, "dir", result))
            state = t.with_options(refresh_cache=True)(cfg=cfg, parent_run_id=parent,
                                                       variant=variant, **params,
                                                       return_state=True)
            result, cached = state.result(), False
    except BaseException as e:
        _name_error(e, label)
        raise
    if cached:
        tracking.record_cached_stage(cfg, parent, stage, variant, result)
    if record is not None:
        record[label] = "cached" if cached else "ran"
    return result


UNWIND_S = 20.0  # seconds the calls of an interrupted run_concurrently get to end (engines gone)


def run_concurrently(calls: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Run each zero-argument call of ``calls`` in its own thread (with a copy of this thread's
    context: the Prefect flow run, so a task called inside is that flow run's task) and wait for
    **all** of them; then raise the first failure (in ``calls`` order) or return ``{key: result}``.

    For stages whose work is independent and single-threaded, such as the trained and the untrained
    draft's deploy+bench (each engine decodes on one CPU thread, ``serve.cpu_threads``): both take
    about as long as one. Nothing is abandoned: a failed call's sibling runs to its end (its engine
    is torn down by its own ``finally``) before the error propagates.

    Interrupted while waiting (SIGTERM or Ctrl-C: Prefect's ``TerminationSignal`` or
    ``KeyboardInterrupt`` raised in this thread), every engine this process started is stopped at
    once (``eagle3.serve.launcher.stop_all_engines``), so the calls serving them fail and unwind;
    they get ``UNWIND_S`` seconds, then the interrupt propagates. The threads are daemon threads: a
    call still computing then (the offline figure) does not hold the interpreter's exit."""
    import contextvars
    import threading
    from concurrent.futures import Future, wait

    if len(calls) <= 1:
        return {k: fn() for k, fn in calls.items()}

    def start(key: str, fn: Callable[[], Any]) -> Future:
        fut: Future = Future()
        ctx = contextvars.copy_context()

        def body() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(ctx.run(fn))
            except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                fut.set_exception(e)

        threading.Thread(target=body, name=f"eagle3-stage-{key}", daemon=True).start()
        return fut

    futures = {k: start(k, fn) for k, fn in calls.items()}
    try:
        wait(futures.values())
    except BaseException:
        from eagle3.serve.launcher import stop_all_engines

        stop_all_engines()
        wait(futures.values(), timeout=UNWIND_S)
        raise
    for f in futures.values():
        if f.exception() is not None:
            raise f.exception()
    return {k: f.result() for k, f in futures.items()}


@contextmanager
def parent_run(cfg: RunConfig, flow_name: str, record: dict | None = None) -> Iterator[str]:
    """The MLflow parent run of this flow run (reused when the flow run is retried); FAILED with the
    error when the body raises, and then a Prefect failure artifact
    (``flows.summary.publish_failure``: the failed stage, links to its MLflow run and log, the
    stages of ``record`` that ran before)."""
    config_file = save_resolved_config(cfg)
    run_id = tracking.start_pipeline_run(cfg, flow_run_id=str(flow_run.id), flow_name=flow_name,
                                         config_file=config_file)
    # the run id (with the `eagle3 decide` command for a flow that decides), first in the log
    announce_parent(cfg, run_id, decides=flow_name in DECIDING_FLOWS)
    with _recorded(cfg, run_id):
        try:
            yield run_id
        except BaseException as e:
            publish_failure(cfg, run_id, f"{flow_name}: {cfg.name}", e,
                            record if record is not None else {})
            raise


@contextmanager
def _recorded(cfg: RunConfig, run_id: str) -> Iterator[None]:
    """The parent run ``run_id`` ends FINISHED when the block does, FAILED with the error when it
    raises."""
    try:
        yield
    except BaseException as e:
        tracking.record_failure(cfg, run_id, e)
        raise
    tracking.finish_run(cfg, run_id)


@contextmanager
def reopen_run(cfg: RunConfig, run_id: str) -> Iterator[str]:
    """An earlier parent run continued by this flow run (a sweep spread over several sessions):
    marked RUNNING with ``eagle3.attempts`` incremented, then FINISHED, or FAILED with the error.
    Raises DataError when the run is not in the config's tracking store."""
    client, _ = tracking.client_for(cfg)
    try:
        run = client.get_run(run_id)
    except Exception as e:  # noqa: BLE001 - MLflow raises its own types for an unknown id
        raise DataError(f"MLflow run {run_id!r}: not found in {tracking.tracking_uri(cfg)} "
                        f"({type(e).__name__}: {e}); expected the id of an earlier run of this "
                        "flow in the same store") from e
    client.update_run(run_id, status="RUNNING")
    for k, v in tracking.owner_tags().items():  # this process owns it now (close_stale_runs)
        client.set_tag(run_id, k, v)
    client.set_tag(run_id, "eagle3.attempts", str(int(run.data.tags.get("eagle3.attempts",
                                                                        "1")) + 1))
    with _recorded(cfg, run_id):
        yield run_id


@contextmanager
def local_prefect(cfg: RunConfig) -> Iterator[dict[str, str]]:
    """Prefect settings for a run without a server: the ephemeral API with its SQLite database, its
    home and the task result storage (the cache) under ``<runs_dir>/.prefect`` (works offline). The
    storage path is Prefect's default under that home, so ``PREFECT_HOME=<runs_dir>/.prefect prefect
    flow-run retry ID --entrypoint flows/pipeline.py:eagle3_pipeline`` finds the same database and
    cache.

    When ``PREFECT_API_URL`` is set (e.g. ``make stack-up``), only the result storage path is set.
    Yields the settings applied (name → value).
    """
    from prefect.settings import (
        PREFECT_API_DATABASE_CONNECTION_URL,
        PREFECT_HOME,
        PREFECT_LOCAL_STORAGE_PATH,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    base = cfg.paths.resolved_runs_dir() / ".prefect"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"paths.runs_dir: cannot create {base} for Prefect's state "
                          f"({type(e).__name__}: {e.strerror or e}); "
                          "choose a writable paths.runs_dir") from e
    updates: dict = {}
    if not os.environ.get("PREFECT_LOCAL_STORAGE_PATH"):
        # = Prefect's default under PREFECT_HOME
        updates[PREFECT_LOCAL_STORAGE_PATH] = str(base / "storage")
    if not os.environ.get("PREFECT_API_URL"):
        updates.update({PREFECT_HOME: str(base),
                        PREFECT_API_DATABASE_CONNECTION_URL:
                            f"sqlite+aiosqlite:///{base / 'prefect.db'}",
                        PREFECT_SERVER_ANALYTICS_ENABLED: False,
                        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 300})
    env = {s.name: str(v) for s, v in updates.items()}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the ephemeral server subprocess inherits these
    try:
        with temporary_settings(updates=updates):
            yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def stop_ephemeral_server(drain_timeout_s: float = 15.0) -> None:
    """Stop the ephemeral Prefect API server this process started, if any (no server left behind).

    Logs and events still queued are sent first (otherwise their workers retry a dead server at
    exit), for at most ``drain_timeout_s`` seconds in all, and only while the server still runs:
    when a signal sent to the whole process group has already ended it, nothing can be delivered and
    waiting would hang the exit.
    """
    import threading

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.server.api.server import SubprocessASGIServer

    servers = list(SubprocessASGIServer._instances.values())
    if not servers:
        return
    alive = any(getattr(s, "server_process",
                        None) is not None and s.server_process.poll() is None for s in servers)
    if alive:
        def drain() -> None:
            APILogWorker.drain_all(timeout=drain_timeout_s / 2)
            EventsWorker.drain_all(timeout=drain_timeout_s / 2)

        worker = threading.Thread(target=drain, name="eagle3-drain-prefect", daemon=True)
        worker.start()
        worker.join(drain_timeout_s)
    for server in servers:
        server.stop()


def data_line(extract_dir: Path) -> str:
    """One line on what extraction used: samples, tokens, skipped records by reason, truncated
    samples, and ``DATA_SHORT`` when there are fewer samples than ``data.num_conversations``
    asked (a run with ``data.on_short=warn``)."""
    from eagle3.artifacts import read_manifest

    m = read_manifest(extract_dir)
    c = m.get("counts") or {}
    skipped = m.get("skipped_by_reason") or {}
    line = (f"{c.get('samples')} samples ({c.get('tokens')} tokens, {c.get('loss_tokens')} in the "
            f"loss) from {c.get('records')} records; skipped {c.get('skipped', 0)}")
    line += f" {skipped}" if skipped else ""
    line += f"; truncated {c.get('truncated', 0)}"
    asked = ((m.get("config") or {}).get("data") or {}).get("num_conversations")
    if isinstance(asked, int) and isinstance(c.get("samples"), int) and c["samples"] < asked:
        line += f"; DATA_SHORT: {asked} asked (data.num_conversations)"
    return line
