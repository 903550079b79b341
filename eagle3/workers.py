"""Deadlines for the processes of one multi-process job (torchrun ranks, extraction workers), so
a hung start-up or step ends in a named error instead of silence.

Each worker writes ``<dir>/<prefix>-<k>.json`` (:class:`WorkerStatus`): ``{"index", "pid",
"phase", "step", "time", ...}``, ``time`` in seconds since the epoch (same host). Phases::

    started   running (written before the heavy imports)
    arriving  (training) waiting in torch.distributed.init_process_group
    ready     joined the process group / loaded the target
    step      progress: ``step`` = optimizer steps or tokens written; rewritten at most once per
              ``min_interval_s``, so a stale ``time`` means no progress
    done      finished its share
    failed    raised; ``error_type`` and ``message`` (the parent re-raises that project error)

The parent (:func:`overdue`) holds them to: start-up (all ``ready`` within ``startup_s`` of
launch); first step (all at ``step``/``done`` within ``first_step_s`` of the last ``ready``, model
build and ``train.compile`` included); stall (no progress older than ``stall_s``). A miss becomes
:class:`eagle3.errors.RankFailed` (:func:`describe`), after a ``py-spy dump`` of each live worker
(:func:`dump_stacks`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# set by the parent for its workers (training: every torchrun rank)
STATUS_DIR_ENV = "EAGLE3_STATUS_DIR"
PHASES = ("started", "arriving", "ready", "step", "done", "failed")


class WorkerStatus:
    """Worker ``index``'s status file under ``directory``, written by the worker. Writes go through
    a temporary sibling and ``os.replace`` (no fsync): readers never see half a file. Write errors
    are reported once on stderr then swallowed: a full disk must not crash the worker."""

    def __init__(self, directory: str | Path, index: int, *, prefix: str = "rank",
                 min_interval_s: float = 1.0):
        self.path = Path(directory) / f"{prefix}-{index}.json"
        self.index, self.min_interval_s = int(index), float(min_interval_s)
        self.fields: dict = {"index": self.index, "pid": os.getpid(), "phase": None, "step": None}
        self._last_write, self._warned = 0.0, False

    def mark(self, phase: str, **fields) -> None:
        """Record ``phase`` (one of :data:`PHASES`) with JSON-able ``fields``, written at once."""
        if phase not in PHASES:
            raise ValueError(f"worker phase: expected one of {PHASES}, got {phase!r}")
        self.fields.update(fields, phase=phase)
        if phase == "ready":
            self.fields["ready_time"] = time.time()
        self._write()

    def progress(self, step: int) -> None:
        """Record ``step``: written at once the first time, then once per ``min_interval_s``."""
        first = self.fields["phase"] != "step"
        self.fields.update(phase="step", step=int(step))
        if first or time.monotonic() - self._last_write >= self.min_interval_s:
            self._write()

    def failed(self, error: BaseException) -> None:
        self.mark("failed", error_type=type(error).__name__, message=str(error)[:4000])

    def _write(self) -> None:
        self._last_write = time.monotonic()
        self.fields["time"] = time.time()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.fields, default=str))
            os.replace(tmp, self.path)
        except OSError as e:
            if not self._warned:
                print(f"[eagle3] could not write the status file {self.path}: {e}", file=sys.stderr,
                      flush=True)
                self._warned = True


class _NoStatus:
    """What a worker started without a parent that watches it gets: every call does nothing."""

    def mark(self, *args, **kwargs) -> None:
        pass

    progress = failed = mark


_CURRENT: dict = {}


def rank_status():
    """This rank's :class:`WorkerStatus` (``RANK``) if ``EAGLE3_STATUS_DIR`` is set, else no-op."""
    key = (os.environ.get(STATUS_DIR_ENV), os.environ.get("RANK", "0"))
    if key not in _CURRENT:
        _CURRENT[key] = WorkerStatus(key[0], int(key[1])) if key[0] else _NoStatus()
    return _CURRENT[key]


