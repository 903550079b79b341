"""Build-time check of the worker image (infra/Dockerfile.worker): the torch build matches the variant, and PyPI's
CUDA torchvision/torchaudio stayed out of the CPU image. Exit status 0, else 1 with what was expected and found.

    python infra/image_check.py cpu|gpu
"""

from __future__ import annotations

import importlib.metadata as md
import sys


def main(variant: str) -> int:
    import torch

    if variant not in ("cpu", "gpu"):
        print(f"image_check: variant expected 'cpu' or 'gpu', got {variant!r}", file=sys.stderr)
        return 1
    installed = {d.metadata["Name"].lower() for d in md.distributions()}
    problems = []
    is_cpu = "+cpu" in torch.__version__
    if variant == "cpu" and not is_cpu:
        problems.append(f"torch: expected a +cpu build in the cpu image, got {torch.__version__}")
    if variant == "gpu" and (is_cpu or torch.version.cuda is None):
        problems.append(f"torch: expected a CUDA build in the gpu image, got {torch.__version__} (cuda "
                        f"{torch.version.cuda})")
    extra = sorted(installed & {"torchvision", "torchaudio"})
    if variant == "cpu" and extra:
        problems.append(f"expected no torchvision/torchaudio in the cpu image (PyPI's are CUDA builds), got {extra}")
    for p in problems:
        print(f"image_check: {p}", file=sys.stderr)
    if not problems:
        print(f"image_check: {variant} image: torch {torch.__version__}, prefect {md.version('prefect')}, "
              f"mlflow {md.version('mlflow')}, prefect-docker {md.version('prefect-docker')}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ""))
