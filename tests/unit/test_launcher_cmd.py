"""Engine command lines built from cfg.serve (no process is started here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eagle3.config import load_config
from eagle3.serve import launcher
from eagle3.serve.launcher import build_command, is_cuda_graph_crash, resolve_engine
from eagle3.errors import ConfigError, EngineUnsupported


def _cfg(*overrides: str):
    return load_config(None, list(overrides))


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_sglang_command_carries_every_configured_flag():
    cfg = _cfg(
        "train.ttt_steps=5",
        "serve.speculative_num_steps=5",
        "serve.speculative_eagle_topk=4",
        "serve.max_running_requests=64",
        "data.chat_template_kwargs={enable_thinking: false}",
        "serve.speculative_num_draft_tokens=8",
        "serve.tp=8",
        "serve.mem_fraction_static=0.7",
        "serve.cuda_graph_max_bs=16",
        "serve.context_length=4096",
        "serve.dtype=bfloat16",
        "serve.host=0.0.0.0",
        "serve.sglang_python=/opt/sgl/bin/python",
        "serve.extra_args=[--attention-backend, fa3, --disable-radix-cache]",
        "serve.env={NCCL_P2P_DISABLE: '1', NCCL_DEBUG: INFO}",
    )
    argv, env = build_command(cfg, Path("/m/target"), Path("/m/draft"), 31234, engine="sglang")
    assert argv[:3] == ["/opt/sgl/bin/python", "-m", "sglang.launch_server"]
    assert _flag(argv, "--model-path") == "/m/target"
    assert _flag(argv, "--speculative-algorithm") == "EAGLE3"
    assert _flag(argv, "--speculative-draft-model-path") == "/m/draft"
    assert (
        _flag(argv, "--speculative-num-steps"),
        _flag(argv, "--speculative-eagle-topk"),
        _flag(argv, "--speculative-num-draft-tokens"),
    ) == ("5", "4", "8")
    assert _flag(argv, "--tp-size") == "8" and _flag(argv, "--mem-fraction-static") == "0.7"
    assert (
        _flag(argv, "--max-running-requests") == "64"
    )  # else SGLang resets it to 48 with speculation on
    assert (
        _flag(argv, "--default-chat-template-kwargs") == '{"enable_thinking": false}'
    )  # the extraction's switches
    assert (
        _flag(argv, "--cuda-graph-max-bs-decode") == "16"
    )  # 0.5.23's name; plain --cuda-graph-max-bs is ambiguous
    assert _flag(argv, "--context-length") == "4096" and _flag(argv, "--dtype") == "bfloat16"
    assert (_flag(argv, "--host"), _flag(argv, "--port")) == ("0.0.0.0", "31234")
    assert "--enable-metrics" in argv and "--disable-cuda-graph" not in argv
    assert argv[-3:] == [
        "--attention-backend",
        "fa3",
        "--disable-radix-cache",
    ]  # pass-through, verbatim, last
    assert env == {"PYTHONUNBUFFERED": "1", "NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO"}


def test_disable_cuda_graph_and_no_draft_means_no_speculative_flags():
    cfg = _cfg("serve.disable_cuda_graph=true")
    argv, _ = build_command(cfg, Path("/t"), None, 1, engine="sglang")
    assert "--disable-cuda-graph" in argv
    assert not [a for a in argv if a.startswith("--speculative")]


def test_reference_command_uses_this_interpreter_and_only_flags_it_implements():
    cfg = _cfg(
        "serve.engine=reference", "serve.context_length=512", "serve.disable_cuda_graph=true"
    )
    argv, env = build_command(cfg, Path("/t"), Path("/d"), 4242)
    assert argv[:3] == [sys.executable, "-m", "refengine.launch_server"]
    assert _flag(argv, "--speculative-num-steps") == "3" and _flag(argv, "--port") == "4242"
    assert _flag(argv, "--context-length") == "512"
    for gpu_only in ("--tp-size", "--enable-metrics"):
        assert gpu_only not in argv
    assert (
        _flag(argv, "--dtype") == cfg.serve.dtype != "auto"
    )  # auto resolved by load_config (test_precision.py)
    assert (
        "--disable-cuda-graph" in argv
    )  # the reference engine's fast path has CUDA graphs to turn off
    assert env["PYTHONUNBUFFERED"] == "1"
    argv32, _ = build_command(
        _cfg("serve.engine=reference", "serve.dtype=float32"), Path("/t"), Path("/d"), 1
    )
    assert _flag(argv32, "--dtype") == "float32" and "--disable-cuda-graph" not in argv32


@pytest.mark.parametrize(
    "override, field",
    [
        ("serve.tp=2", "serve.tp"),
        ("serve.mem_fraction_static=0.8", "serve.mem_fraction_static"),
        ("serve.cuda_graph_max_bs=8", "serve.cuda_graph_max_bs"),
        ("serve.max_running_requests=8", "serve.max_running_requests"),
    ],
)
def test_reference_refuses_gpu_only_settings_by_name(override, field):
    with pytest.raises(
        ConfigError, match=field
    ):  # at config load, before any training (eagle3.config_checks)
        _cfg("serve.engine=reference", override)
    with pytest.raises(
        EngineUnsupported, match=field
    ):  # and again at launch, when auto resolved to reference
        build_command(
            _cfg("serve.engine=auto", override), Path("/t"), Path("/d"), 1, engine="reference"
        )


@pytest.mark.parametrize("name", ["SGLANG_SIMULATE_ACC_LEN", "SGL_SIMULATE_ACC_LEN"])
def test_simulated_acceptance_in_the_servers_environment_is_refused_at_launch(monkeypatch, name):
    monkeypatch.setenv(
        name, "2.5"
    )  # inherited from this process: not in the config, so config load cannot see it
    with pytest.raises(
        ConfigError, match=f"{name}='2.5' in the server's environment .this process's environment"
    ):
        build_command(_cfg(), Path("/t"), Path("/d"), 1, engine="sglang")
    monkeypatch.setenv(name, "-1")  # SGLang's default: off
    build_command(_cfg(), Path("/t"), Path("/d"), 1, engine="sglang")


def test_extra_args_may_not_repeat_a_generated_flag():
    with pytest.raises(ConfigError, match=r"serve.extra_args.*--port"):
        build_command(
            _cfg("serve.extra_args=[--port=9999]"), Path("/t"), Path("/d"), 1, engine="sglang"
        )


def test_reference_rules_are_the_reference_engines_parser():
    """launcher.reference_rules (the product may not import refengine) equals
    refengine.launch_server's argparse: every option string, its flag and its value count."""
    import argparse

    from refengine.launch_server import _parser

    parser = _parser()
    options, counts = {}, {}
    for action in parser._actions:
        flag = max(action.option_strings, key=len)
        takes = (
            "0"
            if isinstance(action, (argparse._StoreTrueAction, argparse._HelpAction))
            else "1"
            if action.nargs is None
            else str(action.nargs)
        )
        for o in action.option_strings:
            options[o] = flag
            if takes != "1":
                counts[o] = takes
    rules = launcher.reference_rules()
    assert parser.allow_abbrev is False and rules.allow_abbrev is False
    assert dict(rules.options) == options and dict(rules.nargs) == counts


