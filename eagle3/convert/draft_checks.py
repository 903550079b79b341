"""Checks of what a draft was trained with that the serving config would silently change:
disagreeing RoPE thetas, a sliding window served as full attention (a lone ``sliding_window``: a
warning), a draft vocabulary that cannot propose the data's tokens. Used by validate on a serving
checkpoint and by conversion on its source."""

from __future__ import annotations

import json
from typing import Mapping

import torch

from eagle3.convert.checkpoint import Checkpoint, Problem, cfg_get
from eagle3.engines.sglang.draft_load import DEFAULT_THETA, rope_base_key
from eagle3.engines.sglang.draft_load import rope_parameters as effective_rope
from eagle3.engines.sglang.profile import RELEASES

# Which RoPE theta SGLang builds the draft's attention with: SGLang 0.5.23 / 0.5.16 load
# config.json through transformers 5.19.0 / 5.12.1 (wheels' METADATA), whose LlamaConfig folds
# the three places into ``rope_parameters``, first found wins (checked by
# tests/unit/test_convert_classes.py); srt/models/llama.py ``LlamaDecoderLayer.__init__`` reads
# ``rope_parameters["rope_theta"]``. Neither reads speculators' ``transformer_layer_config``,
# which speculators 0.9.0 builds the layer from (models/eagle3/core.py).
SGLANG_THETA_ORDER = ("rope_scaling.rope_theta", "rope_parameters.rope_theta", "rope_theta")
SGLANG_RELEASES = "SGLang " + " and ".join(
    sorted(RELEASES, key=lambda v: [int(p) if p.isdigit() else 0 for p in v.split(".")]))

# Share of the data's target tokens the draft vocabulary must hold: with coverage c the accepted
# drafts per pass stay below c / (1 - c), under one token below 0.5 (refused), at most 9 below
# 0.9 (warning).
COVERAGE_REFUSE = 0.5
COVERAGE_WARN = 0.9
# Fewest counted tokens for a coverage verdict: two standard errors (<= 1 / sqrt(N)) are 0.05 at
# 400, half the 0.1 margin; fewer: VOCAB_COVERAGE_UNJUDGED.
COVERAGE_MIN_TOKENS = 400


def _scopes(cfg: Mapping) -> list[tuple[str, Mapping]]:
    """``(key prefix, config object)`` of the top level and speculators'
    ``transformer_layer_config``."""
    out: list[tuple[str, Mapping]] = [("", cfg)]
    tl = cfg.get("transformer_layer_config")
    if isinstance(tl, Mapping):
        out.append(("transformer_layer_config.", tl))
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def stated_thetas(cfg: Mapping) -> dict[str, float]:
    """Every numeric RoPE theta ``cfg`` states, ``{dotted key: float}`` (keys of
    :data:`SGLANG_THETA_ORDER`, prefixed ``transformer_layer_config.`` where stated there)."""
    return {prefix + key: float(cfg_get(dict(scope), key)) for prefix, scope in _scopes(cfg)
            for key in SGLANG_THETA_ORDER if _number(cfg_get(dict(scope), key))}


def _read_theta(scope: Mapping) -> tuple[str, float] | None:
    """``(key, theta)`` transformers 5 builds ``scope``'s layer with: the kept RoPE dict's
    ``rope_theta`` (:func:`rope_base_key`; a ``rope_scaling`` without one hides
    ``rope_parameters``'), else the top-level ``rope_theta``; None when neither is a number."""
    keys = (rope_base_key(scope) + ".rope_theta", "rope_theta")
    return next(((k, float(cfg_get(dict(scope), k))) for k in keys
                 if _number(cfg_get(dict(scope), k))), None)


def sglang_theta(cfg: Mapping) -> tuple[str, float]:
    """``(key, theta)`` SGLang 0.5.16 / 0.5.23 serve a serving-format config with (top level,
    :func:`_read_theta`; ``("default", 10000.0)`` when none)."""
    top = {k: v for k, v in cfg.items() if k != "transformer_layer_config"}
    return _read_theta(top) or ("default", DEFAULT_THETA)


def trained_theta(cfg: Mapping) -> tuple[str, float] | None:
    """``(key, theta)`` the draft's attention was trained with: :func:`_read_theta` of
    speculators' ``transformer_layer_config`` when present, else the top level; None if none."""
    tl = cfg.get("transformer_layer_config")
    scope, prefix = (tl, "transformer_layer_config.") if isinstance(tl, Mapping) else (cfg, "")
    found = _read_theta({k: v for k, v in scope.items() if k != "transformer_layer_config"})
    return None if found is None else (prefix + found[0], found[1])


