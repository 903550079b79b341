"""CLI commands refuse arguments that cannot work (exit 2 or 1, the option and the value named),
before any waiting or any store is created."""

import pytest
from typer.testing import CliRunner

from cli.main import app


@pytest.mark.parametrize(
    "args, message",
    [
        (["--url", "localhost:8000"], "url: expected http(s)://host[:port], got 'localhost:8000'"),
        (
            ["--url", "ftp://127.0.0.1:9"],
            "url: expected http(s)://host[:port], got 'ftp://127.0.0.1:9'",
        ),
        (
            ["--url", "http://127.0.0.1:9", "--timeout", "-1"],
            "timeout_s: expected a positive, finite number of seconds, got -1.0",
        ),
        (
            ["--url", "http://127.0.0.1:9", "--poll-interval", "0"],
            "poll_interval_s: expected a positive, finite number",
        ),
        (
            ["--url", "http://127.0.0.1:9", "--timeout", "inf"],
            "timeout_s: expected a positive, finite number of seconds, got inf",
        ),
        (["--url", "http://127.0.0.1:99999"], "url: expected a port in 1..65535, got 99999"),
        (
            ["--url", "http://no-such-host.invalid:80"],
            "url: host 'no-such-host.invalid' does not resolve",
        ),
        (
            ["--url", "http://127.0.0.1:9", "--pid", "999999999"],
            "--pid: expected a running process, got 999999999",
        ),
        (
            ["--url", "http://127.0.0.1:9", "--log", "/no/such/server.log"],
            "--log: expected the server's log file",
        ),
    ],
)
def test_bad_arguments_exit_2_with_the_value_named(args, message):
    res = CliRunner().invoke(app, ["wait-ready", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_decide_with_a_missing_store_names_it_and_creates_nothing(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    res = CliRunner().invoke(app, ["decide", "0123abcd"])
    assert res.exit_code == 1
    assert f"MLflow store sqlite:///{tmp_path}/runs/mlflow.db: no such database file" in res.output
    res = CliRunner().invoke(
        app, ["decide", "0123abcd", "--tracking-uri", f"sqlite:///{tmp_path}/other.db"]
    )
    assert f"MLflow store sqlite:///{tmp_path}/other.db: no such database file" in res.output
    assert list(tmp_path.iterdir()) == []  # no empty store left behind


def test_decide_on_a_file_that_is_no_database_says_so_without_a_traceback(tmp_path):
    pytest.importorskip("mlflow")
    bad = tmp_path / "plan.json"
    bad.write_text('{"points": []}')
    res = CliRunner().invoke(app, ["decide", "0123abcd", "--tracking-uri", f"sqlite:///{bad}"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert (
        f"MLflow store sqlite:///{bad}: expected an SQLite database" in res.output
        and 'b\'{"points"' in res.output
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["extract.aux_layer_ids=[2,4,8]"],
            "extract.aux_layer_ids: ids [8] out of range for a target with 8 layers "
            "(expected HF hidden_states indices in [1, 7]",
        ),
        (["extract.aux_layer_ids=[4,2,5]"], "extract.aux_layer_ids: expected strictly increasing"),
        (
            ["data.source=file", "data.path=/no/such/convs.jsonl"],
            "data.path: expected a conversations file",
        ),
        (["data.source=file", "data.path=EMPTY"], "(empty: 0 bytes)"),
        (["data.source=file", "data.path=BLANK"], "empty file (expected conversations"),
        (["data.source=file", "data.path=GARBLED"],
         "no usable conversation among 2 records (skipped: {'malformed_json_line': 2}"),
    ],
)
def test_run_refuses_settings_that_cannot_work_before_loading_anything(
    overrides, message, tmp_path
):
    from tests.conftest import CONFIGS

    args = ["run", str(CONFIGS / "tiny-random.yaml"), "-o", f"paths.runs_dir={tmp_path}"]
    for o in overrides:
        for name, text in (("EMPTY", ""), ("BLANK", "\n \n\n"), ("GARBLED", "{no\n\n[1,\n")):
            if o.endswith(f"={name}"):  # a file read whole before anything starts
                (tmp_path / f"{name}.jsonl").write_text(text)
                o = o.replace(name, str(tmp_path / f"{name}.jsonl"))
        args += ["-o", o]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert (
        not (tmp_path / "tiny-random").exists() and not (tmp_path / ".prefect").exists()
    )  # nothing started


@pytest.mark.parametrize("value", ["0", "abc", "inf"])
def test_run_refuses_a_bad_stop_grace_before_starting_anything(value, tmp_path, monkeypatch):
    """Found by a new user: a bad ``EAGLE3_STOP_GRACE_S`` was reported as "pipeline failed" with
    exit 1."""
    from tests.conftest import CONFIGS

    monkeypatch.setenv("EAGLE3_STOP_GRACE_S", value)
    res = CliRunner().invoke(
        app, ["run", str(CONFIGS / "tiny-random.yaml"), "-o", f"paths.runs_dir={tmp_path}"]
    )
    assert res.exit_code == 2, res.output
    assert f"EAGLE3_STOP_GRACE_S='{value}': expected seconds between 1 and 3600" in res.output
    assert "pipeline failed" not in res.output
    assert (
        not (tmp_path / "tiny-random").exists() and not (tmp_path / ".prefect").exists()
    )  # nothing started


@pytest.mark.parametrize(
    "uri, message",
    [
        (
            "/somewhere/runs/mlflow.db",
            "expected a URI such as sqlite:////somewhere/runs/mlflow.db or http://host:port, "
            "got a plain path",
        ),
        (
            "http://127.0.0.1:1",
            "MLflow server http://127.0.0.1:1: not reachable",
        ),  # refused at once, no minutes of retries
    ],
)
def test_decide_names_a_store_that_cannot_answer(uri, message):
    pytest.importorskip("mlflow")
    res = CliRunner().invoke(app, ["decide", "0123abcd", "--tracking-uri", uri])
    assert res.exit_code == 1 and message in res.output


@pytest.mark.parametrize("uri", ["", "  "])
def test_decide_refuses_an_empty_store_instead_of_reading_the_default(uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["decide", "0123abcd", "--tracking-uri", uri])
    assert res.exit_code == 2 and "--tracking-uri: expected an MLflow store URI" in res.output
    assert not (tmp_path / "runs").exists()
    res = CliRunner().invoke(app, ["decide", "", "--tracking-uri", f"sqlite:///{tmp_path}/x.db"])
    assert res.exit_code == 2 and "RUN_ID: expected an MLflow run id" in res.output
    assert not (tmp_path / "x.db").exists()


def test_wait_ready_diagnostics_that_cannot_be_a_folder_is_a_bad_argument(tmp_path):
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    res = CliRunner().invoke(
        app,
        [
            "wait-ready",
            "--url",
            "http://127.0.0.1:9",
            "--timeout",
            "30",
            "--diagnostics",
            str(a_file),
        ],
    )
    assert res.exit_code == 2, res.output
    assert "--diagnostics" in res.output and "taken" in res.output
    assert "Traceback" not in res.output


def test_the_mlflow_ui_command_quotes_a_store_with_a_space():
    import shlex

    from tasks.mlflow_ui import ui_command

    cmd = ui_command("sqlite:////tmp/runs sp/mlflow.db")
    assert shlex.split(cmd)[3] == "sqlite:////tmp/runs sp/mlflow.db"
    assert ui_command("sqlite:////tmp/runs/mlflow.db").split()[3] == "sqlite:////tmp/runs/mlflow.db"
