"""Progress signals of a server process: is it doing *anything*? Each optional:

- log: the log grew by more than access lines of the gate's own requests (a hung server behind a
  live HTTP front-end would otherwise look busy forever);
- cpu: the tree's CPU time grew by ≥ ``cpu_busy_fraction`` × wall time (default 5 % of one core);
- gpu: a GPU of the tree (all GPUs when nvidia-smi shows none of its pids) shows utilisation or a
  change of used memory.

A spinning hang (busy NCCL, a Python loop) is only caught by the overall deadline.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from eagle3.serve.diagnostics import gpu_sample
from eagle3.procs import tree_cpu_seconds, tree_pids

# Access-log lines of the gate's and watchdog's own requests (uvicorn and http.server formats).
GATE_NOISE = re.compile(r'"(GET|POST|HEAD) '
                        r'/(health_generate|health|ready|generate|get_server_info|server_info'
                        r'|metrics)\b[^"]*"'
                        # SGLang's http_server.py logs this while the scheduler hangs
                        r"|Health check failed\. Server couldn't get a response from detokenizer")
MAX_READ_BYTES = 1 << 20
GPU_MIN_INTERVAL_S = 1.0


class ProgressMonitor:
    """Samples one server's progress signals. ``pid`` / ``log_path`` None: no cpu / log signal;
    ``cpu_busy_fraction``: CPU seconds per wall second that count as progress."""

    def __init__(self, pid: int | None = None, log_path: str | Path | None = None, *,
                 use_gpu: bool = True, cpu_busy_fraction: float = 0.05):
        self.pid, self.log_path = pid, Path(log_path) if log_path else None
        self.cpu_busy_fraction, self.log_pos = cpu_busy_fraction, 0
        self._cpu: tuple[float, float] | None = None  # (monotonic time, cpu seconds)
        self._gpu_t, self._gpu_prev = 0.0, None
        self.gpu_available = use_gpu and gpu_sample() is not None
        self.counts = {"log": 0, "cpu": 0, "gpu": 0}

    @property
    def sources(self) -> list[str]:
        """Signal sources that can be observed for this server."""
        return [name for name, ok in (("log", self.log_path is not None),
                                      ("cpu", self.pid is not None), ("gpu", self.gpu_available))
                if ok]

    def sample(self) -> list[str]:
        """Read every source once; names of the signals that progressed since the last call."""
        progressed = [name for name, fn in (("log", self._log), ("cpu", self._cpu_grew),
                                            ("gpu", self._gpu)) if fn()]
        for name in progressed:
            self.counts[name] += 1
        return progressed

    def _log(self) -> bool:
        if self.log_path is None:
            return False
        try:
            size = self.log_path.stat().st_size
        except OSError:
            return False
        if size < self.log_pos:  # truncated or replaced: treat as new output
            self.log_pos = 0
        if size == self.log_pos:
            return False
        start, self.log_pos = self.log_pos, size
        if size - start > MAX_READ_BYTES:  # too much to be the gate's own access lines
            return True
        with open(self.log_path, "rb") as f:
            f.seek(start)
            text = f.read(size - start).decode(errors="replace")
        return any(ln.strip() and not GATE_NOISE.search(ln) for ln in text.splitlines())

    def _cpu_grew(self) -> bool:
        if self.pid is None:
            return False
        now, cpu = time.monotonic(), tree_cpu_seconds(self.pid)
        if cpu is None:
            return False
        prev, self._cpu = self._cpu, (now, cpu)
        return prev is not None and cpu - prev[1] >= self.cpu_busy_fraction * max(now - prev[0],
                                                                                  1e-3)

    def _gpu(self) -> bool:
        now = time.monotonic()
        if not self.gpu_available or now - self._gpu_t < GPU_MIN_INTERVAL_S:
            return False
        self._gpu_t = now
        gpus = gpu_sample() or []
        pids = set(tree_pids(self.pid)) if self.pid is not None else set()
        mine = [g for g in gpus if pids & set(g["pids"])] or gpus
        current = {g["uuid"]: (g["util_pct"], g["mem_used_mib"]) for g in mine}
        prev, self._gpu_prev = self._gpu_prev, current
        busy = any(util > 0 for util, _ in current.values())
        return busy or prev is not None and any(prev.get(k, (0, mem))[1] != mem
                                                for k, (_, mem) in current.items())
