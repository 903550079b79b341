"""Checks of what a draft was trained with that the serving config would silently change: two RoPE
thetas in one config, a sliding-window draft the engine serves with full attention, and a draft
vocabulary that cannot propose the data's tokens. Each returns ``Problem`` records naming the key
and both values; used by :func:`eagle3.convert.validate.validate_report` on a serving checkpoint
and by :func:`eagle3.convert.stage.convert` on its source, before anything is written.
"""

from __future__ import annotations

from typing import Mapping

import torch

from eagle3.convert.checkpoint import Checkpoint, Problem, cfg_get

# Which RoPE theta SGLang 0.5.23 builds the draft's attention with. It loads config.json through
# transformers 5.19 (its pinned requirement: sglang-0.5.23.dist-info/METADATA), whose LlamaConfig
# folds the three places into ``rope_parameters`` with this precedence (first found wins; checked
# against the installed transformers by tests/unit/test_convert_classes.py), and then
# srt/models/llama.py ``LlamaDecoderLayer.__init__`` reads ``rope_parameters["rope_theta"]``.
SGLANG_THETA_ORDER = ("rope_scaling.rope_theta", "rope_parameters.rope_theta", "rope_theta")
DEFAULT_THETA = 10000.0  # transformers' LlamaConfig and SGLang's llama.py default

# Share of the data's target tokens the draft vocabulary must hold. A drafted id outside it is never
# accepted, so with coverage c the accepted drafts per verify pass stay below c + c² + ... =
# c / (1 - c): under 0.5 that is less than one token even for a perfect draft (refused); under 0.9
# (at most 9 tokens per pass) it is reported as a warning.
COVERAGE_REFUSE = 0.5
COVERAGE_WARN = 0.9


def _scopes(cfg: Mapping) -> list[tuple[str, Mapping]]:
    """The config objects that describe the draft's decoder layers, with their key prefix: the
    top level, and speculators' ``transformer_layer_config``."""
    out: list[tuple[str, Mapping]] = [("", cfg)]
    tl = cfg.get("transformer_layer_config")
    if isinstance(tl, Mapping):
        out.append(("transformer_layer_config.", tl))
    return out


