"""A bounded window of computed hidden states on disk, for ``extract.mode: cached``: training
(:mod:`eagle3.train.online`) keeps a sample's states while the window has room, so later epochs
recompute only the samples outside it.

Layout: ``<dir>/hs_{i}.safetensors`` (``hidden_states [T, n_aux+1, H]`` as training used them:
rounded to ``extract.dtype``, fp8 as its bfloat16 dequantization, so reads are bit-exact) and
``<dir>/cache.json`` ``{"identity": the data identity}``.

Policy: first come, first kept, nothing evicted: each epoch scans every sample in a fresh order,
and for cyclic scans a fixed set recomputes least (LRU evicts each sample shortly before it comes
back). A resume finds the window as it was (atomic writes); a window of other data is emptied.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CACHE_FILE = "cache.json"


class StateCache:
    """States of samples (by row index) under ``root``, at most ``max_bytes`` bytes of files;
    ``identity``: the data identity they belong to (:func:`eagle3.train.data.data_identity`).
    ``bytes`` (used), ``hits`` / ``hit_tokens`` (reads served) are public counters."""

    def __init__(self, root: str | Path, max_bytes: int, identity: str):
        self.root, self.max_bytes = Path(root), int(max_bytes)
        self.hits = self.hit_tokens = 0
        self.full_warned = False
        marker = self.root / CACHE_FILE
        try:
            same = json.loads(marker.read_text()).get("identity") == identity
        except (OSError, ValueError, AttributeError):
            same = False
        if not same:  # another training's states, or none yet
            shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"identity": identity}) + "\n")
        for p in self.root.glob(".*.tmp"):  # a write cut short by a kill
            p.unlink(missing_ok=True)
        self.sizes = {int(p.stem.split("_", 1)[1]): p.stat().st_size
                      for p in self.root.glob("hs_*.safetensors")}
        self.bytes = sum(self.sizes.values())

    def path(self, i: int) -> Path:
        return self.root / f"hs_{i}.safetensors"

    def get(self, i: int, shape: tuple[int, ...], device: torch.device) -> torch.Tensor | None:
        """Sample ``i``'s states on ``device``, or None when not kept; a file unreadable or of
        another shape than ``shape`` is removed (states recomputed) with a warning naming it."""
        if i not in self.sizes:
            return None
        from safetensors.torch import load_file

        path = self.path(i)
        try:
            hs = load_file(str(path))["hidden_states"]
        except Exception as e:  # noqa: BLE001 - safetensors' own error type for a damaged file
            hs, why = None, f"{type(e).__name__}: {e}"
        else:
            why = f"shape {list(hs.shape)}, expected {list(shape)}"
        if hs is None or tuple(hs.shape) != tuple(shape):
            log.warning("%s: dropped from the hidden-state window (%s); recomputing it", path, why)
            self._drop(i)
            return None
        self.hits += 1
        self.hit_tokens += int(shape[0])
        return hs.to(device)

    def put(self, i: int, hs: torch.Tensor) -> bool:
        """Keep sample ``i``'s states if they fit; True if kept. A full window or a failed write
        (disk full) keeps nothing more, with one warning."""
        if i in self.sizes:
            return True
        need = hs.numel() * hs.element_size() + 256  # payload + safetensors header
        if self.bytes + need > self.max_bytes:
            self._warn_full(f"{self.bytes:,} of {self.max_bytes:,} bytes used; this sample "
                            f"needs {need:,}")
            return False
        from safetensors.torch import save_file

        path = self.path(i)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            save_file({"hidden_states": hs.detach().contiguous().cpu()}, str(tmp))
            os.replace(tmp, path)
        except Exception as e:  # noqa: BLE001 - OSError or safetensors' error ("No space left")
            tmp.unlink(missing_ok=True)
            self.max_bytes = self.bytes  # stop trying: the states are recomputed instead
            self._warn_full(f"writing {path} failed ({type(e).__name__}: {e})")
            return False
        self.sizes[i] = path.stat().st_size
        self.bytes += self.sizes[i]
        return True

    def clear(self) -> None:
        """Remove the window (the run has finished with it)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.sizes, self.bytes = {}, 0

    def _drop(self, i: int) -> None:
        self.path(i).unlink(missing_ok=True)
        self.bytes -= self.sizes.pop(i, 0)

    def _warn_full(self, why: str) -> None:
        if not self.full_warned:
            self.full_warned = True
            log.warning("hidden-state window %s is full (%s; extract.cache_max_gb): %d samples "
                        "kept, the others are recomputed every epoch", self.root, why,
                        len(self.sizes))
