"""A draft folder read into memory for the checks: :class:`Checkpoint`, :class:`Target`,
:class:`Problem`. Only unreadable input raises (DataError naming the file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eagle3.artifacts import read_json_object
from eagle3.engines.profile import dotted_get
from eagle3.errors import DataError
from eagle3.target_config import target_config_json, text_config

WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")
VOCAB_SIDE_FILES = ("d2t*", "t2d*", "vocab_map*")


@dataclass(frozen=True)
class Problem:
    """One reason the checkpoint would be served wrongly. ``str(p)`` is ``CODE: message``."""

    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass
class Checkpoint:
    """A draft directory read into memory; ``problems``: ``DUPLICATE_TENSOR`` across weight files
    (``tensors`` then holds the copy of the file read first)."""

    path: Path
    config: dict
    tensors: dict[str, torch.Tensor]
    weight_files: list[Path]
    manifest: dict | None
    problems: list[Problem] = field(default_factory=list)


def load_tensors(files: list[Path]) -> tuple[dict[str, torch.Tensor], list[Problem]]:
    """All tensors of safetensors / ``pytorch_model*.bin`` files, and a ``DUPLICATE_TENSOR``
    problem for each name present in two files (the first file's copy is kept). DataError on a
    corrupt file."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    origin: dict[str, Path] = {}
    problems = []
    for f in files:
        try:
            part = (load_file(str(f)) if f.suffix == ".safetensors"
                    else torch.load(f, map_location="cpu", weights_only=True))
        except Exception as e:  # safetensors/pickle raise many unrelated types on corrupt input
            raise DataError(f"{f}: unreadable weights ({type(e).__name__}: {e})") from e
        if not isinstance(part, dict):
            raise DataError(f"{f}: expected a name -> tensor mapping, got {type(part).__name__}")
        for name, t in part.items():
            if name in out:
                problems.append(Problem(
                    "DUPLICATE_TENSOR", f"tensor {name!r}: expected it in one weight file, got it "
                    f"in both {origin[name]} and {f}: the engine reads every weight file, so "
                    "which copy it keeps depends on the order it reads them"))
                continue
            out[name], origin[name] = t, f
    return out, problems


def read_checkpoint(ckpt_dir: str | Path) -> Checkpoint:
    """``config.json``, all weight files and the optional ``manifest.json`` of a draft directory."""
    path = Path(ckpt_dir)
    if path.is_file():
        raise DataError(f"{path}: is a file; expected a draft checkpoint directory (config.json + "
                        "model.safetensors)")
    if not path.is_dir():
        raise DataError(f"{path}: checkpoint directory not found")
    config = read_json_object(path / "config.json", "config.json")
    files = sorted({f for g in WEIGHT_GLOBS for f in path.glob(g)})
    if not files:
        raise DataError(f"{path}: no weight file (expected model.safetensors or pytorch_model.bin)")
    manifest = (read_json_object(path / "manifest.json", "manifest.json")
                if (path / "manifest.json").is_file() else None)
    tensors, problems = load_tensors(files)
    return Checkpoint(path, config, tensors, files, manifest, problems)


@dataclass
class Target:
    """The target's ``config.json`` (text config for multimodal ones; ``raw``: the whole file) and
    lazily its embedding."""

    path: Path
    config: dict
    architecture: str
    _embed: torch.Tensor | None = None
    raw: dict = field(default_factory=dict)

    @classmethod
    def read(cls, target_dir: str | Path) -> "Target":
        path = Path(target_dir)
        raw = target_config_json(path)
        archs = raw.get("architectures") or ["(none)"]
        return cls(path, text_config(raw), str(archs[0]), raw=raw)

    def embed(self) -> torch.Tensor | None:
        """The target's embedding ``[vocab, H]``: the first ``*embed_tokens.weight`` in
        ``*.safetensors``, else ``pytorch_model*.bin`` (``weights_only``, memory-mapped). None when
        absent (:attr:`embed_searched` says where); DataError on a corrupt file."""
        if self._embed is None:
            from safetensors import safe_open

            for f in sorted(self.path.glob("*.safetensors")):
                with safe_open(str(f), framework="pt") as h:
                    for k in h.keys():
                        if k.endswith("embed_tokens.weight"):
                            self._embed = h.get_tensor(k)
                            return self._embed
            for f in sorted(self.path.glob("pytorch_model*.bin")):
                try:
                    part = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
                except Exception as e:  # pickle/zip raise many types on corrupt or unsafe input
                    raise DataError(f"{f}: unreadable target weights ({type(e).__name__}: "
                                    f"{e})") from e
                names = part if isinstance(part, dict) else []
                found = next((k for k in names if str(k).endswith("embed_tokens.weight")), None)
                if found is not None:
                    self._embed = part[found].clone()
                    return self._embed
        return self._embed

    @property
    def embed_searched(self) -> str:
        """What :meth:`embed` looks through, for a message when it finds nothing."""
        files = sorted(p.name for g in WEIGHT_GLOBS for p in self.path.glob(g))
        files = files or "no *.safetensors or pytorch_model*.bin file"
        return f"tensors named *embed_tokens.weight in {files}"


def cfg_get(config: dict, key: str, default: Any = None) -> Any:
    """Dotted lookup with a default (``eagle_config.norm_before_fc``)."""
    found, value = dotted_get(config, key)
    return value if found else default
