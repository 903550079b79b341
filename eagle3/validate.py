"""Every check of a serving checkpoint that can be made from files (../shared/FAILURE_CLASSES.md).

``validate(ckpt_dir, target_dir=..., engine=..., data_manifest=...)`` returns a list of :class:`Problem`
(empty = valid). The tensor checks replay the engine's loader from its profile
(:mod:`eagle3.engines.profiles`): every tensor must fill a parameter the engine has (SGLang skips unknown
names in silence), every parameter the engine reads must be filled (else it keeps its random init), and
shapes must agree with the config. Codes, by failure class:

    1 MISSING_TENSOR   2 UNKNOWN_TENSOR, DUPLICATE_TENSOR   3 SHAPE_MISMATCH, CONFIG_FIELD
    4 NAN_INF, ALL_ZERO, EMBED_MISMATCH   5 UNSUPPORTED_FLAG, FLAG_MISMATCH   6 VOCAB_MAP_MISSING
    7 VOCAB_MAP_INVALID, VOCAB_SIZE_MISMATCH   8 VOCAB_DATA_TOO_SMALL   9 VOCAB_MAP_CHANGED
    10 AUX_IDS_MISSING, AUX_IDS_COUNT, AUX_IDS_RANGE, AUX_IDS_ORDER, AUX_IDS_MISMATCH, AUX_DISABLED
    11 TARGET_NO_AUX_CAPTURE   12 TARGET_HIDDEN_SIZE   13 ROPE_MISMATCH, CONTEXT_LENGTH
    14 CHAT_TEMPLATE_MISMATCH, TOKENIZER_MISMATCH, TARGET_MISMATCH   15/16 DATA_INVALID
    22 ARCHITECTURE

Only unreadable input raises (DataError: missing/corrupt ``config.json`` or weights, unreadable target).
Target checks need ``target_dir``; data checks need ``data_manifest`` (the extraction manifest).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagle3.engines.profiles import dotted_get, get_profile
from eagle3.errors import DataError

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
    """A draft directory read into memory: ``config`` (dict), ``tensors`` {name: tensor}, ``manifest``."""

    path: Path
    config: dict
    tensors: dict[str, torch.Tensor]
    weight_files: list[Path]
    manifest: dict | None


def _read_json(path: Path, what: str) -> dict:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise DataError(f"{path}: {what} not found") from e
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: {what} unreadable ({e})") from e
    if not isinstance(value, dict):
        raise DataError(f"{path}: {what} expected a JSON object, got {type(value).__name__}")
    return value


def load_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """All tensors of safetensors / ``pytorch_model*.bin`` files; DataError on a corrupt file or a name
    present in two files."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            part = load_file(str(f)) if f.suffix == ".safetensors" else torch.load(f, map_location="cpu",
                                                                                   weights_only=True)
        except Exception as e:  # safetensors/pickle raise many unrelated types on corrupt input
            raise DataError(f"{f}: unreadable weights ({type(e).__name__}: {e})") from e
        if not isinstance(part, dict):
            raise DataError(f"{f}: expected a name → tensor mapping, got {type(part).__name__}")
        for name, t in part.items():
            if name in out:
                raise DataError(f"{f}: tensor {name!r} also appears in another weight file")
            out[name] = t
    return out


def read_checkpoint(ckpt_dir: str | Path) -> Checkpoint:
    """Read ``config.json``, all weight files and ``manifest.json`` (optional) of a draft directory."""
    path = Path(ckpt_dir)
    if not path.is_dir():
        raise DataError(f"{path}: checkpoint directory not found")
    config = _read_json(path / "config.json", "config.json")
    files = sorted({f for g in WEIGHT_GLOBS for f in path.glob(g)})
    if not files:
        raise DataError(f"{path}: no weight file (expected model.safetensors or pytorch_model.bin)")
    manifest = _read_json(path / "manifest.json", "manifest.json") if (path / "manifest.json").is_file() else None
    return Checkpoint(path, config, load_tensors(files), files, manifest)


@dataclass
class Target:
    """The target's ``config.json`` (text config for multimodal ones) and lazily its embedding."""

    path: Path
    config: dict
    architecture: str
    _embed: torch.Tensor | None = None

    @classmethod
    def read(cls, target_dir: str | Path) -> "Target":
        path = Path(target_dir)
        raw = _read_json(path / "config.json", "target config.json")
        archs = raw.get("architectures") or ["(none)"]
        return cls(path, raw.get("text_config") or raw, str(archs[0]))

    def embed(self) -> torch.Tensor | None:
        """The target's input embedding ``[vocab, H]`` (first tensor named ``*embed_tokens.weight``)."""
        if self._embed is None:
            from safetensors import safe_open

            for f in sorted(self.path.glob("*.safetensors")):
                with safe_open(str(f), framework="pt") as h:
                    for k in h.keys():
                        if k.endswith("embed_tokens.weight"):
                            self._embed = h.get_tensor(k)
                            return self._embed
        return self._embed


def validate(ckpt_dir: str | Path, *, target_dir: str | Path | None = None, engine: str = "sglang",
             data_manifest: dict | None = None, version: str | None = None) -> list[Problem]:
    """All file-checkable problems of a serving checkpoint for ``engine`` (see the module docstring).

    Args:
        ckpt_dir: the serving checkpoint (``config.json``, weights, optional ``manifest.json``).
        target_dir: the target's HF folder; enables embedding, hidden size, RoPE, context, layer-range,
            aux-capture and vocab-size checks.
        engine, version: the engine profile (default version: the pinned one, SGLang 0.5.23).
        data_manifest: the extraction manifest (kind ``hidden_states``); enables aux-id, chat-template,
            tokenizer, target identity and vocabulary-size-vs-data checks.
    Raises DataError only when an input cannot be read; EngineUnsupported for an engine without a profile.
    """
    from eagle3 import validate_checks as checks
    from eagle3.engines.profiles import default_version

    profile = get_profile(engine, version or default_version(engine))
    ck = read_checkpoint(ckpt_dir)
    target = Target.read(target_dir) if target_dir is not None else None
    problems: list[Problem] = []
    problems += checks.check_architecture(ck, profile)
    problems += checks.check_flags(ck, profile)
    problems += checks.check_tensors(ck, profile)
    problems += checks.check_values(ck, target)
    problems += checks.check_vocab_map(ck, profile)
    problems += checks.check_aux_ids(ck, profile, target, data_manifest)
    if target is not None:
        problems += checks.check_target(ck, profile, target)
    if data_manifest is not None:
        problems += checks.check_data(ck, target, data_manifest)
    return problems


def cfg_get(config: dict, key: str, default: Any = None) -> Any:
    """Dotted lookup with a default (``eagle_config.norm_before_fc``)."""
    found, value = dotted_get(config, key)
    return value if found else default


__all__ = ["Problem", "Checkpoint", "Target", "validate", "read_checkpoint", "load_tensors", "cfg_get"]
