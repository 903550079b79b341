"""What a new user hits when running the pipeline from a fresh clone: a given port with the
untrained baseline, a target folder that is not there, a gate against a port nothing listens on,
MLflow runs left RUNNING by a ``kill -9``. Each test builds its own tiny inputs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import CONFIGS


def _cfg(tmp_path: Path, *overrides: str):
    from eagle3.config import load_config

    return load_config(
        CONFIGS / "tiny-random.yaml", [f"paths.runs_dir={tmp_path / 'runs'}", *overrides]
    )


def test_a_given_port_goes_to_the_trained_engine_and_the_baseline_gets_its_own(tmp_path):
    from flows.stages import variants

    cfg = _cfg(tmp_path, "serve.port=18123", "bench.baseline_untrained=true")
    ports = {v: c.serve.port for v, c in variants(cfg)}
    assert ports["trained"] == 18123
    # None: the launcher picks a free port (and retries another one taken meanwhile)
    assert ports["untrained"] is None
    assert cfg.serve.port == 18123  # the user's config is not changed


def test_run_refuses_a_target_folder_that_is_not_there_before_prefect(tmp_path, monkeypatch):
    import cli.run
    from cli.main import app

    def reached(*_a, **_k):
        raise AssertionError("Prefect was started for a config whose target.path is missing")

    monkeypatch.setattr(cli.run, "run_flow_cli", reached)
    missing = tmp_path / "no-such-model"
    result = CliRunner().invoke(
        app,
        [
            "run",
            str(CONFIGS / "tiny-random.yaml"),
            "-o",
            f"paths.runs_dir={tmp_path / 'runs'}",
            "-o",
            "target.kind=hf",
            "-o",
            f"target.path={missing}",
        ],
    )
    assert result.exit_code == 2, result.output
    assert f"target.path {missing}" in result.output
    assert "config.json" in result.output


def test_check_target_is_the_one_resolve_target_uses(tmp_path):
    from cli.run import check_target
    from eagle3.errors import ConfigError

    with pytest.raises(ConfigError, match=r"target.path .*: expected an HF model folder"):
        check_target(_cfg(tmp_path, "target.kind=hf", f"target.path={tmp_path / 'none'}"))
    good = tmp_path / "model"
    good.mkdir()
    (good / "config.json").write_text("{}")
    check_target(_cfg(tmp_path, "target.kind=hf", f"target.path={good}"))  # no error
    check_target(_cfg(tmp_path))  # tiny-random: prepared by the extraction, nothing to check


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the block ends: nothing listens there


def test_the_gate_names_a_refused_connection(tmp_path):
    from eagle3.serve.readiness import wait_ready

    url = f"http://127.0.0.1:{_closed_port()}"
    res = wait_ready(url, timeout_s=1.5, poll_interval_s=0.2, probe_timeout_s=1.0)
    assert res.verdict == "timed_out"
    assert res.last_health == "refused"
    assert "Connection refused at " + url in res.detail
    assert "Connection refused" in res.summary()


def test_wait_ready_cli_says_connection_refused(tmp_path):
    from cli.main import app

    url = f"http://127.0.0.1:{_closed_port()}"
    result = CliRunner().invoke(
        app, ["wait-ready", "--url", url, "--timeout", "1.5", "--poll-interval", "0.2"]
    )
    assert result.exit_code == 1, result.output
    assert "Connection refused at " + url in result.output


def test_a_run_left_running_by_a_killed_process_is_marked_killed(tmp_path):
    from tasks import tracking

    cfg = _cfg(tmp_path, "name=demo")
    client, exp_id = tracking.client_for(cfg)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale_tags = {
        **tracking.owner_tags(),
        tracking.OWNER_PID_TAG: str(dead.pid),
        tracking.CONFIG_TAG: "demo",
    }
    stale = client.create_run(exp_id, tags=stale_tags).info.run_id
    stale_stage = client.create_run(
        exp_id, tags={**stale_tags, tracking.PARENT_TAG: stale}
    ).info.run_id
    # controls: a run whose owner still runs (this process), one of another config, one of
    # another host, one without owner tags
    alive = client.create_run(
        exp_id, tags={**tracking.owner_tags(), tracking.CONFIG_TAG: "demo"}
    ).info.run_id
    other = client.create_run(exp_id, tags={**stale_tags, tracking.CONFIG_TAG: "other"}).info.run_id
    elsewhere = client.create_run(
        exp_id, tags={**stale_tags, tracking.OWNER_HOST_TAG: "another-host"}
    ).info.run_id
    untagged = client.create_run(exp_id, tags={tracking.CONFIG_TAG: "demo"}).info.run_id

    new = tracking.start_pipeline_run(cfg, flow_run_id="f" * 32, flow_name="eagle3-pipeline")

    for run_id in (stale, stale_stage):
        run = client.get_run(run_id)
        assert run.info.status == "KILLED"
        reason = run.data.tags[tracking.KILLED_TAG]
        assert f"process {dead.pid} on " in reason and "is gone" in reason
    for run_id in (alive, other, elsewhere, untagged):
        assert client.get_run(run_id).info.status == "RUNNING"
    new_tags = client.get_run(new).data.tags
    assert new_tags[tracking.OWNER_PID_TAG].isdigit() and new_tags[tracking.OWNER_HOST_TAG]


def test_a_reused_pid_is_not_the_owner():
    from tasks import tracking

    tags = tracking.owner_tags()
    assert not tracking.owner_gone(tags)
    tags[tracking.OWNER_STARTED_TAG] = f"{float(tags[tracking.OWNER_STARTED_TAG]) - 1000:.2f}"
    assert tracking.owner_gone(tags)  # same pid, another start time: another process


def test_outputs_of_other_settings_live_beside_each_other(tmp_path):
    from flows.common import stage_dirs
    from tasks.stage_config import latest_output, record_latest

    base = stage_dirs(_cfg(tmp_path))
    lr = stage_dirs(_cfg(tmp_path, "train.lr=5e-4"))
    served = stage_dirs(_cfg(tmp_path, "bench.num_prompts=3"))
    again = stage_dirs(_cfg(tmp_path))
    assert again == base  # the same settings find the same folders
    assert lr["extract"] == base["extract"]
    for k in ("train", "serving", "deploy", "bench"):
        assert lr[k] != base[k] and lr[k].parent == base[k].parent, k
        assert base[k].parent == _cfg(tmp_path).run_dir() / k
    # a bench setting leaves the draft's folders alone
    assert (served["train"], served["serving"]) == (base["train"], base["serving"])
    assert served["bench"] != base["bench"]
    # the judge-only gate minimum changes no folder (and no cache key)
    judged = stage_dirs(_cfg(tmp_path, "bench.min_acceptance_length=1.5"))
    assert judged["bench"] == base["bench"]
    untrained = stage_dirs(_cfg(tmp_path), "untrained")
    assert untrained["train"].parent.name == "train-untrained"

    run_dir = _cfg(tmp_path).run_dir()
    assert latest_output(run_dir, "serving") == run_dir / "serving"  # nothing recorded yet
    record_latest(lr["serving"])
    assert latest_output(run_dir, "serving") == lr["serving"]
    record_latest(base["serving"])
    assert latest_output(run_dir, "serving") == base["serving"]


def test_a_bad_latest_pointer_is_named(tmp_path):
    from eagle3.errors import DataError
    from tasks.stage_config import latest_output

    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "latest.json").write_text('{"dir": "../elsewhere"}')
    with pytest.raises(DataError, match=r"latest.json: key 'dir': expected the name of a folder"):
        latest_output(tmp_path, "train")
    (tmp_path / "train" / "latest.json").write_text("not json")
    with pytest.raises(DataError, match=r"latest.json: expected JSON"):
        latest_output(tmp_path, "train")


def test_a_config_path_that_is_a_directory_is_named_as_one(tmp_path):
    from eagle3.config import load_config
    from eagle3.errors import ConfigError

    (tmp_path / "a.yaml").write_text("name: a\n")
    with pytest.raises(
        ConfigError,
        match=r"expected a YAML file, got a directory "
        r"\(YAML files in it: a.yaml\)",
    ):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match=r"not found"):
        load_config(tmp_path / "none.yaml")


def test_bench_url_without_a_server_says_so():
    from cli.main import app

    url = f"http://127.0.0.1:{_closed_port()}"
    result = CliRunner().invoke(app, ["bench", "--url", url, "--num-prompts", "1"])
    assert result.exit_code == 1, result.output
    assert f"bench: no server at {url} (" in result.output


def test_preflight_of_a_gpu_config_on_a_cpu_machine_lists_its_checks(tmp_path):
    import torch

    from cli.main import app

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    result = CliRunner().invoke(
        app,
        [
            "preflight",
            str(CONFIGS / "tiny-random.yaml"),
            "-o",
            f"paths.runs_dir={tmp_path / 'runs'}",
            "-o",
            "train.device=cuda",
            "-o",
            "serve.device=cuda",
            "-o",
            "serve.engine=reference",
        ],
    )
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    for check in ("aux_capture", "memory", "settings", "port"):
        assert any(ln.startswith(check) for ln in lines), (check, result.output)
    assert any(ln.startswith("devices") and "failed" in ln for ln in lines)
    assert sum(ln.startswith("DEVICE_MISSING: train.device: ") for ln in lines) == 1
    # serve.device is the memory check's problem: shown once, in that check's row, with its code
    assert sum("DEVICE_MISSING: serve.device: " in ln for ln in lines) == 1
    assert any(ln.startswith("memory") and "DEVICE_MISSING: serve.device: " in ln for ln in lines)
    assert "pre-flight failed" in result.output
