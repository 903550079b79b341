"""Stopping a command-line run on SIGTERM/SIGHUP/Ctrl-C: the signal becomes an interrupt so every
``finally`` runs (engine process groups ended, Prefect's ephemeral server stopped), a signal that a
flow swallowed is still reported, and a run that has not stopped ``$EAGLE3_STOP_GRACE_S`` seconds
after the first signal ends itself (Prefect's engine would retry its crash report to a dead API
server for minutes). Used by ``eagle3 run`` (cli/run.py) and ``python -m flows.sweep``.
"""

from __future__ import annotations

import os
import signal
import threading
import time


def terminating_signal(record: SignalRecord) -> int | None:
    """The first SIGTERM or SIGHUP ``record`` saw (the one a supervisor sends to stop the run),
    else None (only Ctrl-C, or no signal). A run it ended exits with ``128 + signal``, as a
    process killed by it would (143 for SIGTERM), so a supervisor reads the usual status."""
    return next((s for s in record.received() if s in TERMINATING), None)


TERMINATING = (signal.SIGTERM, signal.SIGHUP)
# what the record counts and starts its deadline on: Ctrl-C too (Python's own SIGINT handler raises
# KeyboardInterrupt, but a Ctrl-C to the whole group ends Prefect's API server as well, and
# Prefect's engine then retries its crash report to it for minutes)
RECORDED = (*TERMINATING, signal.SIGINT)
_STOP = threading.Event()  # set once a recorded signal arrived during the installed record


def stop_requested() -> bool:
    """True once a SIGTERM, SIGHUP or Ctrl-C reached this process while the :class:`SignalRecord`
    installed now was: a loop of runs (the sweep's points) starts no further one, even when the
    interrupt itself was caught inside the run that was going on. Cleared when a record is
    installed or uninstalled, so an earlier run's signal never stops a later run of the same
    process."""
    return _STOP.is_set()


class SignalRecord:
    """Which termination signals (SIGTERM, SIGHUP, SIGINT) reached this process during a run,
    whoever handled them, and a deadline after the first one.

    Prefect's flow engine installs its own SIGTERM handler while a flow runs, and CPython swallows
    an exception raised by a handler inside an import's module-lock callback; either way the run may
    go on to its end. The record does not depend on any Python handler: a self-pipe registered with
    :func:`signal.set_wakeup_fd` receives one byte (the signal number) for every signal delivered to
    a Python-level handler, ours or Prefect's, and a thread reads it.

    The deadline: a signal sent to the whole process group (Ctrl-C in a terminal, a supervisor) also
    ends Prefect's ephemeral API server, and Prefect's engine then retries reporting the crash to it
    for minutes. ``grace_s`` seconds after the first termination signal a process that has not
    exited ends itself: the ``atexit`` handlers run (the launcher's end every engine process group),
    its remaining child processes are terminated, and it exits with 128 + the signal number. Main
    thread only (``install`` returns False elsewhere)."""

    def __init__(self, grace_s: float = 30.0) -> None:
        self.grace_s = grace_s
        self._r = self._w = -1
        self._previous_fd = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.seen: list[int] = []

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        _STOP.clear()
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._previous_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="eagle3-signal-record",
                                        daemon=True)
        self._thread.start()
        return True

    def _watch(self) -> None:
        import select

        deadline = None
        while not self._stop.is_set():
            ready, _, _ = select.select([self._r], [], [], 0.5)
            if ready:
                chunk = os.read(self._r, 512)
                new = [b for b in chunk if b in RECORDED]
                self.seen += new
                if new:
                    _STOP.set()
                if new and deadline is None:
                    deadline = time.monotonic() + self.grace_s
            if deadline is not None and time.monotonic() > deadline and not self._stop.is_set():
                _end_now(self.seen[0], self.grace_s)

    def received(self) -> list[int]:
        """The termination signals seen so far."""
        if self._thread is not None:
            time.sleep(0.05)  # a byte written just now reaches the reader thread
        return list(self.seen)

    def uninstall(self) -> None:
        if self._r < 0:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        _STOP.clear()  # the run this record watched is over
        signal.set_wakeup_fd(self._previous_fd)
        for fd in (self._r, self._w):
            os.close(fd)
        self._r = self._w = -1


