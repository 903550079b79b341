"""Draft config flags (failure class 5): trained values the engine computes otherwise, flags read
from a place the engine never looks, and flags nobody knows. The pinned SGLang reads
``norm_output`` and ``fc_norm`` (or ``use_aux_norm``) at the top level only, ``norm_before_fc``
in either place, and inside ``eagle_config`` only ``EngineProfile.eagle_config_keys``.
"""

from __future__ import annotations

import json
from typing import Mapping

from eagle3.convert.checkpoint import Checkpoint, Problem
from eagle3.engines.profile import EngineProfile, dotted_get
from eagle3.errors import ConfigError

# Boolean keys of transformers' configs (PretrainedConfig 4.x and 5.x, the Llama/Qwen-style
# decoder configs drafts copy their fields from): a draft config may carry any of them.
HF_BOOL_KEYS = frozenset({
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
    "tf_legacy_loss", "tie_word_embeddings", "is_encoder_decoder", "is_decoder",
    "add_cross_attention", "tie_encoder_decoder", "do_sample", "early_stopping", "output_scores",
    "return_dict_in_generate", "remove_invalid_values", "use_cache", "attention_bias", "mlp_bias",
    "use_sliding_window", "has_no_defaults_at_init",
})
# Boolean keys whose non-boolean value another check names (SLIDING_WINDOW,
# eagle3.convert.draft_checks.check_sliding_window), left out of FLAG_TYPE.
TYPED_ELSEWHERE = frozenset({"use_sliding_window"})
# The flags conversion writes into the served config.json (absent there means false).
WRITTEN_FLAGS = ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual")


