"""Types of a declarative profile of one engine version's EAGLE-3 draft loader: draft parameters
and shapes (:meth:`engine_params`), tensor routing (:meth:`route`), implemented flags
(:meth:`check_flags`), aux-id convention (:attr:`aux_id_offset`: engine id + offset = HF
``hidden_states`` index), capturing targets (:attr:`aux_capture_classes`). Facts:
``eagle3/engines/sglang/profile.py``; ``eagle3.engines.registry.get_profile`` picks one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from eagle3.errors import ConfigError, EngineUnsupported


@dataclass(frozen=True)
class FlagRule:
    """One draft flag (speculators' name): values computed as trained (``supported``), the default,
    where it is read in ``config.json`` (dotted keys, first wins; empty: fixed), and ``how`` (one
    line with the source location)."""

    name: str
    supported: tuple[bool, ...]
    engine_default: bool
    config_keys: tuple[str, ...]
    how: str


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of the engine's draft module: its full ``shape``; ``shards``: shard id → shape
    of the checkpoint tensor filling that part (stacked q/k/v, gate/up); ``runtime_source``: where
    the engine fills it at run time instead (the target's embedding); ``unused``: the forward never
    reads it."""

    shape: tuple[int, ...]
    shards: Mapping[Any, tuple[int, ...]] = field(default_factory=dict)
    runtime_source: str | None = None
    unused: bool = False


@dataclass(frozen=True)
class Route:
    """Where the loader sends one tensor. ``kind``: ``param`` (fills ``param`` or shard ``shard``),
    ``special`` (``d2t``), ``ignored`` (``t2d``), ``unknown`` (skipped silently). ``renamed``: the
    name after renames."""

    kind: str
    renamed: str
    param: str | None = None
    shard: Any = None


@dataclass(frozen=True)
class EngineProfile:
    """One engine version's draft loader; ``param_fn`` and ``route_fn`` hold its logic."""

    engine: str
    version: str
    draft_architectures: tuple[str, ...]
    legacy_renames: tuple[tuple[str, str], ...]
    unknown_tensor: str  # "skip" (silently) | "raise"
    aux_ids_key: str
    aux_ids_convention: str
    aux_id_offset: int
    aux_default_rule: str
    aux_capture_hf_range: str
    flags: Mapping[str, FlagRule]
    aux_capture_classes: frozenset[str]
    param_fn: Callable[[dict], dict[str, ParamSpec]] = field(repr=False, compare=False)
    route_fn: Callable[[str, Mapping[str, ParamSpec]], Route] = field(repr=False, compare=False)
    # keys the engine reads inside the draft's ``eagle_config``
    eagle_config_keys: tuple[str, ...] = ()
    # top-level booleans it reads besides the flags (``bias``)
    other_bool_keys: tuple[str, ...] = ()

    def engine_params(self, config: dict) -> dict[str, ParamSpec]:
        """The draft's parameters for a ``config.json`` dict; ConfigError naming a bad key."""
        return self.param_fn(config)

    def route(self, name: str, params: Mapping[str, ParamSpec]) -> Route:
        """Route one checkpoint tensor ``name`` as the engine's ``load_weights`` does."""
        return self.route_fn(name, params)

    def check_flags(self, flags: Mapping[str, bool | None]) -> None:
        """ConfigError naming flag, value asked and values computed when this engine would compute
        a flag differently. ``flags``: name → value; None: not set (the engine's default)."""
        for name, value in flags.items():
            if value is None:
                continue
            rule = self.flags.get(name)
            if rule is None:
                raise ConfigError(f"flag {name}={value!r}: unknown to the {self.engine} "
                                  f"{self.version} profile (known: {sorted(self.flags)})")
            if bool(value) not in rule.supported:
                raise ConfigError(
                    f"flag {name}: {self.engine} {self.version} computes {name}="
                    f"{' or '.join(map(str, rule.supported))} ({rule.how}), got {name}={value!r}")

    @property
    def norm_before_residual(self) -> bool:
        """The residual order this engine computes when the config does not say."""
        return self.flags["norm_before_residual"].engine_default

    def engine_flag_value(self, name: str, config: dict) -> bool:
        """Flag ``name``'s value the engine uses for ``config``, defaults applied."""

        rule = self.flags[name]
        for key in rule.config_keys:
            found, value = dotted_get(config, key)
            if found and value is not None:
                return bool(value)
        return rule.engine_default

    def hf_to_engine_ids(self, hf_ids: list[int]) -> list[int]:
        """Aux ids, HF hidden_states index → this engine's convention (``hf - offset``)."""
        return [int(i) - self.aux_id_offset for i in hf_ids]

    def engine_to_hf_ids(self, engine_ids: list[int]) -> list[int]:
        """This engine's aux ids → HF hidden_states index (``id + offset``)."""
        return [int(i) + self.aux_id_offset for i in engine_ids]

    def require_aux_capture(self, target_class: str) -> None:
        """EngineUnsupported when ``target_class`` captures no aux hidden states in this version."""
        if target_class not in self.aux_capture_classes:
            raise EngineUnsupported(
                f"target class {target_class}: {self.engine} {self.version} has no "
                f"set_eagle3_layers_to_capture for it, so an EAGLE-3 draft would get no aux hidden "
                f"states (expected one of {len(self.aux_capture_classes)} capturing classes)")


def dotted_get(config: Mapping, key: str) -> tuple[bool, Any]:
    """``(found, value)`` for a dotted key such as ``eagle_config.x``."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node