def read_statuses(directory: str | Path, count: int, *,
                  prefix: str = "rank") -> dict[int, dict | None]:
    """``{k: status dict or None}`` for workers ``0..count-1`` (None: no readable file yet)."""
    out: dict[int, dict | None] = dict.fromkeys(range(count))
    for k in out:
        with contextlib.suppress(OSError, json.JSONDecodeError):
            out[k] = json.loads((Path(directory) / f"{prefix}-{k}.json").read_text())
    return out


@dataclass(frozen=True)
class Deadlines:
    """Seconds, each with the config key that sets it (named in the error)."""

    startup_s: float
    first_step_s: float
    stall_s: float
    keys: tuple[str, str, str] = ("startup_timeout_s", "first_step_timeout_s", "stall_timeout_s")


@dataclass
class Overdue:
    """A missed deadline: ``kind`` (``not_arrived`` | ``no_first_step`` | ``stalled``), ``workers``,
    ``deadline_s`` and ``key``, ``waited_s``."""

    kind: str
    workers: list[int]
    deadline_s: float
    key: str
    waited_s: float
    statuses: dict[int, dict | None] = field(default_factory=dict)


def overdue(statuses: dict[int, dict | None], *, launched_at: float, now: float,
            deadlines: Deadlines) -> Overdue | None:
    """The first deadline missed at ``now`` (s since the epoch), or None; ``launched_at``: job
    start. Workers ``done`` or ``failed`` are never overdue (the parent reads their exit)."""
    live = {k: s for k, s in statuses.items() if not (s and s.get("phase") in ("done", "failed"))}
    unready = [k for k, s in live.items()
               if not s or s.get("phase") in (None, "started", "arriving")]
    if unready:
        if now - launched_at <= deadlines.startup_s:
            return None
        # at fault: those that never reached the rendezvous, else those waiting there
        absent = [k for k in unready if not live[k] or live[k].get("phase") != "arriving"]
        return Overdue("not_arrived", absent or unready, deadlines.startup_s, deadlines.keys[0],
                       now - launched_at, statuses)
    ready_at = max((s.get("ready_time") or s.get("time") or launched_at)
                   for s in statuses.values() if s)
    no_step = [k for k, s in live.items() if s.get("phase") == "ready"]
    if no_step:
        if now - ready_at <= deadlines.first_step_s:
            return None
        return Overdue("no_first_step", no_step, deadlines.first_step_s, deadlines.keys[1],
                       now - ready_at, statuses)
    stale = [k for k, s in live.items() if now - float(s.get("time") or now) > deadlines.stall_s]
    if stale:
        since = min(float(live[k]["time"]) for k in stale)
        return Overdue("stalled", stale, deadlines.stall_s, deadlines.keys[2], now - since,
                       statuses)
    return None


def last_status(s: dict | None, now: float) -> str:
    """One worker's last status in words: its phase (or step, or error), how long ago, its pid."""
    if not s:
        return "no status file (the process never reached its first line, or it was never started)"
    phase = s.get("phase")
    what = {"step": f"step {s.get('step')}", "arriving": "waiting at the rendezvous",
            "failed": f"failed with {s.get('error_type')}: {str(s.get('message'))[:300]}"
            }.get(phase, phase)
    ago = f"{now - float(s['time']):.0f} s ago" if s.get("time") else "time unknown"
    return f"{what} ({ago}, pid {s.get('pid')})"


def last_statuses(statuses: dict[int, dict | None], noun: str, now: float,
                  label: Callable[[int], str] | None = None) -> str:
    """``"<noun> k[ (label)]: <last_status>; ..."`` over ``statuses`` in index order."""
    return "; ".join(f"{noun} {k}{f' ({label(k)})' if label else ''}: {last_status(s, now)}"
                     for k, s in sorted(statuses.items()))


