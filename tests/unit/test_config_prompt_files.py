"""The pre-flight's ``inputs`` check (and ``eagle3 run``'s early refusal) loads a bench prompts
file and a dev prompts file with the loaders the benchmark and the dev acceptance use, so a file
they would refuse (empty, records without prompt text, too few prompts) fails before any stage."""

from __future__ import annotations

import pytest

from eagle3.config_checks import before_run_problems
from eagle3.errors import ConfigError
from tests.support.handover import hf_target, target_cfg


@pytest.fixture
def target(tmp_path):
    return hf_target(tmp_path)


def _cfg(target, *ov):
    return target_cfg(target, "train.draft_vocab_size=500", *ov)


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "no prompts found"),
        ('{"foo": "bar"}\n', "record 0: expected a non-empty 'prompt', 'text' or 'question'"),
        ('{"prompt": "  "}\n', "record 0: expected a non-empty"),
    ],
)
def test_a_bench_prompts_file_the_benchmark_refuses(target, tmp_path, text, says):
    f = tmp_path / "p.jsonl"
    f.write_text(text)
    got = before_run_problems(_cfg(target, f"bench.prompts={f}", "bench.num_prompts=1"), target)
    assert len(got) == 1, got
    assert got[0].startswith(
        f"BENCH_PROMPTS_FILE: bench.prompts: expected a prompts file the "
        f"benchmark reads (bench.num_prompts 1), got {str(f)!r}: "
    )
    assert says in got[0]


def test_too_few_bench_prompts_for_num_prompts(target, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    got = before_run_problems(_cfg(target, f"bench.prompts={f}", "bench.num_prompts=3"), target)
    assert len(got) == 1 and got[0].startswith("BENCH_PROMPTS_FILE: ")
    assert "3 asked, only 2 available" in got[0]
    assert (
        before_run_problems(_cfg(target, f"bench.prompts={f}", "bench.num_prompts=2"), target) == []
    )


@pytest.mark.parametrize("text", ["", '{"foo": "bar"}\n', b"\x97\x00binary"])
def test_a_dev_prompts_file_the_dev_acceptance_refuses(target, tmp_path, text):
    f = tmp_path / "dev.jsonl"
    f.write_bytes(text) if isinstance(text, bytes) else f.write_text(text)
    cfg = _cfg(target, "train.select_best_by=measured", f"train.dev_prompts_file={f}")
    got = before_run_problems(cfg, target)
    assert len(got) == 1, got
    assert got[0].startswith(
        f"DEV_PROMPTS_FILE: train.dev_prompts_file: expected a prompts file "
        f"the dev acceptance reads, got {str(f)!r}: "
    )
    if isinstance(text, bytes):
        assert "expected UTF-8 text (JSON, JSONL or one prompt a line)" in got[0]
    f.write_text('{"prompt": "hi"}\n')
    assert before_run_problems(cfg, target) == []


def test_the_preflight_and_eagle3_run_refuse_an_empty_bench_file(target, tmp_path, monkeypatch):
    from cli.run import check_target
    from eagle3.serve import preflight

    f = tmp_path / "empty.jsonl"
    f.write_text("")
    cfg = _cfg(target, f"bench.prompts={f}")
    monkeypatch.setattr(
        preflight, "run_preflight", lambda *a, **k: preflight.PreflightReport("reference", [], [])
    )
    report = preflight.preflight_of_run(cfg, None, None)
    assert report.checks[0].name == "inputs" and report.checks[0].status == "failed"
    assert [p.code for p in report.problems] == ["BENCH_PROMPTS_FILE"]
    with pytest.raises(ConfigError, match=r"^BENCH_PROMPTS_FILE: bench.prompts: .*no prompts"):
        check_target(cfg)