def rope_scaling_conflict(scope: Mapping, prefix: str = "") -> str | None:
    """Both keys, values and differing fields when ``scope`` states non-empty ``rope_scaling`` and
    ``rope_parameters`` and transformers 5 builds other RoPE from the first; else None."""
    rs, rp = scope.get("rope_scaling"), scope.get("rope_parameters")
    if not (isinstance(rs, Mapping) and rs and isinstance(rp, Mapping) and rp):
        return None
    served = effective_rope(scope)
    alone = effective_rope({k: v for k, v in scope.items() if k != "rope_scaling"})
    if served == alone:
        return None
    fields = sorted(k for k in set(served) | set(alone) if served.get(k) != alone.get(k))
    return (f"{prefix}rope_scaling={json.dumps(rs, sort_keys=True)} and "
            f"{prefix}rope_parameters={json.dumps(rp, sort_keys=True)} disagree on "
            f"{', '.join(fields)}: transformers 5 replaces rope_parameters by rope_scaling, so "
            f"the layer is built with {json.dumps(served, sort_keys=True)}, not "
            f"{json.dumps(alone, sort_keys=True)}")


def check_rope_scaling(cfg: Mapping, where: str = "config.json") -> list[Problem]:
    """``ROPE_SCALING_CONFLICT`` per config level with a :func:`rope_scaling_conflict`: SGLang
    0.5.16 and 0.5.23 silently read the ``rope_scaling`` one."""
    conflicts = [rope_scaling_conflict(scope, prefix) for prefix, scope in _scopes(cfg)]
    return [Problem("ROPE_SCALING_CONFLICT", f"{where}: expected one RoPE setting, got {what}; "
                    f"{SGLANG_RELEASES} read config.json through transformers 5 and "
                    "srt/models/llama.py reads rope_parameters. Keep only the key holding the "
                    "RoPE the draft was trained with") for what in conflicts if what is not None]


def _is_speculators(cfg: Mapping) -> bool:
    return bool(cfg.get("speculators_model_type")) and isinstance(
        cfg.get("transformer_layer_config"), Mapping)


def _rope_not_a_mapping(cfg: Mapping, where: str) -> list[Problem]:
    """``ROPE_CONFLICT`` for a ``rope_parameters`` / ``rope_scaling`` neither null nor an object
    (transformers 5's ``LlamaConfig`` cannot be built from it)."""
    return [Problem("ROPE_CONFLICT", f"{where}: {prefix}{key}: expected a JSON object (or null), "
                    f"got {v!r} (a {type(v).__name__}); transformers 5 cannot build the draft's "
                    "config from it")
            for prefix, scope in _scopes(cfg) for key in ("rope_parameters", "rope_scaling")
            if (v := scope.get(key)) is not None and not isinstance(v, Mapping)]


def check_rope_conflict(cfg: Mapping, where: str = "config.json") -> list[Problem]:
    """``ROPE_CONFLICT`` when RoPE thetas disagree, at one level or across the top and
    speculators' ``transformer_layer_config``, naming every key and value, the one read and by
    what, and the keys to delete. Speculators format: speculators 0.9.0 trains with
    ``transformer_layer_config``'s theta (default 10000) and conversion serves it; serving
    format: SGLang reads the first of :data:`SGLANG_THETA_ORDER` at the top level."""
    shapes = _rope_not_a_mapping(cfg, where)
    if shapes:
        return shapes
    stated = stated_thetas(cfg)
    both = ", ".join(f"{k}={v:g}" for k, v in stated.items())
    if _is_speculators(cfg):
        trained = trained_theta(cfg)
        key, theta = trained or ("", DEFAULT_THETA)
        if len(set(stated.values()) | {theta}) < 2:
            return []
        used = (f"{key}={theta:g}" if trained else f"transformers' default theta {theta:g} "
                "(transformer_layer_config states none)")
        unread = [k for k in stated if k != key]
        return [Problem("ROPE_CONFLICT", f"{where}: expected one RoPE theta, got {both}. "
                        f"speculators 0.9.0 trained the draft layer with {used} (its Eagle3 "
                        "core.py builds the rotary embedding from transformer_layer_config; "
                        f"transformers takes the first of {', '.join(SGLANG_THETA_ORDER)}); "
                        f"{SGLANG_RELEASES} do not load this format: `eagle3 convert` copies "
                        "transformer_layer_config's RoPE keys into the served config.json (the "
                        "target's RoPE instead when given --target). "
                        f"{', '.join(unread)} {'is' if len(unread) == 1 else 'are'} read by none "
                        f"of them: delete {'it' if len(unread) == 1 else 'them'} or set "
                        f"{'it' if len(unread) == 1 else 'them'} to {theta:g}")]
    if len(set(stated.values())) < 2:
        return []
    s_key, s_theta = sglang_theta(cfg)
    stray = [k for k in stated if k.startswith("transformer_layer_config.")]
    stray_note = (f"; {', '.join(stray)} {'is' if len(stray) == 1 else 'are'} not read when "
                  "serving" if stray else "")
    others = [k for k in stated if k != s_key]
    return [Problem("ROPE_CONFLICT", f"{where}: expected one RoPE theta, got {both}. "
                    f"{SGLANG_RELEASES} read {s_key}={s_theta:g} (transformers folds "
                    f"{', '.join(SGLANG_THETA_ORDER)} into rope_parameters, first stated wins; "
                    "srt/models/llama.py reads rope_parameters['rope_theta'])"
                    f"{stray_note}. The file does not record which theta the draft was "
                    "trained with: keep only the key holding it (normally the target's theta) "
                    f"and delete the others ({', '.join(others)} if {s_key} is the trained one)")]


