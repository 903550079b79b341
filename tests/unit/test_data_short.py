"""An extraction that gets fewer usable conversations than ``data.num_conversations`` asks says
so (``DATA_SHORT``): a data-scaling point would otherwise be labelled with a size it never had."""

import json
import logging

import pytest

from eagle3.config import load_config
from eagle3.errors import DataError
from eagle3.extract.stage import extract
from tests.conftest import CONFIGS


def _file(path, n):
    path.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"c{i}",
                    "conversations": [
                        {"from": "human", "value": f"question {i}?"},
                        {"from": "gpt", "value": f"answer number {i}."},
                    ],
                }
            )
            + "\n"
            for i in range(n)
        )
    )
    return path


def _extract(tmp_path, n_asked, caplog, *more):
    cfg = load_config(
        CONFIGS / "tiny-random.yaml",
        [
            f"paths.runs_dir={tmp_path / 'runs'}",
            "data.source=file",
            f"data.path={_file(tmp_path / 'five.jsonl', 5)}",
            f"data.num_conversations={n_asked}",
            "data.max_seq_len=64",
            *more,
        ],
    )
    with caplog.at_level(logging.WARNING, logger="eagle3.extract.stage"):
        m = extract(cfg, tmp_path / f"x{n_asked}", progress=False)
    return m, [r.getMessage() for r in caplog.records if "DATA_SHORT" in r.getMessage()]


def test_fewer_conversations_than_asked_is_said(tmp_path, caplog):
    m, said = _extract(tmp_path, 12, caplog)
    assert m["counts"]["samples"] == 5
    assert len(said) == 1 and said[0].startswith(
        f"DATA_SHORT: data.num_conversations=12 asked, {tmp_path / 'five.jsonl'} gives 5 usable "
        "conversations (5 records, 0 skipped: {})"
    )


def test_with_on_short_fail_it_stops_before_any_hidden_state(tmp_path, caplog):
    with pytest.raises(DataError) as e:
        _extract(tmp_path, 12, caplog, "data.on_short=fail")
    assert str(e.value).startswith(
        f"DATA_SHORT: data.num_conversations=12 asked, {tmp_path / 'five.jsonl'} gives 5 usable "
        "conversations (5 records, skipped: {}); data.on_short=fail stops before extraction")
    assert not (tmp_path / "x12").exists()
    caplog.clear()
    m, said = _extract(tmp_path, 5, caplog, "data.on_short=fail")
    assert m["counts"]["samples"] == 5 and said == []


def test_as_many_as_asked_is_not(tmp_path, caplog):
    m, said = _extract(tmp_path, 5, caplog)
    assert m["counts"]["samples"] == 5 and said == []


def test_blank_answers_trained_as_they_are_are_warned_about_and_kept(tmp_path, caplog,
                                                                     smollm2_dir):
    from transformers import AutoTokenizer

    from eagle3.extract.plan import build_plan

    src = _file(tmp_path / "five.jsonl", 5)
    lines = src.read_text().splitlines()
    rec = json.loads(lines[2])
    rec["conversations"][1]["value"] = " \u200b "
    src.write_text("\n".join([*lines[:2], json.dumps(rec), *lines[3:]]) + "\n")
    cfg = load_config(CONFIGS / "tiny-random.yaml", ["data.source=file", f"data.path={src}",
                                                      "data.num_conversations=5",
                                                      "data.val_fraction=0"])
    with caplog.at_level(logging.WARNING, logger="eagle3.extract.plan"):
        plan = build_plan(cfg, AutoTokenizer.from_pretrained(str(smollm2_dir)))
    said = [r.getMessage() for r in caplog.records if "BLANK_ANSWERS" in r.getMessage()]
    assert len(plan.ids) == 5  # kept: the selection is what it was
    assert len(said) == 1 and "1 of the 5 selected conversations" in said[0] and "c2" in said[0]


def test_the_run_summary_line_says_data_short_with_on_short_warn(tmp_path, caplog):
    from flows.common import data_line

    _extract(tmp_path, 12, caplog)
    assert data_line(tmp_path / "x12").endswith(
        "; DATA_SHORT: 12 asked (data.num_conversations)")
    _extract(tmp_path, 5, caplog)
    assert "DATA_SHORT" not in data_line(tmp_path / "x5")
