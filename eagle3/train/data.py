"""Reading the hidden-states directory (extract → train) and packing it into micro-batches.

Layout (docs/INTERNALS.md): ``manifest.json`` (kind ``hidden_states``), ``data/`` (HF datasets),
``hidden_states/hs_{i}.safetensors`` (``token_ids [T]`` int64, ``hidden_states [T, n_aux+1, H]``,
slot -1 = last layer output before the final norm), ``token_freq.pt``.

Alignment (speculators' ``shift_batch``): position p gets the aux states of token p and the
embedding of token p+1, and learns the verifier's distribution at p+1. T tokens give T-1 positions,
position ids 1..T-1. Packing: a seeded permutation per epoch, cut greedily into micro-batches of at
most ``max_tokens`` positions, ``document_ids`` keeping sample boundaries; the plan depends only on
(seed, epoch, lengths), so a resume rebuilds it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from collections.abc import Iterator
from pathlib import Path

import torch

from eagle3.artifacts import read_manifest
from eagle3.errors import ConfigError, DataError
from eagle3.extract.store import SCALES_KEY, decode

log = logging.getLogger(__name__)

CONVENTION = "hf_hidden_states_index"


@dataclass
class HiddenStatesData:
    """An opened, checked hidden-states directory. input_ids, loss_mask: per sample, int64 / bool
    ``[T]``; train_ids, val_ids: split sample indices with T >= 2 (skipped: those with T < 2);
    aux_layer_ids: HF hidden_states indices; max_tokens: positions kept per sample."""

    root: Path
    manifest: dict
    input_ids: list[torch.Tensor]
    loss_mask: list[torch.Tensor]
    train_ids: list[int]
    val_ids: list[int]
    aux_layer_ids: list[int]
    hidden_size: int
    max_tokens: int
    skipped: list[int] = field(default_factory=list)
    in_process = False  # states computed in this process (eagle3.train.online): no loader workers
    read_ahead_samples = 0  # samples of consecutive micro-batches loaded in one go (0: one batch)

    @property
    def n_aux(self) -> int:
        return len(self.aux_layer_ids)

    def positions(self, i: int) -> int:
        """Training positions of sample ``i``: ``min(T - 1, max_tokens)``."""
        return min(int(self.input_ids[i].numel()) - 1, self.max_tokens)

    @property
    def truncated(self) -> int:
        return sum(self.input_ids[i].numel() - 1 > self.max_tokens
                   for i in self.train_ids + self.val_ids)

    def unique_train_tokens(self) -> int:
        """Training positions in one pass over the train split."""
        return sum(self.positions(i) for i in self.train_ids)

    def read(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``i`` checked: ``(token_ids [T] int64, hidden_states [T, n_aux+1, H])`` (file
        dtype; fp8 dequantized to bf16). DataError: file missing or unreadable, token ids differing
        from ``data/``, wrong shape, NaN/Inf."""
        from safetensors.torch import load_file

        path = self.root / "hidden_states" / f"hs_{i}.safetensors"
        if not path.is_file():
            raise DataError(f"{path}: hidden-states file of sample {i} not found")
        try:
            t = load_file(str(path))
        except Exception as e:  # noqa: BLE001 - safetensors' own error type for a damaged header
            raise DataError(f"{path}: unreadable hidden-states file of sample {i} "
                            f"({type(e).__name__}: {e}); re-run the extraction") from e
        if "token_ids" not in t or "hidden_states" not in t:
            raise DataError(f"{path}: expected tensors token_ids and hidden_states, got "
                            f"{sorted(t)}")
        tok = t["token_ids"].long()
        hs = decode(t, torch.bfloat16) if SCALES_KEY in t else t["hidden_states"]  # fp8 storage
        ids = self.input_ids[i]
        if not torch.equal(tok, ids):
            raise DataError(f"{path}: token_ids ({tok.numel()} tokens) differ from data/ input_ids "
                            f"of sample {i} ({ids.numel()} tokens)")
        want = (ids.numel(), self.n_aux + 1, self.hidden_size)
        if tuple(hs.shape) != want:
            raise DataError(f"{path}: hidden_states shape expected {list(want)} [T, n_aux+1, H], "
                            f"got {list(hs.shape)}")
        if not bool(torch.isfinite(hs).all()):
            raise DataError(f"{path}: hidden_states contain NaN/Inf")
        return tok, hs

    def load_sample(self, i: int) -> dict[str, torch.Tensor]:
        """:meth:`read` then :meth:`shift` sample ``i``."""
        return self.shift(i, self.read(i)[1])

    def load_samples(self, ids: list[int]) -> list[dict[str, torch.Tensor]]:
        """:meth:`load_sample` of each of ``ids`` (one micro-batch), in order."""
        return [self.load_sample(i) for i in ids]

    def load_group(self, batches: list[list[int]]) -> list[list[dict[str, torch.Tensor]]]:
        """:meth:`load_samples` of each of ``batches`` (:func:`read_ahead_groups`), in order."""
        return [self.load_samples(ids) for ids in batches]

    def take_window(self) -> dict[str, float]:
        """Metrics of how the states were obtained since the last call (none from files)."""
        return {}

    def checkpoint_info(self) -> dict:
        """Counters a checkpoint keeps for :meth:`restore` (none when read from files)."""
        return {}

    def restore(self, info: dict) -> None:
        """Take back :meth:`checkpoint_info`'s counters from a checkpoint's ``info``."""

    def close(self) -> None:
        """Training has finished with the data (nothing to release for files)."""

    def shift(self, i: int, hs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Sample ``i``'s states ``hs [T, n_aux+1, H]`` shifted to ``n = positions(i)`` rows:
        ``hidden_states [n, n_aux*H]`` (aux of tokens 0..n-1), ``verifier_last_hidden_states [n,
        H]`` (last state of tokens 1..n), both on ``hs``'s device and dtype; on the host:
        ``input_ids [n]`` int64, ``loss_mask [n]`` bool, ``position_ids [n]`` 1..n."""
        n = self.positions(i)
        return {"hidden_states": hs[:n, :-1].reshape(n, -1),
                "verifier_last_hidden_states": hs[1:n + 1, -1],
                "input_ids": self.input_ids[i][1:n + 1],
                "loss_mask": self.loss_mask[i][1:n + 1].bool(),
                "position_ids": torch.arange(1, n + 1, dtype=torch.long)}


def open_hidden_states(data_dir: str | Path, target_dir: str | Path, target_conf, *,
                       max_tokens: int, warn: bool = True) -> HiddenStatesData:
    """Open ``data_dir`` and check it against the target (``target_dir``, its text config
    ``target_conf``); ``max_tokens``: positions kept per sample; ``warn``: log the warning of
    :func:`check_loss_tokens` (off for a rank other than 0). DataError: missing/foreign manifest,
    another target, hidden size mismatch, empty train split, bad split ids, aux ids in another
    convention, states shifted against their tokens (``HS_MISALIGNED``)."""
    root = Path(data_dir)
    m = read_manifest(root, kind="hidden_states")
    if m.get("mode", "offline") != "offline":
        raise DataError(f"{root}/manifest.json: mode expected 'offline' (hidden states on disk), "
                        f"got {m.get('mode')!r}: its states are computed in training "
                        "(eagle3.train.online.open_online)")
    data = HiddenStatesData(**open_rows(root, m, Path(target_dir), target_conf, max_tokens))
    check_loss_tokens(data, warn=warn)
    data.load_sample(data.train_ids[0])  # shape/hidden-size check on real data before any step
    _check_alignment(data, Path(target_dir))
    return data


def open_rows(root: Path, m: dict, target_dir: Path, target_conf, max_tokens: int) -> dict:
    """:func:`open_hidden_states`'s checks of the manifest ``m`` and ``root/data/`` (no state file
    read); returns the keyword arguments of :class:`HiddenStatesData`."""
    from datasets import load_from_disk

    _check_target(root, m, Path(target_dir), target_conf)
    conv = m.get("layer_id_convention")
    if conv != CONVENTION:
        raise DataError(f"{root}/manifest.json: layer_id_convention expected {CONVENTION!r}, got "
                        f"{conv!r}")
    aux = m.get("aux_layer_ids")
    if not isinstance(aux, list) or not aux:
        raise DataError(f"{root}/manifest.json: aux_layer_ids expected a non-empty list, got "
                        f"{aux!r}")
    if not (root / "data").is_dir():
        raise DataError(f"{root}/data: HF datasets folder not found")
    splits = m.get("splits") or {}
    if not splits.get("train"):
        raise DataError(f"{root}: empty dataset: manifest splits.train has no sample ids (counts: "
                        f"{m.get('counts')})")
    try:
        rows = load_from_disk(str(root / "data"))
    except (OSError, ValueError, IndexError) as e:  # datasets' errors for empty/corrupt folders
        raise DataError(f"{root}/data: not a readable HF datasets folder "
                        f"({type(e).__name__}: {e})") from e
    for col in ("input_ids", "loss_mask", "seq_len"):
        if col not in rows.column_names:
            raise DataError(f"{root}/data: column {col!r} missing (columns: {rows.column_names})")
    rows = rows.with_format("torch")
    input_ids = [r.long() for r in rows["input_ids"]] if len(rows) else []
    loss_mask = [r.bool() for r in rows["loss_mask"]] if len(rows) else []
    tr, va = _split(root, splits, "train", len(rows)), _split(root, splits, "val", len(rows))
    skipped = [i for i in tr + va if input_ids[i].numel() < 2]
    tr, va = [i for i in tr if i not in skipped], [i for i in va if i not in skipped]
    if not tr:
        raise DataError(f"{root}: empty dataset: the train split has no sample with >= 2 tokens "
                        f"({len(rows)} rows in data/, {len(splits.get('train') or [])} train ids)")
    return dict(root=root, manifest=m, input_ids=input_ids, loss_mask=loss_mask, train_ids=tr,
                val_ids=va, aux_layer_ids=[int(a) for a in aux],
                hidden_size=int(target_conf.hidden_size), max_tokens=max_tokens, skipped=skipped)


def _check_alignment(data: HiddenStatesData, target_dir: Path) -> None:
    """DataError ``HS_MISALIGNED`` (:func:`eagle3.extract.alignment.check_alignment`) in groups of
    the manifest's ``extract.shard_size``, else 64; reads through ``data.read`` (its checks)."""
    from eagle3.extract.alignment import check_alignment

    size = int(((data.manifest.get("config") or {}).get("extract") or {}).get("shard_size") or 64)
    ids = sorted(data.train_ids + data.val_ids)
    check_alignment(data.root, target_dir, [ids[k:k + size] for k in range(0, len(ids), size)],
                    load=data.read)


