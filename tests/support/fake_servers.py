"""Small real HTTP servers (stdlib only, run as subprocesses) that imitate how engine servers behave
at start-up: the readiness gate's tests start these and check its verdicts.

Run: ``python tests/support/fake_servers.py BEHAVIOUR --port P [options]``. The server prints its
own log to stdout (the launcher sends it to a log file), with an access-log line per request in
uvicorn's format (the gate must not count those as progress). Every fake exits by itself after
``--max-life`` seconds, so a test that leaks one leaks it only briefly.

Behaviours:
  slow_warmup              load (log lines), bind, 503 for --warm-s while the log (--progress log)
  or the CPU
                           time (--progress cpu: a busy thread, no log) grows, then ready.  [story,
                           2nd half]
  hang_after_load          load (log lines), bind, 503 forever: log silent, CPU idle.      [story,
  1st half] crash_startup            load (log lines), then a traceback and exit --exit-code.
  health_ok_generate_hangs /health and /health_generate answer 200, /generate never answers.
  never_bind               a few log lines, then sleeps without ever binding the port.
  cuda_graph_crash         crashes in "CUDA graph capture" unless --disable-cuda-graph is given;
  then slow_warmup. no_spec                  ready, but /generate's meta_info has no
  speculative-decoding fields. ready_then_hang          ready at once; --hang-after-s seconds after
  the first /generate, stops answering. gpu_hang                 (needs torch + CUDA) puts --gpu-gib
  of data on the GPU, binds, 503 forever, GPU idle. gpu_warmup               (needs torch + CUDA)
  503 for --warm-s while matrix products run on the GPU, log
                           silent; then ready.
Options --children N spawn N child processes (SGLang's scheduler/detokenizer); --child-ignores-term
makes them ignore SIGTERM; --child-setsid moves them out of the process group.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BEHAVIOURS = (
    "slow_warmup",
    "hang_after_load",
    "crash_startup",
    "health_ok_generate_hangs",
    "never_bind",
    "cuda_graph_crash",
    "no_spec",
    "ready_then_hang",
    "gpu_hang",
    "gpu_warmup",
)
HERE = Path(__file__).resolve()


def fake_argv(behaviour: str, port: int, *extra: str) -> list[str]:
    """The command line that starts one fake server."""
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"fake server behaviour {behaviour!r}: expected one of {BEHAVIOURS}")
    return [sys.executable, "-u", str(HERE), behaviour, "--port", str(port), *extra]


def start_fake(behaviour: str, log_dir: str | Path, *extra: str, grace_s: float = 1.0):
    """Start one fake server through the launcher's own ``start_engine`` (own process group, log
    file). Returns the ``EngineProcess`` (a context manager that ends the group)."""
    from eagle3.serve.launcher import start_engine
    from eagle3.procs import free_port

    port = free_port()
    return start_engine(
        fake_argv(behaviour, port, *extra),
        {"PYTHONUNBUFFERED": "1"},
        host="127.0.0.1",
        port=port,
        log_path=Path(log_dir) / f"{behaviour}.log",
        engine=f"fake-{behaviour}",
        grace_s=grace_s,
    )


def leftovers(port: int) -> list[int]:
    """Pids of live fake-server processes (servers and their children) started for ``port``: the
    process table is searched for this file's path and ``--port PORT`` in the command line."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if str(HERE) in cmd and "--port" in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            i = cmd.index("--port")
            if i + 1 < len(cmd) and cmd[i + 1] == str(port):
                found.append(p.info["pid"])
    return found


def log(msg: str) -> None:
    """One log line in a single write: ``print`` under ``python -u``/PYTHONUNBUFFERED writes the
    text and the newline separately, so lines of a server and its children sharing the log file
    could merge."""
    os.write(sys.stdout.fileno(), f"[{time.strftime('%H:%M:%S')}] {msg}\n".encode())


class State:
    ready = False  # /health_generate answers 200
    hang_generate = False  # /generate never answers
    spec = True  # meta_info carries spec_* fields
    hang_all = False  # nothing answers any more
    first_generate: float | None = None
    hang_after_s: float | None = None


