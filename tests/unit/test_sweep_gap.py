"""The sweep's table and report, read back from an MLflow store: each point's development
acceptance (measured in training, the exported checkpoint's) and its curve along the training, and
the table of where simulated and measured acceptance part (text and scoring, position sampling,
prompts, turn position); the offline evaluation logs each turn of a set of several turns."""

from __future__ import annotations

import pytest

from eagle3.config import load_config
from tests.conftest import CONFIGS


def _store(tmp_path):
    """A sweep run with two finished points: one trained with measured selection (a development
    curve that peaks and falls, MT-Bench by turn, GSM8K), one without any of those."""
    from tasks import tracking
    from tasks.reports import SWEEP_TAG

    cfg = load_config(CONFIGS / "tiny-random.yaml", [f"paths.runs_dir={tmp_path / 'runs'}"])
    client, exp = tracking.client_for(cfg)
    sweep = client.create_run(exp, tags={"prefect.flow_name": "eagle3-sweep",
                                         "eagle3.decision": "stop"}).info.run_id
    points = {}
    for name, size in (("measured", 3000), ("plain", 1000)):
        run = client.create_run(exp, tags={SWEEP_TAG: sweep, "eagle3.sweep.point": name,
                                           "eagle3.sweep.data_size": str(size),
                                           "eagle3.sweep.schedule": "constant",
                                           "eagle3.sweep.eval_primary": "mtbench"}).info.run_id
        client.log_metric(run, "acceptance_length_simulated", 2.9)
        client.log_metric(run, "offline.mtbench.acceptance_length", 2.1)
        client.set_terminated(run)
        points[name] = run
    run = points["measured"]
    for k, v in {"acceptance_length_dev": 2.4, "offline.mtbench.turn1.acceptance_length": 2.25,
                 "offline.mtbench.turn2.acceptance_length": 1.95,
                 "offline.gsm8k.acceptance_length": 2.6}.items():
        client.log_metric(run, k, v)
    train = client.create_run(exp, tags={tracking.PARENT_TAG: run, "eagle3.stage": "train",
                                         "eagle3.variant": "trained",
                                         "eagle3.cached": "false"}).info.run_id
    for step, v in ((500, 1.9), (1000, 2.4), (1500, 2.3)):
        client.log_metric(train, "dev/acceptance_length", v, step=step)
        client.log_metric(train, "dev/num_prompts", 64, step=step)
    client.log_metric(train, "dev_acceptance_length_all_positions", 2.7)
    client.log_metric(train, "simulated_acceptance_length_first64", 2.75)
    for step in (500, 1000):
        client.log_metric(train, "dev/out_of_draft_vocab_share", 0.089, step=step)
    client.set_terminated(train)
    plain = client.create_run(exp, tags={tracking.PARENT_TAG: points["plain"],
                                         "eagle3.stage": "train", "eagle3.variant": "trained",
                                         "eagle3.cached": "false"}).info.run_id
    client.log_metric(plain, "val/on_train_split", 1.0, step=10)  # no validation split
    client.set_terminated(plain)
    return cfg, sweep


def test_the_table_and_the_gap_report_read_the_measured_figures_back(tmp_path):
    from tasks.reports import format_table, gap_table, simulated_pivot, sweep_table

    cfg, sweep = _store(tmp_path)
    rows = {r["point"]: r for r in sweep_table(sweep, cfg.mlflow_uri())}
    m, p = rows["measured"], rows["plain"]
    assert m["dev"] == 2.4
    assert m["dev_curve"] == "1.900@500 → 2.400@1000 → 2.300@1500 (64 prompts)"
    assert p["dev"] is None and p["dev_curve"] is None
    assert m["eval"]["mtbench"]["turn1.acceptance_length"] == 2.25
    assert m["eval_primary"] == "mtbench" and m["offline_eval"] == 2.1
    assert "2.400@1000" in format_table(list(rows.values()))
    assert m["simulated_on_train_split"] is False and p["simulated_on_train_split"] is True
    assert "| 2.900 (train split) |" in format_table([p])
    assert m["dev_all_positions"] == 2.7 and p["dev_all_positions"] is None
    table = gap_table([m, p]).splitlines()
    assert "teacher-forced" in table[0] and "position sampling" in table[0]
    # simulated − development = answer position + text and scoring + position sampling;
    # development − turn 1; turn 1 − turn 2
    assert m["simulated_first"] == 2.75 and p["simulated_first"] is None
    assert table[-2] == ("| measured | 2.900 | 2.750 | 2.700 | 2.400 | 2.250 | 1.950 | 2.600 | "
                         "+0.500 | +0.150 | +0.050 | +0.300 | +0.150 | +0.300 | 8.9% |")
    assert table[-1] == ("| plain | 2.900 (train split) | n/a | n/a | n/a | n/a | n/a | n/a | "
                         "n/a | n/a | n/a | n/a | n/a | n/a | n/a |")
    assert "2.900 train split (" in simulated_pivot([p])


