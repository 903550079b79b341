"""Which samples an extraction writes: records read in a seeded random order, templated, the first
``data.num_conversations`` with a loss token kept (cut to ``data.max_seq_len``, counted as
truncated), split into train/val rows (train first), with their provenance (file and sha256). With
``data.regenerate`` the chosen assistant turns are replaced by the target's own answers
(:mod:`eagle3.extract.regen`) and templated again.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from eagle3.artifacts import sha256_file
from eagle3.errors import DataError

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """The samples an extraction will write, in row order (train rows first), and provenance."""

    ids: list[str]
    input_ids: list[list[int]]
    loss_masks: list[list[int]]
    num_train: int
    truncated: int
    records: int
    skipped: Counter = field(default_factory=Counter)
    source: dict = field(default_factory=dict)
    skip_examples: list[str] = field(default_factory=list)  # "<file>:<line>: <reason>"
    unstable: dict = field(default_factory=dict)  # :func:`unstable_summary` of the selection

    @property
    def num_tokens(self) -> int:
        return sum(len(x) for x in self.input_ids)


def data_source_path(cfg) -> tuple[str, Path]:
    """(kind, conversations file) of ``cfg.data``: the prepared ShareGPT or instruction-prompt
    JSONL (:mod:`eagle3.assets`), or ``data.path``."""
    if cfg.data.source == "sharegpt":
        from eagle3.assets import prepare_sharegpt

        return "sharegpt", prepare_sharegpt(cfg.paths.resolved_cache_dir())
    if cfg.data.source == "instructions":
        from eagle3.assets import prepare_instructions

        return "instructions", prepare_instructions(cfg.paths.resolved_cache_dir())
    return "file", Path(cfg.data.path).expanduser()


UNSTABLE = "template_not_prefix_stable"
NO_ANSWER = "no_answer_after_regeneration"


@dataclass
class Tally:
    """What a selection tried: conversations and tokens (rendered, before truncation) in all, and
    of those dropped because the template is not prefix-stable."""

    tried: int = 0
    tried_tokens: int = 0
    unstable: int = 0
    unstable_tokens: int = 0


def unstable_summary(tally: Tally, threshold: float) -> dict:
    """``{"conversations", "tokens", "share_conversations", "share_tokens", "tried",
    "tried_tokens", "threshold"}`` of ``tally``; shares are fractions (0..1) of those tried."""
    return {"conversations": tally.unstable, "tokens": tally.unstable_tokens,
            "share_conversations": tally.unstable / max(1, tally.tried),
            "share_tokens": tally.unstable_tokens / max(1, tally.tried_tokens),
            "tried": tally.tried, "tried_tokens": tally.tried_tokens, "threshold": threshold}


def check_unstable(summary: dict, path: Path) -> None:
    """DataError ``TEMPLATE_UNSTABLE`` when the share of conversations or tokens dropped as not
    prefix-stable exceeds ``data.max_unstable_template_share`` (``summary["threshold"]``)."""
    worst = max(summary["share_conversations"], summary["share_tokens"])
    if summary["conversations"] and worst > summary["threshold"]:
        raise DataError(
            f"TEMPLATE_UNSTABLE: {path}: {summary['conversations']} of {summary['tried']} "
            f"conversations ({summary['share_conversations']:.1%}) and {summary['tokens']} of "
            f"{summary['tried_tokens']} tokens ({summary['share_tokens']:.1%}) were dropped "
            "because the chat template renders an earlier assistant turn differently once later "
            "turns follow; expected at most data.max_unstable_template_share="
            f"{summary['threshold']} of either. Fix: a template with {{% generation %}} markers "
            "or one that renders history stably, or raise the setting to accept the loss")


def selected_conversations(cfg, tokenizer, tally: Tally | None = None
                           ) -> tuple[list, object, Counter, Path, str]:
    """The conversations an extraction of ``cfg`` would use, before any regeneration (module doc).
    Returns ``(chosen [(Conversation, TokenizedSample)], read stats, skipped-by-reason counter,
    source path, source kind)``; ``tally`` (optional) counts what was tried and dropped as not
    prefix-stable."""
    from eagle3.extract.conversations import read_conversations

    kind, path = data_source_path(cfg)
    convs, stats = read_conversations(path)
    order = list(range(len(convs)))
    random.Random(cfg.data.seed).shuffle(order)
    skipped = Counter(stats.skipped)
    chosen = _select(cfg, tokenizer, (convs[j] for j in order), skipped, tally)
    return chosen, stats, skipped, path, kind


def _warn_blank_answers(convs: list, path: Path) -> None:
    """Warn (``BLANK_ANSWERS``) about selected conversations with a blank assistant turn: trained
    as they are, such a turn teaches only an end-of-turn there. Kept, so the selection (and every
    run's data) stays what it was; regeneration would leave them out."""
    from eagle3.extract.conversations import answered

    kept, blank = answered(convs)
    if blank:
        left = {id(c) for c in kept}
        ids = [c.id for c in convs if id(c) not in left][:3]
        log.warning("BLANK_ANSWERS: %s: %d of the %d selected conversations have a blank "
                    "assistant turn (e.g. %s), trained on as an end-of-turn only; clean the file "
                    "or regenerate (data.regenerate) to leave them out", path, blank, len(convs),
                    ids)


def build_plan(cfg, tokenizer, regen=None) -> Plan:
    """Read, order (seeded), template and select the samples; split train/val. ``regen(convs) ->
    convs`` (optional) rewrites the chosen assistant turns before they are templated again; the
    conversations it leaves out count as skipped :data:`NO_ANSWER`.
    DataError when the file is unreadable, no record gives a usable sample, or
    ``TEMPLATE_UNSTABLE`` (:func:`check_unstable`); ``Plan.unstable`` records the drop always."""
    tally = Tally()
    chosen, stats, skipped, path, kind = selected_conversations(cfg, tokenizer, tally)
    if regen is not None:
        convs = regen([c for c, _ in chosen])
        if len(convs) < len(chosen):  # prompts left without an answer (conversations.answered)
            skipped[NO_ANSWER] += len(chosen) - len(convs)
        chosen = _select(cfg, tokenizer, convs, skipped, tally)
    else:
        _warn_blank_answers([c for c, _ in chosen], path)
    unstable = unstable_summary(tally, cfg.data.max_unstable_template_share)
    check_unstable(unstable, path)
    if not chosen:
        raise DataError(f"{path}: no usable sample among {stats.records} records (skipped: "
                        f"{dict(skipped)})")
    samples, vf = [s for _, s in chosen], cfg.data.val_fraction
    n = len(samples)
    n_val = 0 if vf == 0 or n < 2 else min(n - 1, max(1, round(n * vf)))
    return Plan([s.id for s in samples], [s.input_ids for s in samples],
                [s.loss_mask for s in samples], n - n_val, sum(s.truncated for s in samples),
                stats.records, skipped,
                {"kind": kind, "path": str(path.resolve()), "sha256": sha256_file(path)},
                list(stats.examples), unstable)


def _select(cfg, tokenizer, convs, skipped: Counter, tally: Tally | None = None) -> list:
    """The first ``data.num_conversations`` conversations that template to >= 1 loss token, with
    their samples; one not rendered prefix-stably is skipped under :data:`UNSTABLE` and counted in
    ``tally`` with its rendered tokens."""
    from eagle3.extract.conversations import (TemplateUnstable, rendered_tokens,
                                              tokenize_conversation)

    chosen, tally = [], tally if tally is not None else Tally()
    for conv in convs:
        if len(chosen) >= cfg.data.num_conversations:
            break
        tally.tried += 1
        try:
            s = tokenize_conversation(tokenizer, conv, cfg.data.max_seq_len,
                                      cfg.data.chat_template_kwargs)
        except TemplateUnstable:
            n = rendered_tokens(tokenizer, conv, cfg.data.chat_template_kwargs)
            skipped[UNSTABLE] += 1
            tally.unstable += 1
            tally.unstable_tokens += n
            tally.tried_tokens += n
            continue
        except DataError as e:
            skipped[f"template_error: {str(e)[:80]}"] += 1
            continue
        tally.tried_tokens += s.num_tokens
        if not any(s.loss_mask):
            skipped["no_loss_tokens_after_truncation" if s.truncated else "no_loss_tokens"] += 1
            continue
        chosen.append((conv, s))
    return chosen
