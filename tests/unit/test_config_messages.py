"""Config messages as ``CODE: message``: schema (pydantic) errors get ``CONFIG_VALUE`` with the key
and the ``[from -o ...]`` provenance, cross-section rules without their own code get
``CONFIG_RULE``, a missing ``data.path`` says "got none" once, a ``data.path`` that is a directory
says so, and the pre-flight prints a failed check once, with its code."""

from __future__ import annotations

import json

import pytest

from eagle3.config import load_config
from eagle3.errors import ConfigError


def _error(*overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, list(overrides))
    return str(e.value)


@pytest.mark.parametrize(
    "override, line",
    [
        ("train.epochs=abc", "  CONFIG_VALUE: train.epochs: Input should be a valid number"),
        ("train.select_best_by=x", "  CONFIG_VALUE: train.select_best_by: Input should be "),
        ("serve.port=70000", "  CONFIG_VALUE: serve.port: Input should be less than or equal to"),
    ],
)
def test_schema_errors_have_a_code_key_and_provenance(override, line):
    msg = _error(override)
    got = msg.splitlines()[1]
    assert got.startswith(line) and got.endswith(f"[from -o {override}]"), msg


def test_a_cross_section_rule_gets_a_code():
    msg = _error("serve.speculative_num_steps=3", "train.ttt_steps=1")
    rule = next(x for x in msg.splitlines() if "train.ttt_steps 1" in x)
    assert rule.startswith("  CONFIG_RULE: serve.speculative_num_steps 3 > train.ttt_steps 1: ")
    assert "[from -o serve.speculative_num_steps=3]" in rule


def test_coded_messages_keep_their_own_code():
    msg = _error("train.epochs=true")
    assert "  NUMBER_TYPE: train.epochs: " in msg and "CONFIG_VALUE" not in msg


def test_a_missing_data_path_says_got_none_once():
    msg = _error("data.source=file")
    line = msg.splitlines()[1]
    assert line.startswith("  DATA_PATH: data: data.path is required when data.source is 'file'")
    assert line.count("(got ") == 1 and "(got none)" in line and "a mapping" not in line


def test_a_data_path_that_is_a_directory_says_so(tmp_path):
    from eagle3.extract.precheck import check_before_run

    cfg = load_config(None, ["data.source=file", f"data.path={tmp_path}"])
    with pytest.raises(ConfigError, match=r"got '.*' \(a directory\)$"):
        check_before_run(cfg)
    with pytest.raises(ConfigError, match=r"\(not found\)$"):
        check_before_run(load_config(None, ["data.source=file", f"data.path={tmp_path / 'x'}"]))
    with pytest.raises(ConfigError, match=r"'/dev/null' \(not a regular file\)$"):
        check_before_run(load_config(None, ["data.source=file", "data.path=/dev/null"]))


def test_preflight_names_a_file_short_of_its_size_when_short_data_fails(tmp_path):
    from eagle3.config_checks import before_run_problems

    convs = tmp_path / "convs.jsonl"
    convs.write_text("\n".join(json.dumps({"conversations": [
        {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}) for _ in range(3)))
    base = ["data.source=file", f"data.path={convs}", "data.num_conversations=5"]
    assert not [p for p in before_run_problems(load_config(None, base)) if "DATA_SHORT" in p]
    got = before_run_problems(load_config(None, [*base, "data.on_short=fail"]))
    assert (f"DATA_SHORT: data.path {convs} holds 3 usable conversations, "
            "data.num_conversations=5 asked") in "\n".join(got)


def test_the_preflight_prints_a_failed_check_once_with_its_code():
    from eagle3.convert.checkpoint import Problem
    from eagle3.serve.preflight import Check, PreflightReport

    p, q = Problem("REFERENCE_UNSUPPORTED", "serve.tp 2: no"), Problem("OTHER", "more")
    below = Problem("BENCH_PROMPTS", "missing")
    report = PreflightReport(
        "reference",
        [
            Check("inputs", "failed", "1 problem(s) a stage would refuse at its start (below)"),
            Check("settings", "failed", "serve.tp 2: no; more"),
            Check("port", "passed", "free"),
        ],
        [below, p, q],
    )
    assert report.lines() == [
        "inputs       failed   1 problem(s) a stage would refuse at its start (below)",
        "settings     failed   REFERENCE_UNSUPPORTED: serve.tp 2: no; OTHER: more",
        "port         passed   free",
        "BENCH_PROMPTS: missing",
    ]
