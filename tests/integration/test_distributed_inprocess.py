"""flows/distributed.py's orchestrator and stage flows for real, in one process (no Docker, no work
pool): each ``run_deployment`` of a stage is answered by running that stage's flow here, so the
typed hand-overs, the pre-flight in the deploy stage, and the decision → acceptance gate →
registry order of the orchestrator run on the real tiny pipeline (CPU reference engine). The
containers and pools themselves are ``make test-distributed``."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from tests.support.flow_runs import TINY, child_processes_except_prefect, task_states  # noqa: E402

pytestmark = pytest.mark.slow


def _run_here(calls: list):
    """A stand-in for ``prefect.deployments.run_deployment``: runs ``eagle3-<stage>``'s flow in this
    process with the same parameters and returns its flow run, as Prefect does after the
    deployment's run finished."""
    from prefect.client.orchestration import get_client

    from flows.stages import STAGE_FLOWS, flow_name

    by_name = {flow_name(s): f for s, f in STAGE_FLOWS.items()}

    def run_deployment(name, *, parameters, timeout, flow_run_name):
        calls.append((name, sorted(parameters), timeout))
        state = by_name[name.split("/")[0]](**parameters, return_state=True)
        with get_client(sync_client=True) as client:
            return client.read_flow_run(state.state_details.flow_run_id)

    return run_deployment


def test_distributed_pipeline_hands_typed_results_over_and_runs_preflight_before_deploy(
    tmp_path, tiny_target_dir, sharegpt_path, monkeypatch
):
    import prefect.deployments

    from eagle3.config import load_config
    from flows.common import local_prefect, stage_dirs, stop_ephemeral_server
    from flows.distributed import distributed_pipeline
    from tasks.tracking import summarize_run

    overrides = [
        f"paths.runs_dir={tmp_path / 'runs'}",
        "bench.num_prompts=2",
        "data.num_conversations=8",
        "train.draft_vocab_size=128",
    ]
    cfg = load_config(TINY, overrides)
    calls: list = []
    monkeypatch.setattr(prefect.deployments, "run_deployment", _run_here(calls))
    try:
        with local_prefect(cfg):
            st = distributed_pipeline(
                config_path=str(TINY),
                overrides=overrides,
                stage_deployment="tiny-random",
                return_state=True,
            )
            assert st.is_completed(), st.message
            summary = st.result()
            own = {
                k: v
                for k, v in task_states(st.state_details.flow_run_id).items()
                if not k.startswith("eagle3-")
            }  # the stage flow runs appear as tasks of the parent here
            assert list(own) == [
                "decision",
                "acceptance-gate",
                "register-draft",
            ]  # flows/pipeline.py's order
            deploy_run = summary["stage_flow_runs"]["deploy"]["flow_run_id"]
            assert task_states(deploy_run) == {
                "preflight": ["Completed"],
                "deploy-bench": ["Completed"],
                "deploy-bench (untrained)": ["Completed"],
                "acceptance": ["Completed"],
            }
            assert list(task_states(deploy_run))[0] == "preflight"  # before any engine starts
            assert child_processes_except_prefect() == []
    finally:
        stop_ephemeral_server()

    assert [c[0] for c in calls] == [
        f"eagle3-{s}/{s}-tiny-random" for s in ("extract", "train", "convert", "deploy")
    ]
    assert calls[3][1] == ["config_path", "overrides", "parent_run_id", "train_result"]
    deploy = json.loads((cfg.run_dir() / "handover" / "deploy.json").read_text())
    assert deploy["record"] == {
        "preflight": "ran",
        "deploy-bench": "ran",
        "deploy-bench (untrained)": "ran",
    }
    assert {k: v["type"] for k, v in deploy["results"].items()} == {
        "trained": "StageResult",
        "untrained": "StageResult",
        "figures": "AcceptanceFigures",
        "preflight": "dict",
    }
    # relative to the runs directory, in the folder of the run's settings
    bench = stage_dirs(cfg)["bench"].name
    assert deploy["results"]["trained"]["dir"] == f"{cfg.name}/bench/{bench}"
    served = deploy["results"]["figures"]["served"]
    assert (
        summary["acceptance_length"] == pytest.approx(served)
        and 1.0 <= served <= cfg.serve.speculative_num_steps + 1
    )
    assert summary["registered_model"].startswith("eagle3-draft-") and set(
        summary["stage_flow_runs"]
    ) == {"extract", "train", "convert", "deploy"}

    s = summarize_run(summary["parent_run_id"], cfg.mlflow_uri())
    assert s["status"] == "FINISHED" and s["tags"]["eagle3.preflight"] == "passed"
    assert s["tags"]["eagle3.decision"] == summary["decision"]
    got = sorted((x["stage"], x["variant"], x["status"]) for x in s["stages"])
    assert got == sorted(
        [
            ("extract", "trained", "FINISHED"),
            ("register", "trained", "FINISHED"),
            ("preflight", "trained", "FINISHED"),
        ]
        + [
            (st_, v, "FINISHED")
            for st_ in ("train", "convert", "deploy-bench")
            for v in ("trained", "untrained")
        ]
    )
