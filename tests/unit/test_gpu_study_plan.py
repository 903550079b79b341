"""benchmarks/gpu_study.py's plan: a failed regen stage stops the sweep with its own message, not a config error."""

import argparse
import json

import pytest

from benchmarks.gpu_study import _plan


def _args(tmp_path, plan):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan))
    return argparse.Namespace(plan=str(f), tiny=False, all_size=100)


PLAN = {"data": {"as-is": [], "regenerated": ["data.source=file", "data.path={regen}"]},
        "schedules": {"c": ["train.epochs=1"]}, "points": [["regenerated", 0, "c"], ["as-is", 10, "c"]]}


def test_plan_without_a_regenerated_file_names_the_variants_that_need_it(tmp_path):
    with pytest.raises(RuntimeError, match=r"data variant\(s\) regenerated read the regenerated file"):
        _plan(_args(tmp_path, PLAN), "")


def test_plan_fills_in_the_regenerated_file_and_the_all_size(tmp_path):
    out = _plan(_args(tmp_path, PLAN), "/x/regen.jsonl")
    assert out["data"]["regenerated"] == ["data.source=file", "data.path=/x/regen.jsonl"]
    assert out["points"] == [["regenerated", 100, "c"], ["as-is", 10, "c"]]


def test_plan_without_regenerated_variants_needs_no_regen_file(tmp_path):
    plan = {"data": {"as-is": []}, "schedules": PLAN["schedules"], "points": [["as-is", 10, "c"]]}
    assert _plan(_args(tmp_path, plan), "")["points"] == [["as-is", 10, "c"]]
