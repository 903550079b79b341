"""``eagle3 doctor``: is this machine ready to run the pipeline, and where will it run?

One ``OK``/``WARN``/``FAIL`` line each: Python, torch and devices, CPU features and ``auto``
dtypes with the measured bf16/float32 ratio (eagle3.precision), SGLang (needs an NVIDIA GPU; else
the CPU reference engine serves), free disk, the asset cache, Prefect and MLflow servers (httpx
only). An unconfigured, absent server is fine (ephemeral Prefect, local SQLite MLflow); one set via
``PREFECT_API_URL`` / ``MLFLOW_TRACKING_URI`` that does not answer is a FAIL."""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import os
import platform
import re
import shutil
import sys
from pathlib import Path
from typing import Callable

import httpx

from eagle3.engines.sglang.profile import RELEASES as SGLANG_RELEASES
from eagle3.engines.sglang.profile import VERSION as SGLANG_VERSION

MIN_FREE_BYTES = 5 * 1024**3  # below this a run may not fit (hidden states, checkpoints)
PREFECT_DEFAULT = "http://127.0.0.1:4200/api"  # infra/stack.sh
MLFLOW_DEFAULT = "http://127.0.0.1:5000"
# a release as package metadata writes it (PEP 440: 0.5.23, 0.5.0rc2, 0.4.6.post1, 0.5.1+cu128)
VERSION_RE = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9.]+)?")


def _probe(url: str, timeout_s: float = 2.0) -> tuple[bool, str]:
    """(answered with 2xx, short description) for ``GET url``."""
    try:
        r = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as e:
        return False, type(e).__name__
    return r.is_success, f"HTTP {r.status_code}"


def check_torch() -> tuple[str, str]:
    try:
        import torch
    except ImportError as e:
        return "FAIL", f"torch not importable ({e}); run `make env`"
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(n))
        return "OK", f"torch {torch.__version__}, CUDA {torch.version.cuda}: {n} GPU(s) ({names})"
    return "OK", (f"torch {torch.__version__}, CPU only ({os.cpu_count()} cores): training and "
                  "extraction on CPU")


def check_precision() -> tuple[str, str]:
    """CPU features (torch, ``/proc/cpuinfo``), ISA caps in the environment, the measured
    bf16/float32 ratio and what ``auto`` resolves to on CPU (and CUDA)."""
    try:
        import torch
    except ImportError as e:
        return "FAIL", f"precision: torch not importable ({e})"
    from eagle3.precision import bf16_is_fast, probe_cpu_bf16, resolve_dtype, resolve_precision

    p = probe_cpu_bf16()
    flags = ", ".join(f for f, on in p.features.items() if on) or "none found"
    caps = "; caps " + ", ".join(f"{k}={v}" for k, v in p.isa_env.items()) if p.isa_env else ""
    text = (f"CPU: torch capability {p.capability}, flags {flags}{caps}; {p.describe()}; on the "
            f"CPU: target/extract/serve dtype auto = {resolve_dtype('auto', 'cpu')}, "
            f"train.precision auto = {resolve_precision('auto', 'cpu')}")
    if torch.cuda.is_available():
        text += f"; on CUDA auto = {resolve_dtype('auto', 'cuda')} ({bf16_is_fast('cuda')[1]})"
    return "OK", text


def interpreter_problem(python: str) -> str | None:
    """Why ``python`` (a path, ``~`` expanded) cannot be run as an interpreter, naming the path:
    it is empty (``Path("")`` would be the current directory), it does not exist, it is a
    directory, or it is a file without execute permission; None when it is an executable file."""
    if not python.strip():
        return (f"{python!r}: expected the path of the Python interpreter of an environment with "
                "SGLang, got an empty value")
    p = Path(python).expanduser()
    if not p.exists():
        found = shutil.which(python) if "/" not in python else None
        hint = (" (a broken link)" if p.is_symlink() else
                f" (a bare name is not looked up on PATH: give its full path, e.g. {found})"
                if found else "")
        return (f"{python}: expected the Python interpreter of an environment with SGLang, got a "
                f"path that does not exist{hint}")
    if p.is_dir():
        cand = next((c for c in (p / "bin" / "python", p / "bin" / "python3") if c.is_file()),
                    None)
        hint = f"; did you mean {cand}?" if cand else " (expected a file such as DIR/bin/python)"
        return (f"{python}: expected the Python interpreter of an environment with SGLang, got a "
                f"directory{hint}")
    if not os.access(p, os.X_OK):
        return (f"{python}: expected an executable Python interpreter, got a file without "
                "execute permission (chmod +x, or the environment's bin/python)")
    return None


