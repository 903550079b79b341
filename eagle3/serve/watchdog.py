"""A watchdog for work against a running server: a server that dies or stalls fails the work with
the gate's diagnostics instead of hanging it.

Usage::

    with Watchdog(url, pid=engine.pid, log_path=engine.log_path, stall_timeout_s=120,
                  diagnostics_dir=run_dir / "deploy" / "watchdog") as wd:
        report = wd.call(run_bench, url, prompts=..., on_request_done=wd.beat)

``call`` runs the work in a daemon thread: its result, or ``GateFailed`` (``crashed``,
``stalled``) once tripped; ending the server's group unblocks the work.
Progress: :mod:`eagle3.serve.liveness` signals or a ``beat()`` per finished request.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

from eagle3.config import GATE_POLL_INTERVAL_S, GATE_STALL_TIMEOUT_S
from eagle3.errors import GateFailed
from eagle3.serve.diagnostics import collect_diagnostics
from eagle3.serve.liveness import ProgressMonitor
from eagle3.serve.readiness import Call
from eagle3.procs import exit_status


class Watchdog:
    """Watches one server while work runs (module docstring). ``*_s`` in seconds; ``url`` only
    named in messages. Raises GateFailed from ``call``/``check``/``__exit__`` once tripped."""

    def __init__(self, url: str, pid: int | None = None, log_path: str | Path | None = None, *,
                 stall_timeout_s: float = GATE_STALL_TIMEOUT_S,
                 check_interval_s: float = GATE_POLL_INTERVAL_S,
                 diagnostics_dir: str | Path | None = None, use_gpu: bool = True):
        self.url, self.pid, self.log_path = url, pid, log_path
        self.stall_timeout_s, self.check_interval_s = stall_timeout_s, check_interval_s
        self.diagnostics_dir = Path(diagnostics_dir) if diagnostics_dir else None
        self.use_gpu, self.detail, self.beats = use_gpu, "", 0
        self.verdict: str | None = None
        self._last_progress = time.monotonic()
        self._tripped, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self, *_: Any, **__: Any) -> None:
        """Record the work's own progress (ignores arguments: usable as a request callback)."""
        self.beats += 1
        self._last_progress = time.monotonic()

    def __enter__(self) -> "Watchdog":
        self._last_progress = time.monotonic()
        self._thread = threading.Thread(target=self._watch, name="eagle3-watchdog", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.check_interval_s) + 60.0)
        if exc_type is None:
            self.check()

    def check(self) -> None:
        """Raise GateFailed if the watchdog has tripped."""
        if self._tripped.is_set():
            raise GateFailed(f"server {self.url} failed during the benchmark: {self.verdict}: "
                             f"{self.detail}", verdict=self.verdict or "",
                             diagnostics_dir=str(self.diagnostics_dir or "") or None)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` under the watchdog: its result, its exception, or GateFailed."""
        work = Call(lambda: fn(*args, **kwargs))
        while not work.wait(min(0.2, self.check_interval_s)):
            if self._tripped.is_set():
                if self._thread is not None:  # diagnostics are written before the thread ends
                    self._thread.join(timeout=120.0)
                self.check()
        if work.error is not None:
            raise work.error
        return work.result

    def _watch(self) -> None:
        mon = ProgressMonitor(self.pid, self.log_path, use_gpu=self.use_gpu)
        sources = mon.sources + ["beat"]
        while not self._stop.wait(self.check_interval_s):
            now = time.monotonic()
            if mon.sample():
                self._last_progress = now
            exited, code = exit_status(self.pid) if self.pid is not None else (False, None)
            if exited:
                self.verdict = "crashed"
                self.detail = f"server process {self.pid} exited (exit code {code})"
            elif now - self._last_progress >= self.stall_timeout_s:
                self.verdict = "stalled"
                self.detail = (f"no progress signal ({', '.join(sources)}) for "
                               f"{now - self._last_progress:.1f} s (stall_timeout_s="
                               f"{self.stall_timeout_s}); {self.beats} requests had finished")
            else:
                continue
            self._tripped.set()  # set first: call() waits for this thread to finish diagnostics
            if self.diagnostics_dir is not None:
                collect_diagnostics(self.diagnostics_dir, pid=self.pid,
                                    log_paths=[self.log_path] if self.log_path else [],
                                    reason=f"watchdog {self.verdict}: {self.detail}")
            return
