"""Shared fixtures. Real assets are prepared once into the asset cache ($EAGLE3_CACHE, default
~/.cache/eagle3-pipeline); everything a test writes goes under its tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _threads_per_xdist_worker() -> int | None:
    """Under pytest-xdist, each worker's share of the CPU cores (at least 1); None in a plain pytest
    run."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if not os.environ.get("PYTEST_XDIST_WORKER") or workers < 1:
        return None
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    return max(1, cores // workers)


# `make test`'s xdist workers each get their share of the cores as torch/OpenMP threads, inherited
# by the processes they start (CLI runs, extraction workers, DDP ranks): with torch's default of one
# thread per core in each of 2 workers, 2 cores run 4+ spinning OpenMP threads, and the tiny models'
# small matmuls ran 5-40x slower (tests/unit/test_train.py 60 s -> 12 s on a 2-core AMD EPYC held to
# AVX2; serve.cpu_threads says the same of the engines). Set before torch is imported; an
# OMP_NUM_THREADS already set wins.
if (_share := _threads_per_xdist_worker()) is not None:
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
    os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"

# The files with the longest tests (pytest --durations of .ci/run, 2026-12-03, on a 2-core Intel
# Xeon with torch capability AVX512 held to AVX2 by ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA /
# MKL_ENABLE_INSTRUCTIONS), longest first: with `make test`'s two xdist workers and --dist loadfile,
# files are handed out in collection order, so starting the long ones first keeps one of them from
# running alone at the end (the suite's wall time is its longest tail).
HEAVY_FIRST = (
    "tests/integration/test_gpu_study_smoke.py",
    "tests/integration/test_cli_signals.py",
    "tests/integration/test_flow_rerun.py",
    "tests/unit/test_train_fixed_shapes.py",
    "tests/unit/test_train_ranks.py",
    "tests/e2e/test_pipeline_preflight.py",
    "tests/sglang/test_extract_sglang.py",
    "tests/integration/test_sweep.py",
    "tests/e2e/test_pipeline_tiny.py",
    "tests/unit/test_extract_resume.py",
    "tests/integration/test_distributed_inprocess.py",
    "tests/unit/test_multi_gpu_bench.py",
    "tests/unit/test_replay.py",
    "tests/sglang/test_tier1.py",
    "tests/unit/test_fastpath.py",
)


_PREFECT_SERVER = None


def pytest_configure(config):
    """Start one Prefect API server for this process's tests (each pytest-xdist worker gets its own;
    the xdist controller runs no test and starts none) and point ``PREFECT_API_URL`` at it, also for
    the CLI subprocesses the tests start: see :mod:`testkit.prefect_server` for why and what it
    costs otherwise. Left out when ``PREFECT_API_URL`` is already set or
    ``EAGLE3_TEST_EPHEMERAL_PREFECT=1`` (every flow then starts its own ephemeral server, as on a
    user's laptop); the tests that are about that mode ask for it with the :func:`ephemeral_prefect`
    fixture."""
    global _PREFECT_SERVER
    is_controller = getattr(config.option, "numprocesses", None) and not hasattr(
        config, "workerinput"
    )
    if (
        is_controller
        or os.environ.get("PREFECT_API_URL")
        or os.environ.get("EAGLE3_TEST_EPHEMERAL_PREFECT") == "1"
    ):
        return
    import tempfile

    from testkit.prefect_server import PID_ENV, start_prefect_server

    home = Path(tempfile.mkdtemp(prefix="eagle3-test-prefect-"))
    _PREFECT_SERVER, url = start_prefect_server(home)
    os.environ["PREFECT_API_URL"] = url
    os.environ[PID_ENV] = str(_PREFECT_SERVER.pid)


def pytest_unconfigure(config):
    global _PREFECT_SERVER
    if _PREFECT_SERVER is not None:
        import sys

        from testkit.prefect_server import PID_ENV, stop_prefect_server

        if (
            "prefect" in sys.modules
        ):  # logs and events this process still queues go out before the server ends
            from prefect.events.worker import EventsWorker
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=5)
            EventsWorker.drain_all(timeout=5)

        stop_prefect_server(_PREFECT_SERVER)
        os.environ.pop("PREFECT_API_URL", None)
        os.environ.pop(PID_ENV, None)
        _PREFECT_SERVER = None


@pytest.fixture
def ephemeral_prefect(monkeypatch):
    """This test's flows (and the CLI processes it starts) use Prefect's ephemeral API server, each
    its own, as without the session server of :func:`pytest_configure`."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)


def pytest_collection_modifyitems(config, items):
    """Run the :data:`HEAVY_FIRST` files first, in that order; every other file, and the tests
    inside each file, keep their collection order (a stable sort)."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    from eagle3.config import PathsConfig

    return PathsConfig().resolved_cache_dir()


@pytest.fixture(scope="session")
def smollm2_dir(cache_dir) -> Path:
    """The real SmolLM2-135M-Instruct HF folder (converted once from the GGUF wheel)."""
    from eagle3.assets import prepare_smollm2

    return prepare_smollm2(cache_dir)


@pytest.fixture(scope="session")
def sharegpt_path(cache_dir) -> Path:
    from eagle3.assets import prepare_sharegpt

    return prepare_sharegpt(cache_dir)


@pytest.fixture
def tiny_cfg(tmp_path):
    """configs/tiny-random.yaml with runs under tmp_path."""
    from eagle3.config import load_config

    return load_config(CONFIGS / "tiny-random.yaml", [f"paths.runs_dir={tmp_path / 'runs'}"])


@pytest.fixture(scope="session")
def tiny_target_dir(cache_dir) -> Path:
    from eagle3.assets import resolve_target
    from eagle3.config import load_config

    return resolve_target(load_config(CONFIGS / "tiny-random.yaml"))


@pytest.fixture
def one_torch_thread():
    """Small models on a shared 2-core machine: one intra-op thread is far faster than two contended
    ones (restored after the test)."""
    from eagle3.precision import torch_threads

    with torch_threads(1):
        yield
