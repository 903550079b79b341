"""Helpers for flow tests: a Prefect ephemeral API rooted in a temporary runs folder, and the
task-run states of a flow run as Prefect recorded them."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny-random.yaml"


def task_states(flow_run_id, since: dt.datetime | None = None) -> dict[str, list[str]]:
    """``{task run name: [state names, oldest first]}`` of a flow run (only task runs created after
    ``since``).

    "Cached" means the task was served from its cache; "Completed" that it ran; "Failed" that it
    failed.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
            sort=TaskRunSort.EXPECTED_START_TIME_ASC,
        )
    out: dict[str, list[str]] = {}
    for tr in runs:
        if since is not None and tr.created is not None and tr.created < since:
            continue
        out.setdefault(tr.name, []).append(tr.state.name if tr.state else "none")
    return out


def retry_flow_run(flow, flow_run_id):
    """What ``prefect flow-run retry ID --entrypoint ...`` does for a flow run without a deployment:
    schedule the same flow run again and execute it here. Returns the final state."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow
    from prefect.states import Scheduled

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Scheduled(message="retried by a test"), force=True)
        fr = client.read_flow_run(flow_run_id)
    return run_flow(flow, flow_run=fr, parameters=fr.parameters, return_type="state")


# Python's multiprocessing starts one resource tracker per process that first uses its semaphores or
# shared memory (a DataLoader with workers, a torch.multiprocessing queue) and keeps it until that
# process exits: under pytest-xdist the worker that ran such a test earlier still has it. It is not
# a process the pipeline started.
RESOURCE_TRACKER = "from multiprocessing.resource_tracker import main"


def child_processes(ignore_prefect_server: bool = False) -> list[str]:
    """Command lines of this process's live descendants (``pid: cmdline``), leaving out zombies,
    Python's multiprocessing resource tracker (see :data:`RESOURCE_TRACKER`) and, with
    ``ignore_prefect_server``, Prefect's own ephemeral API server."""
    import psutil

    out = []
    skip = set()
    session = os.environ.get(
        "EAGLE3_TEST_PREFECT_SERVER_PID"
    )  # the tests' own server (tests/conftest.py)
    if session:
        try:
            root = psutil.Process(int(session))
            skip = {root.pid} | {c.pid for c in root.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid in skip:
                continue
            cmd = " ".join(p.cmdline())
            if p.status() == psutil.STATUS_ZOMBIE or RESOURCE_TRACKER in cmd:
                continue
            if ignore_prefect_server and "prefect.server.api.server:create_app" in cmd:
                continue
            out.append(f"{p.pid}: {cmd[:200]}")
        except psutil.NoSuchProcess:
            continue
    return out


def child_processes_except_prefect() -> list[str]:
    """:func:`child_processes` without Prefect's own ephemeral API server."""
    return child_processes(ignore_prefect_server=True)