def _block_forever() -> None:
    while True:
        time.sleep(3600)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # uvicorn-style access line, like SGLang's log
        print(
            f'INFO:     127.0.0.1:{self.client_address[1]} - "{self.requestline}" {args[1]}',
            flush=True,
        )

    def _send(self, code: int, body: dict | None = None) -> None:
        data = json.dumps(body or {}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _maybe_hang(self) -> None:
        st = State
        if st.hang_after_s is not None and st.first_generate is not None:
            if time.monotonic() - st.first_generate >= st.hang_after_s:
                st.hang_all = True
        if st.hang_all:
            _block_forever()

    def do_GET(self):
        self._maybe_hang()
        if self.path in ("/health", "/health_generate", "/ready"):
            self._send(200 if State.ready else 503)
        elif self.path in ("/get_server_info", "/server_info"):
            self._send(200, {"internal_states": [{"avg_spec_accept_length": 2.0}]})
        else:
            self._send(404, {"error": f"no route {self.path}"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        req = json.loads(self.rfile.read(length) or b"{}")
        self._maybe_hang()
        if self.path != "/generate":
            return self._send(404, {"error": f"no route {self.path}"})
        if not State.ready:
            return self._send(503, {"error": "warming up"})
        if State.hang_generate:
            _block_forever()
        if State.first_generate is None:
            State.first_generate = time.monotonic()
        n = int(req.get("sampling_params", {}).get("max_new_tokens", 4))
        meta = {
            "prompt_tokens": 5,
            "completion_tokens": n,
            "finish_reason": {"type": "length", "length": n},
        }
        if State.spec:
            meta.update(
                {"spec_verify_ct": max(1, n // 2), "spec_accept_length": n / max(1, n // 2)}
            )
        self._send(
            200, {"text": " word" * n, "output_ids": list(range(1, n + 1)), "meta_info": meta}
        )


def serve(port: int) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    log(f"Uvicorn running on http://127.0.0.1:{port}")


def load(seconds: float) -> None:
    steps = max(1, int(seconds / 0.2))
    for i in range(steps):
        log(f"Loading safetensors checkpoint shards: {100 * (i + 1) // steps}% Completed")
        time.sleep(seconds / steps)
    log("Load weight end. type=LlamaForCausalLM, avail mem=70.12 GB")


def warm_up(seconds: float, progress: str) -> None:
    end = time.monotonic() + seconds
    if progress == "log":
        bs = 160
        while time.monotonic() < end:
            log(f"Capturing batches (bs={bs} avail_mem=61.3 GB)")
            bs = max(1, bs - 8)
            time.sleep(0.3)
    else:  # busy CPU, silent log
        x = 0
        while time.monotonic() < end:
            x = (x * 31 + 7) % 1_000_003


def gpu_load(gib: float):
    import torch

    x = torch.empty(int(gib * (1 << 30)) // 2, dtype=torch.bfloat16, device="cuda")
    x.fill_(1.0)
    torch.cuda.synchronize()
    log(f"Load weight end. {gib} GiB on {torch.cuda.get_device_name()}")
    return x


def gpu_warm_up(seconds: float) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


def spawn_children(
    n: int, port: int, ignore_term: bool, setsid: bool, max_life: float
) -> list[subprocess.Popen]:
    args = [sys.executable, str(HERE), "child", "--port", str(port), "--max-life", str(max_life)]
    args += ["--ignore-term"] if ignore_term else []
    return [subprocess.Popen(args, start_new_session=setsid) for _ in range(n)]


def child_main(ignore_term: bool, max_life: float) -> None:
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log(f"child {os.getpid()} started (ignores SIGTERM: {ignore_term})")
    time.sleep(max_life)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("behaviour", choices=BEHAVIOURS + ("child",))
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--load-s", type=float, default=0.6)
    p.add_argument("--warm-s", type=float, default=4.0)
    p.add_argument("--progress", choices=("log", "cpu"), default="log")
    p.add_argument("--exit-code", type=int, default=3)
    p.add_argument("--hang-after-s", type=float, default=1.0)
    p.add_argument("--children", type=int, default=0)
    p.add_argument("--child-ignores-term", action="store_true")
    p.add_argument("--child-setsid", action="store_true")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--max-life", type=float, default=60.0)
    p.add_argument("--gpu-gib", type=float, default=4.0)
    a, unknown = p.parse_known_args(argv)
    if a.behaviour == "child":
        child_main(a.ignore_term, a.max_life)
        return 0
    timer = threading.Timer(a.max_life, lambda: os._exit(0))
    timer.daemon = True
    timer.start()
    log(f"server_args: argv={argv} unknown={unknown} pid={os.getpid()}")
    spawn_children(a.children, a.port, a.child_ignores_term, a.child_setsid, a.max_life)
    b = a.behaviour
    if b == "cuda_graph_crash":
        if not a.disable_cuda_graph:
            load(a.load_s)
            log("Capturing batches (bs=160 avail_mem=12.50 GB)")
            print(
                "Traceback (most recent call last):\n"
                '  File "cuda_graph_runner.py", line 603, in capture\n'
                "Exception: Capture cuda graph failed: CUDA error: out of memory\n"
                "Possible solutions:\n"
                "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
                flush=True,
            )
            return 1
        b = "slow_warmup"
    if b == "never_bind":
        log("Initializing distributed environment")
        _block_forever()
    load(a.load_s)
    # kept alive while the fake server runs
    held = gpu_load(a.gpu_gib) if b in ("gpu_hang", "gpu_warmup") else None  # noqa: F841
    if b == "crash_startup":
        print(
            'Traceback (most recent call last):\n  File "model_runner.py", line 42, in load_model\n'
            "RuntimeError: Weight lm_head.weight has shape [49152, 576], expected [8192, 576]",
            flush=True,
        )
        return a.exit_code
    serve(a.port)
    State.spec = b != "no_spec"
    State.hang_generate = b == "health_ok_generate_hangs"
    if b == "slow_warmup":
        warm_up(a.warm_s, a.progress)
    if b == "gpu_warmup":
        gpu_warm_up(a.warm_s)
    if b in ("hang_after_load", "gpu_hang"):
        _block_forever()
    if b == "ready_then_hang":
        State.hang_after_s = a.hang_after_s
    State.ready = True
    log("The server is fired up and ready to roll!")
    _block_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