def check_loss_tokens(data: HiddenStatesData, *, warn: bool = True) -> None:
    """DataError when no train sample cut to ``max_tokens`` positions holds a loss-masked position
    (the loss would be exactly 0); a warning when the cut drops loss positions (``warn``)."""
    kept = sum(int(data.loss_mask[i][1:data.positions(i) + 1].sum()) for i in data.train_ids)
    total = sum(int(data.loss_mask[i][1:].sum()) for i in data.train_ids)
    if kept == 0:
        raise DataError(f"{data.root}: no loss-masked position within the first "
                        f"train.max_tokens_per_batch={data.max_tokens} positions of any of the "
                        f"{len(data.train_ids)} train samples (they hold {total} loss positions in "
                        "all); expected train.max_tokens_per_batch >= the sample length (longest: "
                        f"{max(int(data.input_ids[i].numel()) - 1 for i in data.train_ids)} "
                        "positions)")
    if kept < total and warn:
        log.warning("train.max_tokens_per_batch=%d cuts %d of %d samples: %d of %d loss positions "
                    "are not trained on", data.max_tokens, data.truncated,
                    len(data.train_ids) + len(data.val_ids), total - kept, total)


def data_identity(data: HiddenStatesData) -> str:
    """sha256 (hex) of the manifest's target, aux ids, splits (and ``online`` facts) plus
    ``data/``'s content, for resume checks (``token_freq.pt`` is checked separately)."""
    import hashlib
    import json

    from eagle3.artifacts import content_hash

    m = data.manifest
    key = {k: m.get(k) for k in ("target", "aux_layer_ids", "splits", "layer_id_convention")}
    if m.get("mode", "offline") != "offline":
        key["online"] = m.get("online")
    h = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode())
    h.update(content_hash(data.root / "data").encode())
    return h.hexdigest()


