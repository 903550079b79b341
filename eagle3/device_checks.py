"""Is the device a config asks for present on this machine? Checked before a command starts work.

``extract.device``, ``train.device``, ``serve.device``: ``auto``, ``cpu``, ``cuda``, ``cuda:N``.
Fails early (naming key, value and what torch sees) instead of after Prefect, MLflow and the
target load. Not part of config loading: configs are also loaded where they do not run."""

from __future__ import annotations

from typing import Any

from eagle3.errors import ConfigError

SECTIONS = ("extract", "train", "serve")


def device_problems(cfg: Any, cuda_count: int | None = None) -> list[str]:
    """One message per ``<section>.device`` naming CUDA when fewer CUDA devices are present than
    needed (``cuda_count``: None = ask torch). ``auto`` and ``cpu`` never fail."""
    if cuda_count is None:
        import torch

        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out = []
    for name in SECTIONS:
        dev = str(getattr(getattr(cfg, name), "device", "auto"))
        if not dev.startswith("cuda"):
            continue
        index = int(dev.split(":", 1)[1]) if ":" in dev and dev.split(":", 1)[1].isdigit() else 0
        if index >= cuda_count:
            seen = (f"{cuda_count} CUDA device(s)" if cuda_count
                    else "no CUDA device (torch.cuda.is_available() is False)")
            out.append(f"{name}.device: expected a device this machine has, got {dev!r} and torch "
                       f"sees {seen}; fix: -o {name}.device=cpu (or auto), or run it on a machine "
                       f"with a GPU")
    return out


def check_devices(cfg: Any, cuda_count: int | None = None) -> None:
    """Raise ConfigError with every :func:`device_problems` message (one a line), if any."""
    problems = device_problems(cfg, cuda_count)
    if problems:
        raise ConfigError("\n".join(problems))
