"""Engine launcher: builds the command line from ``cfg.serve``, starts the engine in its own
process group and ends the group on exit (terminate, wait, kill; never by name), or the parent
watch does if this process dies (:mod:`eagle3.serve.supervise`). Engines: ``sglang`` (``python -m
sglang.launch_server``, :data:`eagle3.engines.sglang.serving.LAUNCH_FLAGS`), ``reference``
(``python -m refengine.launch_server``), ``auto`` (sglang given a GPU and an importable SGLang).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from eagle3.config import RunConfig
from eagle3.redaction import redact
from eagle3.engines.sglang.environment import (install_advice, sglang_installed, sglang_python,
                                               sglang_unusable_reason)
from eagle3.engines.sglang.serving import (ArgvRules, extra_args_problems, launch_args,
                                           simulation_problem)
from eagle3.errors import CheckpointInvalid, ConfigError, EngineUnsupported, GateFailed
from eagle3.serve.diagnostics import log_tail, run_cmd
from eagle3.procs import free_port, snapshot_tree, start_group, terminate_tree
from eagle3.serve.readiness import GateResult, wait_ready
from eagle3.serve.supervise import command as supervised

log = logging.getLogger(__name__)
CUDA_GRAPH_CRASH = re.compile(r"Capture cuda graph failed|CUDA graph capture fail|"
                              r"cuda_graph_runner.*Error", re.I)
CAPTURING = re.compile(r"Capturing batches|capture_cuda_graph|cuda graph", re.I)
PORT_IN_USE = re.compile(r"address already in use|Errno 98", re.I)
CommandBuilder = Callable[[RunConfig, Path, "Path | None", int], "tuple[list[str], dict[str, str]]"]


def gpu_present() -> bool:
    """True when ``nvidia-smi -L`` lists at least one GPU."""
    exe = shutil.which("nvidia-smi")
    out = "" if exe is None else run_cmd([exe, "-L"], 30.0)[1]
    return any(line.startswith("GPU ") for line in out.splitlines())


def reference_device(device: str) -> str:
    """``serve.device`` resolved: ``auto`` = ``cuda`` when torch sees a GPU, else ``cpu``."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_engine(cfg: RunConfig) -> str:
    """``"sglang"`` or ``"reference"`` for ``cfg.serve.engine``; EngineUnsupported when ``sglang``
    is asked for and its Python cannot import it."""
    engine = cfg.serve.engine
    if engine == "reference":
        return engine
    py = sglang_python(cfg)
    has_sglang = sglang_installed(py)
    if engine == "sglang" and not has_sglang:
        raise EngineUnsupported(f"serve.engine is 'sglang' but serve.sglang_python: "
                                f"{sglang_unusable_reason(py)}; expected the Python of an "
                                f"environment with sglang=={cfg.convert.engine_version} "
                                f"({install_advice(cfg.convert.engine_version)})")
    return "sglang" if has_sglang and (engine == "sglang" or gpu_present()) else "reference"


# The reference engine's command line (refengine/launch_server.py ``_parser``: argparse with
# allow_abbrev=False; ``-h``/``--help`` added by argparse; ``--tp`` an alias of ``--tp-size``):
# {flag: nargs}. The product does not import refengine, so the table is here and
# tests/unit/test_launcher_cmd.py pins it to that parser.
REFERENCE_NARGS = {**dict.fromkeys("""--model-path --tokenizer-path --speculative-algorithm
--speculative-draft-model-path --speculative-num-steps --speculative-eagle-topk
--speculative-num-draft-tokens --host --port --dtype --context-length --served-model-name --device
--tp-size --log-level --random-seed""".split(), "1"), **dict.fromkeys("""--skip-server-warmup
--disable-spec-aux-capture --enable-metrics --disable-cuda-graph --help""".split(), "0")}
REFERENCE_ALIASES = {"--tp": "--tp-size", "-h": "--help"}


def reference_rules() -> ArgvRules:
    """The reference engine's command line as
    :func:`eagle3.engines.sglang.serving.extra_args_problems` reads one: every flag of
    :data:`REFERENCE_NARGS` and its aliases, no abbreviations; a flag it does not implement ends
    it with exit code 2 (``refengine.launch_server.parse_args``)."""
    opts = {**{f: f for f in REFERENCE_NARGS}, **REFERENCE_ALIASES}
    counts = {o: REFERENCE_NARGS[c] for o, c in opts.items() if REFERENCE_NARGS[c] != "1"}
    return ArgvRules("the reference engine", opts, counts, allow_abbrev=False,
                     unknown_exit="exit with code 2 ('the reference engine does not implement')",
                     help_hint=" (its flags: `python -m refengine.launch_server --help`)")


