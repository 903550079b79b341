"""The tiny pipeline with a target class SGLang 0.5.23 does not capture aux states for: with SGLang
it fails at the pre-flight, before any engine starts, naming the class; the same config with the
reference engine runs; and a run whose acceptance gate fails still has its decision in MLflow.
(One shared runs folder, so the second and third runs reuse extraction,
training and conversion from the cache.)"""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from tests.support.flow_runs import TINY, child_processes_except_prefect  # noqa: E402

pytestmark = pytest.mark.slow
UNCAPTURED = "GraniteForCausalLM"  # registered in SGLang 0.5.23, no set_eagle3_layers_to_capture


def _granite_labelled_target(tiny_target_dir, dst):
    """The tiny Llama target with architectures [GraniteForCausalLM]: transformers still builds a
    Llama (model_type llama), SGLang would build its Granite class, which captures no aux states."""
    shutil.copytree(tiny_target_dir, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["architectures"] = [UNCAPTURED]
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_unsupported_target_class_fails_at_preflight_and_runs_with_the_reference_engine(
    tmp_path, tiny_target_dir, sharegpt_path
):
    from mlflow import MlflowClient

    from cli.run import run_flow_cli
    from eagle3.config import load_config
    from eagle3.errors import AcceptanceTooLow, EngineUnsupported
    from tasks.tracking import client_for, summarize_run

    target = _granite_labelled_target(tiny_target_dir, tmp_path / "granite-labelled")
    base = [
        f"paths.runs_dir={tmp_path / 'runs'}",
        "target.kind=hf",
        f"target.path={target}",
        "bench.baseline_untrained=false",
        "train.draft_vocab_size=256",
    ]

    # 1. SGLang: refused at the pre-flight, no engine ever started
    with pytest.raises(EngineUnsupported) as e:
        run_flow_cli("pipeline", str(TINY), base + ["serve.engine=sglang"])
    msg = str(e.value)
    assert (
        "stage preflight failed" in msg
        and f"TARGET_NO_AUX_CAPTURE: target architectures[0] {UNCAPTURED}" in msg
    )
    assert "fix: serve.engine reference" in msg
    cfg = load_config(TINY, base + ["serve.engine=sglang"])
    assert not (
        cfg.run_dir() / "deploy"
    ).exists()  # the deploy stage never ran: no engine log, no command
    assert child_processes_except_prefect() == []
    client, exp = client_for(cfg)
    failed = client.search_runs([exp], "tags.`eagle3.stage` = 'preflight'")
    assert [r.info.status for r in failed] == ["FAILED"]
    assert failed[0].data.tags["eagle3.preflight.aux_capture"] == "failed"
    assert failed[0].data.metrics["aux_capture.captures"] == 0.0
    assert not client.search_runs([exp], "tags.`eagle3.stage` = 'deploy-bench'")

    # 2. the same config with the reference engine runs (extraction, training, conversion from the
    #    cache)
    text = run_flow_cli("pipeline", str(TINY), base + ["serve.engine=reference"])
    assert "preflight" in text and "acceptance length, trained draft" in text
    ok = [
        r
        for r in client.search_runs([exp], "tags.`eagle3.stage` = 'preflight'")
        if r.info.status == "FINISHED"
    ]
    assert len(ok) == 1 and ok[0].data.tags["eagle3.engine"] == "reference"
    assert (
        ok[0].data.tags["eagle3.preflight.aux_capture"] == "passed"
        and ok[0].data.metrics["memory.need_gib"] > 0
    )

    # 3. a gate that fails still leaves the decision in MLflow, and then the run fails with the
    #    gate's error
    with pytest.raises(AcceptanceTooLow):
        run_flow_cli(
            "pipeline",
            str(TINY),
            base + ["serve.engine=reference", "bench.min_acceptance_length=50"],
        )
    parents = client.search_runs([exp], "tags.`eagle3.acceptance_gate` = 'failed'")
    assert len(parents) == 1 and parents[0].info.status == "FAILED"
    s = summarize_run(parents[0].info.run_id, cfg.mlflow_uri())
    assert s["tags"]["eagle3.decision"] in (
        "more data",
        "longer training",
        "fix serving integration",
        "stop",
        "more evidence needed",
        "regenerate data",
    )
    assert s["tags"]["eagle3.decision.rule"] and "AcceptanceTooLow" in s["tags"]["eagle3.error"]
    arts = [a.path for a in MlflowClient(cfg.mlflow_uri()).list_artifacts(parents[0].info.run_id)]
    assert "decision.md" in arts and "decision.json" in arts
    assert child_processes_except_prefect() == []
