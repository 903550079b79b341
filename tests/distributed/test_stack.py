"""The distributed stack for real (opt-in: ``make test-distributed``, i.e.
``EAGLE3_DISTRIBUTED=1``).

From a machine with nothing running: a Docker engine (Debian's docker.io installed and dockerd
started when none answers), the base image (debootstrap + docker import), the PostgreSQL and CPU
worker images, then ``infra/dstack.sh up`` (PostgreSQL, Prefect server and MLflow server on it,
Docker work pools eagle3-gpu / eagle3-cpu with a worker each, ``prefect deploy --all``). Then:

1. ``prefect deployment run 'eagle3-distributed/tiny-random'``: every stage a flow run in its own
   container on its pool (extract/train/deploy on eagle3-gpu, convert and the orchestrator on
   eagle3-cpu, the cpu pool mounting the asset cache at another path); MLflow runs, the registered
   draft (alias ``best``) and its artifacts checked through the MLflow server; the hand-over folders
   checked from the host, a third mount point of the storage.
2. The same with other bench settings; the deploy stage's container is killed while its engine
   serves: the flow run fails naming the stage, no process of that container survives, its MLflow
   runs are FAILED.
3. ``prefect flow-run retry`` of that flow run: extract, train and convert come from the cache,
   deploy + bench run again, the same MLflow parent run finishes.

Everything started is stopped at the end, also on failure: the stack's containers and network by id
and label, dockerd only if this test started it. The wall times are printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PIPELINE = "eagle3-distributed/tiny-random"
SLOW_BENCH = [
    "bench.max_new_tokens=32",
    "bench.num_prompts=4",
]  # a deploy stage long enough to be killed in

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(
        os.environ.get("EAGLE3_DISTRIBUTED") != "1",
        reason="opt-in: run `make test-distributed` (EAGLE3_DISTRIBUTED=1)",
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sh(cmd: list[str], env: dict, timeout: float, what: str) -> str:
    """Run ``cmd`` (printing its output as it comes); fail the test with its tail when it exits
    non-zero."""
    print(f"\n$ {' '.join(cmd)}", flush=True)
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    print(out[-4000:], flush=True)
    assert p.returncode == 0, f"{what} failed (exit {p.returncode}):\n{out[-3000:]}"
    return out


class Timer(dict):
    def __call__(self, name: str, t0: float) -> float:
        self[name] = round(time.monotonic() - t0, 1)
        return self[name]


def _flow_run(fid: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as c:
        return c.read_flow_run(fid)


def _wait_final(fid: str, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fr = _flow_run(fid)
        if fr.state is not None and fr.state.is_final():
            return fr
        time.sleep(2)
    raise AssertionError(f"flow run {fid} not finished after {timeout_s:.0f} s (state {fr.state})")


def _deployment_run(env: dict, overrides: list[str] | None = None) -> str:
    cmd = [str(BIN / "prefect"), "deployment", "run", PIPELINE]
    if overrides:
        cmd += ["--param", f"overrides={json.dumps(overrides)}"]
    out = _sh(cmd, env, 120, "prefect deployment run")
    return re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)


def _stage_runs(parent_tags: dict) -> dict:
    """{stage: flow run} of the stage flow runs the MLflow parent run names."""
    return {
        s: _flow_run(parent_tags[f"eagle3.stage.{s}.flow_run_id"])
        for s in ("extract", "train", "convert", "deploy")
    }


def _kill_deploy_while_serving(since: float, timeout_s: float) -> tuple[str, int]:
    """Find the deploy stage's flow run (created after ``since``), wait until the engine runs in its
    container, ``docker kill`` the container. Returns (container id, the engine's host pid)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterStartTime,
    )

    deadline = time.monotonic() + timeout_s
    import datetime as dt

    after = dt.datetime.fromtimestamp(since, dt.timezone.utc)
    while time.monotonic() < deadline:
        with get_client(sync_client=True) as c:
            runs = c.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["eagle3-deploy"])),
                flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=after)),
            )
        for fr in runs:
            if not fr.infrastructure_pid or fr.state is None or fr.state.name != "Running":
                continue
            cid = fr.infrastructure_pid.rsplit(":", 1)[1]
            top = subprocess.run(
                ["docker", "top", cid, "-eo", "pid,args"], capture_output=True, text=True
            )
            engine = [line for line in top.stdout.splitlines() if "refengine" in line]
            if engine:
                pid = int(engine[0].split()[0])
                print(
                    f"\nkilling the deploy stage's container {cid[:12]} (flow run {fr.name}); "
                    f"engine host pid {pid}",
                    flush=True,
                )
                subprocess.run(["docker", "kill", cid], check=True, capture_output=True)
                return cid, pid
        time.sleep(1)
    raise AssertionError(f"the deploy stage's engine was not seen running within {timeout_s:.0f} s")


