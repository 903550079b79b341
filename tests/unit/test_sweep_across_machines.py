"""A sweep spread over machines: the points trained on an earlier machine have no folders here,
only their MLflow records. Their training curves are read from MLflow, and a point that cannot be
evaluated offline here is named, not left out in silence."""

import json

from eagle3.config import load_config
from tests.conftest import CONFIGS

CURVE = [(10, 1.5), (20, 1.75), (30, 1.7)]


def _store(tmp_path):
    from tasks import tracking

    cfg = load_config(CONFIGS / "tiny-random.yaml", [f"paths.runs_dir={tmp_path / 'runs'}"])
    client, exp = tracking.client_for(cfg)
    return cfg, client, exp


def _child(client, exp, parent, stage, cached, metrics=(), produced_by=None):
    from tasks.tracking import PARENT_TAG

    tags = {
        PARENT_TAG: parent,
        "eagle3.stage": stage,
        "eagle3.variant": "trained",
        "eagle3.cached": "true" if cached else "false",
    }
    if produced_by:
        tags["eagle3.produced_by_run_id"] = produced_by
    run = client.create_run(exp, tags=tags)
    for step, value in metrics:
        client.log_metric(run.info.run_id, "dev/acceptance_length", value, step=step)
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def test_stage_metric_history_reads_the_train_run_that_computed(tmp_path):
    from tasks.tracking import stage_metric_history, tracking_uri

    cfg, client, exp = _store(tmp_path)
    parent = client.create_run(exp).info.run_id
    _child(client, exp, parent, "train", cached=False, metrics=CURVE)
    _child(client, exp, parent, "train", cached=True)  # a later run served from the cache
    _child(client, exp, parent, "convert", cached=False, metrics=[(1, 9.0)])
    uri = tracking_uri(cfg)
    assert stage_metric_history(parent, "train", "dev/acceptance_length", uri) == CURVE
    assert stage_metric_history(parent, "train", "val/loss", uri) == []
    other = client.create_run(exp).info.run_id
    assert stage_metric_history(other, "train", "dev/acceptance_length", uri) == []


def test_a_point_whose_training_came_from_the_cache_has_the_curve_of_the_run_that_trained(
    tmp_path,
):
    """A sweep that reuses a point's cached train stage (a rerun on the same machine) reads the
    curve its producing stage run logged, not an empty one."""
    from tasks.tracking import stage_metric_history, tracking_uri

    cfg, client, exp = _store(tmp_path)
    first = client.create_run(exp).info.run_id
    trained = _child(client, exp, first, "train", cached=False, metrics=CURVE)
    again = client.create_run(exp).info.run_id
    _child(client, exp, again, "train", cached=True, produced_by=trained)
    uri = tracking_uri(cfg)
    assert stage_metric_history(again, "train", "dev/acceptance_length", uri) == CURVE
    lost = client.create_run(exp).info.run_id  # its producer is in another store
    _child(client, exp, lost, "train", cached=True, produced_by="0" * 32)
    _child(client, exp, lost, "train", cached=True)  # no producer recorded
    assert stage_metric_history(lost, "train", "dev/acceptance_length", uri) == []


def test_training_curves_fall_back_to_the_history_when_the_folder_is_gone(tmp_path):
    from flows.sweep_decision import training_curves

    here = tmp_path / "here" / "train"
    here.mkdir(parents=True)
    here.joinpath("metrics.jsonl").write_text(
        "".join(
            json.dumps({"kind": "eval", "step": s, "val/simulated_acceptance_length": v}) + "\n"
            for s, v in CURVE
        )
    )
    rows = [
        {"point": "here", "run_dir": str(tmp_path / "here"), "run_id": "a"},
        {"point": "elsewhere", "run_dir": str(tmp_path / "gone"), "run_id": "b"},
        {"point": "nowhere", "run_dir": str(tmp_path / "gone"), "run_id": "c"},
    ]
    asked = []

    def history(row, key):
        asked.append((row["point"], key))
        return CURVE if row["run_id"] == "b" and key == "dev/acceptance_length" else []

    curves = training_curves(rows, history)
    assert [(c["label"], c["kind"], c["steps"], c["acceptance"]) for c in curves] == [
        ("here", "simulated", [10, 20, 30], [1.5, 1.75, 1.7]),
        ("elsewhere", "measured", [10, 20, 30], [1.5, 1.75, 1.7]),
    ]
    assert ("here", "dev/acceptance_length") not in asked  # the file on disk comes first
    assert ("nowhere", "val/simulated_acceptance_length") in asked
    assert training_curves(rows) == curves[:1]  # without a history, only what is on disk


def test_a_point_whose_draft_is_elsewhere_is_named_not_skipped(tmp_path):
    from tasks.evaluate import points_to_evaluate
    from tasks.reports import SWEEP_TAG

    cfg, client, exp = _store(tmp_path)
    serving = tmp_path / "here" / "serving"
    serving.mkdir(parents=True)
    serving.joinpath("manifest.json").write_text("{}")
    runs = {}
    for key, run_dir in (("here", tmp_path / "here"), ("gone", tmp_path / "gone")):
        run = client.create_run(
            exp, tags={SWEEP_TAG: "S", "eagle3.sweep.point": key, "eagle3.run_dir": str(run_dir)}
        )
        client.set_terminated(run.info.run_id)
        runs[key] = run.info.run_id
    todo, missing = points_to_evaluate(cfg, "S", ["mtbench2"])
    assert todo == {"here": (runs["here"], serving)}
    assert missing == {
        "gone": f"mtbench2 not measured: its serving checkpoint {tmp_path / 'gone' / 'serving'}"
        "/manifest.json is not on this machine"
    }
    client.log_metric(runs["gone"], "offline.mtbench2.acceptance_length", 2.0)
    assert points_to_evaluate(cfg, "S", ["mtbench2"]) == (todo, {})  # evaluated earlier: done
    # a set added later names only what the point lacks
    assert points_to_evaluate(cfg, "S", ["mtbench2", "gsm8k200"])[1]["gone"].startswith(
        "gsm8k200 not measured: ")


def test_the_decision_names_the_points_left_out(tmp_path):
    from flows.sweep_decision import decide_and_plot

    why = "its serving checkpoint /x/serving/manifest.json is not on this machine"
    cfg, client, exp = _store(tmp_path)
    parent = client.create_run(exp).info.run_id
    rows = [
        {
            "point": p,
            "run_dir": str(tmp_path / p),
            "run_id": None,
            "data": "as-is",
            "data_size": n,
            "schedule": "c",
            "served": 1.5 + n / 1000,
            "offline": None,
            "offline_eval": None,
            "simulated": None,
            "unique_tokens": n * 100,
            "epochs_over_data": 1.0,
            "optimizer_steps": 10,
        }
        for p, n in (("a", 100), ("b", 200))
    ]
    decision = decide_and_plot(cfg, parent, rows, None, [], {"b": why})
    text = "\n".join(decision.reasons)
    assert f"b is not evaluated offline: {why} (it is judged by its served figure)" in text
    rows[1]["offline_eval"] = 1.9  # measured earlier on another set's machine
    text = "\n".join(decide_and_plot(cfg, parent, rows, None, [], {"b": why}).reasons)
    assert f"b is not evaluated offline: {why} (it is judged by its earlier offline figure)" in text
    decide_and_plot(cfg, parent, rows, None, [], None, {"c": "DATA_SHORT: 9 asked"})
    assert client.get_run(parent).data.tags["eagle3.sweep.failed"] == "1"
    assert "no training curve for a, b" in text
