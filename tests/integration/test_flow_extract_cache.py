"""Extraction is re-executed when its input file changes, and served from Prefect's cache when
nothing changed — counted from the Prefect task-run states (ephemeral API, real MLflow)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from tests.support.flow_runs import TINY, task_states  # noqa: E402

pytestmark = pytest.mark.slow


def _conversations(src, dst, n: int) -> None:
    lines = [ln for ln in src.read_text().splitlines()[:n]]
    dst.write_text("\n".join(lines) + "\n")


def test_changed_dataset_file_reruns_extraction(tmp_path, sharegpt_path, tiny_target_dir):
    from eagle3.config import load_config
    from flows.common import local_prefect, stop_ephemeral_server
    from flows.stages import extract_flow
    from tasks.tracking import summarize_run

    data = tmp_path / "conv.jsonl"
    _conversations(sharegpt_path, data, 6)
    overrides = [
        f"paths.runs_dir={tmp_path / 'runs'}",
        "data.source=file",
        f"data.path={data}",
        "data.num_conversations=4",
        "data.max_seq_len=64",
    ]
    cfg = load_config(TINY, overrides)
    try:
        with local_prefect(cfg):
            states = []
            summaries = []
            for step in ("first", "unchanged", "changed"):
                if step == "changed":
                    rows = [json.loads(x) for x in data.read_text().splitlines()]
                    rows[0]["conversations"][1]["value"] = (
                        "A different answer, so different hidden states."
                    )
                    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
                st = extract_flow(config_path=str(TINY), overrides=overrides, return_state=True)
                assert st.is_completed(), st.message
                summaries.append(st.result())
                states.append(task_states(st.state_details.flow_run_id))
    finally:
        stop_ephemeral_server()
    assert [s["extract"] for s in states] == [["Completed"], ["Cached"], ["Completed"]]
    assert [s["stages"]["extract"] for s in summaries] == ["ran", "cached", "ran"]
    # MLflow: the cached stage's nested run points to the run that produced the artifact
    first = summarize_run(summaries[0]["parent_run_id"], summaries[0]["mlflow_uri"])["stages"][0]
    cached = summarize_run(summaries[1]["parent_run_id"], summaries[1]["mlflow_uri"])["stages"][0]
    assert (
        not first["cached"] and 1 <= first["metrics"]["counts.samples"] <= 4
    )  # 4 conversations asked for
    assert cached["cached"] and cached["produced_by"] == first["run_id"]