def _split(root: Path, splits: dict, name: str, n_rows: int) -> list[int]:
    ids = splits.get(name)
    if ids is None:
        raise DataError(f"{root}/manifest.json: splits.{name} missing (expected a list of sample "
                        "indices)")
    bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < n_rows]
    if bad:
        raise DataError(f"{root}/manifest.json: splits.{name} has ids outside [0, {n_rows}): "
                        f"{bad[:5]}")
    return list(ids)


def _check_target(root: Path, m: dict, target_dir: Path, conf) -> None:
    t = m.get("target")
    if not isinstance(t, dict):
        raise DataError(f"{root}/manifest.json: target expected a mapping, got {t!r}")
    if not t.get("path"):
        raise DataError(f"{root}/manifest.json: target.path missing")
    here = Path(t["path"]).expanduser().resolve() == target_dir.resolve()
    if not here and not _same_target_elsewhere(t, target_dir):
        raise DataError(f"{root}/manifest.json: dataset made from another target: target.path "
                        f"{t['path']}, configured target {target_dir.resolve()} (other path, and "
                        f"its config.json or weights differ from the manifest's target.config_hash "
                        f"/ target.weights_hash)")
    for key, attr in (("hidden_size", "hidden_size"), ("num_layers", "num_hidden_layers"),
                      ("vocab_size", "vocab_size")):
        want = int(getattr(conf, attr))
        if key in t and t[key] is not None and int(t[key]) != want:
            raise DataError(f"{root}/manifest.json: target.{key} {t[key]} disagrees with the "
                            f"target's config.json {attr}={want} ({target_dir})")


