"""Declarative profiles of serving engines' EAGLE-3 draft loaders.

A profile says, for one engine version, what its loader does with a draft checkpoint directory:

- which parameters the engine's draft module has, with shapes as functions of the served ``config.json``
  (:meth:`EngineProfile.engine_params`);
- how each checkpoint tensor name is routed to a parameter: legacy renames, stacked q/k/v and gate/up
  shards, name prefixes tried, tensors consumed specially (``d2t``) or ignored (``t2d``), and what happens
  to a name that matches nothing (:meth:`EngineProfile.route`);
- which config flags it implements and how (:meth:`EngineProfile.check_flags`);
- where it reads the aux layer ids and in which convention (:attr:`EngineProfile.aux_id_offset`:
  engine id + offset = HF ``hidden_states`` index, the project's convention);
- which target classes can capture aux hidden states (:attr:`EngineProfile.aux_capture_classes`).

This module holds the profile's types only; each engine's facts live in ``eagle3/engines/<engine>/profile.py``
(``sglang``: pinned to the released source by ``tests/unit/test_profiles.py``, which reads the wheel statically;
``vllm``: from the notes in docs/ENGINE_FACTS.md, marked ``pinned=False``), and
``eagle3.engines.registry.get_profile`` picks one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from eagle3.errors import ConfigError, EngineUnsupported


@dataclass(frozen=True)
class FlagRule:
    """How an engine treats one draft config flag.

    Attributes:
        name: the flag (speculators' name).
        supported: the values the engine computes the way speculators trained them.
        engine_default: the value the engine assumes when the served config lacks the flag.
        config_keys: where the engine reads it in the served ``config.json`` (dotted paths, first wins);
            empty when the engine never reads it (behaviour fixed in code).
        how: one line on what the engine computes, with the source location.
    """

    name: str
    supported: tuple[bool, ...]
    engine_default: bool
    config_keys: tuple[str, ...]
    how: str


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of the engine's draft module.

    ``shape`` is the full parameter shape; ``shards`` maps a shard id to the shape of the checkpoint
    tensor that fills that part (stacked q/k/v, gate/up). ``runtime_source`` names where the engine fills
    the parameter at run time instead of from the checkpoint (e.g. the target's embedding); ``unused``
    marks a parameter the forward pass never reads.
    """

    shape: tuple[int, ...]
    shards: Mapping[Any, tuple[int, ...]] = field(default_factory=dict)
    runtime_source: str | None = None
    unused: bool = False


@dataclass(frozen=True)
class Route:
    """Where the loader sends one checkpoint tensor.

    ``kind``: ``"param"`` (fills ``param``, or its shard ``shard``), ``"special"`` (consumed otherwise,
    e.g. ``d2t`` → hot token ids), ``"ignored"`` (dropped on purpose, e.g. ``t2d``), ``"unknown"``
    (matches no parameter: SGLang skips it silently, vLLM raises). ``renamed`` is the name after the
    loader's renames.
    """

    kind: str
    renamed: str
    param: str | None = None
    shard: Any = None


@dataclass(frozen=True)
class EngineProfile:
    """What one engine version's EAGLE-3 draft loader accepts. See the module docstring.

    ``param_fn(config) -> {engine param name: ParamSpec}`` and ``route_fn(name, params) -> Route`` hold the
    engine-specific logic; everything else is data.
    """

    engine: str
    version: str
    pinned: bool
    source_file: str
    draft_architectures: tuple[str, ...]
    legacy_renames: tuple[tuple[str, str], ...]
    stacked: tuple[tuple[str, str, Any], ...]
    name_prefixes: tuple[str, ...]
    unknown_tensor: str  # "skip" (silently) | "raise"
    special_tensors: Mapping[str, str]
    ignored_tensors: tuple[str, ...]
    embed_from_target: bool
    aux_ids_key: str
    aux_ids_convention: str
    aux_id_offset: int
    aux_default_rule: str
    aux_capture_hf_range: str
    residual_order: str
    flags: Mapping[str, FlagRule]
    flags_not_read: tuple[str, ...]
    aux_capture_classes: frozenset[str]
    max_draft_layers: int | None
    param_fn: Callable[[dict], dict[str, ParamSpec]] = field(repr=False, compare=False)
    route_fn: Callable[[str, Mapping[str, ParamSpec]], Route] = field(repr=False, compare=False)
    notes: tuple[str, ...] = ()
    eagle_config_keys: tuple[str, ...] = ()  # keys the engine reads inside the draft's ``eagle_config``
    other_bool_keys: tuple[str, ...] = ()  # top-level booleans the engine reads besides the flags (e.g. ``bias``)
    config_view_fn: Callable[[dict], dict] | None = field(default=None, repr=False, compare=False)

    def config_view(self, config: dict) -> dict:
        """The served ``config.json`` as this engine reads its model fields: SGLang reads the top level as is;
        vLLM reads a speculators-format draft's layer fields from ``transformer_layer_config`` (so a check of
        ``hidden_size`` or ``vocab_size`` must look there). A new dict; the input is not changed."""
        return dict(config) if self.config_view_fn is None else self.config_view_fn(config)

    def engine_params(self, config: dict) -> dict[str, ParamSpec]:
        """The engine draft module's parameters for a served ``config.json`` dict.

        Raises ConfigError naming the config key when a field the engine needs is missing or malformed.
        """
        return self.param_fn(config)

    def route(self, name: str, params: Mapping[str, ParamSpec]) -> Route:
        """Route one checkpoint tensor ``name`` as the engine's ``load_weights`` does."""
        return self.route_fn(name, params)

    def check_flags(self, flags: Mapping[str, bool | None]) -> None:
        """Raise ConfigError when a draft flag value would be computed differently by this engine.

        ``flags`` maps flag name (``norm_before_residual``, ``norm_before_fc``, ``fc_norm``,
        ``norm_output``, ``embed_requires_grad``) to its value; ``None`` means "not set": the engine's own
        behaviour, which is then what the trainer must use. The message names the flag, the value asked
        and the value(s) this engine version computes.
        """
        for name, value in flags.items():
            if value is None:
                continue
            rule = self.flags.get(name)
            if rule is None:
                raise ConfigError(f"flag {name}={value!r}: unknown to the {self.engine} {self.version} profile "
                                  f"(known: {sorted(self.flags)})")
            if bool(value) not in rule.supported:
                raise ConfigError(
                    f"flag {name}: {self.engine} {self.version} computes {name}="
                    f"{' or '.join(map(str, rule.supported))} ({rule.how}), got {name}={value!r}")

    @property
    def norm_before_residual(self) -> bool:
        """The residual order this engine computes when the config does not say (SGLang 0.5.23: False)."""
        return self.flags["norm_before_residual"].engine_default

    def engine_flag_value(self, name: str, config: dict) -> bool:
        """The value of flag ``name`` the engine will use for a served ``config`` (its defaults applied)."""
        rule = self.flags[name]
        for key in rule.config_keys:
            found, value = _dotted_get(config, key)
            if found and value is not None:
                return bool(value)
        return rule.engine_default

    def hf_to_engine_ids(self, hf_ids: list[int]) -> list[int]:
        """Project aux ids (HF hidden_states index) → this engine's convention (``hf - offset``)."""
        return [int(i) - self.aux_id_offset for i in hf_ids]

    def engine_to_hf_ids(self, engine_ids: list[int]) -> list[int]:
        """This engine's aux ids → HF hidden_states index (``id + offset``)."""
        return [int(i) + self.aux_id_offset for i in engine_ids]

    def require_aux_capture(self, target_class: str) -> None:
        """Raise EngineUnsupported when ``target_class`` does not capture aux hidden states in this version."""
        if target_class not in self.aux_capture_classes:
            raise EngineUnsupported(
                f"target class {target_class}: {self.engine} {self.version} has no "
                f"set_eagle3_layers_to_capture for it, so an EAGLE-3 draft would get no aux hidden states "
                f"(expected one of {len(self.aux_capture_classes)} capturing classes)")


def _dotted_get(config: Mapping, key: str) -> tuple[bool, Any]:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def dotted_get(config: Mapping, key: str) -> tuple[bool, Any]:
    """``(found, value)`` for a dotted key such as ``eagle_config.eagle_aux_hidden_state_layer_ids``."""
    return _dotted_get(config, key)
