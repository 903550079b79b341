"""Several processes for one training run, parent side: ``torchrun`` + DDP/FSDP, held to deadlines.

:func:`launch` (``train.num_gpus > 1`` outside torchrun) moves the previous launch's files to
``state/launch.prev/``, writes ``state/launch/config.yaml`` and runs (:func:`torchrun_command`)::

    torchrun --standalone --nproc-per-node=N --max-restarts=0 --rdzv-conf=join_timeout=<startup>
             --log-dir=state/launch/logs --tee=3 -m eagle3.train.worker --config C --data D --out O

Each process calls ``eagle3.train.stage.train`` again (NCCL on CUDA, gloo on CPU). The parent
forwards new ``metrics.jsonl`` records to ``on_metrics`` and holds the ranks (status files
``state/launch/rank-<r>.json``) to ``train.startup_timeout_s``, ``first_step_timeout_s`` and
``stall_timeout_s``: a missed deadline saves each live rank's stack (``rank-<r>.stack.txt``), ends
the job and raises :class:`eagle3.errors.RankFailed`. Rank logs:
``state/launch/logs/<run id>/attempt_0/<rank>/{stdout,stderr}.log``.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from eagle3.errors import ConfigError, RankFailed
from eagle3.workers import (STATUS_DIR_ENV, Deadlines, describe, dump_stacks, end_processes,
                            exit_text, last_statuses, overdue, read_statuses, reraise_failed,
                            status_pids)

LAUNCH_DIR = "launch"
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)"
                         r".*?exitcode\s*:\s*(-?\d+)", re.DOTALL)
_FAILED_LINE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")


def _forward_metrics(path: Path, pos: tuple[int, int], on_metrics) -> tuple[int, int]:
    """Send complete lines of ``metrics.jsonl`` after ``pos = (inode, byte offset)`` to
    ``on_metrics``; returns the new position. A rewritten file (new inode: the trainer started or
    resumed) is read from the start, so records up to the resumed step may be forwarded twice."""
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
        rec.pop("kind", None)
        if on_metrics is not None:
            on_metrics(rec, int(rec.pop("step")))
    return ino, offset + end


def torchrun_command(cfg, conf: Path, data_dir: Path, out_dir: Path, log_dir: Path) -> list[str]:
    """The torchrun command line of one launch (see the module docstring)."""
    t = cfg.train
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={t.num_gpus}", "--max-restarts=0",
            f"--rdzv-conf=join_timeout={math.ceil(t.startup_timeout_s)}", f"--log-dir={log_dir}",
            "--tee=3", "-m", "eagle3.train.worker", "--config", str(conf), "--data", str(data_dir),
            "--out", str(out_dir)]


def rank_logs(launch_dir: Path, world: int) -> dict[int, list[Path]]:
    """``{rank: [stdout.log, stderr.log]}`` that torchrun wrote for this launch (one node: rank =
    local rank)."""
    return {r: sorted(launch_dir.glob(f"logs/*/attempt_*/{r}/std*.log")) for r in range(world)}


def _fresh_launch_dir(state: Path) -> Path:
    cur, prev = state / LAUNCH_DIR, state / f"{LAUNCH_DIR}.prev"
    if cur.exists():
        shutil.rmtree(prev, ignore_errors=True)
        os.replace(cur, prev)
    cur.mkdir(parents=True)
    return cur


def launch(cfg, data_dir: Path, out_dir: Path, *, on_metrics=None, poll_s: float = 1.0) -> dict:
    """Run the training under torchrun with ``cfg.train.num_gpus`` processes; returns the manifest.
    Raises a rank's Eagle3Error subclass with its message; RankFailed when a rank did not arrive,
    made no first step, stalled or died (naming the first failed rank, every rank's last status,
    the logs and the checkpoint a re-run resumes from); ConfigError for more GPUs than visible."""
    import torch

    from eagle3.artifacts import read_manifest
    from eagle3.train.state import ensure_writable

    t = cfg.train
    want = t.device if t.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if want.startswith("cuda") and t.num_gpus > torch.cuda.device_count():
        raise ConfigError(f"train.num_gpus: expected at most {torch.cuda.device_count()} (the CUDA "
                          f"devices visible here), got {t.num_gpus}")
    ensure_writable(out_dir)
    ldir = _fresh_launch_dir(out_dir / "state")
    conf, metrics, log = ldir / "config.yaml", out_dir / "metrics.jsonl", ldir / "torchrun.log"
    conf.write_text(cfg.to_yaml())
    offset = (metrics.stat().st_ino, metrics.stat().st_size) if metrics.is_file() else (-1, 0)
    world = t.num_gpus
    deadlines = Deadlines(t.startup_timeout_s, t.first_step_timeout_s, t.stall_timeout_s)
    with open(log, "wb") as logf:
        proc = subprocess.Popen(torchrun_command(cfg, conf, data_dir, out_dir, ldir / "logs"),
                                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, STATUS_DIR_ENV: str(ldir)},
                                start_new_session=True)
        launched = time.time()
        try:
            while proc.poll() is None:
                time.sleep(poll_s)
                offset = _forward_metrics(metrics, offset, on_metrics)
                statuses = read_statuses(ldir, world)
                missed = overdue(statuses, launched_at=launched, now=time.time(),
                                 deadlines=deadlines)
                if missed is not None and proc.poll() is None:
                    stacks = dump_stacks(statuses, ldir)
                    end_processes(proc, status_pids(statuses))
                    logs = rank_logs(ldir, world)
                    msg = describe(missed, section="train", noun="rank", total=world, logs=logs,
                                   stacks=stacks)
                    raise RankFailed(f"train under torchrun: {msg}; torchrun's output: {log}. "
                                     f"{_resume_hint(cfg, out_dir)}",
                                     ranks=missed.workers, kind=missed.kind, logs=logs)
        finally:
            if proc.poll() is None:
                end_processes(proc, status_pids(read_statuses(ldir, world)))
    _forward_metrics(metrics, offset, on_metrics)
    _raise_on_failure(cfg, proc.returncode, ldir, log, out_dir)
    return read_manifest(out_dir, kind="draft_checkpoint")


def _resume_hint(cfg, out_dir: Path) -> str:
    from eagle3.train.state import list_checkpoints

    if not cfg.train.resume:
        return "train.resume=false: a re-run starts from step 0"
    ckpts = list_checkpoints(out_dir / "state")
    if not ckpts:
        return "No complete checkpoint was written yet: a re-run starts from step 0"
    return (f"The newest complete checkpoint is {ckpts[-1]}: re-running the same command resumes "
            "from it")


def _raise_on_failure(cfg, returncode: int, ldir: Path, log: Path, out_dir: Path) -> None:
    """After torchrun exited: a rank's project error (rank 0's first), else RankFailed for a
    non-zero exit."""
    world = cfg.train.num_gpus
    statuses = read_statuses(ldir, world)
    reraise_failed(statuses)
    if returncode == 0:
        return
    text = log.read_text(errors="replace") if log.is_file() else ""
    root, line = _ROOT_CAUSE.search(text), _FAILED_LINE.search(text)
    if root or line:
        culprits, code = ([int(root.group(1))], int(root.group(2))) if root else \
            ([int(line.group(2))], int(line.group(1)))
    else:
        phase = {r: (s or {}).get("phase") for r, s in statuses.items()}
        culprits = ([r for r, p in phase.items() if p not in ("done", "failed")]
                    or [r for r, p in phase.items() if p == "failed"])
        code = None
    logs = rank_logs(ldir, world)
    last = last_statuses(statuses, "rank", time.time())
    files = "; ".join(f"rank {r}: {', '.join(str(p) for p in logs[r]) or 'no log file'}"
                      for r in sorted(logs))
    how = exit_text(code, kill_hint=True) if code is not None else "stopped without an error record"
    failed = any((statuses.get(r) or {}).get("phase") == "failed" for r in culprits)
    err_logs = [p for r in culprits for p in logs.get(r, []) if p.name == "stderr.log"]
    tail = (f"\n--- last lines of {err_logs[0]} ---\n"
            + err_logs[0].read_text(errors="replace")[-1500:]) if err_logs else ""
    raise RankFailed(f"train under torchrun: {', '.join(f'rank {r}' for r in culprits)} of {world} "
                     f"failed first ({how}); expected every rank to exit 0, torchrun exited "
                     f"{returncode}. Last status: {last}. Logs: {files}; torchrun's output: "
                     f"{log}. {_resume_hint(cfg, out_dir)}{tail}",
                     ranks=culprits, kind="failed" if failed else "died", logs=logs)
