"""What the running engine really runs, read back from ``/server_info`` after the gate (failure
class 23); keys a server does not report are recorded as unreported, never as changes."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import httpx

from eagle3.config import RunConfig
from eagle3.engines.sglang.serving import asked_settings, compare_server_info, running_problems
from eagle3.errors import ConfigError


def check_running_settings(url: str, cfg: RunConfig, engine: str, deploy_dir: str | Path, *,
                           timeout_s: float = 10.0) -> dict:
    """``GET <url>/server_info`` (else ``/get_server_info``) against
    :func:`~eagle3.engines.sglang.serving.asked_settings`. Returns and writes ``{"engine", "asked",
    "reported", "changed", "scheduler", "server_info_found"}``. ConfigError when a speculative
    setting or request limit differs, or ``bench.concurrency`` cannot run for real
    (:func:`~eagle3.engines.sglang.serving.running_problems`)."""
    info = None
    with httpx.Client(timeout=timeout_s) as client:
        for path in ("/server_info", "/get_server_info"):
            with contextlib.suppress(httpx.HTTPError):
                r = client.get(url.rstrip("/") + path)
                if r.status_code == 200:
                    with contextlib.suppress(ValueError):
                        info = r.json()
                    break
    asked = asked_settings(cfg.serve, engine)
    cmp = compare_server_info(info or {}, asked)
    record = {"engine": engine, "asked": asked, **cmp, "server_info_found": info is not None}
    out = Path(deploy_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_settings.json").write_text(json.dumps(record, indent=2, default=str))
    problems = [f"{k}: asked {v['asked']}, the engine runs {v['running']}"
                for k, v in cmp["changed"].items()] + running_problems(info, cfg.bench.concurrency)
    if problems:
        raise ConfigError(f"engine at {url} does not run what was asked "
                          f"({out / 'engine_settings.json'}): {'; '.join(problems)}; the "
                          "benchmark would not measure what it reports")
    return record