def _processes_of(cid: str) -> list[str]:
    """Host processes still in the container's cgroup (none after a kill)."""
    left = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and cid in (proc / "cgroup").read_text():
                left.append(
                    f"{proc.name}: {(proc / 'cmdline').read_text().replace(chr(0), ' ')[:120]}"
                )
        except OSError:
            continue
    return left


def _check_mlflow(uri: str, parent: str, expect_cached: set[str], new_version: bool) -> dict:
    """The parent run FINISHED with a FINISHED nested run per stage and variant (``expect_cached``
    the stages served from the cache), a decision, and the draft registered under alias ``best``.
    ``new_version``: this run registered a new version (a ``register`` run); else the serving
    checkpoint was already registered."""
    from mlflow import MlflowClient

    from tasks.tracking import summarize_run

    s = summarize_run(parent, uri)
    assert s["status"] == "FINISHED", s
    stages = {(x["stage"], x["variant"]): x for x in s["stages"] if x["status"] == "FINISHED"}
    want = {("extract", "trained"), ("preflight", "trained")} | {
        (st, v) for st in ("train", "convert", "deploy-bench") for v in ("trained", "untrained")
    }
    if new_version:
        want.add(("register", "trained"))
    assert set(stages) == want, sorted(set(stages))
    cached = {st for (st, _), x in stages.items() if x["cached"]}
    assert cached == expect_cached, (cached, expect_cached)
    assert s["metrics"]["acceptance_length"] >= 1.0 and s["tags"]["eagle3.decision"]
    client = MlflowClient(uri, registry_uri=uri)
    name, version = s["tags"]["eagle3.registered_model"].split("/")
    best = client.get_model_version_by_alias(name, "best")
    assert best.name == name and int(best.version) >= 1
    return s


