"""Serve a draft and measure it, with nothing left running: launch the engine behind the readiness
gate, run the acceptance benchmark under a watchdog, tear the engine down.

The engine process is a context manager (``eagle3.serve.launcher.launch_ready``: launch + gate;
GateFailed on any verdict other than ready): its process group is ended in ``finally`` whatever
happens. While the benchmark runs, :class:`eagle3.serve.watchdog.Watchdog` watches the engine: an
engine that dies or stops making progress (no log growth, CPU or GPU activity and no finished
request for ``serve.stall_timeout_s``) fails the benchmark with the gate's diagnostics in
``<deploy_dir>/watchdog`` instead of leaving it blocked until the request timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


def serve_and_measure(cfg: Any, target_dir: Path, serving_dir: Path, deploy_dir: Path,
                      bench_dir: Path, *,
                      on_ready: Callable[[Any, Any], None] | None = None) -> dict:
    """launch → readiness gate → benchmark (watched) → teardown; returns the acceptance report
    (``run_bench``).

    ``cfg``: a RunConfig (``serve`` and ``bench`` sections). ``on_ready(engine, gate)`` is called
    once the gate passed (the caller logs the gate timeline). Raises GateFailed (gate or watchdog
    verdict other than ready / running), ConfigError when the engine does not run the settings asked
    (:func:`eagle3.serve.engine_settings.check_running_settings`), the benchmark's errors.
    """
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
                      stall_timeout_s=s.stall_timeout_s,
                      check_interval_s=s.poll_interval_s,
                      diagnostics_dir=Path(deploy_dir) / "watchdog") as wd:
            return wd.call(run_bench, engine.url, prompts=b.prompts, num_prompts=b.num_prompts,
                           max_new_tokens=b.max_new_tokens, temperature=b.temperature,
                           concurrency=b.concurrency,
                           tokenizer_dir=target_dir, out_dir=bench_dir,
                           request_timeout_s=b.request_timeout_s,
                           on_request_done=wd.beat,
                           chat_template_kwargs=cfg.data.chat_template_kwargs)
