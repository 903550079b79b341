"""Plausible ranges of the numbers in a model ``config.json`` (user input), checked by
:func:`bounded_int` before they size a loop, shape or allocation. Limits are far above any released
model (~128 layers, hidden 16384, vocab ~260k, 10M-token contexts) and far below exhausting memory.
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
    """``config[key]`` (``default`` when absent or None) as an int inside ``LIMITS[key]``.
    ConfigError naming ``where``, key, range and value when missing, a bool, not an integer (an
    integer string is accepted) or out of range."""
    value = config.get(key)
    value = default if value is None else value
    lo, hi = LIMITS.get(key, (None, None))
    span = f" in [{lo}, {hi}]" if lo is not None else ""
    if value is None or isinstance(value, bool) or (isinstance(value, float)
                                                    and not value.is_integer()):
        raise ConfigError(f"{where}: {key!r} expected an integer{span}, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {key!r} expected an integer{span}, got {value!r}") from e
    if lo is not None and not lo <= number <= hi:
        raise ConfigError(f"{where}: {key!r} expected an integer{span}, got {number}")
    return number


def out_of_bounds(config: Mapping[str, Any], *, where: str = "config.json") -> list[str]:
    """Messages for every ``LIMITS`` key in ``config`` out of range or not an integer."""
    out = []
    for key in LIMITS:
        if config.get(key) is None:
            continue
        try:
            bounded_int(config, key, where=where)
        except ConfigError as e:
            out.append(str(e))
    return out