def check_sliding_window(cfg: Mapping, where: str = "config.json") -> list[Problem]:
    """``SLIDING_WINDOW`` when the draft's layers use sliding-window attention (speculators
    ``layer_types`` ``"sliding_attention"``, Eagle3 ``core.py``; Qwen-style
    ``use_sliding_window: true``): SGLang 0.5.16's / 0.5.23's ``LlamaForCausalLMEagle3``
    (srt/models/llama_eagle3.py) reads neither key, so serves full attention. Also for a
    non-boolean ``use_sliding_window`` (transformers reads it by truthiness) and a non-positive-
    integer ``sliding_window`` beside ``use_sliding_window: true``, each named with its type."""
    out = []
    for prefix, scope in _scopes(cfg):
        types, window = scope.get("layer_types"), scope.get("sliding_window")
        use = scope.get("use_sliding_window")
        if use is not None and not isinstance(use, bool):
            out.append(Problem("SLIDING_WINDOW", f"{where} {prefix}use_sliding_window: expected "
                               f"true or false (a JSON boolean), got {use!r} (a "
                               f"{type(use).__name__}) with {prefix}sliding_window={window!r}; "
                               "transformers takes any truthy value as true (the string 'false' "
                               f"included) and the LlamaForCausalLMEagle3 of {SGLANG_RELEASES} "
                               "reads neither key, so the draft would be served with full "
                               "attention: write false if it was trained without a window"))
        bad_window = window is not None and not (_number(window) and isinstance(window, int)
                                                 and window > 0)
        if use is True and bad_window:
            out.append(Problem("SLIDING_WINDOW", f"{where} {prefix}sliding_window: expected a "
                               "positive integer (the window in tokens) with "
                               f"{prefix}use_sliding_window=true, got {window!r} (a "
                               f"{type(window).__name__}); the window the draft was trained with "
                               "is unclear, and the LlamaForCausalLMEagle3 of "
                               f"{SGLANG_RELEASES} reads neither key, so the draft would be "
                               "served with full attention: write the window as an integer, or "
                               "use_sliding_window=false if it was trained without one"))
        sliding = [i for i, t in enumerate(types if isinstance(types, list) else [])
                   if t != "full_attention"]
        flag = use is True and not bad_window and window is not None
        if not sliding and not flag:
            continue
        got = (f"{prefix}layer_types={types} (layers {sliding} not full attention)" if sliding
               else f"{prefix}use_sliding_window=true")
        out.append(Problem("SLIDING_WINDOW", f"{where}: expected full attention in every draft "
                           f"layer, got {got} with {prefix}sliding_window={window!r}; the "
                           f"LlamaForCausalLMEagle3 of {SGLANG_RELEASES} reads neither key (its "
                           "only window is the server flag --speculative-draft-window-size), so "
                           "the draft would be served with full attention"))
    return out


def aux_ids_invalid(ids, key: str, where: str = "config.json") -> Problem | None:
    """``AUX_IDS_INVALID`` when the aux ids ``ids`` (``key`` in ``where``) are stated but are no
    JSON list of integers (a string, a number, a list holding a string, float or boolean): the
    engine sizes ``fc`` from the list's length. None for a list of integers or absent ids."""
    def is_id(i) -> bool:
        return isinstance(i, int) and not isinstance(i, bool)

    def json_type(v) -> str:
        names = ((bool, "boolean"), (int, "number"), (float, "float"), (str, "string"),
                 (Mapping, "object"))
        return next((n for t, n in names if isinstance(v, t)), type(v).__name__)

    if ids is None or (isinstance(ids, list) and all(is_id(i) for i in ids)):
        return None
    if isinstance(ids, list):
        bad = ", ".join(f"item {n} = {i!r} (a {json_type(i)})"
                        for n, i in enumerate(ids) if not is_id(i))
        got = f"{ids!r} (not integers: {bad})"
    else:
        got = f"{ids!r} (a {json_type(ids)}, not a list)"
    return Problem("AUX_IDS_INVALID", f"{where} {key}: expected a list of integers (the aux layer "
                   f"ids, e.g. [1, 4, 7]), got {got}; write the ids as a JSON list of numbers")


