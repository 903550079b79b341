"""Online hidden states: the target runs in the training process, on the training device, and
computes each micro-batch's aux and last hidden states from the tokenized samples of an
``extract.mode: online`` folder; nothing is written to disk.

Offline and online agree: the same tokens (the extract stage's ``data/``, rows, split), the same
capture (:func:`eagle3.extract.hf_backend.forward_capture`: HF ``hidden_states`` indices
``aux_layer_ids + [L]``, L = the last layer's output before the final norm), the same rounding to
``extract.dtype`` (:func:`eagle3.extract.store.encode` / ``decode``) and the same plan
(:func:`eagle3.train.data.plan_epoch`). An online draft equals the offline one up to kernel
rounding of another batch composition (float32 on a CPU: about 1e-6 relative per state).

``extract.mode: cached`` adds a bounded window of computed states on disk
(:class:`eagle3.train.online_cache.StateCache`, ``extract.cache_max_gb``), removed at the end.

Costs: the target's weights and one forward per ``extract.batch_size`` samples, every epoch and
evaluation; the samples of the next micro-batches are computed together, length-sorted
(:meth:`OnlineHiddenStates.load_group`). :class:`OnlineStats` counts those forwards for the train
manifest's ``online`` section.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eagle3.artifacts import read_manifest
from eagle3.errors import ConfigError, DataError
from eagle3.extract.store import ONLINE_FILE
from eagle3.train.data import HiddenStatesData, check_loss_tokens, data_identity, open_rows
from eagle3.train.online_cache import StateCache


MODES = ("online", "cached")  # extract.mode values whose states training computes


def is_online(data_dir: str | Path) -> bool:
    """True when ``data_dir``'s manifest ``mode`` is online or cached. DataError for a missing or
    unreadable manifest."""
    return read_manifest(Path(data_dir), kind="hidden_states").get("mode") in MODES


def check_data_mode(cfg, data_dir: str | Path) -> str:
    """The extraction's mode (``offline``, ``online``, ``cached``) from ``data_dir``'s manifest,
    once it agrees with ``cfg.extract.mode`` (for ``cached`` also ``extract.cache_max_gb``).
    ConfigError ``EXTRACT_MODE_MISMATCH`` (another mode) or ``EXTRACT_CACHE_MISMATCH`` (another
    window size), naming the manifest, the key and both values; DataError for a missing or
    unreadable manifest."""
    root = Path(data_dir)
    m = read_manifest(root, kind="hidden_states")
    got, want = m.get("mode", "offline"), cfg.extract.mode
    where = root / "manifest.json"
    # the extract command writing what this config trains on (the mode may be an override)
    redo = f"eagle3 extract CONFIG -o extract.mode={want}" + (
        f" -o extract.cache_max_gb={cfg.extract.cache_max_gb:g}" if want == "cached" else "") + (
        " with this run's other -o overrides")
    if got != want:
        raise ConfigError(f"EXTRACT_MODE_MISMATCH: {where}: mode expected {want!r} (extract.mode "
                          f"of this config), got {got!r}; run the extract stage with this "
                          f"config's mode ({redo}) or train with -o extract.mode={got}")
    if want == "cached":
        size = (m.get("online") or {}).get("cache_max_bytes")
        expected = cfg.extract.cache_max_bytes
        if size != expected:
            gb = size / 1e9 if isinstance(size, int) and not isinstance(size, bool) else None
            fit = (f"-o extract.cache_max_gb={gb:g}" if gb and round(float(f"{gb:g}") * 1e9)
                   == size else "extract.cache_max_gb to the folder's window")
            raise ConfigError(f"EXTRACT_CACHE_MISMATCH: {where}: online.cache_max_bytes expected "
                              f"{expected} (extract.cache_max_gb={cfg.extract.cache_max_gb:g}), "
                              f"got {size!r} (mode 'cached' in both); run the extract stage with "
                              f"this config's window ({redo}) or train with {fit}")
    return got


@dataclass
class OnlineStats:
    """Target forwards of this training (earlier processes included up to the checkpoint resumed
    from): ``tokens`` computed (no padding), ``seconds`` of forward (CUDA events on CUDA),
    ``forwards`` (batched calls)."""

    tokens: int = 0
    seconds: float = 0.0
    forwards: int = 0


@dataclass
class OnlineHiddenStates(HiddenStatesData):
    """A :class:`HiddenStatesData` whose :meth:`read` runs the target: ``model`` (HF causal LM on
    the training device, eval mode), ``capture_ids`` (HF indices, last = L), ``store_dtype``
    (``extract.dtype``, rounded to as a stored file is), ``batch_size`` (samples per forward)."""

    model: torch.nn.Module | None = None
    capture_ids: list[int] = field(default_factory=list)
    store_dtype: str = "float32"
    batch_size: int = 4
    pad_id: int = 0
    stats: OnlineStats = field(default_factory=OnlineStats)
    cache: StateCache | None = None
    _events: list = field(default_factory=list)

    in_process = True

    def read(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(token_ids [T] int64 on the host, hidden_states [T, n_aux+1, H])`` on the target's
        device, in the stored dtype (fp8: dequantized to bfloat16, as offline)."""
        return self.input_ids[i], self.compute([i])[0]

    def load_samples(self, ids: list[int]) -> list[dict[str, torch.Tensor]]:
        """One micro-batch: the states of ``ids`` computed together, shifted, in order."""
        return [self.shift(i, hs) for i, hs in zip(ids, self.compute(ids))]

    @property
    def read_ahead_samples(self) -> int:
        return self.batch_size

    def load_group(self, batches: list[list[int]]) -> list[list[dict[str, torch.Tensor]]]:
        """The consecutive micro-batches ``batches`` computed together, shifted, per batch."""
        states = iter(self.compute([i for ids in batches for i in ids]))
        return [[self.shift(i, next(states)) for i in ids] for ids in batches]

    def compute(self, ids: list[int]) -> list[torch.Tensor]:
        """``[T_i, n_aux+1, H]`` per sample of ``ids`` (same order): right-padded batches of
        ``batch_size`` samples, shortest first, through
        :func:`eagle3.extract.hf_backend.forward_capture`, rounded to ``store_dtype``; not
        inference-mode tensors (autograd may save them). Samples in :attr:`cache` are read."""
        from eagle3.extract.hf_backend import forward_capture

        out: list[torch.Tensor | None] = [None] * len(ids)
        todo = list(range(len(ids)))
        if self.cache is not None:
            dev = next(self.model.parameters()).device
            shape = (len(self.capture_ids), self.hidden_size)
            for k, i in enumerate(ids):
                out[k] = self.cache.get(i, (int(self.input_ids[i].numel()), *shape), dev)
            todo = [k for k in todo if out[k] is None]
        order = sorted(todo, key=lambda k: (int(self.input_ids[ids[k]].numel()), ids[k]))
        timer = self._start()
        for b in range(0, len(order), self.batch_size):
            chunk = order[b:b + self.batch_size]
            states = forward_capture(self.model, self.capture_ids,
                                     [self.input_ids[ids[k]].tolist() for k in chunk], self.pad_id)
            for k, hs in zip(chunk, states):
                out[k] = round_to_store(hs, self.store_dtype).clone()
                if self.cache is not None:
                    self.cache.put(ids[k], out[k])
            self.stats.forwards += 1
        self._stop(timer)
        self.stats.tokens += sum(int(self.input_ids[ids[k]].numel()) for k in todo)
        return out

    def _start(self):
        dev = next(self.model.parameters()).device
        if dev.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return start
        return time.perf_counter()

    def _stop(self, start) -> None:
        if isinstance(start, float):
            self.stats.seconds += time.perf_counter() - start
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._events.append((start, end))

    def _settle(self) -> None:
        """Add the CUDA-event timings recorded so far (waits for their forwards)."""
        for start, end in self._events:
            end.synchronize()
            self.stats.seconds += start.elapsed_time(end) / 1000.0
        self._events.clear()

    def take_window(self) -> dict[str, float]:
        """``extract/tokens_recomputed`` and ``extract/tokens_per_s`` (per second of forward; not
        before the first) over the whole training, as the manifest's ``online`` section (a
        per-window rate would swing with how many forwards fell in the window)."""
        self._settle()
        s = self.stats
        out = {"extract/tokens_recomputed": float(s.tokens)}
        if s.tokens:
            out["extract/tokens_per_s"] = s.tokens / max(s.seconds, 1e-9)
        return out

    def checkpoint_info(self) -> dict:
        """The counters (``online_*``) a checkpoint keeps."""
        self._settle()
        hits = {} if self.cache is None else {"online_cache_hits": self.cache.hits,
                                              "online_cache_hit_tokens": self.cache.hit_tokens}
        return {"online_tokens_recomputed": self.stats.tokens,
                "online_target_forwards": self.stats.forwards,
                "online_target_forward_s": self.stats.seconds, **hits}

    def restore(self, info: dict) -> None:
        """Resume the counters of :meth:`checkpoint_info` (a missing key counts 0); forwards a
        killed process made after that checkpoint are redone and counted here."""
        self.stats = OnlineStats(tokens=int(info.get("online_tokens_recomputed") or 0),
                                 seconds=float(info.get("online_target_forward_s") or 0.0),
                                 forwards=int(info.get("online_target_forwards") or 0))
        if self.cache is not None:
            self.cache.hits = int(info.get("online_cache_hits") or 0)
            self.cache.hit_tokens = int(info.get("online_cache_hit_tokens") or 0)

    def summary(self, offline_bytes: int | None) -> dict:
        """The train manifest's ``online`` section: bytes on disk (0), ``offline_bytes_estimate``
        (from the extract manifest), tokens recomputed and per epoch (train split), forward
        seconds, tokens/s and count (the whole training), dtype, batch size; ``cached`` adds the
        window's max bytes, bytes, samples, hits and hit tokens (the whole training)."""
        self._settle()
        s, c = self.stats, self.cache
        return {"hidden_state_bytes_on_disk": 0, "offline_bytes_estimate": offline_bytes,
                "tokens_recomputed": s.tokens,
                "tokens_per_epoch": sum(int(self.input_ids[i].numel()) for i in self.train_ids),
                "target_forward_s": s.seconds,
                "extract_tokens_per_s": s.tokens / max(s.seconds, 1e-9),
                "target_forwards": s.forwards, "store_dtype": self.store_dtype,
                "batch_size": self.batch_size,
                **({} if c is None else {
                    "cache_max_bytes": c.max_bytes, "cache_bytes": c.bytes,
                    "cache_samples": len(c.sizes), "cache_hits": c.hits,
                    "cache_hit_tokens": c.hit_tokens})}

    def close(self) -> None:
        """Remove the window of states (``cached``)."""
        if self.cache is not None:
            self.cache.clear()


