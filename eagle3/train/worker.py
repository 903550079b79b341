"""The entry point torchrun runs in each process (``python -m eagle3.train.worker --config C --data D --out O``;
started by ``eagle3.train.launch.launch``). A library error of rank 0 is written to
``<out>/state/launch-error.json`` so the parent re-raises it with its class and message."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from eagle3.errors import Eagle3Error
from eagle3.train.launch import ERROR_FILE


def main(argv: list[str] | None = None) -> int:
    """Entry point run by torchrun in each process."""
    from eagle3.config import load_config
    from eagle3.train.stage import train

    p = argparse.ArgumentParser(prog="python -m eagle3.train.worker")
    p.add_argument("--config", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    cfg = load_config(a.config)
    try:
        train(cfg, Path(a.data), Path(a.out), progress=False)
    except Eagle3Error as e:
        if int(os.environ.get("RANK", "0")) == 0:
            from eagle3.artifacts import atomic_write_json

            atomic_write_json(Path(a.out) / "state" / ERROR_FILE, {"type": type(e).__name__, "message": str(e)})
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
