"""flows/distributed.py and flows/handover.py without Docker: hand-over records across mount points,
and what the orchestrator does when a stage's flow run (on another machine) ends other than
Completed."""

from __future__ import annotations

import json
import uuid

import pytest

pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from eagle3.config import load_config  # noqa: E402
from eagle3.errors import DataError  # noqa: E402


def _cfg(root):
    return load_config(None, [f"paths.runs_dir={root}", "name=tiny"])


def _flow_run(state, pool="eagle3-gpu"):
    from prefect.client.schemas.objects import FlowRun

    return FlowRun(
        id=uuid.uuid4(), name="tiny-deploy", flow_id=uuid.uuid4(), state=state, work_pool_name=pool
    )


def test_handover_is_read_through_another_mount_point(tmp_path):
    from flows import handover as d
    from tasks.results import AcceptanceFigures, StageResult

    a, b = _cfg(tmp_path / "gpu-node" / "runs"), _cfg(tmp_path / "cpu-node" / "runs")
    result = StageResult("train", a.run_dir() / "train", "c", "run-9", {"x": 1.0}, "untrained")
    moved = d.portable(a, result)
    assert moved["dir"] == "tiny/train" and moved["type"] == "StageResult"
    back = d.localized(
        b, json.loads(json.dumps(moved))
    )  # through JSON, as a record or a flow parameter goes
    assert back == StageResult(
        "train", b.run_dir() / "train", "c", "run-9", {"x": 1.0}, "untrained"
    )
    figures = AcceptanceFigures(1.4, 1.0, 1.5, None, 2.5, 1.0, True)
    assert d.localized(b, json.loads(json.dumps(d.portable(a, figures)))) == figures
    assert d.localized(b, d.portable(a, {"checks": [{"name": "memory"}]})) == {
        "checks": [{"name": "memory"}]
    }
    with pytest.raises(
        DataError,
        match="a result of type StageResult, AcceptanceFigures or dict expected, got list",
    ):
        d.portable(a, [1])
    with pytest.raises(
        DataError, match=r"type StageResult, AcceptanceFigures or dict expected, got None"
    ):
        d.localized(
            b, {"dir": "tiny/train", "content_hash": "c"}
        )  # an untyped record (older version)
    with pytest.raises(
        DataError, match=r"StageResult fields \['content_hash', 'stage'\] do not make a StageResult"
    ):
        d.localized(
            b, {"type": "StageResult", "dir": "tiny/train", "content_hash": "c", "stage": "train"}
        )
    doc = {
        "stage": "train",
        "flow_run_id": "run-1",
        "host": "gpu-node",
        "record": {"train": "ran"},
        "results": {"trained": moved},
    }
    path = d.handover_path(b, "train")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    got = d.read_handover(b, "train", "run-1")
    assert got["results"]["trained"].dir == b.run_dir() / "train" and got["record"] == {
        "train": "ran"
    }
    with pytest.raises(
        DataError, match="flow_run_id expected run-2 .* got 'run-1': a record of another run"
    ):
        d.read_handover(b, "train", "run-2")
    with pytest.raises(
        DataError, match="convert.json: no hand-over record; expected stage convert's flow run r"
    ):
        d.read_handover(b, "convert", "r")


def test_a_crashed_stage_fails_the_orchestrator_naming_it_and_fails_its_orphaned_runs(
    tmp_path, monkeypatch
):
    import prefect.deployments
    from mlflow import MlflowClient
    from prefect.states import Completed, Crashed

    from flows import distributed as d
    from flows.handover import handover_path
    from tasks import tracking

    cfg = _cfg(tmp_path / "runs")
    client, exp = tracking.client_for(cfg)
    parent = client.create_run(exp).info.run_id
    crashed = _flow_run(
        Crashed(message="Flow run infrastructure exited with non-zero status code 137.")
    )
    orphan = client.create_run(
        exp, tags={tracking.FLOW_RUN_TAG: str(crashed.id), "eagle3.stage": "deploy-bench"}
    )
    calls = []
    monkeypatch.setattr(
        prefect.deployments,
        "run_deployment",
        lambda name, **kw: calls.append((name, kw)) or crashed,
    )
    with pytest.raises(
        d.StageRunFailed,
        match=r"stage deploy failed: flow run 'tiny-deploy' \(.*\) of deployment "
        r"eagle3-deploy/deploy-tiny-random on work pool 'eagle3-gpu' ended "
        r"Crashed: Flow run infrastructure exited with non-zero status code "
        r"137.*now FAILED: " + orphan.info.run_id,
    ):
        d.run_stage_deployment(cfg, "deploy", "tiny-random", {"config_path": "c"}, {}, parent)
    assert calls[0][0] == "eagle3-deploy/deploy-tiny-random" and calls[0][1]["parameters"] == {
        "config_path": "c"
    }
    assert calls[0][1]["timeout"] == d.stage_deadline_s(cfg, "deploy")
    run = MlflowClient(tracking.tracking_uri(cfg)).get_run(orphan.info.run_id)
    assert (
        run.info.status == "FAILED"
        and "exited with non-zero status code 137" in run.data.tags["eagle3.error"]
    )
    assert MlflowClient(tracking.tracking_uri(cfg)).get_run(parent).data.tags[
        "eagle3.stage.deploy.flow_run_id"
    ] == str(crashed.id)

    done = _flow_run(Completed(), pool="eagle3-cpu")
    monkeypatch.setattr(prefect.deployments, "run_deployment", lambda name, **kw: done)
    path = handover_path(cfg, "convert")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "flow_run_id": str(done.id),
                "host": "c0ffee",
                "record": {"convert": "cached"},
                "results": {
                    "trained": {
                        "type": "StageResult",
                        "stage": "convert",
                        "dir": "tiny/serving",
                        "content_hash": "h",
                        "mlflow_run_id": "m",
                    }
                },
            }
        )
    )
    record, placed = {}, {}
    out = d.run_stage_deployment(cfg, "convert", "tiny-random", {}, record, parent, placed)
    assert out["trained"].dir == cfg.run_dir() / "serving" and out["trained"].content_hash == "h"
    assert record == {"convert": "cached"}
    assert placed == {
        "convert": {"flow_run_id": str(done.id), "work_pool": "eagle3-cpu", "host": "c0ffee"}
    }
