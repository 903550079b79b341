"""What a stage would refuse at its start, from files only, is reported by the pre-flight
(``eagle3 preflight`` and the pipeline's preflight task both run ``preflight_of_run``) through
:func:`eagle3.config_checks.before_run_problems`, which calls each check's one home."""

from __future__ import annotations

import pytest

from eagle3.config_checks import before_run_problems
from tests.support.handover import hf_target, target_cfg


@pytest.fixture
def target(tmp_path):
    return hf_target(tmp_path)


def _cfg(target, *ov):
    return target_cfg(target, *ov)


def test_a_fitting_config_has_no_problem(target):
    assert before_run_problems(_cfg(target, "train.draft_vocab_size=500"), target) == []


def test_aux_layer_ids_beyond_the_targets_layers(target):
    got = before_run_problems(
        _cfg(target, "extract.aux_layer_ids=[1,4,9]", "train.draft_vocab_size=500"), target
    )
    assert len(got) == 1 and got[0].startswith(
        "AUX_LAYER_IDS: extract.aux_layer_ids: ids [9] out of range for a target with 8 layers"
    )


def test_a_draft_vocabulary_not_below_the_targets(target):
    got = before_run_problems(_cfg(target, "train.draft_vocab_size=4096"), target)
    assert got == [
        "DRAFT_VOCAB_SIZE: train.draft_vocab_size: expected 2 <= value < target "
        "vocab_size 1000, got 4096"
    ]
    cfg = _cfg(target, "train.draft_vocab_size=4096")
    assert before_run_problems(cfg, None) == []  # no readable target config: not checked


def test_a_missing_dev_prompts_file(target, tmp_path):
    missing = tmp_path / "none.txt"
    got = before_run_problems(
        _cfg(
            target,
            "train.draft_vocab_size=500",
            "train.select_best_by=measured",
            f"train.dev_prompts_file={missing}",
        ),
        target,
    )
    assert got == [
        f"DEV_PROMPTS_FILE: train.dev_prompts_file: expected a prompts file (JSONL, "
        f"JSON or text: the eagle3 bench --prompts FILE formats), got "
        f"{str(missing)!r} (not found)"
    ]


def test_a_missing_data_file(target, tmp_path):
    got = before_run_problems(
        _cfg(
            target,
            "train.draft_vocab_size=500",
            "data.source=file",
            f"data.path={tmp_path / 'conv.jsonl'}",
        ),
        target,
    )
    assert len(got) == 1 and got[0].startswith("DATA_PATH: data.path: expected a conversations")


def test_the_preflight_reports_them_first(target, monkeypatch):
    from eagle3.serve import preflight

    monkeypatch.setattr(
        preflight, "run_preflight", lambda *a, **k: preflight.PreflightReport("reference", [], [])
    )
    bad = _cfg(target, "train.draft_vocab_size=4096", "extract.aux_layer_ids=[1,9]")
    report = preflight.preflight_of_run(bad, None, None)
    assert [c.name for c in report.checks] == ["inputs"] and not report.passed
    assert [p.code for p in report.problems] == ["AUX_LAYER_IDS", "DRAFT_VOCAB_SIZE"]
    good = preflight.preflight_of_run(_cfg(target, "train.draft_vocab_size=500"), None, None)
    assert good.passed and good.checks[0].status == "passed"


def test_eagle3_run_refuses_a_missing_dev_prompts_file_before_prefect_starts(target, tmp_path):
    from cli.run import check_target
    from eagle3.errors import ConfigError

    missing = tmp_path / "none.txt"
    cfg = _cfg(
        target,
        "train.draft_vocab_size=500",
        "train.select_best_by=measured",
        f"train.dev_prompts_file={missing}",
    )
    with pytest.raises(
        ConfigError,
        match=r"^DEV_PROMPTS_FILE: train.dev_prompts_file: .*"
        r"\(not found\)$",
    ):
        check_target(cfg)
    check_target(_cfg(target, "train.draft_vocab_size=500"))  # a fitting config passes


def test_an_uncoded_stage_message_gets_its_code_even_when_capitalised(target, monkeypatch):
    from eagle3.errors import ConfigError
    from eagle3.extract import precheck as stage

    def refuse(cfg):
        raise ConfigError("Aux ids [9] out of range")

    monkeypatch.setattr(stage, "check_before_run", refuse)
    got = before_run_problems(_cfg(target, "train.draft_vocab_size=500"), target)
    assert got == ["AUX_LAYER_IDS: Aux ids [9] out of range"]
