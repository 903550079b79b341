"""Plausible ranges of the numbers in a model ``config.json``, checked before any loop or allocation
uses them.

A draft or target config is user input. A value such as ``num_hidden_layers: 1000000000`` used to
make ``eagle3 validate`` and ``eagle3 convert`` loop over a billion layers and grow to gigabytes; a
zero head count divided by zero. Every number that sizes a loop, a shape or an allocation goes
through :func:`bounded_int` first, which refuses it with the key, the range and the value
(ConfigError).

The upper limits are far above any released model (the largest have ~128 layers, hidden 16384, vocab
~260k, contexts of 10M tokens) and far below what would exhaust memory when a loop or a shape is
built from them.
"""

from __future__ import annotations

from typing import Any, Mapping

from eagle3.errors import ConfigError

# key -> (lowest, highest) accepted value; integers only
LIMITS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 1024),
    "hidden_size": (1, 1 << 17),
    "target_hidden_size": (1, 1 << 17),
    "intermediate_size": (1, 1 << 20),
    "num_attention_heads": (1, 1 << 12),
    "num_key_value_heads": (1, 1 << 12),
    "head_dim": (1, 1 << 12),
    "vocab_size": (1, 1 << 24),
    "draft_vocab_size": (1, 1 << 24),
    "max_position_embeddings": (1, 1 << 31),
    "num_aux_hidden_states": (1, 64),
}


def bounded_int(config: Mapping[str, Any], key: str, default: Any = None, *,
                where: str = "config.json") -> int:
    """``config[key]`` (``default`` when absent or None) as an int inside ``LIMITS[key]`` (no limit
    for other keys).

    Raises ConfigError naming ``where``, the key, the accepted range and the value for a missing
    value, a bool, a non-integer (``2.5``, ``"64"`` is accepted only if it is an integer string), or
    a value out of range.
    """
    value = config.get(key)
    value = default if value is None else value
    lo, hi = LIMITS.get(key, (None, None))
    span = f" in [{lo}, {hi}]" if lo is not None else ""
    if value is None or isinstance(value, bool) or isinstance(value,
                                                              float) and not value.is_integer():
        raise ConfigError(f"{where}: {key!r} expected an integer{span}, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {key!r} expected an integer{span}, got {value!r}") from e
    if lo is not None and not lo <= number <= hi:
        raise ConfigError(f"{where}: {key!r} expected an integer{span}, got {number}")
    return number


def out_of_bounds(config: Mapping[str, Any], *, where: str = "config.json") -> list[str]:
    """Messages for every key of ``LIMITS`` present in ``config`` (not None) whose value is out of
    range or not an integer; empty when all are plausible. For checks that report every problem
    instead of raising."""
    out = []
    for key in LIMITS:
        if config.get(key) is None:
            continue
        try:
            bounded_int(config, key, where=where)
        except ConfigError as e:
            out.append(str(e))
    return out