def _same_target_elsewhere(t: dict, target_dir: Path) -> bool:
    """True when the manifest's target, recorded at another path, has ``target_dir``'s
    ``config.json`` sha256 and weights hash (every ``*.safetensors`` byte read: ~10 s per 10 GB)."""
    from eagle3.artifacts import sha256_file, weights_hash

    cfg_file = target_dir / "config.json"
    if not (t.get("config_hash") and t.get("weights_hash") and cfg_file.is_file()
            and sha256_file(cfg_file) == t["config_hash"]):
        return False
    log.info("target %s: the hidden states name it at %s; comparing the weights by hash",
             target_dir, t["path"])
    # None (no *.safetensors here) never equals a hash
    return weights_hash(target_dir) == t["weights_hash"]


def plan_epoch(data: HiddenStatesData, seed: int, epoch: int) -> list[list[int]]:
    """The micro-batches (sample ids) of ``epoch``: a seeded permutation packed by :func:`pack`."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = [data.train_ids[j] for j in torch.randperm(len(data.train_ids), generator=g).tolist()]
    return pack(order, [data.positions(i) for i in order], data.max_tokens)


def pack(order: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Greedy sequential packing of ``order`` into groups of total length <= ``max_tokens`` (a
    sample is never split); ConfigError when one length exceeds ``max_tokens``."""
    for i, n in zip(order, lengths):
        if n > max_tokens:
            raise ConfigError(f"train.max_tokens_per_batch={max_tokens}: sample {i} has {n} "
                              "positions")
    return _greedy(order, lengths, max_tokens)


def _greedy(items: list, sizes: list[int], cap: int) -> list[list]:
    """``items`` in order, cut into runs of total size <= ``cap`` (an item over it: its own run)."""
    runs: list[list] = []
    used = 0
    for x, n in zip(items, sizes):
        if not runs or used + n > cap:
            runs.append([])
            used = 0
        runs[-1].append(x)
        used += n
    return runs


