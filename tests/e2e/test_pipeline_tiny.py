"""The whole flow on configs/tiny-random.yaml through ``run_flow_cli`` (what ``eagle3 run`` calls):
extract → train (+ untrained baseline) → convert+validate+equivalence → deploy behind the
readiness gate (CPU reference engine) + bench → gate → decision; MLflow holds the parent run
with one nested run per stage and variant."""

from __future__ import annotations

import json
from pathlib import Path

import re

import pytest

pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from tests.support.flow_runs import TINY, child_processes  # noqa: E402

pytestmark = pytest.mark.slow


def test_whole_pipeline_tiny(tmp_path, tiny_target_dir, sharegpt_path, ephemeral_prefect):
    from eagle3.config import load_config
    from tasks.reports import decision_text
    from cli.run import run_flow_cli
    from tasks.tracking import metric_history, summarize_run

    # draft_vocab_size: the 16 tiny conversations hold fewer distinct tokens than the config's 512
    overrides = [
        f"paths.runs_dir={tmp_path / 'runs'}",
        "serve.env.HF_TOKEN=not-a-real-token",
        "train.draft_vocab_size=256",
    ]
    text = run_flow_cli("pipeline", str(TINY), overrides)
    cfg = load_config(TINY, overrides)

    lines = text.strip().splitlines()
    assert lines[-1].startswith("its decision in full: eagle3 decide ")
    assert f"--tracking-uri {cfg.mlflow_uri()}" in lines[-1]  # runs_dir is not the default one
    assert lines[-2].startswith("MLflow UI: mlflow ui --backend-store-uri sqlite:///")
    assert lines[-3].startswith(f"MLflow: {cfg.mlflow_uri()}")
    trained = float(re.search(r"trained draft:\s+([0-9.]+)", text).group(1))
    untrained = float(re.search(r"untrained baseline:\s+([0-9.]+)", text).group(1))
    assert 1.0 <= untrained <= cfg.serve.speculative_num_steps + 1
    assert 1.0 <= trained <= cfg.serve.speculative_num_steps + 1
    parent = re.search(r"parent run ([0-9a-f]{32})", text).group(1)

    s = summarize_run(parent, cfg.mlflow_uri())
    assert s["status"] == "FINISHED"
    got = sorted((x["stage"], x["variant"], x["status"]) for x in s["stages"])
    assert got == sorted(
        [
            ("extract", "trained", "FINISHED"),
            ("register", "trained", "FINISHED"),
            ("preflight", "trained", "FINISHED"),
        ]
        + [
            (st, v, "FINISHED")
            for st in ("train", "convert", "deploy-bench")
            for v in ("trained", "untrained")
        ]
    )
    assert s["metrics"]["acceptance_length"] == pytest.approx(trained, abs=5e-4)
    assert s["metrics"]["acceptance_length_untrained"] == pytest.approx(untrained, abs=5e-4)
    extract_run = next(x for x in s["stages"] if x["stage"] == "extract")
    assert (
        extract_run["metrics"]["counts.samples"] >= 1
        and extract_run["metrics"]["counts.tokens"] > 0
    )
    train_run = next(x for x in s["stages"] if x["stage"] == "train" and x["variant"] == "trained")
    # the hidden states are one MLflow dataset: written by extract, read by train, same digest
    # (content hash)
    from eagle3.artifacts import read_manifest

    hs_dir = Path(json.loads(extract_run["datasets"][0]["source"])["uri"])
    assert read_manifest(hs_dir)["content_hash"][:32] == extract_run["datasets"][0]["digest"]
    assert [d["context"] for d in extract_run["datasets"]] == ["extraction"]
    assert [(d["context"], d["digest"], d["source"]) for d in train_run["datasets"]] == [
        ("training", extract_run["datasets"][0]["digest"], extract_run["datasets"][0]["source"])
    ]
    assert (hs_dir / "manifest.json").is_file()
    losses = metric_history(train_run["run_id"], "train/loss", cfg.mlflow_uri())
    assert len(losses) >= 1 and all(v > 0 for _, v in losses)
    assert s["tags"].get("eagle3.decision") in (
        "more data",
        "longer training",
        "fix serving integration",
        "stop",
        "more evidence needed",
    )
    assert "Decision" in decision_text(parent, cfg.mlflow_uri())
    from eagle3.errors import DataError

    with pytest.raises(
        DataError, match=f"is the extract stage run of pipeline run {parent}; expected a pipeline"
    ):
        decision_text(extract_run["run_id"], cfg.mlflow_uri())
    # secrets never reach MLflow; the resolved config next to the artifacts is redacted too
    from mlflow import MlflowClient

    assert MlflowClient(cfg.mlflow_uri()).get_run(parent).data.params["serve.env.HF_TOKEN"] == "***"
    assert "not-a-real-token" not in (cfg.run_dir() / "config.yaml").read_text()
    # nothing left running: no engine, no ephemeral Prefect server
    assert child_processes() == []

    # the stand-alone gate, as a user who starts a server by hand would run it: `eagle3 wait-ready`
    # against the reference engine serving the draft the pipeline just converted
    import subprocess
    import sys

    from eagle3.assets import resolve_target
    from eagle3.serve.launcher import launch_engine
    from flows.common import stage_dirs

    with launch_engine(
        cfg,
        resolve_target(cfg),
        stage_dirs(cfg)["serving"],
        tmp_path / "by-hand",
        engine="reference",
    ) as eng:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "cli.main",
                "wait-ready",
                "--url",
                eng.url,
                "--pid",
                str(eng.pid),
                "--log",
                str(eng.log_path),
                "--timeout",
                "120",
                "--stall-timeout",
                "60",
                "--poll-interval",
                "0.5",
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "READY" in out.stdout and "spec_verify_ct" in out.stdout
    assert child_processes() == []
