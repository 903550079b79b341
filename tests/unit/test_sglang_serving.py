"""What SGLang 0.5.23 changes or fakes in the serving settings (eagle3.engines.sglang.serving),
pinned against the released wheel's source, and the config-load rules built on it
(eagle3.config_checks): each refused case names the key and both values."""

from __future__ import annotations

import ast
import re

import pytest

from eagle3.config import load_config
from eagle3.engines.sglang.serving import (
    compare_server_info,
    flag_value,
    resolve,
    simulated_acceptance,
)
from eagle3.errors import ConfigError, EngineUnsupported

HOOK = "sglang/srt/arg_groups/speculative_hook.py"


@pytest.fixture(scope="module")
def sglang_source(cache_dir):
    from eagle3.engines.sglang.source import find_engine_source

    try:
        return find_engine_source("sglang", "0.5.23", cache_dir=cache_dir, download=True)
    except EngineUnsupported as e:
        pytest.skip(f"SGLang 0.5.23 wheel unavailable (download failed): {e}")


def _fn(src: str, name: str) -> str:
    tree = ast.parse(src)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.unparse(node)


def test_pinned_in_the_wheel(sglang_source):
    eagle = _fn(sglang_source.read(HOOK), "_handle_eagle_family")
    # S11: unset max_running_requests becomes 48 with speculation
    assert re.search(
        r"if cfg.max_running_requests is None:\s+declare_resolution\(server_args, "
        r"'_handle_eagle_family', max_running_requests=48\)",
        eagle,
    )
    # S12: topk 1 rewrites the draft tokens to steps + 1
    assert re.search(
        r"if cfg.speculative_eagle_topk == 1 and cfg.speculative_num_draft_tokens != "
        r"cfg.speculative_num_steps \+ 1:.*"
        r"speculative_num_draft_tokens=cfg.speculative_num_steps \+ 1",
        eagle,
        re.S,
    )
    # S13: overlap is switched off for cpu only inside the EAGLE hook; nothing there ties it to topk
    assert "_disable_overlap_schedule_for_cpu(server_args)" in eagle
    assert not re.search(r"topk[^\n]*overlap|overlap[^\n]*topk", eagle)
    cpu = _fn(sglang_source.read(HOOK), "_disable_overlap_schedule_for_cpu")
    assert "cfg.device != 'cpu'" in cpu and "disable_overlap_schedule=True" in cpu
    info = sglang_source.read("sglang/srt/speculative/spec_info.py")
    assert "EAGLE / EAGLE3 / STANDALONE / MULTI_LAYER always use the V2 worker" in info
    # S14: the simulated acceptance length, off below 0, and the SGL_ prefix rewritten
    env = sglang_source.read("sglang/srt/environ.py")
    assert "SGLANG_SIMULATE_ACC_LEN = EnvFloat(-1)" in env
    assert 'key.replace("SGL_", "SGLANG_", 1)' in env
    assert "if SIMULATE_ACC_LEN > 0" in sglang_source.read("sglang/srt/speculative/spec_utils.py")
    # S15: /server_info returns the resolved settings
    common = _fn(sglang_source.read("sglang/srt/utils/common.py"), "build_server_info")
    assert "server_args.resolved_dict()" in common


def _serve(steps, topk, tokens, mrr, extra=()):
    from eagle3.config import ServeConfig

    return ServeConfig(
        speculative_num_steps=steps,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=tokens,
        max_running_requests=mrr,
        extra_args=list(extra),
    )


def test_resolve_what_the_engine_will_run():
    r = resolve(_serve(3, 4, 5, None))  # the seed's settings
    assert (r["scheduler"], r["drafting"], r["max_running_requests"], r["num_draft_tokens"]) == (
        "overlap",
        "tree",
        48,
        5,
    )
    assert r["max_running_requests_source"] == "SGLang's speculative default (48)"
    r = resolve(_serve(3, 1, 6, 64, ["--device", "cpu"]))
    assert (
        r["num_draft_tokens"] == 4
        and r["num_draft_tokens_adjusted"]
        and r["max_running_requests"] == 64
    )
    assert r["scheduler"] == "synchronous" and "cpu" in r["scheduler_reason"]
    r = resolve(_serve(3, 1, 4, None, ["--disable-overlap-schedule", "--max-running-requests=96"]))
    assert (r["scheduler"], r["max_running_requests"]) == ("synchronous", 96)
    assert (
        flag_value(["--a", "--b", "x"], "--a") == "true"
        and flag_value(["--b=1", "--b", "2"], "--b") == "2"
    )