def sliding_window_warnings(cfg: Mapping, where: str = "config.json") -> list[Problem]:
    """Warning ``SLIDING_WINDOW`` for a positive ``sliding_window`` with neither ``layer_types``
    nor ``use_sliding_window`` at its level: speculators 0.9.0 windows only ``layer_types``'
    ``"sliding_attention"`` layers, LlamaConfig derives none, SGLang reads no window key."""
    return [Problem("SLIDING_WINDOW", f"{where} {prefix}sliding_window={window}: stated without "
                    f"{prefix}layer_types or {prefix}use_sliding_window, so no layer uses it: "
                    "speculators 0.9.0 windows only layers that layer_types marks "
                    f"'sliding_attention' and {SGLANG_RELEASES} read no window key; the draft is "
                    "served with full attention. Delete the key, or, if the draft was trained "
                    "with a window, serve it with --speculative-draft-window-size")
            for prefix, scope in _scopes(cfg)
            if isinstance(window := scope.get("sliding_window"), int) and _number(window)
            and window > 0 and scope.get("layer_types") is None
            and "use_sliding_window" not in scope]


def _d2t(ck: Checkpoint) -> torch.Tensor | None:
    return next((v for k, v in sorted(ck.tensors.items()) if "d2t" in k), None)


def check_vocab_reach(ck: Checkpoint, token_counts: Mapping[int, int] | None
                      ) -> tuple[list[Problem], list[Problem], dict]:
    """The draft vocabulary against the data: ``(problems, warnings, figures)``. Warning
    ``VOCAB_MAP_PREFIX`` when ``d2t`` is all zeros. With ``token_counts`` ``{target id: count}``:
    figures ``{"vocab_coverage", "tokens_covered", "tokens_counted"}``, ``VOCAB_COVERAGE_LOW``
    below :data:`COVERAGE_REFUSE`, warning ``VOCAB_COVERAGE`` below :data:`COVERAGE_WARN`; under
    :data:`COVERAGE_MIN_TOKENS` tokens, warning ``VOCAB_COVERAGE_UNJUDGED`` (figures
    ``"vocab_coverage_judged": False``). Nothing without ``d2t``."""
    from eagle3.train.vocab import is_identity_prefix, vocab_coverage

    tl = ck.config.get("transformer_layer_config")
    vocab = ck.config.get("vocab_size", tl.get("vocab_size") if isinstance(tl, Mapping) else None)
    d2t = _d2t(ck)
    if d2t is None or not isinstance(vocab, int) or d2t.dim() != 1:
        return [], [], {}
    problems, warnings, figures = [], [], {}
    share = None
    if token_counts is not None:
        share, covered, total = vocab_coverage(d2t, dict(token_counts))
        if total < COVERAGE_MIN_TOKENS:
            warnings.append(Problem("VOCAB_COVERAGE_UNJUDGED", "draft vocabulary coverage: "
                                    f"expected at least {COVERAGE_MIN_TOKENS} target tokens of "
                                    f"data to judge it, got {total} ({covered} in the draft "
                                    "vocabulary): not judged"))
            figures = {"tokens_counted": total, "tokens_covered": covered,
                       "vocab_coverage_judged": False}
            share = None
        else:
            figures = {"vocab_coverage": round(share, 6), "tokens_covered": covered,
                       "tokens_counted": total}
    of_data = "" if share is None else f"; it holds {share:.1%} of the data's target tokens"
    if is_identity_prefix(d2t, vocab):
        warnings.append(Problem("VOCAB_MAP_PREFIX", "d2t: expected the data's most frequent "
                                "target ids, got all zeros: the draft vocabulary is target ids "
                                f"[0, {d2t.numel()}) of {vocab}, so the draft can only propose ids "
                                f"below {d2t.numel()}{of_data}"))
    if share is None:
        return problems, warnings, figures
    what = (f"draft vocabulary ({d2t.numel()} ids): expected at least {{:.0%}} of the data's "
            f"{total} target tokens in it, got {share:.1%} ({covered}); a drafted id outside it "
            f"is never accepted")
    if share < COVERAGE_REFUSE:
        problems.append(Problem("VOCAB_COVERAGE_LOW", what.format(COVERAGE_REFUSE)))
    elif share < COVERAGE_WARN:
        warnings.append(Problem("VOCAB_COVERAGE", what.format(COVERAGE_WARN)))
    return problems, warnings, figures
