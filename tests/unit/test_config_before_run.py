"""What ``eagle3 run`` refuses before Prefect starts and the pre-flight's ``inputs`` check reports:
a missing bench prompts file, and, for the built-in target kinds, a draft vocabulary not below the
target's when the target's cached folder is there already (nothing is prepared for it)."""

from __future__ import annotations

import json

import pytest

from eagle3.config import load_config
from eagle3.config_checks import before_run_problems
from eagle3.errors import ConfigError
from tests.support.handover import hf_target, target_cfg


@pytest.fixture
def target(tmp_path):
    return hf_target(tmp_path)


def _cfg(target, *ov):
    return target_cfg(target, "train.draft_vocab_size=500", *ov)


def test_a_missing_bench_prompts_file_is_an_input_problem(target, tmp_path):
    missing = tmp_path / "p.jsonl"
    got = before_run_problems(_cfg(target, f"bench.prompts={missing}"), target)
    assert got == [
        f"BENCH_PROMPTS: bench.prompts: expected one of ('mtbench', 'gsm8k', "
        f"'humaneval') or an existing prompts file (JSONL, JSON or text), got "
        f"{str(missing)!r} (not found)"
    ]
    missing.write_text('{"prompt": "hi"}\n')
    assert (
        before_run_problems(_cfg(target, f"bench.prompts={missing}", "bench.num_prompts=1"), target)
        == []
    )
    assert before_run_problems(_cfg(target, "bench.prompts=gsm8k"), target) == []


def test_the_preflight_inputs_check_and_eagle3_run_report_it(target, tmp_path, monkeypatch):
    from cli.run import check_target
    from eagle3.serve import preflight

    cfg = _cfg(target, f"bench.prompts={tmp_path / 'none.jsonl'}")
    monkeypatch.setattr(
        preflight, "run_preflight", lambda *a, **k: preflight.PreflightReport("reference", [], [])
    )
    report = preflight.preflight_of_run(cfg, None, None)
    assert report.checks[0].name == "inputs" and report.checks[0].status == "failed"
    assert [p.code for p in report.problems] == ["BENCH_PROMPTS"]
    with pytest.raises(ConfigError, match=r"^BENCH_PROMPTS: bench.prompts: .*\(not found\)$"):
        check_target(cfg)


def _tiny_cached(cache, cfg, vocab):
    from eagle3.assets import tiny_random_dir

    d = tiny_random_dir(cache, cfg.target.tiny)
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": 8, "vocab_size": vocab}))
    return d


def test_eagle3_run_checks_a_builtin_targets_vocabulary_when_it_is_cached(tmp_path, monkeypatch):
    import eagle3.assets as assets
    from cli.run import check_target

    def never(*a, **k):
        raise AssertionError("check_target must not prepare a target")

    monkeypatch.setattr(assets, "prepare_tiny_random", never)
    monkeypatch.setattr(assets, "prepare_smollm2", never)
    ov = [
        "target.kind=tiny-random",
        "target.tiny.num_hidden_layers=8",
        f"paths.cache_dir={tmp_path}",
        "train.draft_vocab_size=4096",
    ]
    cfg = load_config(None, ov)
    check_target(cfg)  # not cached yet: nothing to read, nothing prepared
    _tiny_cached(tmp_path, cfg, 1000)
    with pytest.raises(
        ConfigError,
        match=r"^DRAFT_VOCAB_SIZE: train.draft_vocab_size: expected "
        r"2 <= value < target vocab_size 1000, got 4096$",
    ):
        check_target(cfg)
    check_target(load_config(None, [*ov, "train.draft_vocab_size=500"]))


def test_prepared_target_finds_the_cached_smollm2_folder(tmp_path):
    from eagle3.assets import SMOLLM2_DIRNAME, prepared_target

    cfg = load_config(None, ["target.kind=smollm2", f"paths.cache_dir={tmp_path}"])
    assert prepared_target(cfg) is None
    d = tmp_path / "models" / SMOLLM2_DIRNAME
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    assert prepared_target(cfg) == d