REF_REFUSED = [
    (["-h"], "EXTRA_ARG_HELP"),
    (["--help"], "EXTRA_ARG_HELP"),
    (["--log-level"], "EXTRA_ARG_NO_VALUE"),
    (["--log-level", "--skip-server-warmup"], "EXTRA_ARG_NO_VALUE"),
    (["--skip-server-warmup=yes"], "EXTRA_ARG_SWITCH_VALUE"),
    (["--log-level", "debug", "verbose"], "EXTRA_ARG_STRAY"),
    (["--log-lev", "debug"], "EXTRA_ARG_UNKNOWN"),  # no abbreviations in its parser
    (["--attention-backend", "fa3"], "EXTRA_ARG_UNKNOWN"),
]


@pytest.mark.parametrize("extra, code", REF_REFUSED)
def test_reference_extra_args_its_parser_would_not_take_are_refused_at_launch(extra, code):
    """Each case is one the reference engine's own parser ends on (help printed, exit 0; or
    argparse's exit 2; or the engine's UsageError): the launcher refuses it first, by the same
    rules as SGLang's (extra_args_problems), naming the token."""
    from refengine.launch_server import UsageError, parse_args

    cfg = _cfg("serve.engine=reference", f"serve.extra_args={extra}")
    with pytest.raises(ConfigError) as e:
        build_command(cfg, Path("/t"), Path("/d"), 1)
    msg = str(e.value)
    named = extra[-1] if code == "EXTRA_ARG_STRAY" else extra[0]
    assert msg.startswith(f"{code}: serve.extra_args {named!r}")
    assert "the reference engine" in msg
    with pytest.raises((SystemExit, UsageError)):  # what the engine itself would do with it
        parse_args(["--model-path", "/t", *extra])


