"""What a user writes of a run config: the YAML file (each key once), ``-o section.key=value``
overrides, and validation errors naming the override that set a bad value."""

from __future__ import annotations

import difflib
import re
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

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
            if (child := node.get(p)) is None:
                child = node[p] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {p!r} is a value ({child!r}), not a section")
            node = child
        node[parts[-1]] = _parse_value(raw)
    return data


def known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of ``model``, nested models' too (``train``, ``target.tiny.seed``, ...)."""
    out = []
    for name, field in model.model_fields.items():
        out.append(prefix + name)
        if isinstance(sub := field.annotation, type) and issubclass(sub, BaseModel):
            out += known_keys(sub, f"{prefix}{name}.")
    return out


def _unknown_key_line(loc: str, got: Any, override: str | None, model: type[BaseModel] | None) \
        -> str:
    """``UNKNOWN_KEY`` line with the known keys of ``model`` closest to the key as written (an
    override's whole key: ``-o trian.epochs=1`` suggests ``train.epochs``)."""
    written = override.split("=", 1)[0].strip() if override else loc
    if not override and isinstance(got, dict) and len(got) == 1:  # an unknown section in a file
        written = f"{loc}.{next(iter(got))}"
    names = known_keys(model) if model is not None else []
    close = difflib.get_close_matches(written, names, n=3, cutoff=0.6)
    if not close and "." in loc:  # a known section with an unknown key: compare the keys alone
        section, key = loc.rsplit(".", 1)
        close = [f"{section}.{k}" for k in difflib.get_close_matches(
            key, [n[len(section) + 1:] for n in names if n.startswith(section + ".")], n=3)]
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    if not close and "." not in loc and names:
        hint = f"; the sections and top-level keys: {', '.join(n for n in names if '.' not in n)}"
    what, within = (("key", f"in section {loc.rsplit('.', 1)[0]}") if "." in loc
                    else ("section", "at the top level"))
    got_s = "a mapping" if isinstance(got, dict) else repr(got)[:120]
    origin = f" [from -o {override}]" if override else ""
    return (f"  UNKNOWN_KEY: {loc}: expected a known {what} {within}, got {loc!r} (set to "
            f"{got_s}){hint}{origin}")


def format_validation_error(err: ValidationError, source: str, overrides: list[str] = (),
                            model: type[BaseModel] | None = None) -> str:
    """One ``CODE: key: message`` line per invalid field, saying when a ``-o`` override set it: the
    error's own code (a custom error's ``ctx["code"]``), else ``CONFIG_VALUE``; a rule across
    sections without a code of its own is ``CONFIG_RULE``; an unknown key is an ``UNKNOWN_KEY``
    line with the nearest keys of ``model`` (the validated schema) when given."""
    given = {item.split("=", 1)[0].strip(): item for item in overrides if "=" in item}
    lines = [f"{source}{' with -o overrides' if given else ''}: invalid configuration"]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        # a rule across sections (eagle3.config_checks): one line per broken rule, keys in the text
        if not loc:
            for rule in str(e["msg"]).removeprefix("Value error, ").split("\n"):
                origin = "".join(f" [from -o {item}]" for k, item in given.items() if k in rule)
                coded = re.match(r"[A-Z][A-Z0-9_]+: ", rule) is not None
                lines.append(f"  {'' if coded else 'CONFIG_RULE: '}{rule}{origin}")
            continue
        got = e.get("input")
        # an override of an unknown section fails at the section (its key is below the error's)
        by = next((given[k] for k in given if loc == k or loc.startswith(k + ".")
                   or (e["type"] == "extra_forbidden" and k.startswith(loc + "."))), None)
        if e["type"] == "extra_forbidden":
            lines.append(_unknown_key_line(loc, got, by, model))
            continue
        got_s = repr(got) if not isinstance(got, dict) else "a mapping"
        origin = f" [from -o {by}]" if by else ""
        ctx = e.get("ctx") or {}  # a custom error may name its input itself, and give a code
        shown = "" if ctx.get("shows_input") else f" (got {got_s[:120]})"
        code = f"{ctx.get('code') or 'CONFIG_VALUE'}: "
        lines.append(f"  {code}{loc}: {e['msg']}{shown}{origin}")
    return "\n".join(lines)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader refusing a mapping key written twice (YAML keeps the last one silently: a second
    ``train:`` would reset the first's keys). ``name``: the file named in the message."""

    name = "<config>"

    def construct_document(self, node: yaml.Node) -> Any:
        _refuse_duplicates(node, (), self.name)
        return super().construct_document(node)


def _refuse_duplicates(node: yaml.Node, where: tuple[str, ...], name: str) -> None:
    """ConfigError ``DUPLICATE_KEY`` for the first key written twice in ``node``'s tree."""
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicates(item, (*where, str(i)), name)
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[tuple, int] = {}
    for key, value in node.value:
        line = key.start_mark.line + 1
        if isinstance(key, yaml.ScalarNode):
            if (ident := (key.tag, key.value)) in seen:
                dotted = ".".join((*where, key.value))
                raise ConfigError(f"DUPLICATE_KEY: {name}:{line}: {dotted} is written twice "
                                  f"(lines {seen[ident]} and {line}); YAML would keep the last "
                                  "one silently; expected each key once")
            seen[ident] = line
            _refuse_duplicates(value, (*where, key.value), name)
        else:
            _refuse_duplicates(value, where, name)


def load_yaml(text: str, name: str) -> Any:
    """``yaml.safe_load(text)``, refusing a key written twice in a mapping (``DUPLICATE_KEY``
    naming ``name``, the line and both lines; :class:`_UniqueKeyLoader`)."""
    loader = _UniqueKeyLoader(text)
    loader.name = name
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
