"""Running the real SGLang 0.5.23 as the conformance oracle, from the project's own environment
(test harness).

SGLang lives in its own environment ``<asset cache>/venv-sglang`` (``make sglang-env``; CUDA torch
2.14.1, never mixed into ``.venv``). This module runs code there as child processes with
``TRITON_INTERPRET=1`` (SGLang's Triton kernels run on the CPU in Triton's interpreter) and
``testkit/sglang_shims`` on ``PYTHONPATH`` (a pure-torch ``vllm._custom_ops.rotary_embedding``, the
``spec_tree`` patches, and the ``sitecustomize`` hook that applies them in every process, SGLang's
spawned schedulers included). Recipe and facts: docs/SGLANG_ON_CPU.md. Tensors cross between the two
environments as safetensors files.

The SGLang-side code is ``testkit/sglang_worker.py`` (coverage with a NaN sentinel fill and an
EXTEND-mode forward of ``LlamaForCausalLMEagle3``); :func:`run_jobs` batches many checkpoints into
one worker process so SGLang's ~10 s import is paid once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]


def _default_sglang_venv() -> Path:
    """``$EAGLE3_SGLANG_VENV``, else ``<asset cache>/venv-sglang`` (where ``make sglang-env`` puts
    it)."""
    from eagle3.config import PathsConfig

    return PathsConfig().resolved_cache_dir() / "venv-sglang"


SGLANG_VENV = Path(os.environ.get("EAGLE3_SGLANG_VENV") or _default_sglang_venv())
SHIMS_DIR = Path(__file__).resolve().parent / "sglang_shims"
WORKER = Path(__file__).resolve().parent / "sglang_worker.py"
SGLANG_VERSION = "0.5.23"


def sglang_python() -> Path:
    """Path of ``.venv-sglang``'s interpreter (it may not exist; see :func:`sglang_env_missing`)."""
    return SGLANG_VENV / "bin" / "python"


def sglang_env_missing() -> str | None:
    """Why the SGLang environment cannot be used, or ``None`` when it can (a skip reason for tests).

    Checks the interpreter and the stamp file ``make sglang-env`` writes after verifying the pinned
    version.
    """
    if not sglang_python().is_file():
        return (
            f"{sglang_python()} not found: run `make sglang-env` (SGLang {SGLANG_VERSION}, ~11 GB, "
            "~4 min)"
        )
    if not (SGLANG_VENV / ".installed").is_file():
        return f"{SGLANG_VENV}/.installed missing: `make sglang-env` did not finish; run it again"
    return None


