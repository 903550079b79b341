"""Is the device a config asks for present on this machine? Checked before a command starts its
work.

``extract.device``, ``train.device`` and ``serve.device`` take ``auto``, ``cpu``, ``cuda`` or
``cuda:N``. A GPU config (e.g. ``configs/smollm2-gpu.yaml``) run on a machine without CUDA otherwise
got far (Prefect started, MLflow runs opened, the target's weights loaded) before torch failed with
"Torch not compiled with CUDA enabled" and a retry hint; this check fails first, naming every key,
the value and what torch sees. Not part of loading a config: a config is also loaded where it is not
run (tests, the machine that only submits a deployment run)."""

from __future__ import annotations

from typing import Any

from eagle3.errors import ConfigError

SECTIONS = ("extract", "train", "serve")


def device_problems(cfg: Any, cuda_count: int | None = None) -> list[str]:
    """One message per ``<section>.device`` that names CUDA (``cuda`` or ``cuda:N``) when this
    machine has fewer CUDA devices than it needs. ``cuda_count``: the visible CUDA devices (None =
    ask torch). ``auto`` and ``cpu`` never fail here."""
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
