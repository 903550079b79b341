"""Config-load rules: a key the settings never read is warned about (``UNUSED_KEY``) and stays out
of the cache keys without moving the keys of configs that leave it unset; a key written twice in
the YAML is refused (``DUPLICATE_KEY``); reference-engine settings it cannot serve are refused by
one rule at load, in the pre-flight and at launch; a misspelt bench prompt set is refused at load;
``localhost.`` is loopback."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eagle3 import config as config_mod
from eagle3.config import load_config
from eagle3.errors import ConfigError, EngineUnsupported

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _warnings(caplog, overrides, path=None) -> list[str]:
    config_mod._PARSED.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="eagle3.config"):
        load_config(path, overrides)
    return [r.getMessage() for r in caplog.records if r.name == "eagle3.config"]


# ---- keys the chosen mode never reads


@pytest.mark.parametrize(
    "override, start",
    [
        (
            "data.path=/tmp/my.jsonl",
            "UNUSED_KEY: data.path is set ('/tmp/my.jsonl') but data.source "
            "sharegpt never reads it (read only with data.source file)",
        ),
        (
            "train.compile_mode=reduce-overhead",
            "UNUSED_KEY: train.compile_mode is set "
            "('reduce-overhead') but train.compile False never reads it (read only with "
            "train.compile True)",
        ),
        (
            "extract.sglang_engine_args={tp_size: 2}",
            "UNUSED_KEY: extract.sglang_engine_args is set "
            "({'tp_size': 2}) but extract.backend hf never reads it (read only with "
            "extract.backend sglang)",
        ),
    ],
)
def test_a_key_the_mode_never_reads_is_warned(caplog, override, start):
    got = _warnings(caplog, [override])
    assert len(got) == 1 and got[0].startswith(start), got


def test_keys_read_by_the_mode_are_not_warned(caplog, tmp_path):
    conv = tmp_path / "c.jsonl"
    assert _warnings(caplog, ["data.source=file", f"data.path={conv}"]) == []
    assert _warnings(caplog, ["train.compile=true", "train.compile_mode=reduce-overhead"]) == []


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_unused_keys_do_not_move_the_cache_keys(path):
    """A config that leaves the new keys unset keeps its digests (the unused keys stay in the dump
    at their default), and setting one where it is unused keys like leaving it unset."""
    from tasks.stage_config import FOLDER_STAGES, sections_hash, settings_digest, stage_sections

    cfg = load_config(path)
    keyed = stage_sections(cfg, "extract", keyed=True)
    if cfg.data.source != "file":
        assert keyed["data"]["path"] is None  # kept at its default, not dropped
    digest = settings_digest(cfg, FOLDER_STAGES["bench"])
    hashes = {s: sections_hash(cfg, s) for s in ("extract", "train")}
    for ov in (
        "data.path=/elsewhere.jsonl",
        "train.compile_mode=max-autotune-no-cudagraphs",
        "extract.sglang_engine_args={dp_size: 2}",
    ):
        other = load_config(path, [ov])
        section, key = ov.split("=")[0].split(".")
        if key == "path" and other.data.source == "file":
            continue  # read there: it keys
        if key == "sglang_engine_args" and other.extract.backend == "sglang":
            continue
        if key == "compile_mode" and other.train.compile:
            continue
        assert settings_digest(other, FOLDER_STAGES["bench"]) == digest, ov
        assert {s: sections_hash(other, s) for s in ("extract", "train")} == hashes, ov


def test_a_read_data_path_keys_the_extraction(tmp_path):
    from tasks.stage_config import sections_hash

    a = load_config(None, ["data.source=file", f"data.path={tmp_path / 'a.jsonl'}"])
    b = load_config(None, ["data.source=file", f"data.path={tmp_path / 'b.jsonl'}"])
    assert sections_hash(a, "extract") != sections_hash(b, "extract")


# ---- a key written twice


def _yaml(tmp_path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_a_section_written_twice_is_refused(tmp_path):
    p = _yaml(
        tmp_path,
        "name: x\ntrain:\n  draft_vocab_size: 256\n  lr: 1.0e-3\n"
        "data:\n  num_conversations: 16\ntrain:\n  epochs: 3\n",
    )
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value) == (
        f"DUPLICATE_KEY: {p}:7: train is written twice (lines 2 and 7); YAML "
        "would keep the last one silently; expected each key once"
    )


def test_a_key_written_twice_in_a_section_is_refused(tmp_path):
    p = _yaml(
        tmp_path, "train:\n  draft_vocab_size: 256\n  epochs: 1\n  draft_vocab_size: 100000\n"
    )
    with pytest.raises(
        ConfigError,
        match=rf"^DUPLICATE_KEY: {p}:4: train.draft_vocab_size is "
        r"written twice \(lines 2 and 4\)",
    ):
        load_config(p)


def test_a_nested_key_written_twice_is_refused_and_distinct_keys_pass(tmp_path):
    p = _yaml(
        tmp_path,
        "target:\n  kind: tiny-random\n  tiny:\n    hidden_size: 64\n    hidden_size: 128\n",
    )
    with pytest.raises(
        ConfigError,
        match=r"target.tiny.hidden_size is written twice "
        r"\(lines 4 and 5\)",
    ):
        load_config(p)
    ok = _yaml(tmp_path, "train:\n  epochs: 1\nserve:\n  env: {A: '1', B: '2'}\n")
    assert load_config(ok).serve.env == {"A": "1", "B": "2"}


# ---- reference-engine settings


@pytest.mark.parametrize(
    "override", ["serve.speculative_eagle_topk=4", "serve.tp=2", "serve.mem_fraction_static=0.5"]
)
def test_reference_settings_one_rule_at_load_preflight_and_launch(tmp_path, override):
    from eagle3.config_checks import reference_problem
    from eagle3.serve import preflight
    from eagle3.serve.launcher import build_command

    field = override.split("=")[0]
    with pytest.raises(
        ConfigError,
        match=rf"REFERENCE_UNSUPPORTED: serve.engine reference: .*"
        rf"'{field}'",
    ):
        load_config(
            None, ["serve.engine=reference", override, "serve.speculative_num_draft_tokens=5"]
        )
    cfg = load_config(None, ["serve.engine=auto", override])  # auto may be SGLang: loads
    msg = reference_problem(cfg.serve)
    assert (
        msg.startswith(
            "REFERENCE_UNSUPPORTED: serve.engine auto (it resolves to the "
            "reference engine on this machine)"
        )
        and field in msg
    )
    check, problems = preflight._check_settings(cfg, "reference")
    assert check.status == "failed" and "settings passed" not in check.detail
    assert [p.code for p in problems] == ["REFERENCE_UNSUPPORTED"]
    assert f"{problems[0].code}: {problems[0].message}" == msg
    with pytest.raises(EngineUnsupported) as e:
        build_command(cfg, tmp_path, tmp_path, 1234, engine="reference")
    assert str(e.value) == msg


def test_eagle3_run_refuses_them_where_auto_resolves_to_reference(tmp_path, monkeypatch):
    from cli.run import check_target
    from eagle3.serve import launcher

    cfg = load_config(None, [f"paths.cache_dir={tmp_path}", "serve.speculative_eagle_topk=4"])
    monkeypatch.setattr(launcher, "resolve_engine", lambda c: "reference")
    with pytest.raises(ConfigError, match=r"^REFERENCE_UNSUPPORTED: .*speculative_eagle_topk"):
        check_target(cfg)
    monkeypatch.setattr(launcher, "resolve_engine", lambda c: "sglang")
    check_target(cfg)  # SGLang serves top-k 4


# ---- bench prompts


def test_a_misspelt_bench_prompt_set_is_refused_at_load():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["bench.prompts=mtbenchh"])
    assert (
        "BENCH_PROMPTS: bench.prompts: expected one of ('mtbench', 'gsm8k', 'humaneval') or "
        "a prompts file, got 'mtbenchh', which is neither (did you mean 'mtbench'?)" in str(e.value)
    )
    for name in ("mtbench", "gsm8k", "humaneval", "/no/such/p.jsonl", "p.jsonl"):
        load_config(None, [f"bench.prompts={name}"])  # names, and paths (checked before the run)


# ---- serve.host


def test_localhost_with_a_trailing_dot_is_loopback(caplog):
    assert _warnings(caplog, ["serve.host=localhost."]) == []
    assert _warnings(caplog, ["serve.host=localhost.example."])[0].startswith("SERVE_HOST_EXPOSED")
