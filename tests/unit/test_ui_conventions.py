"""What the Prefect and MLflow UIs show: the flow run's name, the experiment's kind and run-list
columns, stage runs named by cache and attempt with their config as params, the parent run's
description, links that work (a server's URL; the UI command as text for a local store), and a
failed run's artifact naming the stage."""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("mlflow")
pytest.importorskip("prefect")

from eagle3.decide import recommend  # noqa: E402
from flows import summary  # noqa: E402
from tasks import mlflow_ui, tracking  # noqa: E402
from tasks.results import AcceptanceFigures, StageResult  # noqa: E402


def test_flow_run_name_has_the_config_name_and_overrides(monkeypatch):
    from prefect.runtime import flow_run

    from tests.conftest import CONFIGS

    monkeypatch.setattr(flow_run, "id", "096d3bad-0000-4000-8000-000000000000", raising=False)
    monkeypatch.setattr(
        flow_run,
        "parameters",
        {"config_path": str(CONFIGS / "tiny-random.yaml"), "overrides": ["train.lr=1e-3"]},
        raising=False,
    )
    assert summary.flow_run_label() == "tiny-random-096d3bad [train.lr=1e-3]"
    monkeypatch.setattr(
        flow_run, "parameters", {"config_path": "nowhere/my-cfg.yaml"}, raising=False
    )
    assert (
        summary.flow_run_label() == "my-cfg-096d3bad"
    )  # the flow then fails with the config's own error


def test_distributed_runs_are_named_like_local_runs(tiny_cfg):
    """A distributed flow run gets ``<config>-<id[:8]> [overrides]`` (the MLflow parent run's name),
    not Prefect's random ``adjective-animal``: run for real on the ephemeral API, where it stops at
    once on the missing stage deployment name."""
    from prefect.client.orchestration import get_client

    from flows.common import local_prefect, stop_ephemeral_server
    from flows.distributed import distributed_pipeline
    from tests.conftest import CONFIGS

    overrides = [f"paths.runs_dir={tiny_cfg.paths.runs_dir}"]
    try:
        with local_prefect(tiny_cfg):
            st = distributed_pipeline(
                config_path=str(CONFIGS / "tiny-random.yaml"),
                overrides=overrides,
                return_state=True,
            )
            assert st.is_failed() and "stage_deployment" in st.message
            fr_id = st.state_details.flow_run_id
            with get_client(sync_client=True) as client:
                name = client.read_flow_run(fr_id).name
    finally:
        stop_ephemeral_server()
    assert name == f"tiny-random-{str(fr_id)[:8]} [{overrides[0]}]"


