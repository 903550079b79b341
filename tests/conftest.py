"""Shared fixtures. Real assets are prepared once into the asset cache ($EAGLE3_CACHE, default
~/.cache/eagle3-pipeline); everything a test writes goes under its tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


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
    """Small models on a shared 2-core machine: one intra-op thread is far faster than two contended ones
    (restored after the test)."""
    from eagle3.precision import torch_threads

    with torch_threads(1):
        yield
