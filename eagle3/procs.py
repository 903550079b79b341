"""Process groups and trees: start a server in its own group, measure the tree, end it.

Each server runs in its own session (``start_new_session=True``) so its whole tree (SGLang's
scheduler, detokenizer, TP workers) is signalled at once, by group id and psutil-collected pids —
never by name."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

import psutil

from eagle3.errors import ConfigError, TransientError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` a moment ago (bind port 0). It may be taken before the server
    binds (the gate then reports a crash; the launcher retries once). ConfigError ``SERVE_HOST``
    when ``host`` is no address of this machine or no name that resolves (a re-run cannot help);
    TransientError for any other bind failure (no free port)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    except OSError as e:
        if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(f"SERVE_HOST: serve.host: expected an address of this machine (or a "
                              f"name that resolves to one) to bind, got {host!r}: {e}; fix: "
                              "serve.host 127.0.0.1, or an address this machine has") from e
        raise TransientError(f"could not bind a free port on host {host!r}: {e}") from e


def start_group(argv: Sequence[str], env: Mapping[str, str], log_path: str | Path,
                cwd: str | Path | None = None) -> subprocess.Popen:
    """Start ``argv`` in a new session (pgid == pid), stdout+stderr to ``log_path`` (truncated),
    stdin closed, ``env`` the child's full environment. FileNotFoundError/PermissionError from
    ``subprocess`` when it cannot start."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb", buffering=0) as log:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=dict(env), cwd=cwd,
                                start_new_session=True)


def process_tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and all its live descendants (root first); empty if ``pid`` is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def tree_pids(pid: int) -> list[int]:
    """Pids of :func:`process_tree` (root first)."""
    return [p.pid for p in process_tree(pid)]


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) of the tree of ``pid`` incl. reaped children; None if gone."""
    if not (procs := process_tree(pid)):
        return None
    total = 0.0
    for i, p in enumerate(procs):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            t = p.cpu_times()
            total += t.user + t.system
            if i == 0:
                total += getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    return total


def exit_status(pid: int) -> tuple[bool, int | None]:
    """Whether ``pid`` exited, and its exit code if it is our child (read with ``waitid(WNOWAIT)``,
    leaving the zombie to ``Popen``); signal N → ``-N`` (``subprocess``'s convention); else None."""
    with contextlib.suppress(ChildProcessError):  # not our child (or already reaped): psutil
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is None:
            return False, None
        return True, info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return True, None
    return status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD), None


def group_members(pgid: int) -> list[int]:
    """Pids of live processes in group ``pgid`` (by group id, not name), orphans included that
    :func:`process_tree` can no longer reach."""
    out = []
    for p in psutil.process_iter(["pid"]):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(p.pid) == pgid:
                out.append(p.pid)
    return out


def _signal_all(pgid: int | None, pids: list[int], sig: int) -> None:
    if pgid is not None and pgid != os.getpgid(0):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for p in pids:  # members that left the group (setsid) still belong to the tree we started
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def alive_pids(pids: list[int]) -> list[int]:
    """The pids of ``pids`` that still run (not gone, zombie or dead)."""
    out = []
    for p in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(p).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                out.append(p)
    return out


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def snapshot_tree(pid: int) -> dict[int, float]:
    """``{pid: create_time}`` of the tree of ``pid`` (create time guards against pid reuse)."""
    return {p: t for p in tree_pids(pid) if (t := _create_time(p)) is not None}


def terminate_tree(proc: subprocess.Popen | int, grace_s: float = 10.0,
                   known_pids: dict[int, float] | None = None) -> dict:
    """End a :func:`start_group` group: SIGTERM to the group and the tree (descendants, group
    members, ``known_pids`` ``{pid: create_time}`` from :func:`snapshot_tree`), ``grace_s`` s,
    SIGKILL the rest, reap the root. Returns ``{"pids": [...], "killed": [...], "returncode": int |
    None, "seconds": float}``. Idempotent."""
    t0 = time.monotonic()
    popen = isinstance(proc, subprocess.Popen)
    pid = proc.pid if popen else int(proc)
    try:
        pgid: int | None = os.getpgid(pid)
    except ProcessLookupError:
        pgid = pid if popen else None  # start_group made pgid == pid
    if pgid != pid:  # not a group leader: never signal a group we did not create (a shell)
        pgid = None

    def members() -> set[int]:
        found = set(tree_pids(pid)) | {p for p, t in (known_pids or {}).items()
                                       if _create_time(p) == t}
        return (found | set(group_members(pgid) if pgid is not None else ())) - {os.getpid()}

    pids = sorted(members())
    _signal_all(pgid, pids, signal.SIGTERM)
    while time.monotonic() < t0 + grace_s:
        pids = sorted(set(pids) | members())  # children spawned during shutdown too
        if popen:
            proc.poll()
        if not alive_pids(pids):
            break
        time.sleep(0.05)
    if leftover := alive_pids(sorted(set(pids) | members())):
        _signal_all(pgid, leftover, signal.SIGKILL)
    returncode = None
    if popen:
        with contextlib.suppress(subprocess.TimeoutExpired):
            returncode = proc.wait(timeout=max(1.0, grace_s))
    gone_by = time.monotonic() + 5.0
    while alive_pids(leftover) and time.monotonic() < gone_by:
        time.sleep(0.05)
    return {"pids": pids, "killed": leftover, "returncode": returncode,
            "seconds": time.monotonic() - t0}