STOP_GRACE_ENV = "EAGLE3_STOP_GRACE_S"


def stop_grace_s(environ: dict | None = None) -> float:
    """Seconds a run gets to stop by itself after a termination signal before it ends itself
    (:class:`SignalRecord`): ``$EAGLE3_STOP_GRACE_S``, default 30 (Kubernetes' default termination
    grace period; set it below your supervisor's own, e.g. systemd's ``TimeoutStopSec``). Raises
    ConfigError naming the variable and its value unless it is a number of seconds in [1, 3600]
    (fractions allowed; unset or blank = 30)."""
    from eagle3.errors import ConfigError

    raw = (os.environ if environ is None else environ).get(STOP_GRACE_ENV)
    if raw is None or raw.strip() == "":
        return 30.0
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 1.0 <= value <= 3600.0:  # also refuses nan and inf
        raise ConfigError(f"{STOP_GRACE_ENV}={raw!r}: expected seconds between 1 and 3600")
    return value


EXIT_HANDLERS_S = 10.0  # what the exit handlers get once the grace time is over (seconds)


def _end_now(signum: int, grace_s: float) -> None:
    """The run did not exit within ``grace_s`` of a termination signal: end engines (atexit, given
    at most ``EXIT_HANDLERS_S``), this process's own children (SIGTERM, then SIGKILL after 5 s),
    then exit 128 + ``signum``."""
    import atexit
    import sys

    import psutil

    print(f"error: received {signal.Signals(signum).name} and the run did not stop within "
          f"{grace_s:.0f} s (Prefect's API server was ended with it); ending it now",
          file=sys.stderr, flush=True)
    try:
        # the launcher registers every engine's stop here; other exit handlers (logging's flush of
        # Prefect's API log handler to a server that is already gone) can block, so they get a
        # bounded time in a thread
        runner = threading.Thread(target=atexit._run_exitfuncs, name="eagle3-exit-handlers",
                                  daemon=True)
        runner.start()
        runner.join(timeout=EXIT_HANDLERS_S)
        if runner.is_alive():
            print(f"error: exit handlers still running after {EXIT_HANDLERS_S:.0f} s; "
                  "ending without them",
                  file=sys.stderr, flush=True)
    finally:
        children = psutil.Process().children(recursive=True)
        for c in children:
            try:
                c.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(children, timeout=5)
        for c in alive:
            try:
                c.kill()
            except psutil.Error:
                pass
        os._exit(128 + signum)


def raise_if_terminated(record: SignalRecord) -> None:
    """Raise KeyboardInterrupt when a SIGTERM/SIGHUP arrived during the run but its interrupt was
    lost (caught by Prefect's engine or swallowed by CPython): a run that was told to stop must not
    then exit 0 as if nothing happened."""
    seen = record.received()
    if seen:
        names = ", ".join(sorted({signal.Signals(s).name for s in seen}))
        raise KeyboardInterrupt(f"received {names} during the run; the interrupt was lost inside "
                                "the run, which went on to its end: its outputs are complete, but "
                                "it is reported as interrupted")


def terminate_as_interrupt() -> dict:
    """Make SIGTERM/SIGHUP raise KeyboardInterrupt in the main thread, so a killed ``eagle3 run``
    still runs every ``finally`` (engine process groups ended, the ephemeral Prefect server stopped)
    instead of dying with its children orphaned. Returns the previous handlers (empty outside the
    main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def interrupt(signum, _frame):
        raise KeyboardInterrupt(f"received signal {signal.Signals(signum).name}")

    return {sig: signal.signal(sig, interrupt) for sig in TERMINATING}


def ended_message(what: str, signum: int) -> str:
    """The line a run ended by ``signum`` prints before exiting ``128 + signum``."""
    return (f"error: {what} ended by {signal.Signals(signum).name}: engines and the Prefect "
            "server stopped; re-run the same command to go on (finished stages are cached)")
