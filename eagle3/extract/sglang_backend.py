"""The ``sglang`` extraction backend: SGLang's offline ``Engine`` with aux-state capture, for
targets too large for transformers.

The engine runs in a child process in SGLang's own environment (``serve.sglang_python``),
``eagle3/engines/sglang/plugin/sglang_extract_worker.py``; this side sends token ids, reads states
``[T, S, H]`` and writes them as the ``hf`` backend does (:mod:`eagle3.extract.store`).

Layer ids: HF ``hidden_states`` index i is SGLang id i-1 ("output of layer k"; docs/ENGINE_FACTS.md
§3). Index L (last layer, before the final norm) is taken by ``eagle3_sglang_capture``
(``SGLANG_EXTERNAL_MODEL_PACKAGE``) at the final norm; index 0 has no SGLang id. Tested on the CPU
against the ``hf`` backend (tests/sglang/test_extract_sglang.py), not on a GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from safetensors.torch import load_file

from eagle3.engines.sglang.profile import VERSION as SGLANG_VERSION
from eagle3.errors import ConfigError, DataError, EngineUnsupported
from eagle3.extract.store import (HS_DIR, PROGRESS_DIR, ShardSpec, check_sample, commit_shard,
                                  hs_name, write_sample)

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "engines" / "sglang" / "plugin"
WORKER = PLUGIN_DIR / "sglang_extract_worker.py"
PREFIX = "EAGLE3-"


def sglang_layer_ids(capture_ids: list[int], num_layers: int) -> list[int]:
    """SGLang's ids (output of layer k) for HF ``hidden_states`` indices ``capture_ids`` (last =
    ``num_layers``). ConfigError for index 0 (the embeddings: no SGLang id) or one above
    ``num_layers``."""
    bad = [i for i in capture_ids if not 1 <= i <= num_layers]
    if bad:
        raise ConfigError(f"extract.aux_layer_ids: HF hidden_states indices {bad} cannot be "
                          f"captured by SGLang (expected 1..{num_layers}: index i is the output of "
                          "layer i-1; index 0, the embeddings, has no SGLang id), got "
                          f"{capture_ids[:-1]}")
    from eagle3.engines.registry import get_profile

    return get_profile("sglang").hf_to_engine_ids(capture_ids)  # the profile owns the ±1


def worker_env(cfg, log_dir: Path) -> dict[str, str]:
    """The worker's environment: this one without our virtualenv/PYTHONPATH, the plugin folder first
    on ``PYTHONPATH`` (then ``extract.sglang_env``'s own ``PYTHONPATH``), then the rest of
    ``extract.sglang_env``."""
    env = {k: v for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    extra = dict(cfg.extract.sglang_env)
    paths = [str(PLUGIN_DIR)] + ([extra.pop("PYTHONPATH")] if extra.get("PYTHONPATH") else [])
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


class SGLangWorker:
    """The worker process: start, ``request(ids, out)``, ``close()``; a context manager. stdout
    carries the protocol lines (read by a thread), stderr (SGLang's log) goes to ``log_path``.
    EngineUnsupported, naming the log, when the worker fails to start or reports an error."""

    def __init__(self, python: str, job: dict, work_dir: Path, env: dict[str, str],
                 startup_timeout_s: float):
        self.work_dir, job_path = work_dir, work_dir / "sglang_job.json"
        work_dir.mkdir(parents=True, exist_ok=True)
        job_path.write_text(json.dumps(job, indent=1))
        self.log_path = work_dir / "sglang_extract.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in close()
        try:
            self.proc = subprocess.Popen([python, str(WORKER), str(job_path)], text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, env=env, start_new_session=True,
                                         cwd=str(work_dir))
        except OSError as e:
            self._log.close()
            raise EngineUnsupported(f"serve.sglang_python={python!r}: cannot start the SGLang "
                                    f"extraction worker ({e}); expected the interpreter of an "
                                    f"environment with sglang=={SGLANG_VERSION}") from e
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="sglang-extract-stdout").start()
        self.ready = self._expect("READY", startup_timeout_s, "start the engine")

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _expect(self, kind: str, timeout_s: float, doing: str) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise EngineUnsupported("SGLang extraction worker: no answer within "
                                        f"{timeout_s:.0f} s to {doing}; log: {self.log_path}"
                                        ) from None
            if line is None:
                code = self.proc.wait()
                raise EngineUnsupported(f"SGLang extraction worker exited (code {code}) while "
                                        f"trying to {doing}; last log "
                                        f"lines:\n{_tail(self.log_path)}\n(full log: "
                                        f"{self.log_path})")
            if not line.startswith(PREFIX):
                self._log.write(line + "\n")
                continue
            got_kind, _, payload = line[len(PREFIX):].partition(" ")
            data = json.loads(payload or "{}")
            if got_kind == "ERROR":
                raise EngineUnsupported(f"SGLang extraction worker failed to {doing}: "
                                        f"{data.get('error')} (full traceback in {self.log_path})")
            if got_kind == kind:
                return data

    def request(self, ids: list[list[int]], out: Path, timeout_s: float) -> dict:
        """Send one batch; returns the worker's RESULT payload once ``out`` is written."""
        try:
            self.proc.stdin.write(json.dumps({"ids": ids, "out": str(out)}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise EngineUnsupported(f"SGLang extraction worker is gone ({e}); last log lines:\n"
                                    f"{_tail(self.log_path)}") from e
        return self._expect("RESULT", timeout_s, f"extract a batch of {len(ids)} samples")

    def close(self, grace_s: float = 30.0) -> None:
        """Ask the engine to shut down; end the worker's process group after ``grace_s``."""
        from eagle3.procs import terminate_tree

        if self.proc.poll() is None:
            with contextlib.suppress(OSError):  # BrokenPipeError included
                self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self.proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        terminate_tree(self.proc, grace_s=5.0)
        self._log.close()

    def __enter__(self) -> "SGLangWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(log unreadable)"


def run_sglang_shards(cfg, target_dir: Path, capture_ids: list[int], num_layers: int,
                      sample_ids: list[str], input_ids: list[list[int]],
                      loss_masks: list[list[int]], shards: list[ShardSpec], out_dir: Path,
                      on_progress: Callable[[int], None] | None = None) -> dict[int, int]:
    """Extract ``shards`` through SGLang, committing each; returns {shard index: bytes written}.
    ``capture_ids``: HF ``hidden_states`` indices, the last = ``num_layers``; a shard's samples go
    in length-sorted batches of ``extract.batch_size``. ConfigError (ids SGLang cannot capture),
    EngineUnsupported (worker start/engine failure, with the log's tail), DataError (integrity)."""
    from eagle3.engines.sglang.environment import sglang_python

    layer_ids = sglang_layer_ids(capture_ids, num_layers)
    job = {"target_dir": str(target_dir), "dtype": cfg.target.dtype, "layer_ids": layer_ids,
           "engine_args": dict(cfg.extract.sglang_engine_args)}
    work = out_dir / PROGRESS_DIR / "sglang"
    written: dict[int, int] = {}
    with SGLangWorker(sglang_python(cfg), job, work, worker_env(cfg, work),
                      cfg.extract.sglang_startup_timeout_s) as worker:
        for spec in shards:
            rows = sorted(range(spec.start, spec.stop), key=lambda i: (len(input_ids[i]), i))
            sizes: dict[str, int] = {}
            for b in range(0, len(rows), cfg.extract.batch_size):
                chunk = rows[b: b + cfg.extract.batch_size]
                batch_file = work / f"batch_{spec.index}_{b}.safetensors"
                worker.request([input_ids[i] for i in chunk], batch_file,
                               cfg.extract.sglang_request_timeout_s)
                states = load_file(str(batch_file))
                for k, i in enumerate(chunk):
                    hs = states.get(f"s{k}")
                    if hs is None:
                        raise DataError(f"{batch_file}: tensor 's{k}' (sample {sample_ids[i]}) "
                                        "missing")
                    path = out_dir / HS_DIR / hs_name(i)
                    check_sample(sample_ids[i], path, input_ids[i], loss_masks[i], hs)
                    sizes[path.name] = write_sample(path, input_ids[i], hs, cfg.extract.dtype)
                batch_file.unlink()
                if on_progress:
                    on_progress(sum(len(input_ids[i]) for i in chunk))
            commit_shard(out_dir, spec, sizes)
            written[spec.index] = sum(sizes.values())
    return written
