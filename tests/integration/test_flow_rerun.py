"""Re-running after a failure re-executes only what failed, counted from Prefect's task-run
states: the pre-flight refuses the benchmark's broken prompt file once (before any engine
starts), the flow run is retried after the file is fixed, and only the pre-flight and
deploy+bench run; then a changed training setting re-runs training and what follows, not
extraction.
Real Prefect (ephemeral API), real MLflow, the real tiny pipeline with the CPU reference engine."""

from __future__ import annotations

import datetime as dt

import pytest

pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from tests.support.flow_runs import (
    TINY,
    child_processes_except_prefect,
    retry_flow_run,
    task_states,
)  # noqa: E402

pytestmark = pytest.mark.slow

UPSTREAM = ("extract", "train", "convert")


def test_bench_prompts_refused_once_then_only_preflight_and_deploy_bench_rerun(
    tmp_path, tiny_target_dir, sharegpt_path
):
    from mlflow import MlflowClient

    from eagle3.config import load_config
    from flows.common import local_prefect, stop_ephemeral_server
    from flows.pipeline import eagle3_pipeline
    from tasks.tracking import PIPELINE_TAG, client_for, summarize_run

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Say hello."}\n{this line is not JSON\n')
    overrides = [
        f"paths.runs_dir={tmp_path / 'runs'}",
        "bench.baseline_untrained=false",
        f"bench.prompts={prompts}",
        "bench.num_prompts=2",
        "data.num_conversations=8",
        "train.draft_vocab_size=128",
    ]
    cfg = load_config(TINY, overrides)
    try:
        with local_prefect(cfg):
            st = eagle3_pipeline(config_path=str(TINY), overrides=overrides, return_state=True)
            assert st.is_failed()
            assert "stage preflight failed" in st.message and str(prompts) in st.message
            fr = st.state_details.flow_run_id
            assert task_states(fr) == {
                **{s: ["Completed"] for s in UPSTREAM},
                "preflight": ["Failed"],
            }
            assert child_processes_except_prefect() == []  # no engine was started

            prompts.write_text('{"prompt": "Say hello."}\n{"prompt": "Count to five."}\n')
            since = dt.datetime.now(dt.timezone.utc)
            st2 = retry_flow_run(
                eagle3_pipeline, fr
            )  # `prefect flow-run retry` of the same flow run
            assert st2.is_completed(), st2.message
            assert task_states(fr, since) == {
                **{s: ["Cached"] for s in UPSTREAM},
                "preflight": ["Completed"],
                "deploy-bench": ["Completed"],
                "acceptance": ["Completed"],
                "acceptance-gate": ["Completed"],
                "register-draft": ["Completed"],
                "decision": ["Completed"],
            }

            # a changed training setting: training and everything after it run again, extraction
            # does not
            changed = overrides + ["train.lr=5e-4"]
            st3 = eagle3_pipeline(config_path=str(TINY), overrides=changed, return_state=True)
            assert st3.is_completed(), st3.message
            assert task_states(st3.state_details.flow_run_id) == {
                "extract": ["Cached"],
                "train": ["Completed"],
                "convert": ["Completed"],
                "preflight": ["Completed"],
                "deploy-bench": ["Completed"],
                "acceptance": ["Completed"],
                "acceptance-gate": ["Completed"],
                "register-draft": ["Completed"],
                "decision": ["Completed"],
            }
            assert child_processes_except_prefect() == []

            # back to the first settings: their outputs are still there beside the changed ones
            st4 = eagle3_pipeline(config_path=str(TINY), overrides=overrides, return_state=True)
            assert st4.is_completed(), st4.message
            states = task_states(st4.state_details.flow_run_id)
            assert {s: states[s] for s in (*UPSTREAM, "deploy-bench")} == {
                s: ["Cached"] for s in (*UPSTREAM, "deploy-bench")
            }, states
            assert child_processes_except_prefect() == []
    finally:
        stop_ephemeral_server()

    # MLflow: the retried flow run kept its parent run; cached stages point at the runs that made
    # them
    client, exp = client_for(cfg)
    parents = client.search_runs([exp], f"tags.`{PIPELINE_TAG}` = '{fr}'")
    assert len(parents) == 1 and parents[0].data.tags["eagle3.attempts"] == "2"
    s = summarize_run(parents[0].info.run_id, cfg.mlflow_uri())
    assert s["status"] == "FINISHED" and s["metrics"]["acceptance_length"] >= 1.0
    by = {}
    for x in s["stages"]:
        by.setdefault(x["stage"], []).append(x)
    for stage in UPSTREAM:
        made, cached = by[stage]
        assert (made["cached"], made["status"], cached["cached"]) == (False, "FINISHED", True)
        assert cached["produced_by"] == made["run_id"]
    # the reused extraction is still this pipeline run's dataset: same digest on the producing and
    # the cached run
    assert [d["digest"] for d in by["extract"][1]["datasets"]] == [
        d["digest"] for d in by["extract"][0]["datasets"]
    ]
    assert len(by["extract"][0]["datasets"]) == 1
    assert [x["status"] for x in by["preflight"]] == ["FAILED", "FINISHED"]
    assert [x["status"] for x in by["deploy-bench"]] == ["FINISHED"]
    failed_tags = MlflowClient(cfg.mlflow_uri()).get_run(by["preflight"][0]["run_id"]).data.tags
    assert "prompts" in failed_tags["eagle3.error"] or str(prompts) in failed_tags["eagle3.error"]
