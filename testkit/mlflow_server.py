"""A real MLflow tracking server on 127.0.0.1 for tests: SQLite backend, proxied artifacts (the
set-up of ``infra/stack.sh``), in its own process group, stopped by that group only."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from eagle3.procs import free_port, start_group, terminate_tree


@contextmanager
def mlflow_server(root: Path, start_timeout_s: float = 180.0) -> Iterator[str]:
    """Start ``mlflow server`` (``--backend-store-uri sqlite:///<root>/mlflow.db``,
    ``--artifacts-destination <root>/mlartifacts``, one worker) on a free loopback port; yield its
    URL (``http://127.0.0.1:<port>``).

    Raises RuntimeError naming the log when it exits or does not answer ``/health`` within
    ``start_timeout_s`` seconds. The process group is ended on exit (SIGTERM, SIGKILL after 10 s).
    """
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    argv = [
        str(mlflow),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination",
        str(root / "mlartifacts"),
    ]
    log = root / "mlflow-server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    proc = start_group(argv, env, log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with {proc.returncode} during start-up; see {log}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"mlflow server not ready at {url} after {start_timeout_s:.0f}s; see {log}"
                )
            time.sleep(0.5)
        yield url
    finally:
        terminate_tree(proc, grace_s=10.0)
