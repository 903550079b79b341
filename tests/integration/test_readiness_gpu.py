"""The GPU progress signal with a real GPU (skipped without one; run on the lent H200): the story's
silent server with loaded GPUs (memory held, 0 % utilisation) is stalled; a server warming up on the
GPU with a silent log and no CPU signal (pid not given) is waited for until ready."""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager

import pytest

from eagle3.procs import free_port, start_group, terminate_tree
from eagle3.serve.readiness import wait_ready
from tests.support.fake_servers import fake_argv, leftovers

if shutil.which("nvidia-smi") is None:
    pytest.skip("needs an NVIDIA GPU (no nvidia-smi)", allow_module_level=True)
torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


@contextmanager
def start_fake(behaviour, log_dir, *extra):
    """Like tests.support.fake_servers.start_fake, without the launcher (the GPU image has no
    pydantic)."""
    port = free_port()
    log = log_dir / f"{behaviour}.log"
    proc = start_group(
        fake_argv(behaviour, port, *extra), {**os.environ, "PYTHONUNBUFFERED": "1"}, log
    )
    proc.url, proc.port, proc.log_path = f"http://127.0.0.1:{port}", port, log
    try:
        yield proc
    finally:
        terminate_tree(proc, grace_s=2.0)


GATE = dict(
    timeout_s=60.0, stall_timeout_s=4.0, poll_interval_s=0.5, probe_timeout_s=10.0, use_gpu=True
)


def test_loaded_idle_gpu_is_stalled_with_a_gpu_snapshot(tmp_path):
    with start_fake("gpu_hang", tmp_path, "--gpu-gib", "8", "--max-life", "100") as srv:
        res = wait_ready(
            srv.url, pid=srv.pid, log_path=srv.log_path, diagnostics_dir=tmp_path / "d", **GATE
        )
        print(res.summary())
        assert res.verdict == "stalled", res.summary()
        assert "gpu" in res.signal_sources
        gpus = json.loads((tmp_path / "d" / "gpu.json").read_text())
        assert max(g["mem_used_mib"] for g in gpus) >= 8 * 1024
        assert "NVIDIA" in (tmp_path / "d" / "gpu.txt").read_text()
    assert leftovers(srv.port) == []


def test_gpu_warmup_with_silent_log_is_ready_on_the_gpu_signal_alone(tmp_path):
    with start_fake(
        "gpu_warmup", tmp_path, "--gpu-gib", "1", "--warm-s", "10", "--max-life", "100"
    ) as srv:
        res = wait_ready(
            srv.url, pid=None, log_path=srv.log_path, diagnostics_dir=tmp_path / "d", **GATE
        )
        print(res.summary())
        assert res.verdict == "ready", res.summary()
        assert res.phases["warming"] > GATE["stall_timeout_s"] and res.signals["gpu"] > 0
    assert leftovers(srv.port) == []
