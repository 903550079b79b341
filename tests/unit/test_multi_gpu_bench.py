"""lab/multi_gpu.py keeps working on the CPU (``--tiny --device cpu``: 1 and 2 processes on gloo,
training through torchrun and extraction through spawned workers) and writes its JSON itself."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_multi_gpu_tiny_cpu_writes_both_kinds_with_efficiencies(tmp_path):
    out = tmp_path / "multi_gpu.json"
    r = subprocess.run(
        [
            sys.executable,
            "lab/multi_gpu.py",
            "--tiny",
            "--device",
            "cpu",
            "--gpus",
            "1,2",
            "--work",
            str(tmp_path / "w"),
            "--extract-dest",
            str(tmp_path / "x"),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["smoke_test"] is True and res["goal"] == 0.9 and res["host"]["device"] == "cpu"
    train, ext = res["train"], res["extract"]
    assert [(x["gpus"], x["distributed"]) for x in train["runs"]] == [(1, "none"), (2, "ddp")]
    assert all(x["tokens_per_s"] > 0 and x["optimizer_steps"] == 3 for x in train["runs"]), train[
        "runs"
    ]
    assert set(train["efficiency"]) == {"ddp/2"} and train["efficiency"]["ddp/2"] > 0
    assert [x["gpus"] for x in ext["runs"]] == [1, 2] and all(
        x["tokens_per_s"] > 0 for x in ext["runs"]
    )
    assert [len(x["workers"]) for x in ext["runs"]] == [1, 2]
    assert all(
        w["tokens"] == 4 * 64 for x in ext["runs"] for w in x["workers"]
    )  # 4 samples of 64 per worker
    assert set(ext["efficiency"]) == {f"{tmp_path / 'x'}/2"}
    assert "| 2 | ddp |" in r.stdout and "figures measure nothing" in r.stdout


def test_multi_gpu_refuses_unknown_kinds_and_modes(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "lab/multi_gpu.py",
            "--kinds",
            "train,serve",
            "--distributed",
            "zero",
            "--out",
            str(tmp_path / "o.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "unknown ['serve', 'zero']" in r.stderr, r.stderr[-2000:]