def sglang_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a ``.venv-sglang`` process: interpreter mode for Triton, shims first on
    PYTHONPATH.

    The project's own ``PYTHONPATH``/virtualenv variables are dropped so nothing from ``.venv``
    leaks in; Hugging Face access stays offline. ``extra`` overrides last.
    """
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    env.update(
        {
            "TRITON_INTERPRET": "1",
            "PYTHONPATH": str(SHIMS_DIR),
            "VIRTUAL_ENV": str(SGLANG_VENV),
            "PATH": f"{SGLANG_VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONWARNINGS": "ignore::UserWarning",
        }
    )
    env.update(extra or {})
    return env


def run_sglang_script(
    args: list[str],
    *,
    timeout_s: float,
    cwd: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``.venv-sglang/bin/python ARGS...`` with :func:`sglang_env`; output captured as text.

    Raises ``RuntimeError`` when the environment is missing (with :func:`sglang_env_missing`'s
    reason) and ``subprocess.TimeoutExpired`` after ``timeout_s`` seconds.
    """
    missing = sglang_env_missing()
    if missing:
        raise RuntimeError(missing)
    return subprocess.run(
        [str(sglang_python()), *args],
        cwd=str(cwd or REPO),
        env=sglang_env(extra_env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@dataclass
class Coverage:
    """One checkpoint loaded through SGLang's ``LlamaForCausalLMEagle3.load_weights`` with a NaN
    sentinel.

    ``unfilled``: parameter name → fraction of its elements no tensor wrote (1.0 = whole parameter).
    ``unconsumed``: tensor names that, loaded alone, filled no parameter and set no
    ``hot_token_id``. ``ignored_by_design``: ``t2d`` (SGLang skips it on purpose).
    ``replaced_at_runtime``: the draft's ``embed_tokens`` when no tensor fills it but SGLang's
    ``set_embed`` replaces it with the target's. ``unfilled_unused``: parameters no tensor fills
    that SGLang's forward never reads (changing them leaves an EXTEND forward unchanged), e.g.
    ``model.layers.{i>=1}.input_layernorm.weight``. ``error``: why building/loading raised.
    """

    name: str
    params: list[str] = field(default_factory=list)
    tensors: list[str] = field(default_factory=list)
    unfilled: dict[str, float] = field(default_factory=dict)
    unconsumed: list[str] = field(default_factory=list)
    ignored_by_design: list[str] = field(default_factory=list)
    replaced_at_runtime: list[str] = field(default_factory=list)
    unfilled_unused: list[str] = field(default_factory=list)
    hot_token_id_set: bool = False
    error: str | None = None

    @property
    def complete(self) -> bool:
        """True when SGLang loaded it, filled every parameter and consumed every tensor."""
        return self.error is None and not self.unfilled and not self.unconsumed

    def summary(self) -> str:
        """One line for assertion messages."""
        if self.error:
            return f"{self.name}: failed to load in SGLang: {self.error.splitlines()[0]}"
        return (
            f"{self.name}: unfilled={sorted(self.unfilled)} unconsumed={self.unconsumed} "
            f"hot_token_id={'set' if self.hot_token_id_set else 'unset'}"
        )


def run_jobs(
    jobs: list[dict],
    work_dir: Path,
    *,
    timeout_s: float = 300,
    during: Callable[[], None] | None = None,
) -> list[dict]:
    """Run worker jobs (see ``sglang_worker.py``) in one ``.venv-sglang`` process; returns their
    results.

    ``jobs``: dicts with ``op`` ("coverage" | "forward"), ``name`` and the op's paths. Results come
    back in order. ``during``: called in this process while the worker runs (overlaps other work
    with SGLang's start-up). Raises ``RuntimeError`` (with the worker's stderr tail) when the worker
    exits non-zero or returns fewer results than jobs, ``subprocess.TimeoutExpired`` after
    ``timeout_s`` seconds (the worker is killed).
    """
    missing = sglang_env_missing()
    if missing:
        raise RuntimeError(missing)
    work_dir.mkdir(parents=True, exist_ok=True)
    jobs_path, results_path = work_dir / "sglang_jobs.json", work_dir / "sglang_results.json"
    log_path = work_dir / "sglang_worker.log"
    jobs_path.write_text(json.dumps(jobs, indent=1))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(sglang_python()), str(WORKER), str(jobs_path), str(results_path)],
            cwd=str(REPO),
            env=sglang_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            if during is not None:
                during()
            proc.wait(timeout=timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = json.loads(results_path.read_text()) if results_path.is_file() else []
    if proc.returncode != 0 or len(results) != len(jobs):
        raise RuntimeError(
            f"SGLang worker exit code {proc.returncode}, {len(results)}/{len(jobs)} results; "
            f"log {log_path} tail:\n{log_path.read_text()[-3000:]}"
        )
    return results


def coverage_many(
    checkpoints: dict[str, Path], work_dir: Path, *, timeout_s: float = 300
) -> dict[str, Coverage]:
    """Sentinel-fill coverage of several SGLang-format draft folders in one SGLang process, by
    name."""
    jobs = [
        {"op": "coverage", "name": name, "dir": str(path)} for name, path in checkpoints.items()
    ]
    out = {}
    for res in run_jobs(jobs, work_dir, timeout_s=timeout_s):
        res.pop("op")
        out[res["name"]] = Coverage(**res)
    return out


def sglang_extend_forward(
    draft_dir: Path, inputs: dict, work_dir: Path, *, timeout_s: float = 300
) -> dict:
    """SGLang's EXTEND-mode float32 forward of one draft; returns ``logits``, ``hidden_prenorm``,
    ``last_logits``.

    ``inputs``: ``input_ids [T] int64``, ``positions [T] int64``, ``hidden_states [T, W] float32``
    and optionally ``target_embed [vocab, H]`` (replaces the draft's embedding, as SGLang's
    ``set_embed``). Returned tensors: ``logits [T, draft_vocab]``, ``hidden_prenorm [T, H]`` (the
    hidden state SGLang hands to the next draft step), ``last_logits [1, draft_vocab]`` (SGLang's
    ``LogitsProcessor``, last position).
    """
    return sglang_forward_many({"forward": (draft_dir, inputs)}, work_dir, timeout_s=timeout_s)[
        "forward"
    ]


def sglang_forward_many(
    cases: dict[str, tuple[Path, dict]],
    work_dir: Path,
    *,
    extra_jobs: list[dict] | None = None,
    timeout_s: float = 300,
    during: Callable[[], None] | None = None,
) -> dict[str, dict]:
    """Several EXTEND forwards (name → (draft_dir, inputs)) plus optional other jobs, in one
    SGLang process.

    ``during``: see :func:`run_jobs`.
    Returns name → output tensors (see :func:`sglang_extend_forward`) for forwards, and
    name → the raw result dict for ``extra_jobs``. Raises ``RuntimeError`` naming the case when
    SGLang's forward raised.
    """
    from safetensors.torch import load_file, save_file

    jobs = list(extra_jobs or [])
    clash = set(cases) & {j.get("name") for j in jobs}
    if clash:
        raise ValueError(
            f"sglang_forward_many: forward case names {sorted(clash)} also name extra jobs; "
            "expected unique names"
        )
    for name, (draft_dir, inputs) in cases.items():
        in_path, out_path = (
            work_dir / f"{name}.in.safetensors",
            work_dir / f"{name}.out.safetensors",
        )
        work_dir.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in inputs.items()}, str(in_path))
        jobs.append(
            {
                "op": "forward",
                "name": name,
                "dir": str(draft_dir),
                "inputs": str(in_path),
                "out": str(out_path),
            }
        )
    out: dict[str, dict] = {}
    for res in run_jobs(jobs, work_dir, timeout_s=timeout_s, during=during):
        if res["op"] != "forward":
            out[res["name"]] = res
            continue
        if res.get("error"):
            raise RuntimeError(
                f"SGLang EXTEND forward of case {res['name']!r} failed: {res['error']}"
            )
        out[res["name"]] = load_file(res["out"]) | {"_meta": res}
    return out


