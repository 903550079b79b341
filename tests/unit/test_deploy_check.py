"""The pre-flight of a deployment (eagle3.serve.preflight), one failure class per test with the code
and the key or class named: aux capture of the target class, memory for the launch's GPUs, settings
SGLang changes, simulated acceptance, template switches and server-side template overrides; the
reference engine checks what applies to it."""

from __future__ import annotations

import json
import shutil

import pytest

from eagle3.config import load_config
from eagle3.errors import ConfigError, EngineUnsupported
from eagle3.serve.preflight import run_preflight
from testkit.broken_corpus import good_data_manifest, good_pair

H100 = [
    {
        "index": i,
        "uuid": f"GPU-{i}",
        "mem_total_mib": 81559,
        "mem_used_mib": 500,
        "util_pct": 0,
        "pids": [],
    }
    for i in range(8)
]


@pytest.fixture(scope="module")
def serving(tmp_path_factory, tiny_target_dir):
    return good_pair(tmp_path_factory.getbasetemp() / "eagle3-good", tiny_target_dir)[1]


def _sglang(*overrides):
    return load_config(None, ["serve.engine=sglang", *overrides])


def _codes(report):
    return [p.code for p in report.problems]


def _status(report, name):
    return next(c for c in report.checks if c.name == name)


def test_target_class_without_capture_is_named_with_the_fix(tmp_path, tiny_target_dir, serving):
    target = shutil.copytree(tiny_target_dir, tmp_path / "t")
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "architectures": ["OlmoForCausalLM"]}))
    report = run_preflight(_sglang(), target, serving, engine="sglang", gpus=H100)
    problem = next(p for p in report.problems if p.code == "TARGET_NO_AUX_CAPTURE")
    assert "OlmoForCausalLM" in problem.message and "0.5.23" in problem.message
    assert "fix: serve.engine reference" in problem.message
    with pytest.raises(EngineUnsupported) as e:
        report.raise_if_failed()
    assert "TARGET_NO_AUX_CAPTURE" in str(e.value) and e.value.problems == report.problems
    ref = run_preflight(
        load_config(None, ["serve.engine=reference"]), target, serving, engine="reference"
    )
    assert (
        ref.passed and _status(ref, "aux_capture").status == "passed"
    )  # the reference engine captures any HF target


def test_mem_fraction_too_small_for_target_draft_and_both_kv_caches(tiny_target_dir, serving):
    report = run_preflight(
        _sglang("serve.mem_fraction_static=0.0000002"),
        tiny_target_dir,
        serving,
        engine="sglang",
        gpus=H100,
    )
    problem = next(p for p in report.problems if p.code == "MEM_FRACTION_TOO_SMALL")
    assert "serve.mem_fraction_static" in problem.message and "draft_kv" in problem.message
    assert "× mem_fraction_static 2e-07" in problem.message
    ok = run_preflight(
        _sglang("serve.mem_fraction_static=0.8"),
        tiny_target_dir,
        serving,
        engine="sglang",
        gpus=H100,
    )
    assert (
        "MEM_FRACTION_TOO_SMALL" not in _codes(ok) and _status(ok, "memory").figures["need_gib"] > 0
    )


def test_gpus_the_launch_will_use(tiny_target_dir, serving):
    busy = [{**H100[0], "mem_used_mib": 70000}]
    report = run_preflight(
        _sglang("serve.mem_fraction_static=0.8"),
        tiny_target_dir,
        serving,
        engine="sglang",
        gpus=busy,
    )
    assert "GPU_BUSY" in _codes(
        report
    )  # e.g. an engine left running by a dead launcher holds the memory
    few = run_preflight(
        _sglang("serve.tp=4"), tiny_target_dir, serving, engine="sglang", gpus=H100[:2]
    )
    assert any(p.code == "GPU_COUNT" and "serve.tp 4" in p.message for p in few.problems)
    visible = run_preflight(
        _sglang("serve.tp=2", "serve.env={CUDA_VISIBLE_DEVICES: '6,7'}"),
        tiny_target_dir,
        serving,
        engine="sglang",
        gpus=H100,
    )
    assert "GPUs [6, 7]" in _status(visible, "memory").detail


def test_the_seeds_settings_say_which_scheduler_they_get(tiny_target_dir, serving):
    cfg = _sglang(
        "serve.speculative_eagle_topk=4", "serve.speculative_num_draft_tokens=5"
    )  # steps 3 / top-k 4 / 5
    check = _status(
        run_preflight(cfg, tiny_target_dir, serving, engine="sglang", gpus=H100), "settings"
    )
    assert "overlap scheduler" in check.detail and "tree drafting" in check.detail
    assert "max_running_requests 48 (SGLang's speculative default (48))" in check.detail
    sync = _status(
        run_preflight(
            _sglang("serve.extra_args=[--disable-overlap-schedule]"),
            tiny_target_dir,
            serving,
            engine="sglang",
            gpus=H100,
        ),
        "settings",
    )
    assert (
        "synchronous scheduler (--disable-overlap-schedule)" in sync.detail
        and sync.figures["overlap_scheduler"] == 0
    )