def test_the_gap_tables_parts_add_up_as_shown():
    from tasks.reports import gap_table

    row = {"point": "p", "simulated": 1.2346, "dev_all_positions": 1.1233, "dev": 1.0119}
    cells = gap_table([row]).splitlines()[-1].split(" | ")
    assert cells[1:5] == ["1.235", "n/a", "1.123", "1.012"]
    # without the first-tokens figure: answer position n/a, text and scoring from simulated
    assert cells[8:12] == ["+0.223", "n/a", "+0.112", "+0.111"]  # 0.112 + 0.111 = 0.223
    row["simulated_first"] = 1.1801
    cells = gap_table([row]).splitlines()[-1].split(" | ")
    assert cells[8:12] == ["+0.223", "+0.055", "+0.057", "+0.111"]  # the three add up


def test_dev_curve_names_the_earliest_best_and_nothing_for_no_curve():
    from tasks.reports import dev_curve

    assert dev_curve([]) is None
    assert dev_curve([(1, 2.0), (2, 2.0), (3, 1.5)]) == "2.000@1 → 2.000@1 → 1.500@3"
    assert dev_curve([(1, 2.0)], prompts=1) == "2.000@1 → 2.000@1 → 2.000@1 (1 prompt)"


def test_the_offline_evaluation_logs_each_turn_of_a_set_of_several(monkeypatch, tmp_path):
    """:func:`tasks.evaluate.evaluate_task` with the measurement replaced: the per-turn groups of
    ``evaluate_drafts`` become ``offline.<set>.turn<k>.*`` metrics on the point's run."""
    import eagle3.measure.offline as offline
    from tasks import evaluate, tracking

    serving = tmp_path / "serving"
    serving.mkdir()
    group = lambda al: {"acceptance_length": al, "num_requests": 2,  # noqa: E731
                        "ci": {"low": al - 0.1, "high": al + 0.1}}
    monkeypatch.setattr(evaluate, "points_to_evaluate",
                        lambda cfg, sweep, sets: ({"p": ("RUN", serving)}, {}))
    monkeypatch.setattr(offline, "evaluate_drafts", lambda *a, **k: {"p": {
        "per_set": {"mtbench": group(2.0), "gsm8k": group(2.5)},
        "per_turn": {"mtbench": {"turn1": group(2.2), "turn2": group(1.8)}}}})
    logged = {}
    monkeypatch.setattr(tracking, "log_parent_metrics",
                        lambda cfg, run, metrics: logged.update(metrics))
    monkeypatch.setattr(tracking, "set_parent_tags", lambda *a: None)
    monkeypatch.setattr(tracking, "log_parent_artifact", lambda *a: None)
    monkeypatch.setattr("eagle3.assets.resolve_target", lambda cfg: tmp_path)
    cfg = load_config(CONFIGS / "tiny-random.yaml", [f"paths.runs_dir={tmp_path / 'runs'}"])
    out = evaluate.evaluate_task.fn(cfg, "SWEEP", ["mtbench", "gsm8k"], 8)
    assert out["evaluated"]["p"]["mtbench"]["acceptance_length"] == 2.0
    assert logged["offline.mtbench.turn1.acceptance_length"] == pytest.approx(2.2)
    assert logged["offline.mtbench.turn2.ci_low"] == pytest.approx(1.7)
    assert not any(k.startswith("offline.gsm8k.turn") for k in logged)


