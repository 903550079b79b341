"""Several extraction workers (``extract.num_gpus > 1``, backend ``hf``): one spawned process per
device. Each (:func:`_worker_main`) logs to ``<out>/.progress/workers/worker-<k>.log`` and reports
status in ``worker-<k>.json`` (``eagle3.workers``: started, ready, step, done | failed). The
parent holds them to ``extract.startup_timeout_s`` and ``extract.stall_timeout_s``; a missed
deadline saves live stacks (``worker-<k>.stack.txt``), ends all workers and raises
:class:`eagle3.errors.RankFailed`. A failed worker ends the others: its project error is re-raised,
anything else is a RankFailed naming worker, device, exit and log. Committed shards are kept. After
a clean run the folder is removed (``.progress/`` is part of the content hash).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable

from eagle3.errors import RankFailed
from eagle3.extract.hf_backend import WorkerJob, run_shards
from eagle3.workers import (Deadlines, WorkerStatus, describe, dump_stacks, exit_text,
                            last_statuses, overdue, read_statuses, reraise_failed)

PREFIX = "worker"


def _worker_main(job: WorkerJob, status_dir: str, index: int) -> None:
    status = WorkerStatus(status_dir, index, prefix=PREFIX)
    status.mark("started", device=job.device, shards=[s.index for s in job.shards])
    fd = os.open(Path(status_dir) / f"{PREFIX}-{index}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    tokens = 0

    def progress(n: int) -> None:
        nonlocal tokens
        tokens += n
        status.progress(tokens)

    try:
        import torch

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if job.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(job.device))
        run_shards(job, on_progress=progress, on_ready=lambda: status.mark("ready"))
    except BaseException as e:  # noqa: BLE001 - recorded for the parent, then re-raised
        status.failed(e)
        raise
    status.mark("done", step=tokens)


def run_data_parallel(jobs: list[WorkerJob], poll: Callable[[], None], *, status_dir: Path,
                      startup_s: float, stall_s: float, poll_interval_s: float = 0.5) -> None:
    """Run one spawned process per job (one per device); ``poll()`` is called while they run and
    once after all finished, before ``status_dir`` (the workers' final status files) is removed.
    Raises the first failing worker's Eagle3Error (class and message), or RankFailed (a missed
    deadline, a signal or a non-project error). Every worker is ended before it returns or raises;
    committed shards stay."""
    import multiprocessing as mp

    shutil.rmtree(status_dir, ignore_errors=True)
    status_dir.mkdir(parents=True)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker_main, args=(j, str(status_dir), k),
                         name=f"eagle3-extract-{k}") for k, j in enumerate(jobs)]
    deadlines = Deadlines(startup_s, stall_s, stall_s, keys=("startup_timeout_s", "stall_timeout_s",
                                                             "stall_timeout_s"))
    started = time.time()
    try:
        for p in procs:
            p.start()
        while True:
            for p in procs:
                p.join(timeout=poll_interval_s / len(procs))
            poll()
            statuses = read_statuses(status_dir, len(jobs), prefix=PREFIX)
            bad = [k for k, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if bad:
                _raise_failed(bad[0], procs[bad[0]].exitcode, jobs, statuses, status_dir)
            if all(p.exitcode == 0 for p in procs):
                break
            missed = overdue(statuses, launched_at=started, now=time.time(), deadlines=deadlines)
            if missed is not None:
                stacks = dump_stacks(statuses, status_dir, prefix=PREFIX)
                msg = describe(missed, section="extract", noun="worker", total=len(jobs),
                               logs=_logs(status_dir, len(jobs)), stacks=stacks)
                raise RankFailed(f"extraction: {msg}. Committed shards are kept: a re-run extracts "
                                 "the rest", ranks=missed.workers, kind=missed.kind,
                                 logs=_logs(status_dir, len(jobs)))
    finally:
        _end(procs)
    poll()  # every worker's final status ("done") is in place now
    shutil.rmtree(status_dir, ignore_errors=True)


def _logs(status_dir: Path, n: int) -> dict[int, list[Path]]:
    return {k: [status_dir / f"{PREFIX}-{k}.log"] for k in range(n)}


def _raise_failed(k: int, code: int, jobs: list[WorkerJob], statuses: dict,
                  status_dir: Path) -> None:
    s = statuses.get(k) or {}
    reraise_failed({k: s})
    last = last_statuses(statuses, "worker", time.time(), lambda j: jobs[j].device)
    log = status_dir / f"{PREFIX}-{k}.log"
    tail = log.read_text(errors="replace")[-1500:] if log.is_file() else ""
    raise RankFailed(f"extraction: worker {k} of {len(jobs)} ({jobs[k].device}, shards "
                     f"{[sh.index for sh in jobs[k].shards][:8]}) failed ({exit_text(code)}); "
                     f"expected exit code 0. Last status: {last}. Log: {log}. Committed shards "
                     "are kept: a re-run extracts the rest"
                     + (f"\n--- last lines of {log} ---\n{tail}" if tail else ""),
                     ranks=[k], kind="failed" if s.get("phase") == "failed" else "died",
                     logs=_logs(status_dir, len(jobs)))


def _end(procs) -> None:
    """SIGTERM every live worker started here, 10 s to exit, then SIGKILL."""
    live = [p for p in procs if p.pid is not None and p.exitcode is None]
    for p in live:
        p.terminate()
    deadline = time.monotonic() + 10.0
    for p in live:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in live:
        if p.exitcode is None:
            p.kill()
            p.join(timeout=5.0)