def round_to_store(hs: torch.Tensor, dtype: str) -> torch.Tensor:
    """``hs`` as an offline store returns it: cast to ``dtype``, or for ``fp8`` quantized with
    per-row scales and dequantized to bfloat16 (:mod:`eagle3.extract.store`). DataError for
    another dtype."""
    from eagle3.extract.store import STORE_DTYPES, decode, encode

    if dtype not in STORE_DTYPES:
        raise DataError(f"extract.dtype: expected one of {sorted(STORE_DTYPES)}, got {dtype!r}")
    if dtype == "fp8":
        return decode(encode(hs, "fp8"), torch.bfloat16)
    return hs.to(STORE_DTYPES[dtype])


def open_online(data_dir: str | Path, target_dir: str | Path, target_conf, *, max_tokens: int,
                device: torch.device, trust_remote_code: bool = False,
                cache_dir: str | Path | None = None, warn: bool = True) -> OnlineHiddenStates:
    """Open an ``extract.mode: online`` (or ``cached``) folder and load its target on ``device``;
    ``cached`` keeps its window in ``cache_dir`` (required then). Checks as
    :func:`eagle3.train.data.open_hidden_states` (``warn`` too) plus ``online.json`` against the
    manifest, then computes the first train sample (shape check). DataError: not an online
    folder, ``online.json`` missing or disagreeing with the manifest (aux ids, capture ids, dtype,
    plan hash)."""
    from eagle3.extract.hf_backend import pad_id_of
    from eagle3.target_model import load_target

    root = Path(data_dir)
    m = read_manifest(root, kind="hidden_states")
    if m.get("mode") not in MODES:
        raise DataError(f"{root}/manifest.json: mode expected 'online' or 'cached', got "
                        f"{m.get('mode', 'offline')!r} (open it with open_hidden_states)")
    path = root / ONLINE_FILE
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: expected the online extraction record (JSON), could not read "
                        f"it ({type(e).__name__}: {e}); re-run the extract stage") from e
    rows = open_rows(root, m, Path(target_dir), target_conf, max_tokens)
    aux = rows["aux_layer_ids"]
    want = {"aux_layer_ids": aux, "capture_ids": aux + [int(target_conf.num_hidden_layers)],
            "dtype": m.get("dtype"), "plan_hash": m.get("plan_hash")}
    for key, value in want.items():
        if spec.get(key) != value:
            raise DataError(f"{path}: {key} expected {value!r} (manifest.json), got "
                            f"{spec.get(key)!r}; re-run the extract stage")
    model, tok = load_target(target_dir, spec["model_dtype"], str(device), trust_remote_code)
    model.requires_grad_(False)
    data = OnlineHiddenStates(**rows, model=model, capture_ids=list(spec["capture_ids"]),
                              store_dtype=spec["dtype"], batch_size=int(spec["batch_size"]),
                              pad_id=pad_id_of(model, tok))
    check_loss_tokens(data, warn=warn)
    data.load_sample(data.train_ids[0])  # shapes before any step
    data.stats = OnlineStats()
    data._events.clear()  # noqa: SLF001 - the check's forward is not training's
    if spec.get("cache_max_bytes"):
        if cache_dir is None:
            raise DataError(f"{path}: mode 'cached' needs a folder for its window of states "
                            "(cache_dir), got none")
        data.cache = StateCache(cache_dir, int(spec["cache_max_bytes"]), data_identity(data))
        _check_window_disk(data.cache, data.manifest.get("offline_bytes_estimate"))
    return data


