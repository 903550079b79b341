"""benchmarks/study_speedup.py: a speedup measured by a direct gpu_speedup.py call joins gpu_study.json only when
it was measured on the study's best draft and device."""

import json

import pytest

from benchmarks.study_speedup import add_speedup, main

STUDY = {"device": "NVIDIA H200", "best": {"point": "regenerated-n3000-cosine-20ep"}, "served_speedup": None,
         "in_process_speedup": None, "speedup": None, "points": [{"point": "regenerated-n3000-cosine-20ep"}]}


def _speedup(draft="/tmp/study/runs/smollm2-gpu-regenerated-n3000-cosine-20ep/serving", device="NVIDIA H200",
             ratio=1.469):
    return {"settings": {"draft": draft}, "device": {"name": device},
            "summary": {"ratio_median": ratio, "acceptance_length": 2.04, "plain_tokens_per_s": 390.7,
                        "speculative_tokens_per_s": 572.6, "timings_ms": {"verify_ms": 2.81}},
            "http": {"by_concurrency": {"1": {"ratio": 1.383}, "4": {"ratio": 1.349}}}, "predicted": {"2.0": 1.43}}


def test_speedup_of_the_best_draft_fills_the_study_fields(tmp_path):
    study, sp = tmp_path / "gpu_study.json", tmp_path / "gpu_speedup.json"
    study.write_text(json.dumps(STUDY))
    sp.write_text(json.dumps(_speedup()))
    assert main([str(study), str(sp)]) == 0
    new = json.loads(study.read_text())
    assert new["in_process_speedup"] == 1.469 and new["served_speedup"] == 1.383
    assert new["speedup"]["served"]["4"]["ratio"] == 1.349 and new["speedup"]["acceptance_length"] == 2.04
    assert new["speedup"]["point"] == "regenerated-n3000-cosine-20ep" and "direct" in new["speedup"]["measured_by"]
    assert new["points"] == STUDY["points"]


@pytest.mark.parametrize("kw, match", [
    ({"draft": "/tmp/study/runs/smollm2-gpu-regenerated-n3000-cosine-3ep/serving"}, "settings.draft"),
    ({"device": "NVIDIA A100"}, "device.name"),
    ({"ratio": None}, "summary.ratio_median"),
])
def test_speedup_of_another_draft_or_device_is_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        add_speedup(STUDY, _speedup(**kw), "gpu_speedup.json")


def test_unreadable_file_exits_2_and_leaves_the_study_alone(tmp_path, capsys):
    study = tmp_path / "gpu_study.json"
    study.write_text(json.dumps(STUDY))
    (tmp_path / "bad.json").write_text("{cut")
    assert main([str(study), str(tmp_path / "bad.json")]) == 2
    assert "study_speedup:" in capsys.readouterr().err and json.loads(study.read_text()) == STUDY