# The full server on the CPU (docs/SGLANG_ON_CPU.md): flags the launcher does not generate itself.
CPU_SERVER_ARGS = [
    "--device",
    "cpu",
    "--attention-backend",
    "triton",
    "--disable-overlap-schedule",
    "--max-total-tokens",
    "4096",
]


def cpu_serve_config(cfg, *, num_steps: int = 3, startup_timeout_s: float = 420.0):
    """A copy of ``cfg`` (RunConfig) whose ``serve`` section starts the real SGLang from
    ``.venv-sglang`` on the CPU: ``engine=sglang``, float32, no CUDA graphs, context 512, chain
    drafting (topk 1, ``num_steps`` steps, ``num_steps + 1`` draft tokens), the CPU flags above and
    :func:`sglang_env`'s Triton/shim variables."""
    env = {
        k: v
        for k, v in sglang_env().items()
        if k in ("TRITON_INTERPRET", "PYTHONPATH", "PYTHONWARNINGS")
    }
    serve = cfg.serve.model_copy(
        update={
            "engine": "sglang",
            "sglang_python": str(sglang_python()),
            "dtype": "float32",
            "disable_cuda_graph": True,
            "context_length": 512,
            "speculative_num_steps": num_steps,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": num_steps + 1,
            "extra_args": list(CPU_SERVER_ARGS),
            "env": env,
            "startup_timeout_s": startup_timeout_s,
            "stall_timeout_s": 180.0,
            "probe_timeout_s": 300.0,
            "mem_fraction_static": None,
            "cuda_graph_max_bs": None,
            "tp": 1,
        }
    )
    return cfg.model_copy(update={"serve": serve})


if __name__ == "__main__":  # manual use: python testkit/sglang_harness.py DRAFT_DIR...
    dirs = {Path(p).name: Path(p) for p in sys.argv[1:]}
    for cov in coverage_many(dirs, Path("/tmp/sglang_harness")).values():
        print(("OK   " if cov.complete else "FAIL ") + cov.summary())
