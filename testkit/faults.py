"""Faults injected into the processes a test starts (torchrun ranks, spawned extraction workers)
through a ``sitecustomize`` module put first on their ``PYTHONPATH``: the library itself carries no
test hooks.

``fault_env(dir, fault)`` writes the module and returns the environment to add (tests:
``monkeypatch.setenv``). Faults (``EAGLE3_TEST_FAULT``):

- ``train-never-arrive:R`` — rank R writes ``started`` and then sleeps instead of joining the
  process group;
- ``train-kill:R:S`` — rank R kills itself with SIGKILL when it is about to take optimizer step S+1
  (``run.step == S``), i.e. after step S and before the next checkpoint;
- ``extract-hang:K`` — extraction worker K sleeps before it loads the target (never ready);
- ``extract-kill:K`` — extraction worker K writes its first shard, then kills itself with SIGKILL.
"""

from __future__ import annotations

import os
from pathlib import Path

SITECUSTOMIZE = r"""
import os
import sys

_fault = os.environ.get("EAGLE3_TEST_FAULT", "")
_kind, *_args = _fault.split(":") if _fault else ("",)


def _sleep(*a, **k):
    import time
    time.sleep(3600)


if _kind == "train-never-arrive" and os.environ.get("RANK") == _args[0]:
    import eagle3.train.distributed as _d
    _d.setup_distributed = _sleep
elif _kind == "train-kill" and os.environ.get("RANK") == _args[0]:
    import eagle3.train.loop as _loop
    _orig_step = _loop.optimizer_step

    def _step(run, window):
        if run.step == int(_args[1]):
            os.kill(os.getpid(), 9)
        return _orig_step(run, window)

    _loop.optimizer_step = _step
elif _kind.startswith("extract-") and "--multiprocessing-fork" in sys.argv:
    import dataclasses
    import eagle3.extract.workers as _w
    _orig_main, _orig_run = _w._worker_main, _w.run_shards
    _me = {}

    def _main(job, status_dir, index):
        _me["index"] = index
        return _orig_main(job, status_dir, index)

    def _run(job, **kw):
        if _me.get("index") != int(_args[0]):
            return _orig_run(job, **kw)
        if _kind == "extract-hang":
            _sleep()
        _orig_run(dataclasses.replace(job, shards=job.shards[:1]), **kw)
        os.kill(os.getpid(), 9)

    _w._worker_main, _w.run_shards = _main, _run
"""


def fault_env(directory: str | Path, fault: str) -> dict[str, str]:
    """Write ``sitecustomize.py`` into ``directory``; returns
    ``{"PYTHONPATH", "EAGLE3_TEST_FAULT"}`` to set."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": str(directory) + (os.pathsep + path if path else ""),
        "EAGLE3_TEST_FAULT": fault,
    }
