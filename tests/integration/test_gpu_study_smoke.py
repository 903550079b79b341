"""``lab/gpu_study.py --tiny`` on the CPU: regeneration, a two-point sweep through the pipeline with
the Prefect flow and the MLflow store, the offline evaluation, the speedup benchmark of the best
point and the report — every stage path of the GPU study, at tiny sizes. Then ``--resume`` finds
every stage done."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

PLAN = {
    "data": {"as-is": [], "regenerated": ["data.source=file", "data.path={regen}"]},
    "schedules": {"cosine-1ep": ["train.schedule=epochs", "train.epochs=1"]},
    "points": [["regenerated", 8, "cosine-1ep"], ["as-is", 8, "cosine-1ep"]],
}


def _seed_work_cache(work, smollm2_dir, tiny_target_dir):
    """The study keeps its assets under ``<work>/cache``: link the asset cache's converted SmolLM2
    (the tiny target's tokenizer; converting its GGUF again costs ~20 s per call) and tiny target
    there (both only read)."""
    models = work / "cache" / "models"
    models.mkdir(parents=True)
    for src in (smollm2_dir, tiny_target_dir):
        (models / src.name).symlink_to(src, target_is_directory=True)


def _assets(folder):
    """``--assets``: the first MT-Bench question of each of the 8 categories (16 turns for the
    offline evaluation instead of 160; the speedup stage's prompts come from here too)."""
    from eagle3.assets import mtbench_questions

    firsts = {}
    for q in mtbench_questions():
        firsts.setdefault(q["category"], q)
    folder.mkdir()
    (folder / "question.jsonl").write_text("".join(json.dumps(q) + "\n" for q in firsts.values()))
    return folder


def test_gpu_study_tiny_runs_every_stage_and_writes_gpu_study_json(
    tmp_path, tiny_target_dir, smollm2_dir, sharegpt_path
):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    out = tmp_path / "out"
    for work in ("w", "w2"):
        _seed_work_cache(tmp_path / work, smollm2_dir, tiny_target_dir)
    cmd = [
        sys.executable,
        "lab/gpu_study.py",
        "--tiny",
        "--device",
        "cpu",
        "--work",
        str(tmp_path / "w"),
        "--out",
        str(out),
        "--plan",
        str(plan),
        "--quiet",
        "--store-copy",
        "--assets",
        str(_assets(tmp_path / "a")),
        # held-out first turns measured at each evaluation: the development figure and curve
        "--dev-holdout",
        "4",
        "--dev-prompts",
        "4",
    ]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    study = json.loads((out / "gpu_study.json").read_text())
    assert {p["point"] for p in study["points"]} == {
        "regenerated-n8-cosine-1ep",
        "as-is-n8-cosine-1ep",
    }
    for p in study["points"]:
        assert 1.0 <= p["offline_eval"] <= 4.0 and p["optimizer_steps"] > 0, p
        assert (
            1.0 <= p["served"] <= 4.0
            and p["eval"]["mtbench2"]["acceptance_length"] == p["offline_eval"]
        )
        assert 1.0 <= p["dev"] <= 4.0 and p["dev_curve"].count("@") == 3, p
        assert {"turn1.acceptance_length", "turn2.acceptance_length"} <= set(p["eval"]["mtbench2"])
    assert study["best"]["point"] in {p["point"] for p in study["points"]}
    assert study["speedup"]["file"].endswith("gpu_speedup.json")
    report = (out / "sweep_report.md").read_text()
    assert "## eagle3 decide" in report and "regenerated" in report
    assert "## Where simulated and measured acceptance part" in report
    assert (out / "mlflow_store.tar.xz").stat().st_size > 10_000
    again = subprocess.run(
        cmd + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0 and again.stdout.count("done in an earlier call") == 7, (
        again.stdout[-3000:]
    )
    # a fresh machine's call reuses the regenerated file the first call carried back instead of
    # regenerating
    carried = out / "regenerated.jsonl.xz"
    assert carried.stat().st_size > 100 and (out / "regenerated.jsonl.manifest.json").is_file()
    fresh = [a if a != str(tmp_path / "w") else str(tmp_path / "w2") for a in cmd]
    fresh = [a if a != str(out) else str(tmp_path / "out2") for a in fresh]
    reuse = subprocess.run(
        fresh + ["--regen-file", str(carried), "--until", "regen"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert reuse.returncode == 0 and "regen: reusing " in reuse.stdout + reuse.stderr, (
        reuse.stdout[-3000:],
        reuse.stderr[-3000:],
    )
    assert (tmp_path / "w2" / "regenerated.jsonl").read_bytes() == (
        tmp_path / "w" / "regenerated.jsonl"
    ).read_bytes()
