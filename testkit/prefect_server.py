"""One Prefect API server for a whole test session (per pytest-xdist worker), so that each flow run
of the suite does not start its own.

Without ``PREFECT_API_URL`` every process that runs a flow starts Prefect's ephemeral API server
and, under a new ``PREFECT_HOME``, migrates a fresh SQLite database first. Measured on a 2-core AMD
EPYC (AVX2 only, 2026-12-03): a one-task flow took 36 s in a fresh home, 16 s in a used one and 2 s
against a running server. The server started here is the one Prefect's ephemeral mode starts
(``uvicorn --factory prefect.server.api.server:create_app`` with the same environment switches), so
flows behave as in that mode; it runs in its own process group and is stopped by that group only.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx

from eagle3.procs import free_port, start_group, terminate_tree

PID_ENV = (
    "EAGLE3_TEST_PREFECT_SERVER_PID"  # lets the tests that list child processes leave this one out
)


def start_prefect_server(home: Path, start_timeout_s: float = 300.0):
    """Start the API server with ``PREFECT_HOME=home`` on a free loopback port; return
    ``(proc, api_url)``, ``api_url`` = ``http://127.0.0.1:<port>/api``.

    Raises RuntimeError naming the log when the server exits or does not answer ``/api/health``
    within ``start_timeout_s`` seconds (the group is then ended)."""
    import importlib.util

    # found, not imported: Prefect reads its settings (PREFECT_API_URL) from the environment when it
    # is imported, and the caller sets that variable only after this returns
    spec = importlib.util.find_spec("prefect")
    if spec is None or not spec.origin:
        raise RuntimeError(
            "the tests' Prefect server: the prefect package is not installed (run `make env`)"
        )
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "--app-dir",
        str(Path(spec.origin).parent.parent),
        "--factory",
        "prefect.server.api.server:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "error",
        "--lifespan",
        "on",
    ]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        {
            "PREFECT_HOME": str(home),
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        }
    )
    log = home / "server.log"
    proc = start_group(argv, env, log)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + start_timeout_s
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            terminate_tree(proc, grace_s=5.0)
            why = (
                f"exited with {proc.returncode}"
                if proc.returncode is not None
                else f"did not answer {url}/health within {start_timeout_s:.0f} s"
            )
            raise RuntimeError(f"the tests' Prefect server {why}; see {log}")
        time.sleep(0.5)


def stop_prefect_server(proc) -> None:
    """End the server's process group (SIGTERM, SIGKILL after 10 s)."""
    terminate_tree(proc, grace_s=10.0)
