"""The entry point torchrun runs in each process (``python -m eagle3.train.worker --config C --data
D --out O``; :func:`eagle3.train.launch.launch`). Each rank's status file (``eagle3.workers``) says
``started``, then ``done`` or ``failed`` (error class and message, re-raised by the parent)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eagle3.workers import rank_status


def main(argv: list[str] | None = None) -> int:
    status = rank_status()
    status.mark("started")
    p = argparse.ArgumentParser(prog="python -m eagle3.train.worker")
    for flag in ("--config", "--data", "--out"):
        p.add_argument(flag, required=True)
    a = p.parse_args(argv)
    try:
        from eagle3.config import load_config
        from eagle3.train.stage import train

        train(load_config(a.config), Path(a.data), Path(a.out), progress=False)
    except BaseException as e:  # noqa: BLE001 - recorded for the parent, then re-raised
        status.failed(e)
        raise
    status.mark("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
