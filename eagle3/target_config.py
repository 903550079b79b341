"""The target's HF ``config.json`` read as JSON, without torch or transformers: the one reader of
the target's shape (``hidden_size``, ``vocab_size``, ``num_hidden_layers``, ...) for the checks
that run before or beside any model load (pre-checks, pre-flight, conversion, alignment).

A multimodal target (Gemma 3, Llama 4, Qwen2.5-VL, ...) nests its language model's fields under
``text_config``; :func:`text_config` picks that section, from this JSON or from a transformers
config object, wherever the target's text config is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from eagle3.artifacts import read_json_object
from eagle3.errors import DataError


def text_config(conf: Any) -> Any:
    """The text section of a target config: its ``text_config`` when set (multimodal targets),
    else ``conf`` itself. ``conf``: a ``config.json`` dict or a transformers config object."""
    if isinstance(conf, Mapping):
        inner = conf.get("text_config")
        return inner if isinstance(inner, Mapping) and inner else conf
    return getattr(conf, "text_config", None) or conf


def target_config_json(target_dir: str | Path) -> dict:
    """The whole ``config.json`` of the HF folder ``target_dir``. DataError naming the file when it
    is missing, unreadable or not a JSON object."""
    return read_json_object(Path(target_dir) / "config.json", "target config.json")


def target_text_config(target_dir: str | Path | None) -> dict | None:
    """:func:`text_config` of ``target_dir``'s ``config.json``, or None when there is no folder
    (None) or the file is missing, unreadable or not a JSON object (the checks that need it are
    then skipped)."""
    if target_dir is None:
        return None
    try:
        return text_config(target_config_json(target_dir))
    except DataError:
        return None


def target_architecture(target_dir: str | Path) -> str:
    """``architectures[0]`` of the target's ``config.json``; DataError naming the file when it is
    unreadable or the list is absent or empty."""
    archs = target_config_json(target_dir).get("architectures")
    if not archs or not isinstance(archs, list):
        raise DataError(f"{Path(target_dir) / 'config.json'}: 'architectures' expected a non-empty "
                        f"list, got {archs!r}")
    return str(archs[0])
