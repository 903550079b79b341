"""Where SGLang's interpreter is (``serve.sglang_python``: an environment of its own with its own
CUDA torch, built by ``make sglang-env``; the launcher and the ``sglang`` extraction backend start
it), and whether it can import ``sglang`` (found without importing it here).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path


def sglang_python(cfg) -> str:
    """The interpreter that runs SGLang: ``cfg.serve.sglang_python`` (``cfg`` a RunConfig), else
    this one."""
    return cfg.serve.sglang_python or sys.executable


ANSWER_TIMEOUT_S = 60  # a Python answers these questions in well under a second


def _run(python: str, code: str) -> subprocess.CompletedProcess | None:
    """``python -c code`` in a process group of its own, at most :data:`ANSWER_TIMEOUT_S`
    seconds; None when it cannot start or does not answer in time (then its whole group, children
    included, is ended: it is a group this function started)."""
    try:
        proc = subprocess.Popen([python, "-c", code], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError:
        return None
    try:
        out, err = proc.communicate(timeout=ANSWER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def sglang_installed(python: str) -> bool:
    """Whether ``python`` can import ``sglang`` (looked up without importing it)."""
    if python == sys.executable:
        return importlib.util.find_spec("sglang") is not None
    out = Path(python).exists() and _run(
        python, "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)")
    return bool(out) and out.returncode == 0


def sglang_unusable_reason(python: str) -> str:
    """Why ``python`` cannot run SGLang, for messages: not an executable file, or it cannot import
    sglang."""
    if python != sys.executable and not (Path(python).is_file() and os.access(python, os.X_OK)):
        return f"{python} is not an executable file"
    if python != sys.executable:
        probe = _run(python, "import sys; print('python', sys.version_info[0])")
        if probe is None:
            return (f"{python} did not answer within {ANSWER_TIMEOUT_S} s (its process group "
                    "was ended); is it a Python interpreter?")
        if probe.returncode != 0 or probe.stdout.strip() != "python 3":
            return (f"{python} is not a Python 3 interpreter (asked for its version: exit code "
                    f"{probe.returncode}, output {probe.stdout.strip()[:80]!r})")
    return f"{python} cannot import sglang"


def sglang_version(python: str) -> str | None:
    """The sglang version ``python`` has installed (package metadata), None when it cannot tell."""
    out = _run(python, "import importlib.metadata as m; print(m.version('sglang'))")
    return (out.stdout.strip() or None) if out and out.returncode == 0 else None


# pinned releases with a kit for a machine without network (the kit's PINS name that release)
OFFLINE_KITS = {"0.5.16": "lab/gpu/sglang_kit.sh"}


def install_advice(version: str) -> str:
    """How to build an environment with SGLang ``version`` (a key of ``profile.RELEASES``): ``make
    sglang-env`` for ``VERSION`` (the Makefile's SGLANG_VERSION), else a venv of its own, or its
    offline kit (:data:`OFFLINE_KITS`) on a machine without network."""
    from eagle3.engines.sglang.profile import VERSION

    if version == VERSION:
        return "make sglang-env"
    kit = OFFLINE_KITS.get(version)
    offline = f", or {kit} (build, then install) on a machine without network" if kit else ""
    return (f"python3 -m venv DIR && DIR/bin/pip install sglang=={version} (make sglang-env "
            f"builds {VERSION}){offline}")
