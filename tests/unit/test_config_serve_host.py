"""A ``serve.host`` this machine cannot bind (an address it does not have, a name that does not
resolve) fails the pre-flight's ``port`` check with SERVE_HOST, port set or not, and is a
ConfigError (not a TransientError that a retry or re-run could clear) when the launcher picks a
free port on it."""

from __future__ import annotations

import pytest

from eagle3.config import load_config
from eagle3.errors import ConfigError, TransientError
from eagle3.procs import free_port
from eagle3.serve.preflight import _check_port

UNBINDABLE = ["192.0.2.1", "not_a_host.invalid"]  # TEST-NET-1 (never local); a reserved TLD


@pytest.mark.parametrize("host", UNBINDABLE)
@pytest.mark.parametrize("port", [None, 18999])
def test_the_preflight_port_check_binds_serve_host(host, port):
    ov = [f"serve.host={host}"] + ([f"serve.port={port}"] if port else [])
    check, problems = _check_port(load_config(None, ov))
    assert check.status == "failed" and [p.code for p in problems] == ["SERVE_HOST"]
    msg = problems[0].message
    assert msg.startswith(
        f"serve.host: expected an address of this machine (or a name that "
        f"resolves to one) to bind, got {host!r}: binding it gives "
    )
    assert msg.endswith("; fix: serve.host 127.0.0.1, or an address this machine has")
    assert check.detail == msg


def test_a_loopback_host_without_a_port_passes():
    check, problems = _check_port(load_config(None, ["serve.host=127.0.0.1"]))
    assert problems == [] and check.status == "passed"
    assert check.detail == "127.0.0.1 binds; a free port there is chosen at launch"


@pytest.mark.parametrize("host", UNBINDABLE)
def test_free_port_on_an_unbindable_host_is_a_config_error(host):
    with pytest.raises(
        ConfigError,
        match=rf"^SERVE_HOST: serve.host: expected an address of this "
        rf"machine .* got {host!r}: ",
    ) as e:
        free_port(host)
    assert not isinstance(e.value, TransientError)
    assert isinstance(free_port("127.0.0.1"), int)


@pytest.mark.parametrize("host", UNBINDABLE)
def test_eagle3_run_refuses_it_before_prefect_and_the_preflight_names_it_once(
    host, tmp_path, monkeypatch
):
    import json

    from cli.run import check_target
    from eagle3.config_checks import before_run_problems
    from eagle3.serve import preflight

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"num_hidden_layers": 8, "vocab_size": 1000}))
    cfg = load_config(
        None,
        [
            "target.kind=hf",
            f"target.path={target}",
            "train.draft_vocab_size=500",
            f"serve.host={host}",
        ],
    )
    got = before_run_problems(cfg, target)
    assert len(got) == 1 and got[0].startswith("SERVE_HOST: serve.host: ") and repr(host) in got[0]
    with pytest.raises(ConfigError, match=r"^SERVE_HOST: serve.host: "):
        check_target(cfg)
    monkeypatch.setattr(
        preflight,
        "run_preflight",
        lambda *a, **k: preflight.PreflightReport("reference", [], list(_check_port(cfg)[1])),
    )
    report = preflight.preflight_of_run(cfg, None, None)
    assert [p.code for p in report.problems] == ["SERVE_HOST"]  # the port check's, not inputs'
    assert report.checks[0].name == "inputs" and report.checks[0].status == "passed"