def test_distributed_stack(tmp_path):
    from eagle3.artifacts import MANIFEST, content_hash, output_intact, read_manifest

    t_all = time.monotonic()
    times = Timer()
    state = tmp_path / "dstack"
    name = f"eagle3t{os.getpid()}"
    env = {
        **os.environ,
        "EAGLE3_DSTACK_DIR": str(state),
        "EAGLE3_DSTACK_NAME": name,
        "EAGLE3_DOCKER_STATE": str(state / "engine"),
        "PREFECT_PORT": str(_free_port()),
        "MLFLOW_PORT": str(_free_port()),
        "VENV_BIN": str(BIN),
        "PATH": f"{BIN}:{os.environ['PATH']}",
    }
    api, mlflow_uri = (
        f"http://127.0.0.1:{env['PREFECT_PORT']}/api",
        f"http://127.0.0.1:{env['MLFLOW_PORT']}",
    )
    old_api = os.environ.get("PREFECT_API_URL")
    engine_started = False
    try:
        t0 = time.monotonic()
        _sh(["infra/docker-engine.sh", "up"], env, 600, "docker engine")
        engine_started = (state / "engine" / "dockerd.pid").is_file()
        times("docker engine (install if missing, start if none)", t0)
        for what in ("base", "postgres", "cpu"):
            t0 = time.monotonic()
            _sh(["infra/build-image.sh", what], env, 2400, f"image {what}")
            times(f"image {what}", t0)
        t0 = time.monotonic()
        _sh(["infra/dstack.sh", "up"], env, 900, "stack up")
        times("stack up (postgres, prefect, mlflow, 2 workers, prefect deploy --all)", t0)
        os.environ["PREFECT_API_URL"] = env["PREFECT_API_URL"] = (
            api  # the CLI's and this process's client
        )
        env["MLFLOW_TRACKING_URI"] = mlflow_uri
        runs = state / "shared" / "runs"

        # 1. the whole pipeline through `prefect deployment run`, every stage a container on its
        #    pool
        t0 = time.monotonic()
        fid = _deployment_run(env)
        fr = _wait_final(fid, 1800)
        times("pipeline run 1 (all stages ran)", t0)
        assert fr.state.is_completed(), fr.state.message
        assert fr.work_pool_name == "eagle3-cpu"
        from mlflow import MlflowClient

        parent = MlflowClient(mlflow_uri).search_runs(
            [MlflowClient(mlflow_uri).get_experiment_by_name("eagle3-pipeline").experiment_id],
            f"tags.`eagle3.pipeline_flow_run_id` = '{fid}'",
        )[0]
        s1 = _check_mlflow(mlflow_uri, parent.info.run_id, expect_cached=set(), new_version=True)
        placed = _stage_runs(parent.data.tags)
        assert {k: v.work_pool_name for k, v in placed.items()} == {
            "extract": "eagle3-gpu",
            "train": "eagle3-gpu",
            "convert": "eagle3-cpu",
            "deploy": "eagle3-gpu",
        }
        assert all(v.state.is_completed() for v in placed.values())
        hosts = {parent.data.tags[f"eagle3.stage.{k}.host"] for k in placed}
        assert len(hosts) == 4, f"expected each stage in a container of its own, got hosts {hosts}"
        # the hand-over folders as the host (a third mount point) sees them; the draft as the
        # registry serves it
        rd = runs / "tiny-random"
        for d in (
            "extract",
            "train",
            "train-untrained",
            "serving",
            "serving-untrained",
            "bench",
            "bench-untrained",
        ):
            assert output_intact(rd / d) == (True, ""), d
        serving_hash = read_manifest(rd / "serving")["content_hash"]
        assert content_hash(rd / "serving") == serving_hash
        name_, version = s1["tags"]["eagle3.registered_model"].split("/")
        mv = MlflowClient(mlflow_uri, registry_uri=mlflow_uri).get_model_version(name_, version)
        assert mv.tags["eagle3.serving_content_hash"] == serving_hash
        import mlflow.artifacts

        got = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=mv.source,
                dst_path=str(tmp_path / "registered"),
                tracking_uri=mlflow_uri,
            )
        )
        # the registered files are the serving folder plus the MLmodel file that makes them an
        # MLflow model
        assert (got / "MLmodel").is_file(), sorted(p.name for p in got.iterdir())
        assert content_hash(got, exclude=(MANIFEST, "MLmodel")) == serving_hash, (
            "the registered draft differs from the validated serving folder"
        )
        assert any((state / "mlartifacts").rglob("model.safetensors")), (
            "artifacts not in the server's store"
        )
        print(
            "\nrun 1: stages "
            f"{s1['stages'] and [(x['stage'], x['variant']) for x in s1['stages']]}; "
            f"hosts {hosts}; acceptance {s1['metrics']['acceptance_length']:.3f}; "
            f"registered {name_}/{version}"
        )

        # 2. other bench settings: deploy runs again; its container is killed while the engine
        #    serves
        t0 = time.monotonic()
        since = time.time()
        fid2 = _deployment_run(env, SLOW_BENCH)
        cid, engine_pid = _kill_deploy_while_serving(since, 900)
        fr2 = _wait_final(fid2, 600)
        times(
            "pipeline run 2 (until the deploy stage's container was killed and the run failed)", t0
        )
        assert fr2.state.name == "Failed", fr2.state
        msg = fr2.state.message or ""
        assert "stage deploy failed" in msg and "Crashed" in msg and "137" in msg, msg
        print(f"\nrun 2 failed as it should: {msg}", flush=True)
        time.sleep(2)
        assert _processes_of(cid) == [], "processes of the killed container survived"
        assert (
            not Path(f"/proc/{engine_pid}").exists()
            or "refengine" not in Path(f"/proc/{engine_pid}/cmdline").read_text()
        ), "the engine survived its container"
        left = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"id={cid}"], capture_output=True, text=True
        )
        assert left.stdout.strip() == "", "the killed container was not removed"
        client = MlflowClient(mlflow_uri)
        parent2 = client.search_runs(
            [parent.info.experiment_id], f"tags.`eagle3.pipeline_flow_run_id` = '{fid2}'"
        )[0]
        assert (
            parent2.info.status == "FAILED"
            and "stage deploy failed" in parent2.data.tags["eagle3.error"]
        )
        killed = client.search_runs(
            [parent.info.experiment_id],
            "tags.`prefect.flow_run_id` = '"
            + parent2.data.tags["eagle3.stage.deploy.flow_run_id"]
            + "'",
        )
        # the pre-flight ran to its end before the engine started; what ran when the container died
        # is FAILED
        done = [r for r in killed if r.data.tags.get("eagle3.stage") == "preflight"]
        killed = [r for r in killed if r.data.tags.get("eagle3.stage") != "preflight"]
        assert [r.info.status for r in done] == ["FINISHED"], [
            (r.info.run_name, r.info.status) for r in done
        ]
        assert killed and all(r.info.status == "FAILED" for r in killed), [
            r.info.status for r in killed
        ]
        assert all("Crashed" in r.data.tags["eagle3.error"] for r in killed)

        # 3. retry that flow run: only deploy + bench (and the steps after it) run again
        t0 = time.monotonic()
        _sh([str(BIN / "prefect"), "flow-run", "retry", fid2], env, 120, "prefect flow-run retry")
        time.sleep(3)
        fr3 = _wait_final(fid2, 1800)
        times("pipeline retry (extract/train/convert cached, deploy ran)", t0)
        assert fr3.state.is_completed(), fr3.state.message
        assert fr3.run_count == 2
        s3 = _check_mlflow(
            mlflow_uri,
            parent2.info.run_id,
            expect_cached={"extract", "train", "convert"},
            new_version=False,
        )
        assert s3["tags"]["eagle3.attempts"] == "2"
        for stage, want in (
            ("extract", {"extract": "cached"}),
            ("train", {"train": "cached", "train (untrained)": "cached"}),
            ("convert", {"convert": "cached", "convert (untrained)": "cached"}),
            (
                "deploy",
                {"preflight": "ran", "deploy-bench": "ran", "deploy-bench (untrained)": "ran"},
            ),
        ):
            assert json.loads((rd / "handover" / f"{stage}.json").read_text())["record"] == want, (
                stage
            )
        retried = s3["stages"] and sorted(
            {(x["stage"], x["variant"], x["cached"]) for x in s3["stages"]}
        )
        print(f"\nretry: {retried}", flush=True)
    finally:
        if old_api is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = old_api
        t0 = time.monotonic()
        subprocess.run(["infra/dstack.sh", "down"], cwd=REPO, env=env, timeout=300)
        left = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=eagle3.dstack={state}"],
            capture_output=True,
            text=True,
        )
        if engine_started:
            subprocess.run(["infra/docker-engine.sh", "down"], cwd=REPO, env=env, timeout=120)
        times("stack down" + (" + dockerd stopped" if engine_started else ""), t0)
        times("total", t_all)
        print(
            "\nwall times (s):\n" + "\n".join(f"  {v:8.1f}  {k}" for k, v in times.items()),
            flush=True,
        )
        shutil.rmtree(state / "pgdata", ignore_errors=True)
    assert left.stdout.strip() == "", f"containers of the stack left: {left.stdout}"