def window_fill(cache: StateCache, all_bytes: int | None) -> int:
    """Bytes the window ``cache`` holds once as full as the data can make it: its size, or less
    when all the data's states (``all_bytes``: the manifest's ``offline_bytes_estimate``) fit."""
    return min(cache.max_bytes, int(all_bytes)) if all_bytes else cache.max_bytes


def window_to_come(data) -> int:
    """Bytes still to come into the cached window of ``data`` (an opened training data set) before
    it is as full as the data can make it; 0 without a window."""
    cache = getattr(data, "cache", None)
    if cache is None:
        return 0
    return max(0, window_fill(cache, data.manifest.get("offline_bytes_estimate")) - cache.bytes)


def _check_window_disk(cache: StateCache, all_bytes: int | None) -> None:
    """DataError naming ``extract.cache_max_gb`` when the window, as full as the data can make it
    (:func:`window_fill`), needs more than the free disk of its folder (the checkpoints' disk,
    which :func:`eagle3.train.state.check_checkpoint_space` checks with the window counted)."""
    import shutil

    fill = window_fill(cache, all_bytes)
    free = shutil.disk_usage(cache.root).free
    if fill - cache.bytes > free:
        raise DataError(f"extract.cache_max_gb: expected a window that fits the free disk of "
                        f"{cache.root} ({free:,} bytes free, {cache.bytes:,} already in it), got "
                        f"{cache.max_bytes / 1e9:g} GB, of which this data fills about "
                        f"{fill:,} bytes; lower it or free space")
