"""Every check of a serving checkpoint that can be made from files (docs/FAILURE_CLASSES.md).

Tensor checks replay the engine's loader (:mod:`eagle3.engines.profile`). Codes, by failure class:
1 MISSING_TENSOR; 2 UNKNOWN_TENSOR, DUPLICATE_TENSOR; 3 SHAPE_MISMATCH, CONFIG_FIELD; 4 NAN_INF,
ALL_ZERO, EMBED_MISMATCH, EMBED_UNCHECKED; 5 UNSUPPORTED_FLAG, FLAG_MISMATCH, NESTED_FLAG,
UNKNOWN_FLAG, FLAG_TYPE; 6 VOCAB_MAP_MISSING; 7 VOCAB_MAP_INVALID, VOCAB_SIZE_MISMATCH,
VOCAB_MAP_ABSOLUTE; 8 VOCAB_DATA_TOO_SMALL, VOCAB_COVERAGE_LOW; 9 VOCAB_MAP_CHANGED;
10 AUX_IDS_MISSING, AUX_IDS_COUNT, AUX_IDS_RANGE, AUX_IDS_ORDER, AUX_IDS_MISMATCH, AUX_DISABLED,
AUX_IDS_INVALID (then the tensor checks, which size fc from the ids, are skipped);
11 TARGET_NO_AUX_CAPTURE; 12 TARGET_HIDDEN_SIZE; 13 ROPE_MISMATCH, CONTEXT_LENGTH, ROPE_CONFLICT,
ROPE_SCALING_CONFLICT, SLIDING_WINDOW; 14 CHAT_TEMPLATE_MISMATCH, TOKENIZER_MISMATCH,
TARGET_MISMATCH, TARGET_WEIGHTS_MISMATCH; 15/16 DATA_INVALID; 22 ARCHITECTURE; 26 CONFIG_FIELD
(numbers out of range); CONTENT_HASH_MISMATCH; TARGET_IS_DRAFT (target checks then skipped).

Warnings (served, but said out loud): VOCAB_MAP_PREFIX, VOCAB_COVERAGE,
VOCAB_COVERAGE_UNJUDGED, SLIDING_WINDOW, DATA_UNCHECKED, CONTENT_UNCHECKED.

Only unreadable input raises (DataError). Target checks need ``target_dir``; data checks need
``data_manifest``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from eagle3.convert import checks, draft_checks, flag_checks
from eagle3.convert.checkpoint import Checkpoint, Problem, Target, cfg_get, read_checkpoint
from eagle3.engines.bounds import out_of_bounds
from eagle3.engines.profile import EngineProfile
from eagle3.engines.registry import get_profile
from eagle3.errors import DataError


@dataclass
class Findings:
    """What :func:`validate_report` found: ``problems`` (would be served wrongly), ``warnings``
    (served as trained, but weaker than it looks) and ``figures`` (e.g. ``vocab_coverage``)."""

    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    figures: dict = field(default_factory=dict)


def validate_report(ckpt_dir: str | Path, *, target_dir: str | Path | None = None,
                    engine: str = "sglang", data_manifest: dict | None = None,
                    version: str | None = None, aux_capture: bool = True,
                    token_counts: Mapping[int, int] | None = None) -> Findings:
    """Problems, warnings and figures of ``ckpt_dir`` for ``engine``. ``version`` None: the pinned
    release. ``aux_capture``: check class 11 here (the pipeline leaves it to
    :mod:`eagle3.serve.preflight`). ``token_counts`` ``{target id: count}``: the data's target
    tokens, for the draft vocabulary's coverage (:func:`eagle3.convert.coverage.token_counts`).
    DataError for unreadable input or a ``data_manifest`` that is not a mapping; EngineUnsupported
    for an unknown engine/release."""
    if data_manifest is not None and not isinstance(data_manifest, Mapping):
        raise DataError("data manifest: expected a JSON object (the extraction manifest), got a "
                        f"{type(data_manifest).__name__}")
    profile = get_profile(engine, version)
    ck = read_checkpoint(ckpt_dir)
    target = Target.read(target_dir) if target_dir is not None else None
    found = Findings(problems=list(ck.problems))
    hashed, found.warnings = checks.check_content_hash(ck)
    if target is not None:
        not_target = checks.check_target_is_draft(target, profile)
        found.problems += not_target
        target = None if not_target else target
    _check_files(found, ck, profile, target, data_manifest, aux_capture, token_counts)
    found.problems += hashed  # last: the findings above say what changed
    return found


def _check_files(found: Findings, ck: Checkpoint, profile: EngineProfile, target: Target | None,
                 data_manifest: Mapping | None, aux_capture: bool,
                 token_counts: Mapping[int, int] | None) -> None:
    problems = found.problems
    arch = checks.check_architecture(ck, profile)
    problems += arch
    if arch and ck.config.get("speculators_model_type"):
        return  # not converted yet: every other finding would only follow from that
    problems += flag_checks.check_flag_types(ck.config, profile)
    skip = flag_checks.non_bool_names(ck.config, profile)  # judged as FLAG_TYPE only
    problems += flag_checks.check_flags(ck, profile, skip)
    problems += flag_checks.check_nested_flags(ck.config, profile, skip)
    problems += flag_checks.check_unknown_flags(ck.config, profile)
    numbers = [Problem("CONFIG_FIELD", m) for m in out_of_bounds(ck.config)]
    if numbers:  # every later check sizes loops and shapes from these numbers
        problems += numbers
        return
    bad_ids = draft_checks.aux_ids_invalid(cfg_get(ck.config, profile.aux_ids_key),
                                           profile.aux_ids_key, f"{ck.path}/config.json")
    if bad_ids is not None:  # the tensor and aux checks size fc from the ids' count
        problems.append(bad_ids)
    else:
        problems += checks.check_tensors(ck, profile)
    problems += checks.check_values(ck)
    problems += checks.check_embedding(ck, target)
    problems += checks.check_vocab_map(ck, profile)
    reach, reach_warnings, found.figures = draft_checks.check_vocab_reach(ck, token_counts)
    problems += reach
    found.warnings += reach_warnings
    if bad_ids is None:
        problems += checks.check_aux_ids(ck, profile, target, data_manifest)
    problems += draft_checks.check_rope_conflict(ck.config)
    problems += draft_checks.check_rope_scaling(ck.config)
    problems += draft_checks.check_sliding_window(ck.config)
    found.warnings += draft_checks.sliding_window_warnings(ck.config)
    if target is not None:
        problems += checks.check_target(ck, profile, target, aux_capture=aux_capture)
    if data_manifest is not None:
        problems += checks.check_data(ck, target, data_manifest)
        source = getattr(data_manifest, "path", None)  # set by coverage.read_data
        where = "data manifest" if source is None else f"--data {source}"
        found.warnings += checks.data_unchecked(ck, target, dict(data_manifest), where)


__all__ = ["Findings", "Problem", "validate_report"]