def test_simulated_acceptance_variables():
    assert simulated_acceptance({"SGLANG_SIMULATE_ACC_LEN": "3.2"}) == (
        "SGLANG_SIMULATE_ACC_LEN",
        "3.2",
    )
    assert simulated_acceptance({"SGL_SIMULATE_ACC_LEN": "2"}) == ("SGL_SIMULATE_ACC_LEN", "2")
    assert (
        simulated_acceptance({"SGLANG_SIMULATE_ACC_LEN": "-1", "SGL_SIMULATE_ACC_LEN": "0"}) is None
    )
    assert (
        simulated_acceptance({"SGLANG_SIMULATE_ACC_LEN": "lots"}) is not None
    )  # unparseable: not trusted


def test_server_info_changes_are_named():
    r = compare_server_info(
        {
            "max_running_requests": 48,
            "speculative_num_draft_tokens": 4,
            "disable_overlap_schedule": False,
        },
        {"max_running_requests": 64, "speculative_num_draft_tokens": 4},
    )
    assert (
        r["changed"] == {"max_running_requests": {"asked": 64, "running": 48}}
        and r["scheduler"] == "overlap"
    )
    assert (
        compare_server_info({}, {"max_running_requests": 64})["changed"] == {}
    )  # not reported: not a change


# ----------------------------------------------------------------------------------- rules at
# config load


def _refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, list(overrides))
    return str(e.value)


def test_served_steps_beyond_the_trained_ones_are_refused_and_say_why():
    msg = _refused("train.ttt_steps=2", "serve.speculative_num_steps=3")
    assert "serve.speculative_num_steps 3 > train.ttt_steps 2" in msg and "untrained" in msg
    assert "[from -o serve.speculative_num_steps=3]" in msg
    load_config(
        None, ["train.ttt_steps=5", "serve.speculative_num_steps=3"]
    )  # fewer served steps: fine


def test_chain_drafting_draft_tokens_must_be_steps_plus_one():
    msg = _refused("serve.speculative_num_draft_tokens=6")
    assert "serve.speculative_num_draft_tokens" in msg and "= 4 tokens, got 6" in msg


@pytest.mark.parametrize(
    "override, named",
    [
        ("serve.speculative_eagle_topk=4", "'serve.speculative_eagle_topk': 4"),
        ("serve.tp=2", "'serve.tp': 2"),
    ],
)
def test_reference_engine_settings_it_cannot_serve_are_refused_before_training(override, named):
    msg = _refused("serve.engine=reference", override, "serve.speculative_num_draft_tokens=5")
    assert "serve.engine reference" in msg and named in msg


def test_concurrency_above_sglangs_48_is_refused_unless_max_running_requests_is_set():
    msg = _refused("serve.engine=sglang", "bench.concurrency=64")
    assert "bench.concurrency 64" in msg and "resets max_running_requests to 48" in msg
    load_config(
        None, ["serve.engine=sglang", "bench.concurrency=64", "serve.max_running_requests=64"]
    )
    assert "serve.max_running_requests is 32" in _refused(
        "serve.engine=sglang", "bench.concurrency=64", "serve.max_running_requests=32"
    )
    load_config(
        None,
        [
            "serve.engine=sglang",
            "bench.concurrency=64",
            "serve.extra_args=[--max-running-requests, '80']",
        ],
    )


def test_simulated_acceptance_in_serve_env_is_refused_at_load():
    msg = _refused("serve.env={SGLANG_SIMULATE_ACC_LEN: '3.0'}")
    assert "SGLANG_SIMULATE_ACC_LEN='3.0' in serve.env: expected unset" in msg


@pytest.mark.parametrize(
    "override, field",
    [
        ("train.num_layers=1000000000", "train.num_layers"),
        ("target.tiny.num_hidden_layers=1000000000", "target.tiny.num_hidden_layers"),
        ("serve.speculative_num_steps=100000", "serve.speculative_num_steps"),
        ("bench.concurrency=10000000", "bench.concurrency"),
    ],
)
def test_absurd_numbers_that_size_loops_or_allocations_are_refused_at_load(override, field):
    msg = _refused(override)
    assert (
        f"{field}: Input should be less than or equal to" in msg and f"[from -o {override}]" in msg
    )
