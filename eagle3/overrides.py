"""``-o section.key=value`` overrides of a run config, and validation errors that name the override
that set a bad value (so a user looks at the command line, not at the file)."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from eagle3.errors import ConfigError


def _parse_value(raw: str) -> Any:
    """YAML-parse an override value (``3``, ``1e-4``, ``true``, ``[2,5]``, ``null`` get types)."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``section.key=value`` overrides to a raw config dict (in place; returned). ConfigError
    without ``=`` or with an empty key; unknown keys are left to the schema."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected 'section.key=value', got no '='")
        key, raw = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"override {item!r}: empty key")
        node = data
        for p in parts[:-1]:
            child = node.get(p)
            if child is None:
                child = node[p] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {p!r} is a value ({child!r}), not a section")
            node = child
        node[parts[-1]] = _parse_value(raw)
    return data


def format_validation_error(err: ValidationError, source: str, overrides: list[str] = ()) -> str:
    """One line per invalid field, saying when a ``-o`` override set it."""
    given = {item.split("=", 1)[0].strip(): item for item in overrides if "=" in item}
    lines = [f"{source}{' with -o overrides' if given else ''}: invalid configuration"]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        # a rule across sections (eagle3.config_checks): one line per broken rule, keys in the text
        if not loc:
            for rule in str(e["msg"]).removeprefix("Value error, ").split("\n"):
                origin = "".join(f" [from -o {item}]" for k, item in given.items() if k in rule)
                lines.append(f"  {rule}{origin}")
            continue
        got = e.get("input")
        got_s = repr(got) if not isinstance(got, dict) else "a mapping"
        origin = next((" [from -o "
                       f"{given[k]}]" for k in given if loc == k or loc.startswith(k + ".")), "")
        lines.append(f"  {loc}: {e['msg']} (got {got_s[:120]}){origin}")
    return "\n".join(lines)