def status_pids(statuses: dict[int, dict | None]) -> list[int]:
    """The pids the workers wrote into their status files."""
    return [int(s["pid"]) for s in statuses.values() if s and s.get("pid")]


def reraise_failed(statuses: dict[int, dict | None]) -> None:
    """Re-raise the project error a ``failed`` worker recorded (lowest index first), if any."""
    from eagle3 import errors

    for _, s in sorted(statuses.items()):
        if s and s.get("phase") == "failed":
            cls = getattr(errors, str(s.get("error_type")), None)
            if isinstance(cls, type) and issubclass(cls, errors.Eagle3Error):
                raise cls(s.get("message", ""))


def exit_text(code: int, kill_hint: bool = False) -> str:
    """``exit code N`` or ``ended by SIGNAME`` (``kill_hint``: likely causes of a SIGKILL added)."""
    if code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    kill = kill_hint and -code == signal.SIGKILL
    return f"ended by {name}{' (killed: the OOM killer, a preemption or a kill)' if kill else ''}"


def describe(od: Overdue, *, section: str, noun: str, total: int, logs: dict[int, list[Path]],
             stacks: dict[int, Path] | None = None, now: float | None = None) -> str:
    """Missed-deadline message: workers, deadline and key, last statuses, expected state, files."""
    now = time.time() if now is None else now
    who = ", ".join(f"{noun} {k}" for k in od.workers)
    verb, expected = {
        "not_arrived": ("did not arrive (ready) within", f"all {total} ready"),
        "no_first_step": ("made no first step within", f"all {total} past their first step"),
        "stalled": ("made no progress for more than",
                    f"progress from all {total} at least every {od.deadline_s:g} s")}[od.kind]
    actual = (f"{total - len(od.workers)} of {total}" if od.kind != "stalled"
              else f"{len(od.workers)} silent")
    files = "; ".join(f"{noun} {k}: {', '.join(str(p) for p in logs.get(k, [])) or 'no log file'}"
                      for k in sorted(od.statuses))
    msg = (f"{who} of {total} {verb} {section}.{od.key}={od.deadline_s:g} s (waited "
           f"{od.waited_s:.0f} s); expected {expected}, got {actual}. Last status: "
           f"{last_statuses(od.statuses, noun, now)}. Logs: {files}")
    if stacks:
        msg += ". Stacks: " + "; ".join(f"{noun} {k}: {p}" for k, p in sorted(stacks.items()))
    return msg


def dump_stacks(statuses: dict[int, dict | None], directory: Path, *,
                prefix: str = "rank") -> dict[int, Path]:
    """``py-spy dump`` of each live worker to ``<directory>/<prefix>-<k>.stack.txt``
    (:func:`eagle3.serve.diagnostics.pyspy_dump`: 20 s each, a failure written instead). Returns
    the files written."""
    from eagle3.procs import alive_pids
    from eagle3.serve.diagnostics import pyspy_dump

    out: dict[int, Path] = {}
    for k, s in statuses.items():
        pid = (s or {}).get("pid")
        if pid and alive_pids([int(pid)]):
            path = directory / f"{prefix}-{k}.stack.txt"
            with contextlib.suppress(OSError):
                path.write_text(pyspy_dump(int(pid)))
                out[k] = path
    return out


def end_processes(proc: subprocess.Popen, extra_pids: list[int], grace_s: float = 10.0) -> None:
    """End ``proc`` (``start_new_session=True``), its descendants and the trees of ``extra_pids``
    (torchrun workers in own sessions) with :func:`eagle3.procs.terminate_tree`: SIGTERM,
    ``grace_s``, SIGKILL; pids matched with start time (reuse-safe), never by name."""
    from eagle3.procs import snapshot_tree, terminate_tree

    known = {p: t for pid in extra_pids for p, t in snapshot_tree(pid).items()}
    terminate_tree(proc, grace_s, known_pids=known)