def stated_thetas(cfg: Mapping) -> dict[str, float]:
    """Every RoPE theta ``cfg`` states, as ``{dotted key: float}`` (keys of
    :data:`SGLANG_THETA_ORDER`, with the ``transformer_layer_config.`` prefix where stated
    there); absent, None and non-numeric values are left out."""
    out: dict[str, float] = {}
    for prefix, scope in _scopes(cfg):
        for key in SGLANG_THETA_ORDER:
            value = cfg_get(dict(scope), key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[prefix + key] = float(value)
    return out


def sglang_theta(cfg: Mapping) -> tuple[str, float]:
    """``(key, theta)`` SGLang 0.5.23 serves a serving-format config with (first key of
    :data:`SGLANG_THETA_ORDER` stated at the top level; ``("default", 10000.0)`` when none)."""
    stated = stated_thetas({k: v for k, v in cfg.items() if k != "transformer_layer_config"})
    return next(iter(stated.items()), ("default", DEFAULT_THETA))  # stated in that order


def trained_theta(cfg: Mapping) -> tuple[str, float] | None:
    """``(key, theta)`` the draft's attention was trained with, from the layer config
    (speculators' ``transformer_layer_config`` when present, else the top level), read in
    :data:`SGLANG_THETA_ORDER` (speculators builds the layer through the same transformers);
    None when the config states no theta."""
    tl = cfg.get("transformer_layer_config")
    scope, prefix = (tl, "transformer_layer_config.") if isinstance(tl, Mapping) else (cfg, "")
    stated = stated_thetas({k: v for k, v in scope.items() if k != "transformer_layer_config"})
    key = next(iter(stated), None)  # stated in SGLANG_THETA_ORDER
    return None if key is None else (prefix + key, stated[key])


def check_rope_conflict(cfg: Mapping, where: str = "config.json") -> list[Problem]:
    """``ROPE_CONFLICT`` when one config states two different RoPE thetas (transformers 4's
    ``rope_theta`` / ``rope_scaling`` beside 5's ``rope_parameters``): names every key and value
    and the one SGLang 0.5.23 and the reference engine read."""
    from eagle3.engines.sglang.draft_load import rope_parameters

    out = []
    for prefix, scope in _scopes(cfg):
        flat = {k: v for k, v in scope.items() if k != "transformer_layer_config"}
        stated = stated_thetas(flat)
        if len(set(stated.values())) < 2:
            continue
        s_key, s_theta = sglang_theta(flat)
        ref_theta = rope_parameters(dict(flat)).get("rope_theta", DEFAULT_THETA)
        both = ", ".join(f"{prefix}{k}={v:g}" for k, v in stated.items())
        out.append(Problem("ROPE_CONFLICT", f"{where}: expected one RoPE theta, got {both}; SGLang "
                           f"0.5.23 reads {prefix}{s_key}={s_theta:g} (transformers 5.19 folds "
                           "them into rope_parameters, srt/models/llama.py reads "
                           "rope_parameters['rope_theta']), the reference engine reads "
                           f"{float(ref_theta):g}; which one the draft was trained with cannot be "
                           "told from the file"))
    return out


def check_sliding_window(cfg: Mapping, where: str = "config.json") -> list[Problem]:
    """``SLIDING_WINDOW`` when the draft's layers use sliding-window attention (speculators:
    ``layer_types`` entries ``"sliding_attention"``, ``Eagle3`` ``core.py``; Qwen-style
    ``use_sliding_window: true`` with a window). SGLang 0.5.23's ``LlamaForCausalLMEagle3``
    (srt/models/llama_eagle3.py) reads neither key: its only window is the server flag
    ``--speculative-draft-window-size``, so the draft is served with full attention."""
    out = []
    for prefix, scope in _scopes(cfg):
        types = scope.get("layer_types")
        window = scope.get("sliding_window")
        sliding = [i for i, t in enumerate(types if isinstance(types, list) else [])
                   if t != "full_attention"]
        flag = scope.get("use_sliding_window") is True and isinstance(window, int) and window > 0
        if not sliding and not flag:
            continue
        got = (f"{prefix}layer_types={types} (layers {sliding} not full attention)" if sliding
               else f"{prefix}use_sliding_window=true")
        out.append(Problem("SLIDING_WINDOW", f"{where}: expected full attention in every draft "
                           f"layer, got {got} with {prefix}sliding_window={window!r}; SGLang "
                           "0.5.23's LlamaForCausalLMEagle3 reads neither key (its only window is "
                           "the server flag --speculative-draft-window-size), so the draft would "
                           "be served with full attention"))
    return out


def _d2t(ck: Checkpoint) -> torch.Tensor | None:
    return next((v for k, v in sorted(ck.tensors.items()) if "d2t" in k), None)


def check_vocab_reach(ck: Checkpoint, token_counts: Mapping[int, int] | None
                      ) -> tuple[list[Problem], list[Problem], dict]:
    """The draft vocabulary against the data: ``(problems, warnings, figures)``. Warning
    ``VOCAB_MAP_PREFIX`` when ``d2t`` is all zeros (the vocabulary is the first
    ``draft_vocab_size`` target ids). With ``token_counts`` ``{target id: count}`` (the data's
    target tokens): figures ``{"vocab_coverage", "tokens_covered", "tokens_counted"}``; problem
    ``VOCAB_COVERAGE_LOW`` below :data:`COVERAGE_REFUSE`, warning ``VOCAB_COVERAGE`` below
    :data:`COVERAGE_WARN`. Nothing when the draft has no ``d2t`` (the full vocabulary)."""
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
