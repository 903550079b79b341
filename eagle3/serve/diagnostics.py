"""What a stuck or dead server looked like (stack dumps, GPU state, log tails), saved *before* its
group is ended. Each collector has a time limit and records its own failure instead of raising."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable

import psutil

from eagle3.artifacts import atomic_write_json, utc_now
from eagle3.procs import group_members, process_tree

GPU_QUERY = "index,uuid,utilization.gpu,memory.used,memory.total"
PYSPY_TIMEOUT_S = 20.0
NVSMI_TIMEOUT_S = 10.0


def run_cmd(argv: list[str], timeout_s: float) -> tuple[int | None, str]:
    """Run a short command, stdin closed: (exit code, or None when it timed out or could not start;
    stdout+stderr text, with the reason appended in those cases)."""
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                            stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:  # its stdout is bytes even with text=True
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        return None, (out or "") + f"\n[timed out after {timeout_s:.0f} s]"
    except OSError as e:
        return None, f"[could not run {argv[0]}: {e}]"
    return cp.returncode, (cp.stdout or "") + (cp.stderr or "")


def gpu_sample() -> list[dict] | None:
    """One reading per GPU: ``{"index", "uuid", "util_pct", "mem_used_mib", "mem_total_mib"}``
    (ints, % and MiB); ``pids``: GPU uuid → compute pids. None without a working nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    csv = "--format=csv,noheader,nounits"
    code, out = run_cmd([exe, f"--query-gpu={GPU_QUERY}", csv], NVSMI_TIMEOUT_S)
    if code != 0:
        return None
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        with contextlib.suppress(ValueError):  # a line that is not 5 readable fields is skipped
            index, uuid, util, used, total = parts
            gpus.append({"index": int(index), "uuid": uuid, "util_pct": _num(util),
                         "mem_used_mib": _num(used), "mem_total_mib": _num(total), "pids": []})
    code, out = run_cmd([exe, "--query-compute-apps=gpu_uuid,pid", csv], NVSMI_TIMEOUT_S)
    if code == 0:
        by_uuid = {g["uuid"]: g for g in gpus}
        for line in out.strip().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0] in by_uuid and parts[1].isdigit():
                by_uuid[parts[0]]["pids"].append(int(parts[1]))
    return gpus or None


def _num(text: str) -> int:
    """nvidia-smi prints ``[N/A]`` for unsupported fields: read those as 0."""
    return 0 if text.startswith("[") else int(float(text))


def log_tail(path: str | Path, max_lines: int = 200, max_bytes: int = 256 * 1024) -> str:
    """Last ``max_lines`` lines (≤ ``max_bytes`` bytes) of a log; '' if it does not exist."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-max_lines:])


def pyspy_dump(pid: int, timeout_s: float = PYSPY_TIMEOUT_S) -> str:
    """``py-spy dump`` of one process (all threads), or why it failed; ``py-spy`` next to the
    running interpreter, else on PATH."""
    local = Path(sys.executable).parent / "py-spy"
    exe = str(local) if local.exists() else shutil.which("py-spy")
    if exe is None:
        return f"[py-spy not installed: no stack dump of pid {pid}]"
    code, out = run_cmd([exe, "dump", "--pid", str(pid)], timeout_s)
    return out if code == 0 else f"[py-spy exit {code}]\n{out}"


def _proc_info(p: psutil.Process) -> dict:
    try:
        with p.oneshot():
            t = p.cpu_times()
            return {"pid": p.pid, "ppid": p.ppid(), "status": p.status(), "cmdline": p.cmdline(),
                    "cpu_user_s": t.user, "cpu_system_s": t.system, "num_threads": p.num_threads(),
                    "rss_bytes": p.memory_info().rss, "create_time": p.create_time()}
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess) as e:
        return {"pid": p.pid, "error": type(e).__name__}


def collect_diagnostics(out_dir: str | Path, *, pid: int | None = None,
                        log_paths: Iterable[str | Path] = (),
                        reason: str = "", extra: dict | None = None) -> dict:
    """Save the server's state under ``out_dir``; returns the index (also ``index.json``). Files:
    ``processes.json``, ``pyspy-<pid>.txt``, ``gpu.txt``/``gpu.json``, ``tail-<log>.txt`` (200
    lines). Never raises for a failed collector."""
    t0, out, files = time.monotonic(), Path(out_dir), ["processes.json"]
    out.mkdir(parents=True, exist_ok=True)
    index: dict = {"reason": reason, "created_at": utc_now(), "pid": pid, "extra": extra or {},
                   "pyspy": {}}

    procs = process_tree(pid) if pid is not None else []
    if pid is not None:  # members of the group led by pid whose parent already died (orphans)
        seen = {p.pid for p in procs}
        for gp in [g for g in group_members(pid) if g not in seen]:
            with contextlib.suppress(psutil.NoSuchProcess):
                procs.append(psutil.Process(gp))
    (out / "processes.json").write_text(json.dumps([_proc_info(p) for p in procs], indent=2))
    for p in procs:
        text = pyspy_dump(p.pid)
        files.append(f"pyspy-{p.pid}.txt")
        (out / files[-1]).write_text(text)
        index["pyspy"][p.pid] = "ok" if not text.startswith("[") else text.splitlines()[0]

    exe = shutil.which("nvidia-smi")
    if exe is not None:
        _, text = run_cmd([exe], NVSMI_TIMEOUT_S)
        (out / "gpu.txt").write_text(text)
        (out / "gpu.json").write_text(json.dumps(gpu_sample(), indent=2))
        files += ["gpu.txt", "gpu.json"]
        index["gpu"] = "nvidia-smi"
    else:
        index["gpu"] = "no nvidia-smi on this machine"

    for lp in map(Path, log_paths):
        files.append(f"tail-{lp.name}.txt" if lp.suffix == ".log" else f"tail-{lp.name}.log.txt")
        (out / files[-1]).write_text(log_tail(lp))
    index.update(files=files, seconds=round(time.monotonic() - t0, 3), host_pid=os.getpid())
    atomic_write_json(out / "index.json", index)
    return index