def _check_extra_args(generated: list[str], extra: list[str], engine: str, version: str) -> None:
    """ConfigError naming every ``serve.extra_args`` problem as ``CODE: message``."""
    rules = reference_rules() if engine == "reference" else None
    problems = extra_args_problems(extra, generated, version, rules=rules)
    if problems:
        raise ConfigError("; ".join(f"{code}: {msg}" for code, msg in problems))


def build_command(cfg: RunConfig, target_dir: str | Path, draft_dir: str | Path | None, port: int,
                  engine: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The engine's argv and the environment variables to add. ``draft_dir`` None: the target alone
    (baseline). ConfigError for ``serve.extra_args`` the engine's parser would not take as written
    or that repeat a generated or owned flag
    (:func:`eagle3.engines.sglang.serving.extra_args_problems`, :func:`reference_rules` for the
    reference engine) or a simulated-acceptance variable; EngineUnsupported for what the reference
    engine cannot honour."""
    s = cfg.serve
    engine = engine or resolve_engine(cfg)
    spec = [] if draft_dir is None else ["--speculative-algorithm", "EAGLE3",
                                         "--speculative-draft-model-path", str(draft_dir)]
    common = ["--model-path", str(target_dir), *spec, "--host", s.host, "--port", str(port),
              *launch_args(s, draft=draft_dir is not None, engine=engine)]
    if engine == "sglang":
        argv = [sglang_python(cfg), "-m", "sglang.launch_server", *common, "--dtype", s.dtype,
                "--enable-metrics"]
        if cfg.data.chat_template_kwargs:  # the template switches the draft was trained with
            argv += ["--default-chat-template-kwargs",
                     json.dumps(cfg.data.chat_template_kwargs, sort_keys=True)]
    elif engine == "reference":
        from eagle3.config_checks import reference_problem

        bad = reference_problem(s)
        if bad:
            raise EngineUnsupported(bad)
        from eagle3.precision import resolve_dtype

        device = reference_device(s.device)
        argv = [sys.executable, "-m", "refengine.launch_server", *common, "--device", device,
                "--dtype", resolve_dtype(s.dtype, device)]
    else:
        raise EngineUnsupported(f"serve.engine resolved to {engine!r}; expected 'sglang' or "
                                "'reference'")
    _check_extra_args(argv, s.extra_args, engine, cfg.convert.engine_version)
    env = {"PYTHONUNBUFFERED": "1"}
    if engine == "reference" and s.cpu_threads is not None and reference_device(s.device) == "cpu":
        env["OMP_NUM_THREADS"] = str(s.cpu_threads)  # torch's CPU threads (serve.env may override)
    env.update(s.env)
    if engine == "sglang":
        inherited = {k: v for k, v in os.environ.items() if k not in s.env}
        for src, where in ((s.env, "serve.env"), (inherited, "this process's environment")):
            problem = simulation_problem(src, f"the server's environment ({where})")
            if problem:
                raise ConfigError(problem)
    return argv + list(s.extra_args), env


class EngineProcess:
    """A running engine; ``__exit__`` ends its process group. ``env``: the added variables."""

    def __init__(self, popen: subprocess.Popen, *, engine: str, argv: list[str],
                 env: dict[str, str], host: str, port: int, log_path: Path, grace_s: float = 15.0):
        self.popen, self.engine, self.argv, self.env = popen, engine, argv, env
        self.host, self.port, self.log_path, self.grace_s = host, port, Path(log_path), grace_s
        url_host = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
        self.url = f"http://{url_host}:{port}"
        self.pid = popen.pid
        self.returncode: int | None = None
        self.stop_report: dict | None = None
        self._known: dict[int, float] = {}
        self._stop_lock = threading.Lock()  # stop_all_engines and the owner's with-block may race

    def remember_tree(self) -> None:
        """Record the current tree's pids, so later orphans are still ended."""
        self._known.update(snapshot_tree(self.pid))

    def stop(self) -> dict:
        """SIGTERM, wait ``grace_s``, SIGKILL, reap; idempotent; returns the stop report."""
        with self._stop_lock:
            if self.stop_report is None:
                self.remember_tree()
                self.stop_report = terminate_tree(self.popen, self.grace_s, known_pids=self._known)
                self.returncode = self.popen.returncode
                atexit.unregister(self.stop)
                _STARTED.discard(self)
        return self.stop_report

    def __enter__(self) -> "EngineProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EngineProcess({self.engine}, pid={self.pid}, url={self.url}, log={self.log_path})"


_STARTED: set[EngineProcess] = set()  # engines of this process not yet stopped


def stop_all_engines() -> int:
    """Stop every engine of this process not stopped yet (:meth:`EngineProcess.stop`), in parallel,
    from any thread: an interrupted run ends its engines before the stages using them unwind, so
    their requests fail at once. Returns how many were stopped."""
    stoppers = [threading.Thread(target=e.stop, name=f"eagle3-stop-{e.pid}", daemon=True)
                for e in list(_STARTED)]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join()
    return len(stoppers)


def start_engine(argv: list[str], env: dict[str, str], *, host: str, port: int,
                 log_path: str | Path, engine: str = "custom",
                 grace_s: float = 15.0) -> EngineProcess:
    """Start ``argv`` (this environment + ``env``) in its own process group under a parent watch
    (:mod:`eagle3.serve.supervise`), output to ``log_path``, ``command.json`` (secrets redacted)
    beside it."""
    log_path = Path(log_path)
    popen = start_group(supervised(argv, parent=os.getpid(), grace_s=grace_s),
                        {**os.environ, **env}, log_path)
    proc = EngineProcess(popen, engine=engine, argv=argv, env=env, host=host, port=port,
                         log_path=log_path, grace_s=grace_s)
    # an interpreter that exits without leaving the with-block still ends the group
    atexit.register(proc.stop)
    _STARTED.add(proc)
    record = {"engine": engine, "argv": argv, "env": redact(env), "url": proc.url, "pid": proc.pid}
    log_path.with_name(log_path.stem + ".command.json").write_text(json.dumps(record, indent=2))
    log.info("started %s", proc)
    return proc


def launch_engine(cfg: RunConfig, target_dir: str | Path, draft_dir: str | Path | None,
                  log_dir: str | Path, *, command_builder: CommandBuilder | None = None,
                  log_name: str | None = None, engine: str | None = None) -> EngineProcess:
    """``with launch_engine(...) as e``: the configured engine on ``serve.port`` or a free one, log
    ``<log_dir>/engine-<engine>.log``. ConfigError/EngineUnsupported from the command builder,
    ConfigError ``SERVE_HOST`` for a ``serve.host`` this machine cannot bind, TransientError when
    no free port is found (:func:`eagle3.procs.free_port`)."""
    engine = engine or (resolve_engine(cfg) if command_builder is None else cfg.serve.engine)
    host = cfg.serve.host
    port = cfg.serve.port or free_port(host if host not in ("0.0.0.0", "") else "127.0.0.1")
    draft, target = Path(draft_dir) if draft_dir else None, Path(target_dir)
    argv, env = (build_command(cfg, target, draft, port, engine) if command_builder is None
                 else command_builder(cfg, target, draft, port))
    log_path = Path(log_dir) / (log_name or f"engine-{engine}.log")
    return start_engine(argv, env, host=cfg.serve.host, port=port, log_path=log_path, engine=engine,
                        grace_s=cfg.serve.stop_grace_s)


def is_cuda_graph_crash(log_text: str) -> bool:
    """The log shows SGLang's "Capture cuda graph failed" or a traceback after "Capturing"."""
    if CUDA_GRAPH_CRASH.search(log_text):
        return True
    lines = log_text.splitlines()
    tb = next((i for i, ln in enumerate(lines) if "Traceback" in ln), None)
    return tb is not None and any(CAPTURING.search(ln) for ln in lines[max(0, tb - 20):tb])


def _retry_plan(cfg: RunConfig, gate: GateResult, log_path: Path,
                retried: set[str]) -> tuple[str, RunConfig] | None:
    if gate.verdict != "crashed":
        return None
    text = log_tail(log_path, max_lines=400)
    s = cfg.serve
    if s.retry_without_cuda_graph and "cuda_graph" not in retried and not s.disable_cuda_graph \
            and is_cuda_graph_crash(text):
        serve = s.model_copy(update={"disable_cuda_graph": True})
        return "cuda_graph", cfg.model_copy(update={"serve": serve})
    if s.port is None and "port" not in retried and PORT_IN_USE.search(text):
        return "port", cfg
    return None


def check_draft_content(draft_dir: str | Path) -> None:
    """CheckpointInvalid ``CONTENT_HASH_MISMATCH`` naming the folder when its files no longer match
    its ``manifest.json`` ``content_hash`` (:func:`eagle3.convert.checks.check_content_hash`): a
    cached convert stage hands the folder over unread, so edited weights would be measured as the
    converted draft. Nothing without a manifest (another tool's draft); DataError if unreadable."""
    from eagle3.artifacts import MANIFEST, read_manifest
    from eagle3.convert.checkpoint import Checkpoint
    from eagle3.convert.checks import check_content_hash

    path = Path(draft_dir)
    if not (path / MANIFEST).is_file():
        return
    problems, _ = check_content_hash(Checkpoint(  # the hash reads the files, not the tensors
        path=path, config={}, tensors={}, weight_files=[], manifest=read_manifest(path)))
    if problems:
        raise CheckpointInvalid(f"{problems[0].code}: refusing to serve {path}: "
                                f"{problems[0].message}; convert the draft again (remove {path} "
                                "so the convert stage writes it anew) or check who changed it",
                                problems)


@contextmanager
def launch_ready(cfg: RunConfig, target_dir: str | Path, draft_dir: str | Path | None,
                 out_dir: str | Path, *, require_spec_fields: bool | None = None,
                 command_builder: CommandBuilder | None = None,
                 use_gpu: bool = True) -> Iterator[tuple[EngineProcess, GateResult]]:
    """Launch, pass the readiness gate, yield ``(engine, gate)``; the group always ends on exit.
    Retries once after a CUDA-graph capture crash (``serve.retry_without_cuda_graph``) or a lost
    race for an automatic port. Writes ``out_dir/engine-*.log``, ``diagnostics[-retryN]/``,
    ``attempts.json``. GateFailed when the last attempt is not ready; CheckpointInvalid
    (:func:`check_draft_content`) before any launch when ``draft_dir`` changed after conversion."""
    if draft_dir is not None:
        check_draft_content(draft_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    require = (draft_dir is not None) if require_spec_fields is None else require_spec_fields
    attempts: list[dict] = []
    retried: set[str] = set()
    name = resolve_engine(cfg) if command_builder is None else cfg.serve.engine
    while True:
        n, s = len(attempts), cfg.serve
        suffix = "" if n == 0 else f"-retry{n}"
        engine = launch_engine(cfg, target_dir, draft_dir, out, command_builder=command_builder,
                               log_name=f"engine-{name}{suffix}.log", engine=name)
        try:
            gate = wait_ready(engine.url, pid=engine.pid, log_path=engine.log_path,
                              timeout_s=s.startup_timeout_s, stall_timeout_s=s.stall_timeout_s,
                              poll_interval_s=s.poll_interval_s, probe_timeout_s=s.probe_timeout_s,
                              diagnostics_dir=out / f"diagnostics{suffix}",
                              require_spec_fields=require, use_gpu=use_gpu)
            engine.remember_tree()
            plan = None if gate.ready else _retry_plan(cfg, gate, engine.log_path, retried)
            attempts.append({"attempt": n, "argv": engine.argv, "verdict": gate.verdict,
                             "phases": gate.phases, "log": str(engine.log_path),
                             "retry": plan[0] if plan else None})
            (out / "attempts.json").write_text(json.dumps(attempts, indent=2))
            if gate.ready:
                with engine:
                    yield engine, gate
                return
        except BaseException:
            engine.stop()
            raise
        engine.stop()
        if plan is None:
            raise GateFailed(gate.summary(), verdict=gate.verdict,
                             diagnostics_dir=gate.diagnostics_dir)
        reason, cfg = plan
        retried.add(reason)
        log.warning("engine crashed (%s); retrying once %s", reason, "with CUDA graphs disabled "
                    "(--disable-cuda-graph)" if reason == "cuda_graph" else "on a new port")
