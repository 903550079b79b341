"""The printed ``eagle3 decide ID`` hint: ``--tracking-uri URI`` whenever the run's MLflow store is
not the one ``eagle3 decide`` reads by default, and the hint only where a decision exists (not for
the extract / train / convert stage flows)."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("mlflow")
pytest.importorskip("prefect")

from flows import summary  # noqa: E402
from tasks import tracking  # noqa: E402


def test_decide_command_names_the_store_unless_it_is_the_default(tmp_path, monkeypatch):
    from eagle3.config import RunConfig

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    default = RunConfig().mlflow_uri()
    assert summary.decide_command(default, "abc") == "eagle3 decide abc"
    assert summary.decide_command(None, "abc") == "eagle3 decide abc"
    other = f"sqlite:///{tmp_path / 'my runs' / 'mlflow.db'}"
    assert summary.decide_command(other, "abc") == f"eagle3 decide abc --tracking-uri '{other}'"
    server = "http://127.0.0.1:5999"
    assert summary.decide_command(server, "abc") == f"eagle3 decide abc --tracking-uri {server}"
    # $MLFLOW_TRACKING_URI pointing elsewhere: the default store must be named, or decide reads
    # the variable's store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    assert summary.decide_command(default, "abc") == f"eagle3 decide abc --tracking-uri {default}"
    assert summary.decide_command(server, "abc") == f"eagle3 decide abc --tracking-uri {server}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", default)
    assert summary.decide_command(default, "abc") == "eagle3 decide abc"


def test_announce_parent_names_a_non_default_store_and_only_for_a_deciding_flow(
    tiny_cfg, monkeypatch
):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client, exp_id = tracking.client_for(tiny_cfg)
    parent = client.create_run(exp_id).info.run_id
    uri = tiny_cfg.mlflow_uri()  # under tmp_path: not the default store
    line = summary.announce_parent(tiny_cfg, parent, decides=True)
    assert f"`eagle3 decide {parent} --tracking-uri {uri}`" in line
    line = summary.announce_parent(tiny_cfg, parent, decides=False)
    assert f"MLflow parent run {parent} (store {uri})" in line and "eagle3 decide" not in line


def test_parent_run_of_a_stage_flow_without_a_decision_prints_no_decide_hint(tiny_cfg, monkeypatch):
    from prefect.runtime import flow_run

    import flows.common as common

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    said: list[str] = []
    monkeypatch.setattr(
        common, "announce_parent", lambda *a, **k: said.append(summary.announce_parent(*a, **k))
    )
    for name, decides in (
        ("eagle3-extract", False),
        ("eagle3-deploy", True),
        ("eagle3-pipeline", True),
    ):
        monkeypatch.setattr(flow_run, "id", str(uuid.uuid4()), raising=False)
        with common.parent_run(tiny_cfg, name) as parent:
            pass
        assert f"MLflow parent run {parent}" in said[-1]
        assert ("eagle3 decide" in said[-1]) == decides, (name, said[-1])


def test_deciding_flows_match_the_flows_that_record_a_decision():
    from flows import distributed, pipeline, stages

    assert pipeline.FLOW_NAME in summary.DECIDING_FLOWS
    assert distributed.FLOW_NAME in summary.DECIDING_FLOWS
    assert "eagle3-sweep" in summary.DECIDING_FLOWS
    for stage in stages.STAGES:  # only the deploy stage flow records a decision
        assert (stages.flow_name(stage) in summary.DECIDING_FLOWS) == (stage == "deploy"), stage


def test_artifact_links_carry_the_decide_line_only_once_a_decision_is_recorded(
    tiny_cfg, monkeypatch
):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client, exp_id = tracking.client_for(tiny_cfg)
    parent = client.create_run(exp_id).info.run_id
    assert not any("eagle3 decide" in x for x in summary._links(tiny_cfg, exp_id, parent))
    tracking.set_parent_tags(tiny_cfg, parent, {summary.DECISION_TAG: "more data"})
    lines = summary._links(tiny_cfg, exp_id, parent)
    assert (
        f"- its decision from the command line: `eagle3 decide {parent} --tracking-uri "
        f"{tiny_cfg.mlflow_uri()}`"
    ) in lines


def test_headline_and_cli_summary_name_the_store(tiny_cfg, monkeypatch):
    from cli.run import format_summary

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = tiny_cfg.mlflow_uri()
    base = {
        "decision": "more data",
        "decision_rule": "r",
        "acceptance_length": 1.2,
        "parent_run_id": "p1",
        "mlflow_uri": uri,
        "config": "tiny",
        "run_dir": "rd",
        "experiment_id": "1",
    }
    assert summary.headline(base).endswith(
        f"MLflow parent run p1: eagle3 decide p1 --tracking-uri {uri}"
    )
    assert "eagle3 decide" not in summary.headline({**base, "decision": None})
    text = format_summary(base, tiny_cfg)
    assert f"its decision in full: eagle3 decide p1 --tracking-uri {uri}" in text
    stage = {**base, "flow": "eagle3-train"}
    stage.pop("decision")
    assert "eagle3 decide" not in format_summary(stage, tiny_cfg)
    assert "eagle3 decide p1 --tracking-uri" in format_summary(
        {**stage, "flow": "eagle3-deploy"}, tiny_cfg
    )
