"""Progress signals without a server: log growth (minus the gate's own access-log lines), and the
GPU signal read through a stand-in ``nvidia-smi`` on PATH; the gate result's summary and MLflow
numbers."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from eagle3.serve.diagnostics import gpu_sample
from eagle3.serve.liveness import ProgressMonitor
from eagle3.serve.readiness import GateResult

FAKE_SMI = """#!{python}
import json, sys
state = json.load(open({state!r}))
if any(a.startswith("--query-gpu") for a in sys.argv):
    for i, g in enumerate(state["gpus"]):
        print(f"{{i}}, GPU-{{i}}, {{g['util']}}, {{g['mem']}}, 143771")
elif any(a.startswith("--query-compute-apps") for a in sys.argv):
    for uuid, pid in state.get("apps", []):
        print(f"{{uuid}}, {{pid}}")
else:
    print("fake nvidia-smi")
"""


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    state = tmp_path / "smi.json"
    exe = tmp_path / "bin" / "nvidia-smi"
    exe.parent.mkdir()
    exe.write_text(FAKE_SMI.format(python=sys.executable, state=str(state)))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")

    def set_gpus(gpus, apps=()):
        state.write_text(json.dumps({"gpus": gpus, "apps": list(apps)}))

    return set_gpus


def test_log_growth_ignores_the_gates_own_access_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("")
    mon = ProgressMonitor(log_path=log, use_gpu=False)
    with open(log, "a") as f:
        f.write(
            'INFO:     127.0.0.1:5555 - "GET /health_generate HTTP/1.1" 503 Service Unavailable\n'
            'INFO:     127.0.0.1:5556 - "POST /generate HTTP/1.1" 200 OK\n\n'
        )
    assert mon.sample() == []  # a hung server behind a live HTTP front-end only logs our polls
    # what SGLang 0.5.23's front-end prints while its scheduler is stopped
    with open(log, "a") as f:
        f.write(
            "[2026-11-30 10:01:02] Health check failed. Server couldn't get a response from "
            "detokenizer for last 20 seconds. tic start time: 10:00:42. "
            "last_heartbeat time: 10:00:40\n"
        )
    assert mon.sample() == []
    with open(log, "a") as f:
        f.write("Capturing batches (bs=128 avail_mem=60.1 GB)\n")
    assert mon.sample() == ["log"]
    assert mon.sample() == []  # nothing new
    assert mon.counts["log"] == 1 and mon.sources == ["log"]


def test_cpu_signal_needs_a_pid_and_real_work():
    mon = ProgressMonitor(pid=os.getpid(), use_gpu=False)
    assert mon.sample() == []  # first reading is the baseline
    x = 0
    for i in range(3_000_000):  # ~0.2 s of CPU in this process
        x += i * i
    assert "cpu" in mon.sample()


def test_gpu_signal_busy_or_memory_change_counts_idle_loaded_gpu_does_not(fake_smi, monkeypatch):
    monkeypatch.setattr("eagle3.serve.liveness.GPU_MIN_INTERVAL_S", 0.0)
    fake_smi([{"util": 0, "mem": 70000}, {"util": 0, "mem": 70000}])
    g = gpu_sample()
    assert [(x["index"], x["util_pct"], x["mem_used_mib"]) for x in g] == [
        (0, 0, 70000),
        (1, 0, 70000),
    ]
    mon = ProgressMonitor(use_gpu=True)
    assert mon.sources == ["gpu"]
    assert mon.sample() == []  # the story's hang: weights loaded, 0 % utilisation
    assert mon.sample() == []  # ... and memory unchanged
    fake_smi([{"util": 0, "mem": 71000}, {"util": 0, "mem": 70000}])
    assert mon.sample() == ["gpu"]  # memory moved (KV cache / CUDA graphs being allocated)
    fake_smi([{"util": 35, "mem": 71000}, {"util": 0, "mem": 70000}])
    assert mon.sample() == ["gpu"]  # kernels running


def test_gpu_signal_only_looks_at_the_servers_gpus_when_known(fake_smi, monkeypatch):
    monkeypatch.setattr("eagle3.serve.liveness.GPU_MIN_INTERVAL_S", 0.0)
    fake_smi([{"util": 0, "mem": 70000}, {"util": 90, "mem": 5000}], apps=[("GPU-0", os.getpid())])
    mon = ProgressMonitor(pid=os.getpid(), use_gpu=True, cpu_busy_fraction=1e9)  # cpu signal off
    assert mon.sample() == []  # GPU 1 is busy with someone else's job: not our progress


def test_summary_and_metrics():
    res = GateResult(
        verdict="stalled",
        url="http://127.0.0.1:1",
        detail="No progress signal (log) for 3.0 s.",
        phases={"launching": 0.5, "loading": 10.0, "warming": 3.2},
        elapsed_s=13.7,
        last_progress_s=10.5,
        signals={"log": 12, "cpu": 0, "gpu": 0},
        signal_sources=["log"],
        diagnostics_dir="/runs/x/deploy/diagnostics",
        log_tail="a\nLoad weight end.\n",
    )
    text = res.summary()
    assert text.startswith(
        "Server http://127.0.0.1:1: STALLED after 13.7 s (launching 0.5 s, loading 10.0 s"
    )
    assert "/runs/x/deploy/diagnostics" in text and "Load weight end." in text and "log 12" in text
    assert res.metrics() == {
        "gate_launching_s": 0.5,
        "gate_loading_s": 10.0,
        "gate_warming_s": 3.2,
        "gate_total_s": 13.7,
        "gate_ready": 0.0,
    }
    assert json.loads(json.dumps(res.to_dict()))["phases"]["warming"] == 3.2
