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
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

from flows.common import (SECRET_OVERRIDES_ENV, local_prefect, mlflow_ui, split_overrides,
                          stop_ephemeral_server)
from flows.summary import DECIDING_FLOWS, decide_command
from flows.pipeline import FLOW_NAME, eagle3_pipeline


def format_summary(summary: dict, cfg: Any) -> str:
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


def check_target(cfg: Any) -> None:
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

        print(f"error: {stage} ended by {signal.Signals(ended_by).name}: engines and the Prefect "
              "server stopped; re-run the same command to go on (finished stages are cached)",
              file=sys.stderr, flush=True)
        raise SystemExit(128 + ended_by)
    return format_summary(summary, cfg)


def terminating_signal(record: "SignalRecord") -> int | None:
    """The first SIGTERM or SIGHUP ``record`` saw (the one a supervisor sends to stop the run),
    else None (only Ctrl-C, or no signal). A run it ended exits with ``128 + signal``, as a
    process killed by it would (143 for SIGTERM), so a supervisor reads the usual status."""
    return next((s for s in record.received() if s in TERMINATING), None)


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


TERMINATING = (signal.SIGTERM, signal.SIGHUP)
# what the record counts and starts its deadline on: Ctrl-C too (Python's own SIGINT handler raises
# KeyboardInterrupt, but a Ctrl-C to the whole group ends Prefect's API server as well, and
# Prefect's engine then retries its crash report to it for minutes)
RECORDED = (*TERMINATING, signal.SIGINT)


class SignalRecord:
    """Which termination signals (SIGTERM, SIGHUP, SIGINT) reached this process during a run,
    whoever handled them, and a deadline after the first one.

    Prefect's flow engine installs its own SIGTERM handler while a flow runs, and CPython swallows
    an exception raised by a handler inside an import's module-lock callback; either way the run may
    go on to its end. The record does not depend on any Python handler: a self-pipe registered with
    :func:`signal.set_wakeup_fd` receives one byte (the signal number) for every signal delivered to
    a Python-level handler, ours or Prefect's, and a thread reads it.

    The deadline: a signal sent to the whole process group (Ctrl-C in a terminal, a supervisor) also
    ends Prefect's ephemeral API server, and Prefect's engine then retries reporting the crash to it
    for minutes. ``grace_s`` seconds after the first termination signal a process that has not
    exited ends itself: the ``atexit`` handlers run (the launcher's end every engine process group),
    its remaining child processes are terminated, and it exits with 128 + the signal number. Main
    thread only (``install`` returns False elsewhere)."""

    def __init__(self, grace_s: float = 30.0) -> None:
        self.grace_s = grace_s
        self._r = self._w = -1
        self._previous_fd = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.seen: list[int] = []

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._previous_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="eagle3-signal-record",
                                        daemon=True)
        self._thread.start()
        return True

    def _watch(self) -> None:
        import select

        deadline = None
        while not self._stop.is_set():
            ready, _, _ = select.select([self._r], [], [], 0.5)
            if ready:
                chunk = os.read(self._r, 512)
                new = [b for b in chunk if b in RECORDED]
                self.seen += new
                if new and deadline is None:
                    deadline = time.monotonic() + self.grace_s
            if deadline is not None and time.monotonic() > deadline and not self._stop.is_set():
                _end_now(self.seen[0], self.grace_s)

    def received(self) -> list[int]:
        """The termination signals seen so far."""
        if self._thread is not None:
            time.sleep(0.05)  # a byte written just now reaches the reader thread
        return list(self.seen)

    def uninstall(self) -> None:
        if self._r < 0:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        signal.set_wakeup_fd(self._previous_fd)
        for fd in (self._r, self._w):
            os.close(fd)
        self._r = self._w = -1


STOP_GRACE_ENV = "EAGLE3_STOP_GRACE_S"


def stop_grace_s(environ: dict | None = None) -> float:
    """Seconds a run gets to stop by itself after a termination signal before it ends itself
    (:class:`SignalRecord`): ``$EAGLE3_STOP_GRACE_S``, default 30 (Kubernetes' default termination
    grace period; set it below your supervisor's own, e.g. systemd's ``TimeoutStopSec``). Raises
    ConfigError naming the variable and its value unless it is a number of seconds in [1, 3600]
    (fractions allowed; unset or blank = 30)."""
    from eagle3.errors import ConfigError

    raw = (os.environ if environ is None else environ).get(STOP_GRACE_ENV)
    if raw is None or raw.strip() == "":
        return 30.0
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 1.0 <= value <= 3600.0:  # also refuses nan and inf
        raise ConfigError(f"{STOP_GRACE_ENV}={raw!r}: expected seconds between 1 and 3600")
    return value


EXIT_HANDLERS_S = 10.0  # what the exit handlers get once the grace time is over (seconds)


def _end_now(signum: int, grace_s: float) -> None:
    """The run did not exit within ``grace_s`` of a termination signal: end engines (atexit, given
    at most ``EXIT_HANDLERS_S``), this process's own children (SIGTERM, then SIGKILL after 5 s),
    then exit 128 + ``signum``."""
    import atexit
    import sys

    import psutil

    print(f"error: received {signal.Signals(signum).name} and the run did not stop within "
          f"{grace_s:.0f} s (Prefect's API server was ended with it); ending it now",
          file=sys.stderr, flush=True)
    try:
        # the launcher registers every engine's stop here; other exit handlers (logging's flush of
        # Prefect's API log handler to a server that is already gone) can block, so they get a
        # bounded time in a thread
        runner = threading.Thread(target=atexit._run_exitfuncs, name="eagle3-exit-handlers",
                                  daemon=True)
        runner.start()
        runner.join(timeout=EXIT_HANDLERS_S)
        if runner.is_alive():
            print(f"error: exit handlers still running after {EXIT_HANDLERS_S:.0f} s; "
                  "ending without them",
                  file=sys.stderr, flush=True)
    finally:
        children = psutil.Process().children(recursive=True)
        for c in children:
            try:
                c.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(children, timeout=5)
        for c in alive:
            try:
                c.kill()
            except psutil.Error:
                pass
        os._exit(128 + signum)


def raise_if_terminated(record: SignalRecord) -> None:
    """Raise KeyboardInterrupt when a SIGTERM/SIGHUP arrived during the run but its interrupt was
    lost (caught by Prefect's engine or swallowed by CPython): a run that was told to stop must not
    then exit 0 as if nothing happened."""
    seen = record.received()
    if seen:
        names = ", ".join(sorted({signal.Signals(s).name for s in seen}))
        raise KeyboardInterrupt(f"received {names} during the run; the interrupt was lost inside "
                                "the run, which went on to its end: its outputs are complete, but "
                                "it is reported as interrupted")


def terminate_as_interrupt() -> dict:
    """Make SIGTERM/SIGHUP raise KeyboardInterrupt in the main thread, so a killed ``eagle3 run``
    still runs every ``finally`` (engine process groups ended, the ephemeral Prefect server stopped)
    instead of dying with its children orphaned. Returns the previous handlers (empty outside the
    main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def interrupt(signum, _frame):
        raise KeyboardInterrupt(f"received signal {signal.Signals(signum).name}")

    return {sig: signal.signal(sig, interrupt) for sig in TERMINATING}
