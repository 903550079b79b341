"""Prefect task of the pre-flight (``eagle3.serve.preflight.run_preflight``): runs before the
deploy stage, so no engine process starts for a launch that cannot serve the draft as trained.

Never cached (not even within a retried flow run): it reads live facts (the installed engine, the
GPUs' memory now, the environment) and costs a few seconds. Its MLflow run (stage ``preflight``)
holds every check's status as a tag, the numeric figures as metrics (GiB, counts) and
``preflight.json``; a failing pre-flight fails that run and the flow with the problems listed.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from eagle3.config import RunConfig
from tasks import prefect_tags, task_options, tracking
from tasks.results import StageResult


@task(name="preflight", task_run_name="preflight", cache_policy=NO_CACHE, **task_options(600.0))
def preflight_task(cfg: RunConfig, serving: StageResult | None, data: StageResult | None,
                   parent_run_id: str,
                   variant: str = "trained") -> dict:
    """Run the pre-flight and record it; raise EngineUnsupported / ConfigError (``.problems``) when
    it fails. Returns the report as a dict."""
    with tracking.stage_run(cfg, parent_run_id, "preflight", variant, tags=prefect_tags()) as sr:
        from eagle3.serve.preflight import preflight_of_run

        report = preflight_of_run(cfg, serving.dir if serving else None, data.dir if data else None)
        sr.set_tags({"eagle3.engine": report.engine,
                     "eagle3.preflight": "passed" if report.passed else "failed",
                     **{f"eagle3.preflight.{c.name}": c.status for c in report.checks}})
        sr.log_metrics(report.figures())
        sr.log_dict(report.to_dict(), "preflight.json")
        tracking.set_parent_tags(cfg, parent_run_id,
                                 {"eagle3.preflight": "passed" if report.passed else "failed"})
        report.raise_if_failed()
    return report.to_dict()
