"""Several processes for one training run, parent side: ``torchrun`` + DDP, followed from this process.

``train(cfg, ...)`` with ``train.num_gpus > 1`` (outside torchrun) calls :func:`launch`, which writes the
resolved config to ``<out_dir>/state/launch-config.yaml`` and runs::

    torchrun --standalone --nproc_per_node=N -m eagle3.train.worker --config C --data D --out O

Each process calls ``eagle3.train.stage.train`` again (now inside torchrun: ``LOCAL_RANK`` is set). The parent
follows ``metrics.jsonl`` and forwards each new record to ``on_metrics`` (so MLflow logging stays in the
caller's process), and re-raises a child's library error with its class and message (from
``state/launch-error.json``). Backend: NCCL on CUDA, gloo on CPU (``train.device=cpu``, for tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from eagle3 import errors
from eagle3.errors import Eagle3Error

ERROR_FILE = "launch-error.json"


def _forward_metrics(path: Path, pos: tuple[int, int], on_metrics) -> tuple[int, int]:
    """Send complete lines of ``metrics.jsonl`` after ``pos = (inode, byte offset)`` to ``on_metrics``.

    The trainer rewrites the file when it starts or resumes (a new inode): then it is read from the start,
    so records up to the resumed step may be forwarded twice. Returns the new position.
    """
    if not path.is_file():
        return pos
    with open(path, "rb") as f:
        ino = os.fstat(f.fileno()).st_ino
        offset = pos[1] if ino == pos[0] else 0
        f.seek(offset)
        chunk = f.read()
    end = chunk.rfind(b"\n") + 1
    for line in chunk[:end].splitlines():
        rec = json.loads(line)
        step = int(rec.pop("step"))
        rec.pop("kind", None)
        if on_metrics is not None:
            on_metrics(rec, step)
    return ino, offset + end


def launch(cfg, data_dir: Path, out_dir: Path, *, on_metrics=None, poll_s: float = 2.0) -> dict:
    """Run the training under torchrun with ``cfg.train.num_gpus`` processes; returns the manifest.

    Raises the child's Eagle3Error subclass with its message, or RuntimeError with the exit code and the
    tail of its output when it failed otherwise.
    """
    from eagle3.artifacts import read_manifest
    from eagle3.train.state import ensure_writable

    ensure_writable(out_dir)
    state = out_dir / "state"
    state.mkdir(parents=True, exist_ok=True)
    (state / ERROR_FILE).unlink(missing_ok=True)
    conf = state / "launch-config.yaml"
    conf.write_text(cfg.to_yaml())
    metrics = out_dir / "metrics.jsonl"
    offset = (metrics.stat().st_ino, metrics.stat().st_size) if metrics.is_file() else (-1, 0)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.train.num_gpus}",
           "-m", "eagle3.train.worker", "--config", str(conf), "--data", str(data_dir), "--out", str(out_dir)]
    log = state / "launch.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while proc.poll() is None:
                time.sleep(poll_s)
                offset = _forward_metrics(metrics, offset, on_metrics)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=30)
    _forward_metrics(metrics, offset, on_metrics)
    err = state / ERROR_FILE
    if err.is_file():
        e = json.loads(err.read_text())
        cls = getattr(errors, e.get("type", ""), None)
        raise (cls if isinstance(cls, type) and issubclass(cls, Eagle3Error) else RuntimeError)(e["message"])
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"torchrun training exited with code {proc.returncode}; log {log}:\n{tail}")
    return read_manifest(out_dir, kind="draft_checkpoint")
