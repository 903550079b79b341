"""SIGTERM to ``eagle3 run`` while both drafts are served and benchmarked (deploy-bench, in worker
threads): the run stops its engines at once, unwinds, and exits 128 + 15 well within the stop grace
time, without tracebacks of a Prefect shut down under running threads and without starting a
second Prefect server on the way out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import CONFIGS, REPO

pytestmark = pytest.mark.slow


def _engines(pid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if "refengine.launch_server" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_sigterm_during_deploy_bench_ends_promptly_with_143(tmp_path, ephemeral_prefect):
    cmd = [
        sys.executable,
        "-m",
        "cli.main",
        "run",
        str(CONFIGS / "tiny-random.yaml"),
        "-o",
        f"paths.runs_dir={tmp_path / 'runs'}",
        "-o",
        "bench.baseline_untrained=true",
        "-o",
        "bench.num_prompts=40",
        "-o",
        "bench.max_new_tokens=64",
    ]
    log_path = tmp_path / "run.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 400
        engines: list[psutil.Process] = []
        while time.monotonic() < deadline and proc.poll() is None:
            engines = _engines(proc.pid)
            if len(engines) >= 2 and "deploy-bench" in log_path.read_text():
                break
            time.sleep(0.5)
        assert len(engines) >= 2, f"no two engines seen; log:\n{log_path.read_text()[-3000:]}"
        time.sleep(3)  # both past the gate, benchmarking
        everything = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        rc = proc.wait(timeout=60)
        took = time.monotonic() - signalled
        text = log_path.read_text()
        assert rc == 128 + signal.SIGTERM, f"exit {rc}; log:\n{text[-3000:]}"
        assert took < 25, f"took {took:.1f} s (the stop grace is 30 s); log:\n{text[-3000:]}"
        assert "did not stop within" not in text
        assert "cannot schedule new futures after interpreter shutdown" not in text, text[-3000:]
        assert text.count("Starting temporary server") <= 1, text[-3000:]
        assert "ended by SIGTERM" in text
        _, alive = psutil.wait_procs(everything, timeout=20)
        assert not alive, f"left behind: {[(p.pid, p.cmdline()[:4]) for p in alive]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
