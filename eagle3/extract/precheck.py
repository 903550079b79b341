"""Checks of the extraction's inputs that need no model and take a second (``data.path``, the
auxiliary layer ids against the target's layer count when its config is at hand), run by
``eagle3 preflight`` and before a run starts."""

from __future__ import annotations

from pathlib import Path

from eagle3.errors import ConfigError, DataError
from eagle3.target_config import target_text_config


def _known_layer_count(cfg) -> int | None:
    """The target's decoder layer count when known without loading anything (the tiny config, or
    the ``config.json`` of a target folder that exists), else None."""
    if cfg.target.kind == "tiny-random":
        return int(cfg.target.tiny.num_hidden_layers)
    from eagle3.assets import prepared_target

    n = (target_text_config(prepared_target(cfg)) or {}).get("num_hidden_layers")
    return int(n) if isinstance(n, int) else None


# a conversations file up to this size is read whole before a run (about a second for 64 MB of
# JSONL); a larger one is read by the extraction only
READ_AHEAD_MAX_BYTES = 256 * 2**20


def check_before_run(cfg) -> int | None:
    """Checks that take a second, before any model loads (the stage repeats them): ``data.path``
    exists (source 'file') and, up to :data:`READ_AHEAD_MAX_BYTES`, holds a usable conversation
    (:func:`eagle3.extract.conversations.read_conversations`: a file of blank lines or of invalid
    JSON is refused now, not at every extraction); ``extract.aux_layer_ids`` fit the target when
    its layer count is known. Returns the usable conversations of a file read whole, else None.
    ConfigError naming the key, the file and what was expected and found."""
    usable = None
    if cfg.data.source == "file":
        path = Path(cfg.data.path).expanduser()
        what = ("a directory" if path.is_dir() else "not a regular file" if path.exists()
                else "not found") if not path.is_file() else (
            "empty: 0 bytes" if path.stat().st_size == 0 else None)
        if what:
            raise ConfigError("data.path: expected a conversations file (JSON, JSONL or text), got "
                              f"{str(path)!r} ({what})")
        if path.stat().st_size <= READ_AHEAD_MAX_BYTES:
            from eagle3.extract.conversations import read_conversations

            try:
                usable = len(read_conversations(path)[0])
            except DataError as e:
                raise ConfigError(f"data.path: {e}") from e
    n = _known_layer_count(cfg)
    if n is not None:
        aux_ids(cfg, n)
    return usable


def aux_ids(cfg, n_layers: int) -> list[int]:
    """``extract.aux_layer_ids``, or the default for ``n_layers`` decoder layers
    (:func:`eagle3.target_model.default_aux_layer_ids`); ConfigError from
    :func:`eagle3.target_model.validate_aux_layer_ids` for ids the target does not have."""
    from eagle3.target_model import default_aux_layer_ids, validate_aux_layer_ids

    if cfg.extract.aux_layer_ids is None:
        return default_aux_layer_ids(n_layers)
    ids = list(cfg.extract.aux_layer_ids)
    validate_aux_layer_ids(ids, n_layers)
    return ids
