"""Serve a draft and measure it, with nothing left running: the engine behind the readiness gate
(``launch_ready``, a context manager ending its process group whatever happens), the benchmark under
:class:`eagle3.serve.watchdog.Watchdog` (an engine that dies or stalls for ``serve.stall_timeout_s``
fails it with diagnostics in ``<deploy_dir>/watchdog``), teardown."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from eagle3.config import RunConfig


def serve_and_measure(cfg: RunConfig, target_dir: Path, serving_dir: Path, deploy_dir: Path,
                      bench_dir: Path, *,
                      on_ready: Callable[[Any, Any], None] | None = None) -> dict:
    """launch → readiness gate → watched benchmark → teardown; returns the ``run_bench`` report.
    Raises GateFailed (gate, watchdog), ConfigError (``check_running_settings``), bench errors."""
    from eagle3.measure.bench import run_bench
    from eagle3.serve.engine_settings import check_running_settings
    from eagle3.serve.launcher import launch_ready
    from eagle3.serve.watchdog import Watchdog

    b, s = cfg.bench, cfg.serve
    with launch_ready(cfg, target_dir, serving_dir, deploy_dir) as (engine, gate):
        if on_ready is not None:
            on_ready(engine, gate)
        # what the engine really runs (scheduler, draft tokens, concurrency):
        # deploy_dir/engine_settings.json
        check_running_settings(engine.url, cfg, engine.engine, deploy_dir)
        with Watchdog(engine.url, pid=engine.pid, log_path=engine.log_path,
                      stall_timeout_s=s.stall_timeout_s, check_interval_s=s.poll_interval_s,
                      diagnostics_dir=Path(deploy_dir) / "watchdog") as wd:
            return wd.call(run_bench, engine.url, prompts=b.prompts, num_prompts=b.num_prompts,
                           max_new_tokens=b.max_new_tokens, temperature=b.temperature,
                           concurrency=b.concurrency, tokenizer_dir=target_dir, out_dir=bench_dir,
                           request_timeout_s=b.request_timeout_s, on_request_done=wd.beat,
                           chat_template_kwargs=cfg.data.chat_template_kwargs,
                           env_checked=True)  # the launcher refused a simulated acceptance
