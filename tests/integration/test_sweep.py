"""The sweep flow on the tiny target: one data size × two schedules sharing one extraction; every
point logs served / offline / simulated acceptance and the served-vs-offline plot, its draft is
registered (alias ``best`` on the highest served figure), the table is read back from MLflow and
``decision_text`` prints the decision."""

from __future__ import annotations

import pytest

pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from tests.support.flow_runs import TINY  # noqa: E402

pytestmark = pytest.mark.slow


def test_tiny_sweep_one_size_two_schedules(tmp_path, tiny_target_dir, sharegpt_path):
    from mlflow import MlflowClient

    from eagle3.config import load_config
    from flows.common import local_prefect, stop_ephemeral_server
    from tasks.reports import decision_text
    from flows.sweep import sweep_flow
    from tasks.reports import sweep_table
    from tasks.registry import BEST_ALIAS, model_name

    overrides = [
        f"paths.runs_dir={tmp_path / 'runs'}",
        "train.draft_vocab_size=128",
        "bench.num_prompts=2",
        "bench.max_new_tokens=8",
    ]
    cfg = load_config(TINY, overrides)
    scheds = {
        "short": ["train.schedule=epochs", "train.epochs=1"],
        "long": ["train.schedule=constant", "train.epochs=2", "train.eval_every=4"],
    }
    try:
        with local_prefect(cfg):
            out = sweep_flow(
                config_path=str(TINY), overrides=overrides, data_sizes=[8], schedules=scheds
            )
    finally:
        stop_ephemeral_server()
    assert out["failed"] == {} and len(out["results"]) == 2
    uri = cfg.mlflow_uri()
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)

    rows = sweep_table(out["parent_run_id"], uri)
    assert [(r["data_size"], r["schedule"]) for r in rows] == [(8, "long"), (8, "short")]
    long_, short = rows
    assert long_["optimizer_steps"] == 2 * short["optimizer_steps"] > 0
    assert long_["epochs_over_data"] == pytest.approx(2.0) and short[
        "epochs_over_data"
    ] == pytest.approx(1.0)
    assert (
        long_["unique_tokens"] == short["unique_tokens"] > 0
    )  # same data size, same (shared) extraction
    for r in rows:
        for k in ("served", "offline", "simulated"):
            assert 1.0 <= r[k] <= cfg.serve.speculative_num_steps + 1, (k, r)
        # the CPU reference engine decodes exactly like the in-process decoder: no serving gap
        assert r["served"] == pytest.approx(r["offline"], abs=1e-6)
        arts = {f.path for f in client.list_artifacts(r["run_id"], "plots")}
        assert "plots/served_vs_offline.png" in arts
    # extraction shared: one extraction folder for the size, the second point found it cached
    assert (cfg.run_dir() / "extract-as-is-n8" / "manifest.json").is_file()
    assert not (tmp_path / "runs" / "tiny-random-as-is-n8-long" / "extract").exists()
    extract_runs = client.search_runs(
        [client.get_run(rows[0]["run_id"]).info.experiment_id],
        filter_string="tags.`eagle3.stage` = 'extract'",
    )
    assert sorted(r.data.tags["eagle3.cached"] for r in extract_runs) == ["false", "true"]

    # both drafts registered; the alias sits on the higher served figure
    name = model_name(tiny_target_dir.name)
    versions = client.search_model_versions(f"name='{name}'")
    assert len(versions) == 2
    best = max(rows, key=lambda r: (r["served"], int(r["registered_model"].split("/")[1])))
    alias = client.get_model_version_by_alias(name, BEST_ALIAS)
    assert f"{name}/{alias.version}" == best["registered_model"]

    text = decision_text(out["parent_run_id"], uri)
    assert f"# Decision: **{out['decision']}**" in text
    assert "| as-is | 8 | long |" in text and "| as-is | 8 | short |" in text
    plot = cfg.run_dir() / "sweep" / out["parent_run_id"] / "data_scaling.png"
    assert plot.stat().st_size > 1000 and out["plot"] == str(plot)