def test_the_report_refuses_a_point_run_and_a_database_that_is_not_a_store(tmp_path):
    import sqlite3

    from eagle3.errors import DataError
    from tasks.reports import SWEEP_TAG, decision_text, sweep_report

    from mlflow import MlflowClient

    cfg, sweep = _store(tmp_path)
    uri = cfg.mlflow_uri()
    png = tmp_path / "data_scaling.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 100)
    MlflowClient(uri).log_artifact(sweep, str(png))
    (tmp_path / "plots").mkdir()
    text = sweep_report(sweep, uri, plot_copy=tmp_path / "plots")  # a folder: copied into it
    assert "## Where simulated and measured acceptance part" in text
    assert (tmp_path / "plots" / "data_scaling.png").read_bytes() == png.read_bytes()

    point = next(r.info.run_id for r in MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_run(sweep).info.experiment_id],
        filter_string=f"tags.`{SWEEP_TAG}` = '{sweep}'"))
    with pytest.raises(DataError, match=f"expected a sweep's run .*its sweep or parent run: "
                                        f"{sweep}"):
        sweep_report(point, uri)
    with pytest.raises(DataError, match="not found"):
        sweep_report("0" * 32, uri)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE notes (x)")
    before = other.read_bytes()
    for read in (lambda: decision_text("0" * 32, f"sqlite:///{other}"),
                 lambda: sweep_report("0" * 32, f"sqlite:///{other}")):
        with pytest.raises(DataError, match=r"expected MLflow's tables .*found \['notes'\]"):
            read()
    assert other.read_bytes() == before  # nothing written into another program's database
    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(DataError, match="got an empty file"):
        decision_text("0" * 32, f"sqlite:///{tmp_path / 'empty.db'}")


def test_a_stop_with_failed_points_names_them_and_has_low_confidence(tmp_path):
    from flows.sweep_decision import decide_and_plot
    from tasks import tracking

    cfg = load_config(CONFIGS / "tiny-random.yaml", [f"paths.runs_dir={tmp_path / 'runs'}"])
    client, exp = tracking.client_for(cfg)
    parent = client.create_run(exp).info.run_id
    rows = [{"point": f"as-is-n{n}-{s}", "data": "as-is", "data_size": n, "schedule": s,
             "unique_tokens": 100 * n, "epochs_over_data": 1.0,
             "optimizer_steps": n * (2 if s == "long" else 1),
             "served": 1.5, "offline": 1.5, "offline_eval": None, "simulated": 1.6}
            for n in (4, 8) for s in ("short", "long")]
    whole = decide_and_plot(cfg, parent, rows, None, [])
    assert (whole.recommendation, whole.confidence) == ("stop", "high")
    cut = decide_and_plot(cfg, parent, rows[:2], None, [],
                          failed={"as-is-n8-short": "DATA_SHORT: 8 asked, gave 5"})
    assert (cut.recommendation, cut.confidence) == ("stop", "low")
    assert any("1 point(s) failed: as-is-n8-short: DATA_SHORT" in r for r in cut.reasons)


def test_a_decision_without_its_markdown_artifact_is_read_from_its_tags_and_says_so(tmp_path):
    from eagle3.decide import Decision
    from tasks.reports import decision_text

    from mlflow import MlflowClient

    cfg, sweep = _store(tmp_path)
    uri = cfg.mlflow_uri()
    d = Decision("longer training", "steps_gain_dominates", ["steps"],
                 {"steps_gain_per_doubling": 0.19987, "best_data_size": 2000}, "medium")
    for k, v in d.tags().items():
        MlflowClient(uri).set_tag(sweep, f"eagle3.{k}", v)
    text = decision_text(sweep, uri)  # no decision.md logged: as a store copied without artifacts
    assert text.startswith("# Decision: **longer training**\n\nRule: `steps_gain_dominates` "
                           "(confidence: medium)")
    assert "The decision's text could not be read (decision.md of " in text
    assert ": MlflowException: " in text
    assert "- best_data_size: 2000\n- steps_gain_per_doubling: 0.1999" in text
    # an empty or undecodable decision.md: the same reading from the tags, saying why
    for body, why in ((b"", "an empty file"), (b"# Decision: caf\xe9", "UnicodeDecodeError")):
        md = tmp_path / "decision.md"
        md.write_bytes(body)
        MlflowClient(uri).log_artifact(sweep, str(md))
        text = decision_text(sweep, uri)
        assert text.startswith("# Decision: **longer training**") and why in text
        assert "- steps_gain_per_doubling: 0.1999" in text
