"""A parent watch for every engine: its process group ends within about a second of the launcher's
death, whatever killed it (failure class 25). A parent killed by a signal never runs ``atexit``,
and an orphaned engine keeps the GPUs' memory.

:func:`eagle3.serve.launcher.start_engine` runs ``python -m eagle3.serve.supervise --parent PID
--grace S -- ENGINE ARGV...`` as a new session leader. It double-forks a *watcher* (outside the
engine's tree and group, so stack dumps, liveness, group signals and exit codes see only the
engine), then ``exec``s the engine, keeping pid, exit status and group. Every ``POLL_S`` seconds the
watcher checks the launcher (pid and start time): once gone, it SIGTERMs the engine's group and
every tree member seen, waits ``--grace`` seconds, SIGKILLs the rest and exits; it also exits when
the engine does.

No ``PR_SET_PDEATHSIG``: it fires when the forking *thread* ends. ``sglang.launch_server`` does not
watch its parent (its scheduler does: ``kill_itself_when_parent_died``). The watcher writes one log
line only when it ends the group, so it never fakes the gate's log-growth signal.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

from eagle3.procs import snapshot_tree, terminate_tree

POLL_S = 0.2  # seconds between checks of the launcher and the engine
SNAPSHOT_EVERY_S = 1.0  # seconds between records of the engine's process tree


def _created(pid: int) -> float | None:
    """Start time of a live, non-zombie process ``pid`` (psutil), None when it is gone."""
    try:
        p = psutil.Process(pid)
        return None if p.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) else p.create_time()
    except psutil.Error:
        return None


def watch(engine: int, parent: int, parent_created: float, grace_s: float) -> None:
    """The watcher's loop (see the module docstring); returns when the engine is gone."""
    # a terminal's Ctrl-C reaches the group: the engine decides
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    engine_created = _created(engine)
    known, last = snapshot_tree(engine), time.monotonic()
    while engine_created is not None and _created(engine) == engine_created:
        if _created(parent) != parent_created:  # the engine's group and its known tree end
            print(f"[eagle3-supervise] launcher {parent} is gone: ending engine group {engine} "
                  f"(SIGTERM, SIGKILL after {grace_s:g} s)", file=sys.stderr, flush=True)
            terminate_tree(engine, grace_s, known_pids=known)
            return
        if time.monotonic() - last >= SNAPSHOT_EVERY_S:
            known.update(snapshot_tree(engine))
            last = time.monotonic()
        time.sleep(POLL_S)


def _start_watcher(engine: int, parent: int, parent_created: float, grace_s: float) -> None:
    """Double fork: the grandchild becomes the watcher (``--watch``, its own command line); the
    child exits at once and is reaped."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        if os.fork():
            os._exit(0)
        os.setsid()  # out of the engine's group (see the module docstring)
        os.execv(sys.executable, [sys.executable, "-m", "eagle3.serve.supervise", "--watch",
                                  str(engine), str(parent), repr(parent_created), f"{grace_s:g}"])
    finally:
        os._exit(0)


def command(argv: list[str], *, parent: int, grace_s: float) -> list[str]:
    """The watched command line for ``argv`` (the wrapper execs ``argv``)."""
    return [sys.executable, "-m", "eagle3.serve.supervise", "--parent", str(parent), "--grace",
            f"{grace_s:g}", "--", *argv]


def main(args: list[str]) -> None:
    """``--parent PID --grace S -- ARGV...``: start the watcher, then exec ``ARGV``. Exit 2 on a
    malformed command line, 1 when the launcher is already gone, 127 when ``ARGV[0]`` cannot be
    executed. (``--watch ENGINE PARENT PARENT_START GRACE`` is the watcher itself.)"""
    if args[:1] == ["--watch"] and len(args) == 5:
        watch(int(args[1]), int(args[2]), float(args[3]), float(args[4]))
        return
    try:
        sep = args.index("--")
        opts = dict(zip(args[:sep:2], args[1:sep:2]))
        parent, grace, argv = int(opts["--parent"]), float(opts["--grace"]), args[sep + 1:]
        if not argv:
            raise ValueError("no engine command after --")
    except (ValueError, KeyError) as e:
        print(f"eagle3.serve.supervise: expected --parent PID --grace S -- ARGV..., got {args} "
              f"({e})", file=sys.stderr)
        sys.exit(2)
    parent_created = _created(parent)
    if os.getppid() != parent or parent_created is None:  # the launcher died before we started
        sys.exit(1)
    _start_watcher(os.getpid(), parent, parent_created, grace)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"eagle3.serve.supervise: cannot execute {argv[0]!r}: {e}", file=sys.stderr,
              flush=True)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
