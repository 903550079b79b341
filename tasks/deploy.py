"""Prefect task of deploy + benchmark (``eagle3.measure.served.serve_and_measure``: launch the
engine, pass the readiness gate, measure under a watchdog, tear down; a failed gate or benchmark
leaves no server behind). The gate's phase timeline (seconds per phase) goes to MLflow as metrics
and as ``gate.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from eagle3.config import RunConfig
from tasks import caching, prefect_tags, stage_result, task_options, tracking
from tasks.results import StageResult


def deploy_timeout_s(cfg: RunConfig) -> float:
    """Task timeout (seconds): start-up deadline + probe + every request at its own timeout + 10 min
    slack."""
    s, b = cfg.serve, cfg.bench
    return (s.startup_timeout_s + s.probe_timeout_s
            + b.request_timeout_s * b.num_prompts / b.concurrency + 600.0)


def deploy_key(context: Any, parameters: dict) -> str:
    """Cache key: the serving checkpoint's content hash, the target, serve and measuring bench
    settings (tasks/stage_config.py), the chat-template switches, the target folder, a prompt file's
    bytes, the code and the engine's version."""
    from eagle3.assets import resolve_target

    cfg = parameters["cfg"]
    files = {"target": resolve_target(cfg)}
    # a user prompt file: its bytes, not its name
    if Path(cfg.bench.prompts).expanduser().is_file():
        files["prompts"] = Path(cfg.bench.prompts).expanduser()
    # the launch and the benchmark render chat prompts with the template switches
    return caching.stage_key("deploy-bench", cfg, parameters["bench_dir"],
                             inputs={"serving": parameters["serving"].dir}, files=files,
                             extra={"chat_template_kwargs": cfg.data.chat_template_kwargs})


def serve_and_measure(cfg: RunConfig, serving_dir: Path, deploy_dir: Path, bench_dir: Path,
                      sr: Any) -> dict:
    """``eagle3.measure.served.serve_and_measure`` with the gate's verdict and timeline logged to
    the stage run."""
    from eagle3.assets import resolve_target
    from eagle3.measure.served import serve_and_measure as measure

    def on_ready(engine, gate) -> None:
        sr.set_tags({"eagle3.engine": engine.engine, "eagle3.engine_url": engine.url,
                     "eagle3.gate_verdict": gate.verdict})
        sr.log_metrics(gate.metrics())
        sr.log_dict(gate.to_dict(), "gate.json")

    return measure(cfg, resolve_target(cfg), serving_dir, deploy_dir, bench_dir, on_ready=on_ready)


def log_attempts(sr: Any, deploy_dir: Path) -> None:
    """The gate's phase timeline of every launch attempt (``attempts.json``) as metrics
    ``attempt<i>.<phase>_s`` (also when the gate failed), what the engine really runs
    (``engine_settings.json``: scheduler, requests at once) as tags, and the whole deploy folder
    (engine logs, diagnostics) as artifacts."""
    import json

    settings = deploy_dir / "engine_settings.json"
    if settings.is_file():
        rec = json.loads(settings.read_text())
        sr.set_tags({"eagle3.scheduler": str(rec.get("scheduler")),
                     "eagle3.max_running_requests":
                         str((rec.get("reported") or {}).get("max_running_requests"))})
    path = deploy_dir / "attempts.json"
    if path.is_file():
        for a in json.loads(path.read_text()):
            sr.log_metrics({f"attempt{a['attempt']}.{k}_s": float(v) for k,
                            v in (a.get("phases") or {}).items()})
            sr.set_tags({f"eagle3.attempt{a['attempt']}.verdict": a.get("verdict")})
    sr.log_path(deploy_dir, "deploy")


@task(name="deploy-bench", cache_key_fn=deploy_key, **task_options(4 * 3600.0))
def deploy_task(cfg: RunConfig, serving: StageResult, deploy_dir: Path, bench_dir: Path,
                parent_run_id: str,
                variant: str = "trained") -> StageResult:
    """Serve ``serving.dir`` behind the readiness gate, benchmark acceptance into ``bench_dir``,
    shut down.

    Raises GateFailed (verdict other than ready, with the diagnostics folder), the benchmark's
    errors.
    """
    from eagle3.artifacts import read_manifest

    with tracking.stage_run(cfg, parent_run_id, "deploy-bench", variant, tags=prefect_tags()) as sr:
        try:
            report = serve_and_measure(cfg, serving.dir, deploy_dir, bench_dir, sr)
        finally:
            log_attempts(sr, deploy_dir)  # engine log, timeline, diagnostics: also when it failed
        s = report["summary"]
        metrics = {k: float(v) for k, v in s.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for i, v in enumerate(report.get("per_position") or []):
            metrics[f"acceptance_per_position.{i}"] = float(v)
        sr.log_metrics(metrics)
        sr.log_path(bench_dir)
        manifest = read_manifest(bench_dir)
    return stage_result("deploy-bench", bench_dir, manifest, sr.run_id, metrics, variant=variant,
                        acceptance_length=s.get("acceptance_length"))