def render_value(value) -> str:
    """A JSON value in words for a message: ``the string 'false'``, ``the number 1``, ``null``,
    ``the list [1]``, ``the object {...}``; ``true`` / ``false`` for booleans."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, (int, float)):
        return f"the number {json.dumps(value)}"
    kind = "list" if isinstance(value, list) else "object" if isinstance(value, dict) else "value"
    return f"the {kind} {json.dumps(value, sort_keys=True, default=str)}"


def _bool_keys(profile: EngineProfile) -> frozenset[str]:
    return (HF_BOOL_KEYS | set(profile.flags) | set(profile.other_bool_keys)) - TYPED_ELSEWHERE


def _non_bool(config: Mapping, profile: EngineProfile) -> list[tuple[str, str, object]]:
    """``(scope prefix, key, value)`` of each known boolean key stated neither true, false nor
    null, at the top level and inside ``eagle_config`` and ``transformer_layer_config``."""
    keys = _bool_keys(profile)
    scopes = [("", config)] + [(f"{k}.", config.get(k))
                               for k in ("eagle_config", "transformer_layer_config")]
    return [(prefix, k, scope[k]) for prefix, scope in scopes if isinstance(scope, Mapping)
            for k in sorted(scope)
            if k in keys and scope[k] is not None and not isinstance(scope[k], bool)]


def check_flag_types(config: Mapping, profile: EngineProfile,
                     where: str = "config.json") -> list[Problem]:
    """``FLAG_TYPE`` for each known boolean key whose value is not a JSON boolean: engines and
    conversion read it by truthiness, so the string ``"false"`` means true."""
    return [Problem("FLAG_TYPE", f"{where} {prefix}{key}: expected true or false, got "
                    f"{render_value(value)} (read by truthiness it means "
                    f"{render_value(bool(value))})")
            for prefix, key, value in _non_bool(config, profile)]


def non_bool_names(config: Mapping, profile: EngineProfile) -> frozenset[str]:
    """The flag names :func:`check_flag_types` reports (``use_aux_norm`` also names ``fc_norm``),
    which the other flag checks skip."""
    names = {key for _, key, _ in _non_bool(config, profile)}
    return frozenset(names | ({"fc_norm"} if "use_aux_norm" in names else set()))


def flag_values(config: Mapping, name: str) -> dict[str, bool]:
    """Every place ``config`` states flag ``name`` non-null (top level, ``eagle_config.<name>``;
    ``use_aux_norm`` for ``fc_norm``), as ``{dotted key: bool}``."""
    aliases = [name] + (["use_aux_norm"] if name == "fc_norm" else [])
    found = {k: dotted_get(config, k) for a in aliases for k in (a, f"eagle_config.{a}")}
    return {k: bool(v) for k, (ok, v) in found.items() if ok and v is not None}


def trained_flag(config: Mapping, name: str, where: str = "config.json") -> bool | None:
    """The trained value of flag ``name`` wherever stated (None: not stated); ConfigError when two
    places disagree."""
    values = flag_values(config, name)
    if len(set(values.values())) > 1:
        raise ConfigError(f"{where}: flag {name} is stated twice with different values {values}; "
                          "expected one value (which one the training code read cannot be told "
                          "from the file)")
    return next(iter(values.values()), None)


def check_nested_flags(config: Mapping, profile: EngineProfile,
                       skip: frozenset[str] = frozenset()) -> list[Problem]:
    """``NESTED_FLAG`` for each flag (not in ``skip``) stated where the engine never reads it, with
    a value other than the engine computes (``eagle_config.norm_output: true`` → False)."""
    out = []
    for name, rule in profile.flags.items():
        if name in skip:
            continue
        engine_value = profile.engine_flag_value(name, dict(config))
        for key, value in flag_values(config, name).items():
            if key not in rule.config_keys and value != engine_value:
                out.append(Problem("NESTED_FLAG", f"config.json {key}: expected it where "
                                   f"{profile.engine} {profile.version} reads {name} "
                                   f"({list(rule.config_keys) or 'nowhere: fixed in code'}), got "
                                   f"{key}={value} there, so the engine computes "
                                   f"{name}={engine_value}"))
    return out


def check_unknown_flags(config: Mapping, profile: EngineProfile) -> list[Problem]:
    """``UNKNOWN_FLAG`` for boolean keys no schema defines at the top level, and for keys inside
    ``eagle_config`` other than ``profile.eagle_config_keys`` and the flags (unread there)."""
    known_top = HF_BOOL_KEYS | set(profile.flags) | set(profile.other_bool_keys)
    out = [Problem("UNKNOWN_FLAG", f"config.json {key}={value}: expected only flags "
                   f"{profile.engine} {profile.version} or transformers define "
                   f"({sorted(set(profile.flags))} and the model config's own), got {key!r}, "
                   "which no engine reads")
           for key, value in sorted(config.items())
           if isinstance(value, bool) and key not in known_top]
    eagle = config.get("eagle_config")
    known_nested = set(profile.eagle_config_keys) | set(profile.flags)
    return out + [Problem("UNKNOWN_FLAG", f"config.json eagle_config.{key}={value!r}: expected "
                          f"only {sorted(profile.eagle_config_keys)} inside eagle_config (what "
                          f"{profile.engine} {profile.version} reads there), got {key!r}, which "
                          "it never reads")
                  for key, value in (sorted(eagle.items()) if isinstance(eagle, Mapping) else [])
                  if key not in known_nested]


def unsupported_flags(flags: Mapping[str, bool | None], profile: EngineProfile,
                      where: str = "") -> list[Problem]:
    """``UNSUPPORTED_FLAG`` for each trained flag in ``flags`` (name -> value; None: not stated)
    the engine does not implement or computes otherwise (:meth:`EngineProfile.check_flags`);
    ``where`` prefixes the message."""
    out = []
    for name, value in flags.items():
        try:
            profile.check_flags({name: value})
        except ConfigError as e:
            out.append(Problem("UNSUPPORTED_FLAG", f"{where + ' ' if where else ''}{e}"))
    return out


def check_flags(ck: Checkpoint, profile: EngineProfile,
                skip: frozenset[str] = frozenset()) -> list[Problem]:
    """Class 5: trained flags (``manifest.json`` ``trained_flags``, else the config's keys) the
    engine does not implement, computes differently, or would read otherwise; ``skip``
    (:func:`non_bool_names`) not judged."""
    out: list[Problem] = []
    cfg = ck.config
    trained = {k: v for k, v in ((ck.manifest or {}).get("trained_flags") or {}).items()
               if k not in skip}
    # a flag the config states but the engine never reads: its value is a fact too
    for name in profile.flags:
        if cfg.get(name) is None or name in skip:
            continue
        if not profile.flags[name].config_keys and bool(cfg[name]):
            trained[name] = True
        elif name not in trained:
            trained[name] = bool(cfg[name])
    for name, value in trained.items():
        bad = unsupported_flags({name: value}, profile)
        if bad:
            out += bad
            continue
        rule = profile.flags.get(name)
        if rule is not None and rule.config_keys:
            engine_value = profile.engine_flag_value(name, cfg)
            if engine_value != bool(value):
                out.append(Problem("FLAG_MISMATCH", f"{name}: the draft was trained with "
                                   f"{name}={value} but {profile.engine} {profile.version} reads "
                                   f"{name}={engine_value} from config.json (keys "
                                   f"{list(rule.config_keys)})"))
    fixed = {"attention_bias": False, "mlp_bias": False, "hidden_act": "silu"}
    for key, want in fixed.items():
        if key in cfg and key not in skip and cfg[key] != want:
            out.append(Problem("UNSUPPORTED_FLAG", f"config.json {key}: {profile.engine} "
                               f"{profile.version}'s EAGLE-3 layer computes {key}={want!r}, got "
                               f"{cfg[key]!r}"))
    dv, vocab = cfg.get("draft_vocab_size"), cfg.get("vocab_size")
    tied = "tie_word_embeddings" not in skip and cfg.get("tie_word_embeddings")
    if tied and dv is not None and dv != vocab:
        out.append(Problem("UNSUPPORTED_FLAG", "config.json tie_word_embeddings: expected false "
                           f"with draft_vocab_size {dv} < vocab_size {vocab} (a tied head has no "
                           "lm_head.weight parameter, so the draft head is skipped), got true"))
    return out


def check_recorded_flags(ck: Checkpoint, where: str = "config.json") -> list[Problem]:
    """``FLAG_MISMATCH`` for each flag ``manifest.json`` ``trained_flags`` records that the config
    ``where`` now states otherwise (a flag conversion does not write, e.g.
    ``embed_requires_grad``, only where stated)."""
    recorded = (ck.manifest or {}).get("trained_flags")
    if not isinstance(recorded, Mapping):
        return []
    out = []
    for name, want in sorted(recorded.items()):
        stated = trained_flag(ck.config, name, where)
        if not isinstance(want, bool) or (stated is None and name not in WRITTEN_FLAGS):
            continue
        got = bool(stated)
        if got != want:
            out.append(Problem("FLAG_MISMATCH", f"{ck.path}/manifest.json trained_flags.{name}: "
                               f"the draft was trained with {name}={want}, but {where} states "
                               f"{name}={got} (edited after conversion): expected the trained "
                               "value, which conversion would otherwise replace"))
    return out