def test_simulated_acceptance_in_the_environment(monkeypatch, tiny_target_dir, serving):
    monkeypatch.setenv("SGL_SIMULATE_ACC_LEN", "2.8")
    report = run_preflight(_sglang(), tiny_target_dir, serving, engine="sglang", gpus=H100)
    assert any(
        p.code == "SIMULATED_ACCEPTANCE" and "SGL_SIMULATE_ACC_LEN='2.8'" in p.message
        for p in report.problems
    )
    ref = run_preflight(
        load_config(None, ["serve.engine=reference"]), tiny_target_dir, serving, engine="reference"
    )
    assert _status(ref, "environment").status == "note" and ref.passed


def test_template_switches_of_extraction_vs_benchmark_vs_server(tiny_target_dir, serving):
    data = {**good_data_manifest(tiny_target_dir), "template_switches": {"enable_thinking": False}}
    report = run_preflight(
        _sglang(), tiny_target_dir, serving, data_manifest=data, engine="sglang", gpus=H100
    )
    assert "TEMPLATE_SWITCHES" in _codes(
        report
    )  # the benchmark would render without enable_thinking=False
    assert any("'enable_thinking': False" in p.message for p in report.problems)
    same = run_preflight(
        _sglang("data.chat_template_kwargs={enable_thinking: false}"),
        tiny_target_dir,
        serving,
        data_manifest=data,
        engine="sglang",
        gpus=H100,
    )
    assert "TEMPLATE_SWITCHES" not in _codes(same)  # passed on to the benchmark and to the server
    plain = good_data_manifest(tiny_target_dir)
    server = run_preflight(
        _sglang("serve.extra_args=[--default-chat-template-kwargs, '{\"enable_thinking\": true}']"),
        tiny_target_dir,
        serving,
        data_manifest=plain,
        engine="sglang",
        gpus=H100,
    )
    assert any(
        p.code == "TEMPLATE_SWITCHES" and "--default-chat-template-kwargs" in p.message
        for p in server.problems
    )


def test_server_side_template_override(tmp_path, tiny_target_dir, serving):
    data = good_data_manifest(tiny_target_dir)
    other = tmp_path / "other.jinja"
    other.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    report = run_preflight(
        _sglang(f"serve.extra_args=[--chat-template, {other}]"),
        tiny_target_dir,
        serving,
        data_manifest=data,
        engine="sglang",
        gpus=H100,
    )
    assert any(
        p.code == "TEMPLATE_OVERRIDE" and "--chat-template" in p.message and str(other) in p.message
        for p in report.problems
    )
    named = run_preflight(
        _sglang("serve.extra_args=[--chat-template, chatml]"),
        tiny_target_dir,
        serving,
        data_manifest=data,
        engine="sglang",
        gpus=H100,
    )
    assert any("built-in template name" in p.message for p in named.problems)
    from transformers import AutoTokenizer

    same = tmp_path / "same.jinja"
    same.write_text(AutoTokenizer.from_pretrained(str(tiny_target_dir)).chat_template)
    ok = run_preflight(
        _sglang(f"serve.extra_args=[--chat-template, {same}]"),
        tiny_target_dir,
        serving,
        data_manifest=data,
        engine="sglang",
        gpus=H100,
    )
    assert "TEMPLATE_OVERRIDE" not in _codes(ok)


def test_a_passing_reference_preflight_records_every_check(tiny_target_dir, serving):
    report = run_preflight(
        load_config(None, ["serve.engine=reference"]),
        tiny_target_dir,
        serving,
        data_manifest=good_data_manifest(tiny_target_dir),
        engine="reference",
    )
    assert report.passed, report.problems
    assert [c.name for c in report.checks] == [
        "engine",
        "aux_capture",
        "memory",
        "settings",
        "environment",
        "template",
        "steps",
        "port",
        "extraction",
    ]
    assert report.figures()["memory.need_gib"] > 0 and report.to_dict()["passed"] is True
    report.raise_if_failed()


def test_a_failing_setting_raises_a_config_error(tiny_target_dir, serving):
    report = run_preflight(
        _sglang("serve.mem_fraction_static=0.0000002"),
        tiny_target_dir,
        serving,
        engine="sglang",
        gpus=H100,
    )
    report.problems = [p for p in report.problems if p.code == "MEM_FRACTION_TOO_SMALL"]
    with pytest.raises(ConfigError, match="MEM_FRACTION_TOO_SMALL"):
        report.raise_if_failed()


def test_a_port_another_process_holds_is_named_before_any_engine_starts(tiny_target_dir, serving):
    """A new-user trial: with serve.port taken, the launch used to spend 140 s and fail with
    'address already in use' at the end of a long log line."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        cfg = load_config(None, ["serve.engine=reference", f"serve.port={port}"])
        report = run_preflight(cfg, tiny_target_dir, serving, engine="reference")
        assert _codes(report) == ["PORT_IN_USE"] and _status(report, "port").status == "failed"
        assert f"serve.port {port} on 127.0.0.1: expected a free port" in report.problems[0].message
        with pytest.raises(ConfigError, match="PORT_IN_USE"):
            report.raise_if_failed()
    free = run_preflight(cfg, tiny_target_dir, serving, engine="reference")  # released: free again
    assert _status(free, "port").status == "passed" and "PORT_IN_USE" not in _codes(free)