def test_experiment_opens_in_model_training_mode_with_headline_columns(tiny_cfg):
    client, exp_id = tracking.client_for(tiny_cfg)
    tags = client.get_experiment(exp_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(tags[f"mlflow.sharedViewState.{mlflow_ui.VIEW_KEY}"])
    # distinct short titles with rounded values and the decision first, then the description
    cols = [
        "metrics.`AL served`",
        "metrics.`AL untrained`",
        "metrics.`AL offline`",
        "tags.`eagle3.decision`",
        "tags.`eagle3.acceptance_gate`",
        "attributes.`Description`",
    ]
    assert view["selectedColumns"] == cols and view["columnOrder"][-len(cols) :] == cols
    titles = [c.split("`")[1] for c in cols]
    assert len({t[:12] for t in titles}) == len(titles)  # no two alike in a 100-px column
    assert view["columnWidths"]["tags.`eagle3.decision`"] >= 8 * len("more evidence needed")
    assert set(view["columnWidths"]) <= set(view["columnOrder"])  # MLflow sizes only those
    assert mlflow_ui.experiment_url("http://h:5000", exp_id) == (
        f"http://h:5000/#/experiments/{exp_id}/runs?workflowType="
        f"machine_learning&viewStateShareKey={mlflow_ui.VIEW_KEY}"
    )


def test_stage_runs_named_by_cache_and_attempt_with_their_params(tiny_cfg, tmp_path):
    client, exp_id = tracking.client_for(tiny_cfg)
    parent = client.create_run(exp_id).info.run_id
    for _ in range(2):  # a retry: the second attempt is numbered
        with pytest.raises(RuntimeError), tracking.stage_run(tiny_cfg, parent, "deploy-bench"):
            raise RuntimeError("stage deploy-bench failed: boom")
    with tracking.stage_run(tiny_cfg, parent, "train", "untrained") as tr:
        pass
    out = tmp_path / "x"
    out.mkdir()
    cached = tracking.record_cached_stage(
        tiny_cfg,
        parent,
        "train",
        "trained",
        StageResult(
            "train",
            out,
            "h",
            "run-0",
            {"final.final_val_loss": 2.0, "simulated_acceptance_length": 1.3},
        ),
    )
    tracking.record_cached_stage(
        tiny_cfg, parent, "train", "trained", StageResult("train", out, "h", "run-0")
    )
    with tracking.stage_run(tiny_cfg, parent, "train"):  # the cached ones were no attempts
        pass
    runs = {
        r.info.run_name: r
        for r in client.search_runs([exp_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    }
    assert set(runs) == {
        "deploy-bench",
        "deploy-bench #2",
        "train-untrained",
        "train (cached)",
        "train",
    }
    assert runs["deploy-bench #2"].data.tags["eagle3.attempt"] == "2"
    assert runs["train (cached)"].data.tags["eagle3.cached"] == "true"
    # the stage's config section as params; a cached run charts no single-point copies of step
    # metrics
    assert runs["train-untrained"].data.params["train.lr"] == str(tiny_cfg.train.lr)
    assert runs["train-untrained"].data.params["train.max_steps"] == str(tiny_cfg.train.max_steps)
    assert not any(k.startswith(("serve.", "data.")) for k in runs["train-untrained"].data.params)
    assert runs["deploy-bench"].data.params["bench.request_timeout_s"] == str(
        tiny_cfg.bench.request_timeout_s
    )
    assert set(client.get_run(cached).data.metrics) == {"simulated_acceptance_length"}
    # the failure's traceback is an artifact of the failed run
    assert {a.path for a in client.list_artifacts(runs["deploy-bench"].info.run_id)} == {
        "error.txt"
    }
    assert tr.run_id in {r.info.run_id for r in runs.values()}


def _figures(passed=True):
    return AcceptanceFigures(
        1.21,
        1.01,
        1.25,
        1.4,
        3.0,
        minimum=1.0,
        passed=passed,
        failure=None if passed else "served 1.21 < minimum 1.5",
    )


def test_parent_description_has_the_decision_and_its_evidence():
    d = recommend({"val_loss": [2.0], "train_loss": 1.9}, {"served": 1.21, "offline": 1.25})
    note = mlflow_ui.parent_note("tiny-random", _figures(), d)
    # the first line, shown before "Show more" and as plain text in the run list: the decision and
    # every acceptance length labelled and rounded
    lines = note.splitlines()
    assert lines[0] == "more evidence needed; AL 1.210, untrained 1.010"
    assert lines[2] == (
        "AL = acceptance length, bonus token counted: served 1.210, untrained "
        "baseline 1.010, offline 1.250, simulated 1.400; acceptance gate "
        "(minimum 1) passed."
    )
    assert "decision **more evidence needed** (rule `too_few_evaluations`" in note
    # the run list shows 50 characters: the first line fits for every decision
    from eagle3.decide import OUTCOMES

    for outcome in OUTCOMES:
        d.recommendation = outcome
        head = mlflow_ui.headline_line(_figures(), d)
        assert len(head) <= mlflow_ui.DESCRIPTION_CHARS, head
    assert (
        "| served, trained draft | 1.210 |" in note
        and "| served, untrained baseline | 1.010 |" in note
    )
    assert "fewer than 2 evaluations" in note and "Acceptance gate (minimum 1): passed" in note


def test_headline_metrics_are_short_distinct_and_rounded():
    fig = AcceptanceFigures(
        1.2345678, None, 1.0000004, 1.4696969696969695, 3.0, minimum=1.0, passed=True, failure=None
    )
    assert mlflow_ui.headline_metrics(fig) == {"AL served": 1.235, "AL offline": 1.0}
    failed = mlflow_ui.figures_line(_figures(passed=False))
    assert failed.endswith("acceptance gate (minimum 1) FAILED.")
    assert "untrained baseline 1.010" in failed


def test_flow_run_shows_the_parent_run_and_the_decision(tiny_cfg, caplog):
    client, exp_id = tracking.client_for(tiny_cfg)
    parent = client.create_run(exp_id).info.run_id
    with caplog.at_level(logging.INFO, logger="flows.summary"):
        line = summary.announce_parent(tiny_cfg, parent)
    assert f"MLflow parent run {parent}" in line
    assert f"`eagle3 decide {parent} --tracking-uri " in line
    assert line in caplog.text
    st = summary.finished(
        {
            "decision": "more data",
            "decision_rule": "val_loss_falling",
            "acceptance_length": 1.2104,
            "acceptance_length_untrained": 1.0,
            "acceptance_length_offline": None,
            "parent_run_id": parent,
        }
    )
    assert st.is_completed() and st.message == (
        "decision: more data (rule val_loss_falling); AL served 1.210, untrained 1.000, offline "
        f"n/a; MLflow parent run {parent}: eagle3 decide {parent}"
    )
    assert st.data["decision"] == "more data"


def test_failure_artifact_error_block_is_wrapped():
    msg = "stage deploy-bench failed: " + "word " * 60 + "/" + "p" * 130 + "\nsecond line"
    block = summary.error_block(f"ValueError: {msg}")
    assert len(block) > 3 and block[-1] == "second line"
    assert all(len(x) <= summary.ERROR_WIDTH for x in block), [len(x) for x in block]
    assert "".join(block).replace(" ", "") == f"ValueError: {msg}".replace(" ", "").replace(
        "\n", ""
    )


def test_links_are_real_urls_or_the_ui_command(tiny_cfg):
    link, cmd = summary.mlflow_ui(tiny_cfg, "1", "abc")
    assert (
        link is None
        and cmd
        == f"mlflow ui --backend-store-uri {tiny_cfg.mlflow_uri()} --host 127.0.0.1 --port 5000"
    )
    served = tiny_cfg.model_copy(deep=True)
    served.tracking.mlflow_uri = "http://127.0.0.1:5999/"
    assert summary.mlflow_ui(served, "1", "abc") == (
        "http://127.0.0.1:5999/#/experiments/1/runs/abc?workflowType=machine_learning",
        None,
    )


def test_failure_lines_name_the_stage_and_its_run(tiny_cfg):
    client, exp_id = tracking.client_for(tiny_cfg)
    parent = client.create_run(exp_id).info.run_id
    err = None
    try:
        with tracking.stage_run(tiny_cfg, parent, "deploy-bench"):
            raise ValueError(
                "stage deploy-bench failed: POST /generate: too slow; raise bench.request_timeout_s"
            )
    except ValueError as e:
        err = e
    lines = summary.failure_lines(tiny_cfg, exp_id, parent, err)
    assert lines[0] == "**Failed stage: deploy-bench**"
    assert any("ValueError: stage deploy-bench failed: POST /generate" in x for x in lines)
    assert any(x.startswith("- its MLflow run: deploy-bench (") and "error.txt" in x for x in lines)
    assert summary.failed_stage(RuntimeError("no stage here")) is None
    # the failure goes on top of the run's description; a decision written there before stays below
    # it
    tracking.set_parent_tags(tiny_cfg, parent, {mlflow_ui.NOTE_TAG: "decision: **more data**"})
    tracking.finish_run(tiny_cfg, parent, error=err)
    note = client.get_run(parent).data.tags[mlflow_ui.NOTE_TAG]
    assert note.startswith("FAILED — ValueError: stage deploy-bench failed") and note.endswith(
        "decision: **more data**"
    )


def test_library_warnings_reach_the_prefect_run_log(tiny_cfg):
    from prefect import flow, task

    from flows.common import local_prefect, stop_ephemeral_server

    sent = []

    @task
    def stage():
        logging.getLogger("eagle3.extract.stage").warning("3 of 9 records skipped")

    @flow
    def f():
        stage()

    from prefect.logging import handlers

    original = handlers.emit_api_log
    handlers.emit_api_log = sent.append
    try:
        summary.attach_library_logs()
        with local_prefect(tiny_cfg):  # Prefect's ephemeral API under the test's runs dir
            f()
    finally:
        handlers.emit_api_log = original
        stop_ephemeral_server()
    mine = [x for x in sent if "records skipped" in x["message"]]
    assert (
        len(mine) == 1
        and mine[0]["task_run_id"] is not None
        and mine[0]["level"] == logging.WARNING
    )