def test_reference_extra_args_it_takes_pass_and_owned_flags_are_refused():
    extra = ["--log-level", "debug", "--skip-server-warmup", "--random-seed=3"]
    argv, _ = build_command(
        _cfg("serve.engine=reference", f"serve.extra_args={extra}"), Path("/t"), Path("/d"), 1
    )
    assert argv[-4:] == extra
    for owned in (["--port=9"], ["--tp", "1"], ["--device", "cpu"]):
        with pytest.raises(ConfigError, match=r"^EXTRA_ARG_OWNED: "):
            build_command(
                _cfg("serve.engine=reference", f"serve.extra_args={owned}"),
                Path("/t"),
                Path("/d"),
                1,
            )


def test_resolve_engine(monkeypatch):
    assert resolve_engine(_cfg("serve.engine=reference")) == "reference"
    with pytest.raises(EngineUnsupported, match="serve.sglang_python"):
        resolve_engine(_cfg("serve.engine=sglang", "serve.sglang_python=/nonexistent/python"))
    monkeypatch.setattr(launcher, "sglang_installed", lambda python: True)
    monkeypatch.setattr(launcher, "gpu_present", lambda: True)
    assert resolve_engine(_cfg()) == "sglang"
    monkeypatch.setattr(launcher, "gpu_present", lambda: False)
    assert (
        resolve_engine(_cfg()) == "reference"
    )  # SGLang without a GPU: auto picks the CPU reference engine
    monkeypatch.setattr(launcher, "gpu_present", lambda: True)
    monkeypatch.setattr(launcher, "sglang_installed", lambda python: False)
    assert resolve_engine(_cfg()) == "reference"


def test_cuda_graph_crash_detection():
    assert is_cuda_graph_crash("Exception: Capture cuda graph failed: CUDA error: out of memory\n")
    capture_then_tb = (
        "Capturing batches (bs=160 avail_mem=10.1 GB)\nTraceback (most recent call last):\n  x\nOOM"
    )
    assert is_cuda_graph_crash(capture_then_tb)
    assert not is_cuda_graph_crash(
        "Load weight end.\nTraceback (most recent call last):\nRuntimeError: shape"
    )
    assert not is_cuda_graph_crash(
        "Capturing batches (bs=1)\nThe server is fired up and ready to roll!"
    )


def test_reference_engine_on_a_cpu_gets_serve_cpu_threads_and_serve_env_wins():
    _, env = build_command(
        _cfg("serve.engine=reference", "serve.device=cpu"), Path("/t"), Path("/d"), 1
    )
    assert env["OMP_NUM_THREADS"] == "1"  # the default serve.cpu_threads
    _, env = build_command(
        _cfg("serve.engine=reference", "serve.device=cpu", "serve.cpu_threads=2"),
        Path("/t"),
        Path("/d"),
        1,
    )
    assert env["OMP_NUM_THREADS"] == "2"
    _, env = build_command(
        _cfg("serve.engine=reference", "serve.device=cpu", "serve.env={OMP_NUM_THREADS: '3'}"),
        Path("/t"),
        Path("/d"),
        1,
    )
    assert env["OMP_NUM_THREADS"] == "3"
    _, env = build_command(
        _cfg("serve.engine=reference", "serve.device=cpu", "serve.cpu_threads=null"),
        Path("/t"),
        Path("/d"),
        1,
    )
    assert "OMP_NUM_THREADS" not in env
    _, env = build_command(
        _cfg("serve.engine=reference", "serve.device=cuda"), Path("/t"), Path("/d"), 1
    )
    assert "OMP_NUM_THREADS" not in env  # a GPU engine's CPU threads are not ours to cap
