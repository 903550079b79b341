"""serve.extra_args read as SGLang's argparse reads them: aliases and unambiguous prefixes resolve
to their flag before the launcher's and the pre-flight's rules judge them; the pinned flag table
is re-derived from the released wheel's source."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3.config import load_config
from eagle3.engines.sglang import server_flags
from eagle3.engines.sglang.serving import canonical_flag, extra_args_problems, flag_value, resolve
from eagle3.errors import ConfigError, EngineUnsupported
from eagle3.serve import preflight
from eagle3.serve.launcher import build_command


def test_pinned_flag_table_is_the_released_source(cache_dir):
    from eagle3.engines.sglang.source import find_engine_source
    from tests.support.sglang_flags import server_flags as derive

    try:
        source = find_engine_source("sglang", "0.5.23", cache_dir=cache_dir, download=True)
    except EngineUnsupported as e:
        pytest.skip(f"SGLang 0.5.23 wheel unavailable (download failed): {e}")
    derived = derive(source)
    pinned = {k: v for k, v in server_flags.OPTIONS.items() if k not in ("-h", "--help")}
    assert pinned == derived
    assert derived["--speculative-draft-model"] == "--speculative-draft-model-path"
    assert server_flags.options("0.5.23") is server_flags.OPTIONS
    # argparse.BooleanOptionalAction adds the negation; it is a flag SGLang takes
    assert derived["--no-enable-tf32-matmul"] == "--enable-tf32-matmul"
    assert extra_args_problems(["--no-enable-tf32-matmul"]) == []


def test_pinned_value_counts_are_the_released_source(cache_dir):
    from eagle3.engines.sglang.source import find_engine_source
    from tests.support.sglang_flags import server_flag_nargs

    try:
        source = find_engine_source("sglang", "0.5.23", cache_dir=cache_dir, download=True)
    except EngineUnsupported as e:
        pytest.skip(f"SGLang 0.5.23 wheel unavailable (download failed): {e}")
    derived = server_flag_nargs(source)
    pinned = {k: v for k, v in server_flags.nargs("0.5.23").items() if k not in ("-h", "--help")}
    assert pinned == derived
    assert derived["--disable-radix-cache"] == "0" and derived["--cuda-graph-bs-decode"] == "+"
    assert "--log-level" not in derived and "--mem-fraction-static" not in derived  # one value
    assert derived["--enable-dp-attention"] == "0"  # a deprecated switch


def _cfg(*extra: str, **kw):
    items = ", ".join(repr(e) for e in extra)
    return load_config(
        None,
        [
            "serve.engine=sglang",
            f"serve.extra_args=[{items}]",
            *[f"serve.{k}={v}" for k, v in kw.items()],
        ],
    )


def _launch_error(cfg, draft: Path | None = Path("/d")) -> str:
    with pytest.raises(ConfigError) as e:
        build_command(cfg, Path("/t"), draft, 1, engine="sglang")
    return str(e.value)


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--speculative-algo", "STANDALONE"], "--speculative-algorithm"),
        (["--speculative-algo=NGRAM"], "--speculative-algorithm"),
        (["--speculative-draft-model", ""], "--speculative-draft-model-path"),
        (["--speculative-draft-model=/t"], "--speculative-draft-model-path"),  # the target
        (["--speculative-draft-model-pa", "/t"], "--speculative-draft-model-path"),
        (["--mem-frac", "0.5"], "--mem-fraction-static"),
        (["--model", "/elsewhere"], "--model-path"),
        (["--tensor-parallel-size", "2"], "--tp-size"),
    ],
)
def test_alias_or_abbreviation_of_an_owned_flag_is_refused(extra, flag):
    msg = _launch_error(_cfg(*extra))
    assert msg.startswith("EXTRA_ARG_OWNED: ") and f"got {flag}" in msg and repr(extra[0]) in msg
    problems = preflight._check_settings(_cfg(*extra), "sglang")[1]
    assert [p.code for p in problems] == ["EXTRA_ARG_OWNED"] and flag in problems[0].message


def test_baseline_launch_refuses_a_smuggled_algorithm_too():
    msg = _launch_error(_cfg("--speculative-algo", "NGRAM"), draft=None)
    assert "EXTRA_ARG_OWNED" in msg and "--speculative-algorithm" in msg


def test_ambiguous_and_unknown_flags_are_refused_like_argparse():
    msg = _launch_error(_cfg("--speculative-draft", "/t"))  # 9 flags start so
    assert msg.startswith("EXTRA_ARG_AMBIGUOUS: ") and "--speculative-draft-model-path" in msg
    msg = _launch_error(_cfg("--cuda-graph-max-bs", "8"))
    assert msg.startswith("EXTRA_ARG_AMBIGUOUS: ") and "--cuda-graph-max-bs-decode" in msg
    assert "--cuda-graph-max-bs-prefill" in msg
    msg = _launch_error(_cfg("--no-such-flag-at-all"))
    assert msg.startswith("EXTRA_ARG_UNKNOWN: ") and "'--no-such-flag-at-all'" in msg


def test_abbreviated_chat_template_is_judged_as_the_template_override():
    cfg = _cfg("--chat-templ", "chatml")
    assert flag_value(cfg.serve.extra_args, "--chat-template") == "chatml"
    out = preflight._server_template(cfg, {}, {"chat_template_hash": "0" * 64})
    assert [p.code for p in out] == ["TEMPLATE_OVERRIDE"] and "'chatml'" in out[0].message


def test_aliases_count_for_the_serving_rules():
    assert canonical_flag("--pipeline-parallel-size=2") == "--pp-size"
    assert resolve(_cfg("--pipeline-parallel", "2").serve)["scheduler"] == "synchronous"
    assert resolve(_cfg("--disable-overlap").serve)["scheduler"] == "synchronous"


def test_flags_the_launcher_does_not_set_pass_verbatim():
    cfg = _cfg(
        "--attention-backend",
        "fa3",
        "--disable-radix-cache",
        "--max-running-requests",
        "80",
        "--chat-template=/x/t.jinja",
    )
    assert extra_args_problems(cfg.serve.extra_args) == []
    argv, _ = build_command(cfg, Path("/t"), Path("/d"), 1, engine="sglang")
    assert argv[-6:] == [
        "--attention-backend",
        "fa3",
        "--disable-radix-cache",
        "--max-running-requests",
        "80",
        "--chat-template=/x/t.jinja",
    ]
    assert preflight._check_settings(cfg, "sglang")[1] == []


@pytest.mark.parametrize(
    "extra", [["-h"], ["--help"], ["--he"], ["--attention-backend", "fa3", "-h"]]
)
def test_help_flag_is_refused_before_sglang_prints_help_and_exits(extra):
    msg = _launch_error(_cfg(*extra))
    assert msg.startswith("EXTRA_ARG_HELP: ") and f"serve.extra_args {extra[-1]!r}" in msg
    assert "prints its help and exits" in msg
    problems = preflight._check_settings(_cfg(*extra), "sglang")[1]
    assert [p.code for p in problems] == ["EXTRA_ARG_HELP"]


@pytest.mark.parametrize(
    "extra, flag, after",
    [
        (["--log-level"], "--log-level", "last in the list"),
        (
            ["--log-level", "--disable-radix-cache"],
            "--log-level",
            "followed by '--disable-radix-cache'",
        ),
        (["--cuda-graph-bs-decode"], "--cuda-graph-bs-decode", "last in the list"),  # nargs "+"
    ],
)
def test_flag_without_its_value_is_refused(extra, flag, after):
    msg = _launch_error(_cfg(*extra))
    assert msg.startswith("EXTRA_ARG_NO_VALUE: ") and f"serve.extra_args {extra[0]!r}" in msg
    assert f"{flag} takes one" in msg and f"got none ({after})" in msg
    problems = preflight._check_settings(_cfg(*extra), "sglang")[1]
    assert [p.code for p in problems] == ["EXTRA_ARG_NO_VALUE"]


def test_value_flag_followed_by_another_flag_reports_both():
    problems = extra_args_problems(["--mem-fraction-static", "--port", "1"])
    assert [c for c, _ in problems] == ["EXTRA_ARG_NO_VALUE", "EXTRA_ARG_OWNED", "EXTRA_ARG_OWNED"]
    assert (
        "'--mem-fraction-static': --mem-fraction-static takes one value, got none (followed by "
        "'--port')" in problems[0][1]
    )
    assert "got --port" in problems[2][1]
    # a value-taking flag the launcher does not own, followed by a flag: only the missing value
    ((code, msg),) = extra_args_problems(["--schedule-policy", "--port=1"], ["--port", "1"])[:1]
    assert code == "EXTRA_ARG_NO_VALUE" and "'--schedule-policy'" in msg


def test_stray_values_and_values_given_to_switches_are_refused():
    ((code, msg),) = extra_args_problems(["--disable-radix-cache", "true"])
    assert code == "EXTRA_ARG_STRAY" and "'true'" in msg and "which takes no value" in msg
    ((code, msg),) = extra_args_problems(["--log-level", "debug", "info"])
    assert code == "EXTRA_ARG_STRAY" and "'info'" in msg and "after the value 'debug'" in msg
    ((code, msg),) = extra_args_problems(["--disable-radix-cache=1"])
    assert code == "EXTRA_ARG_SWITCH_VALUE" and "--disable-radix-cache takes no value" in msg


def test_well_formed_values_pass():
    ok = [
        ["--cuda-graph-bs-decode", "1", "2", "4", "--log-level", "debug"],
        ["--gc-threshold", "-1", "--log-level=info"],  # a negative number is a value
        ["--model-checksum", "--disable-radix-cache"],  # an optional value may be left out
        ["--lora-target-modules", "--log-level", "info"],
        ["--log-level=debug"],
    ]
    for extra in ok:
        assert extra_args_problems(extra) == [], extra
