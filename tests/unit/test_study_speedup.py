"""lab/study_speedup.py: a speedup measured by a direct gpu_speedup.py call joins gpu_study.json
only when it was measured on the study's best draft (same sha256, or path + device with
--match-by-path) and device."""

import json

import pytest

from lab.study_speedup import add_speedup, draft_digest, main

POINT = "regenerated-n3000-cosine-20ep"
STUDY = {
    "device": "NVIDIA H200",
    "best": {"point": POINT, "serving_sha256": "ab" * 32},
    "served_speedup": None,
    "in_process_speedup": None,
    "speedup": None,
    "points": [{"point": POINT}],
}


def _speedup(
    draft=f"/tmp/study/runs/smollm2-gpu-{POINT}/serving",
    device="NVIDIA H200",
    ratio=1.469,
    sha="ab" * 32,
):
    return {
        "settings": {"draft": draft},
        "device": {"name": device},
        "draft_sha256": sha,
        "summary": {
            "ratio_median": ratio,
            "acceptance_length": 2.04,
            "plain_tokens_per_s": 390.7,
            "speculative_tokens_per_s": 572.6,
            "timings_ms": {"verify_ms": 2.81},
        },
        "http": {"by_concurrency": {"1": {"ratio": 1.383}, "4": {"ratio": 1.349}}},
        "predicted": {"2.0": 1.43},
    }


def test_speedup_of_the_best_draft_fills_the_study_fields(tmp_path):
    study, sp = tmp_path / "gpu_study.json", tmp_path / "gpu_speedup.json"
    study.write_text(json.dumps(STUDY))
    sp.write_text(json.dumps(_speedup()))
    assert main([str(study), str(sp)]) == 0
    new = json.loads(study.read_text())
    assert new["in_process_speedup"] == 1.469 and new["served_speedup"] == 1.383
    assert (
        new["speedup"]["served"]["4"]["ratio"] == 1.349
        and new["speedup"]["acceptance_length"] == 2.04
    )
    assert new["speedup"]["identity"] == "sha256" and "direct" in new["speedup"]["measured_by"]
    assert new["points"] == STUDY["points"]


@pytest.mark.parametrize(
    "kw, match",
    [
        (
            {"draft": f"/tmp/study/runs/smollm2-gpu-{POINT.replace('20ep', '3ep')}/serving"},
            "settings.draft",
        ),
        ({"sha": "cd" * 32}, "draft_sha256: expected"),
        ({"device": "NVIDIA A100"}, "device.name"),
        ({"ratio": None}, "summary.ratio_median"),
        ({"ratio": "fast"}, "summary.ratio_median"),
        ({"ratio": -1.0}, "summary.ratio_median"),
    ],
)
def test_speedup_of_another_draft_or_device_or_a_bad_ratio_is_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        add_speedup(STUDY, _speedup(**kw), "gpu_study.json", "gpu_speedup.json")


def test_files_without_digests_need_match_by_path_and_say_so():
    old_study = {**STUDY, "best": {"point": POINT}}
    with pytest.raises(ValueError, match="--match-by-path"):
        add_speedup(old_study, _speedup(sha=None), "s.json", "g.json")
    rec = add_speedup(old_study, _speedup(sha=None), "s.json", "g.json", match_by_path=True)[
        "speedup"
    ]
    assert rec["identity"] == "path" and rec["in_process_speedup"] == 1.469


def test_a_cpu_study_accepts_its_own_cpu_speedup():
    cpu = {**STUDY, "device": "cpu (x86_64)"}
    assert add_speedup(cpu, _speedup(device="cpu"), "s", "g")["in_process_speedup"] == 1.469


@pytest.mark.parametrize(
    "study, speedup, match",
    [
        ([], _speedup(), "gpu_study.json: expected a JSON object, got list"),
        (STUDY, None, "gpu_speedup.json: expected a JSON object, got NoneType"),
        (_speedup(), STUDY, "gpu_study.json: best.point"),  # the two files swapped
        (STUDY, {**_speedup(), "summary": []}, "summary: expected an object"),
    ],
)
def test_wrong_shapes_are_refused_naming_the_file(study, speedup, match):
    with pytest.raises(ValueError, match=match):
        add_speedup(study, speedup, "gpu_study.json", "gpu_speedup.json")


def test_unreadable_file_exits_2_names_it_and_leaves_the_study_alone(tmp_path, capsys):
    study = tmp_path / "gpu_study.json"
    study.write_text(json.dumps(STUDY))
    (tmp_path / "bad.json").write_text("{cut")
    assert main([str(study), str(tmp_path / "bad.json")]) == 2
    assert "bad.json: cannot be read as JSON" in capsys.readouterr().err
    assert json.loads(study.read_text()) == STUDY


def test_draft_digest_follows_the_weights(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"w1")
    (tmp_path / "config.json").write_text("{}")
    first = draft_digest(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"w2")
    assert (
        len(first) == 64
        and draft_digest(tmp_path) != first
        and draft_digest(tmp_path / "none") is None
    )
