"""Is the device a config asks for present on this machine? Checked before a command starts work
(naming key, value and what torch sees), not at config load: configs also load where they do not
run. ``<section>.device``: ``auto``, ``cpu``, ``cuda``, ``cuda:N``; ``num_gpus`` on CUDA."""

from __future__ import annotations

from eagle3.config import RunConfig
from eagle3.errors import ConfigError

SECTIONS = ("extract", "train", "serve")


def device_problems(cfg: RunConfig, cuda_count: int | None = None) -> list[str]:
    """One message per ``<section>.device`` naming CUDA when fewer CUDA devices are present than
    needed (``cuda_count``: None = ask torch). ``auto`` and ``cpu`` never fail. Then, for a
    section whose device is there and resolves to CUDA (``auto`` does when CUDA is present),
    ``extract.num_gpus`` / ``train.num_gpus`` above ``cuda_count``. On the CPU ``num_gpus`` counts
    worker processes (CPU extraction workers, torchrun ranks over gloo), so it is not checked."""
    if cuda_count is None:
        import torch

        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out = []
    for name in SECTIONS:
        sec = getattr(cfg, name)
        dev, n = str(getattr(sec, "device", "auto")), getattr(sec, "num_gpus", None)
        if dev.startswith("cuda"):
            index = int(dev.split(":", 1)[1]) if dev.split(":", 1)[-1].isdigit() else 0
            if index >= cuda_count:
                seen = (f"{cuda_count} CUDA device(s)" if cuda_count
                        else "no CUDA device (torch.cuda.is_available() is False)")
                out.append(f"{name}.device: expected a device this machine has, got {dev!r} and "
                           f"torch sees {seen}; fix: -o {name}.device=cpu (or auto), or run it on "
                           "a machine with a GPU")
                continue
        elif dev != "auto" or cuda_count == 0:  # num_gpus counts CPU worker processes there
            continue
        if isinstance(n, int) and n > cuda_count:
            out.append(f"{name}.num_gpus: expected at most {cuda_count} (the CUDA devices torch "
                       f"sees, {name}.device {dev!r}), got {n}; fix: -o {name}.num_gpus="
                       f"{cuda_count}, or run it on a machine with {n} GPUs")
    return out


def check_devices(cfg: RunConfig, cuda_count: int | None = None) -> None:
    """Raise ConfigError with every :func:`device_problems` message (one a line, each as
    ``DEVICE_MISSING: message``, the code ``eagle3 preflight`` gives them), if any."""
    problems = device_problems(cfg, cuda_count)
    if problems:
        raise ConfigError("\n".join(f"DEVICE_MISSING: {p}" for p in problems))