def collate_host(samples: list[dict[str, torch.Tensor]], pad_to: int | None = None) -> dict:
    """Concatenate shifted samples into one packed sequence of N positions (batch dim 1) on the
    host; ``pad_to``: a padding document (zero states, token 0, no loss, positions 1..) makes
    N == pad_to (one shape to compile). Returns hidden_states ``[1, N, n_aux*H]`` and
    verifier_last_hidden_states ``[1, N, H]`` in the file dtype, input_ids / position_ids /
    document_ids ``[1, N]`` int64, loss_mask ``[1, N]`` bool. ConfigError when N > pad_to."""
    n = sum(int(s["input_ids"].numel()) for s in samples)
    if pad_to is not None:
        if n > pad_to:
            raise ConfigError(f"collate: {n} positions do not fit pad_to={pad_to} "
                              "(train.max_tokens_per_batch)")
        if n < pad_to:
            pad = {k: v.new_zeros((pad_to - n, *v.shape[1:])) for k, v in samples[0].items()}
            pad["position_ids"] = torch.arange(1, pad_to - n + 1, dtype=torch.long)
            samples = [*samples, pad]
    out = {k: torch.cat([s[k] for s in samples])[None] for k in samples[0]}
    out["document_ids"] = torch.cat([torch.full((s["input_ids"].numel(),), j, dtype=torch.long)
                                     for j, s in enumerate(samples)])[None]
    return out


def to_device(batch: dict, device: torch.device, dtype: torch.dtype | None) -> dict:
    """A :func:`collate_host` batch on ``device``, hidden states cast to ``dtype`` (None: kept)."""
    states = ("hidden_states", "verifier_last_hidden_states")
    return {k: v.to(device, dtype if k in states and dtype is not None else v.dtype,
                    non_blocking=True) for k, v in batch.items()}


class MicroBatches(torch.utils.data.Dataset):
    """Micro-batch ``k`` = ``(sample ids, collate_host of their samples, None)`` for DataLoader
    workers; a DataError comes back as ``(ids, None, message)`` for the training process to raise
    unwrapped."""

    def __init__(self, data: HiddenStatesData, batches: list[list[int]], pad_to: int | None = None):
        self.data, self.batches, self.pad_to = data, batches, pad_to

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, k: int) -> tuple[list[int], dict | None, str | None]:
        ids = self.batches[k]
        try:
            return ids, collate_host([self.data.load_sample(i) for i in ids], self.pad_to), None
        except DataError as e:
            return ids, None, str(e)


def _as_is(item):
    return item


def read_ahead_groups(batches: list[list[int]], samples: int) -> Iterator[list[list[int]]]:
    """``batches`` in order, cut into runs of consecutive micro-batches of at most ``samples``
    samples in all (a micro-batch larger than that, or ``samples`` <= 0: a run of its own)."""
    return iter(_greedy(batches, [len(ids) for ids in batches], samples))


def iterate_micro_batches(data: HiddenStatesData, batches: list[list[int]], device: torch.device,
                          workers: int | None = None, pad_to: int | None = None):
    """Yield ``(ids, host batch)`` (:func:`collate_host`, padded to ``pad_to``) for ``batches`` in
    order, read ahead by ``workers`` processes (None: 4 on CUDA, pinned, 0 on a CPU; always 0 for
    ``data.in_process``, which loads :func:`read_ahead_groups` of ``data.read_ahead_samples``).
    DataError naming the file of a bad sample."""
    n = workers if workers is not None else (4 if device.type == "cuda" else 0)
    if n == 0 or data.in_process:
        for group in read_ahead_groups(batches, data.read_ahead_samples):
            for ids, samples in zip(group, data.load_group(group)):
                yield ids, collate_host(samples, pad_to)
        return
    loader = torch.utils.data.DataLoader(MicroBatches(data, batches, pad_to), batch_size=None,
                                         shuffle=False, num_workers=n, collate_fn=_as_is,
                                         pin_memory=device.type == "cuda", prefetch_factor=4)
    for ids, batch, error in loader:
        if error is not None:
            raise DataError(error)
        yield ids, batch