def check_sglang(python: str | None = None) -> tuple[str, str]:
    """SGLang in ``python`` (an interpreter path; None: this environment, naming the conformance
    environment ``$EAGLE3_SGLANG_VENV`` / ``<cache>/venv-sglang`` when it lacks SGLang): its version
    against the pinned releases (``eagle3.engines.sglang.profile.RELEASES``), and whether a GPU can
    run it. FAIL for a ``python`` that is missing, a directory or not executable
    (:func:`interpreter_problem`), or whose answer to the version query is no version string
    (quoted)."""
    from eagle3.config import PathsConfig
    from eagle3.engines.sglang.environment import sglang_version

    if python is not None and (why := interpreter_problem(python)) is not None:
        return "FAIL", f"SGLang: --sglang-python {why}"
    version = None
    if python is not None:
        if (version := sglang_version(python)) is None:
            return "FAIL", f"SGLang: {python} cannot import sglang (serve.sglang_python)"
    else:
        with contextlib.suppress(md.PackageNotFoundError):
            version = md.version("sglang")
    if version is not None and not VERSION_RE.fullmatch(version):
        shown = version if len(version) <= 80 else version[:77] + "..."
        who = f"--sglang-python {python}" if python is not None else "this environment"
        return "FAIL", (f"SGLang: {who}: expected a version string such as "
                        f"{SGLANG_VERSION} when asked for sglang's version, got {shown!r} "
                        "(is it a Python interpreter?)")
    if version is None:
        cache = PathsConfig().resolved_cache_dir()
        venv = Path(os.environ.get("EAGLE3_SGLANG_VENV") or cache / "venv-sglang")
        extra = (f"; a separate SGLang env exists at {venv} (conformance tests)"
                 if (venv / "bin" / "python").exists() else "")
        return "OK", ("SGLang not installed in this environment: deploy uses the CPU reference "
                      f"engine{extra}")
    where = f" in {python}" if python else ""
    pin = (f" (not a pinned release; the profiles are written for {sorted(SGLANG_RELEASES)})"
           if version not in SGLANG_RELEASES else
           f" (pinned; configs serving it set convert.engine_version: '{version}')"
           if version != SGLANG_VERSION else "")
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if gpu:
        return ("OK" if version in SGLANG_RELEASES else "WARN",
                f"SGLang {version}{where}{pin}: can serve here (NVIDIA GPU present)")
    return "WARN", (f"SGLang {version}{where}{pin} installed but no NVIDIA GPU: it cannot serve at "
                    "speed here (CPU only under TRITON_INTERPRET=1 with shims, for conformance "
                    "tests; docs/SGLANG_ON_CPU.md)")


def check_disk(paths: dict[str, Path]) -> list[tuple[str, str]]:
    out = []
    for name, p in paths.items():
        free = shutil.disk_usage(next(q for q in (p, *p.parents) if q.exists())).free
        out.append(("OK" if free >= MIN_FREE_BYTES else "FAIL", f"{name} {p}: "
                    f"{free / 1024**3:.1f} GiB free (need ≥ {MIN_FREE_BYTES / 1024**3:.0f} GiB)"))
    return out


def check_server(name: str, env_var: str, default: str, health_path: str) -> tuple[str, str]:
    configured = os.environ.get(env_var)
    url = (configured or default).rstrip("/")
    if configured and not configured.startswith(("http://", "https://")):
        return "OK", f"{name}: {env_var}={configured} (a local store, no server needed)"
    ok, what = _probe(url + health_path)
    if ok:
        return "OK", f"{name} server answers at {url} ({what})"
    if configured:
        return "FAIL", (f"{name} server configured by {env_var}={configured} does not answer "
                       f"({what}); start it with `make stack-up` or unset the variable")
    fallback = ("Prefect's ephemeral API will be used" if name == "Prefect"
                else "the local SQLite store <runs_dir>/mlflow.db will be used")
    return "OK", f"no {name} server at {url} ({what}): {fallback}"


def run_doctor(echo: Callable[[str], None] = print, sglang_python: str | None = None) -> bool:
    """Run every check, print one line each through ``echo``; True when none is a FAIL.
    ``sglang_python``: the interpreter that serves SGLang (``serve.sglang_python``), if any."""
    from eagle3.config import PathsConfig

    paths = PathsConfig()
    results = [("OK" if sys.version_info[:2] in ((3, 11), (3, 12)) else "WARN",
                f"Python {platform.python_version()} ({sys.executable})"), check_torch(),
                check_precision(), check_sglang(sglang_python)]
    results += check_disk({"runs": paths.resolved_runs_dir(), "cache": paths.resolved_cache_dir()})
    smol = paths.resolved_cache_dir() / "models" / "smollm2-135m-instruct" / "config.json"
    results += [("OK", f"assets: SmolLM2 prepared at {smol.parent}") if smol.is_file() else
                ("WARN", f"assets: SmolLM2 not prepared yet ({smol.parent}); `make assets` "
                         "prepares it"),
                check_server("Prefect", "PREFECT_API_URL", PREFECT_DEFAULT, "/health"),
                check_server("MLflow", "MLFLOW_TRACKING_URI", MLFLOW_DEFAULT, "/health")]
    for status, text in results:
        echo(f"{status:<4} {text}")
    return all(s != "FAIL" for s, _ in results)
