"""Per-TTT-step accuracy, simulated acceptance length, and metric aggregation (also across ranks).

A draft *start* is a training position p; TTT step k predicts the verifier's token at p+k
(teacher-forced, as speculators' ``Eagle3DraftModel.forward``):

- valid_k(p): p+k is loss-masked and in p's document; correct_k(p): draft argmax at step k ==
  verifier argmax at p+k, both over the draft vocabulary.
- ``acc_full_k`` = #(correct_k & valid_k) / #valid_k; ``acc_cond_k``: the same among starts whose
  earlier steps were all right (``acc_cond_0 == acc_full_0``).
- simulated acceptance length = ``1 + c0 + c0*c1 + ...`` over the conditional accuracies. **The
  bonus token is counted**, as SGLang's ``spec_accept_length``: 1.0 = nothing accepted, maximum
  ``ttt_steps + 1``. Source: docs/ENGINE_FACTS.md §5.
- chain acceptance length = ``1 + mean over starts of the leading run of correct steps``.
- the same simulated figure over the starts among an answer's first :data:`FIRST_TOKENS` tokens
  (``simulated_acceptance_length_first<N>``): the span the development measurement decodes
  (``train.dev_max_new_tokens``' default). Averaged over every answer position, a long answer
  that loops (a small target's greedy answers do, :mod:`eagle3.extract.repetition`) weighs its
  easy loop tokens; its first tokens are what a benchmark of short answers meets.

speculators 0.9.0 counts accuracy with ``torch.masked_select`` (a data-dependent shape: recompiles
under ``torch.compile``, tests/unit/test_train_fixed_shapes.py). :func:`accuracy_single_step` gives
the same counts with masked sums; :func:`install` binds it where speculators looks it up.
"""

from __future__ import annotations

import math
import operator
from itertools import accumulate

import torch
import torch.nn.functional as F

# counts layout per TTT step: full_correct, full_total, cond_correct, cond_total, loss_sum, loss_n,
# first_cond_correct, first_cond_total (the conditional counts of starts among an answer's first
# FIRST_TOKENS tokens)
_PER_STEP = 8
_TAIL = 2  # chain_sum, chain_total
FIRST_TOKENS = 64  # an answer's first tokens: train.dev_max_new_tokens' default
FIRST_KEY = f"simulated_acceptance_length_first{FIRST_TOKENS}"  # the figure's metric name


def simulated_acceptance_length(cond_acc: list[float]) -> float:
    """``1 + Σ_k Π_{j<=k} cond_acc[j]``; counts the bonus token (1.0 = nothing accepted)."""
    return 1.0 + sum(accumulate((float(c) for c in cond_acc), operator.mul))


def new_counts(ttt_steps: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A zeroed float64 counts vector ``[ttt_steps * 8 + 2]`` (see the layout above)."""
    return torch.zeros(ttt_steps * _PER_STEP + _TAIL, dtype=torch.float64, device=device)


def first_tokens(valid_base: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """Bool ``[S]``: the loss positions among the first :data:`FIRST_TOKENS` of their answer. An
    answer is a run of loss positions (``valid_base``, bool ``[S]``) inside one document (``doc``,
    ``[S]`` ids). No data-dependent shape (traceable by torch.compile)."""
    idx = torch.arange(valid_base.shape[0], device=valid_base.device)
    same = F.pad(valid_base[:-1] & (doc[1:] == doc[:-1]), (1, 0))  # continues the previous run
    start = valid_base & ~same
    last = torch.cummax(torch.where(start, idx, torch.zeros_like(idx)), 0).values
    return valid_base & (idx - last < FIRST_TOKENS)


def step_stats(pred: torch.Tensor, tgt: torch.Tensor, valid_base: torch.Tensor,
               doc: torch.Tensor, k: int, alive: torch.Tensor, run: torch.Tensor,
               first: torch.Tensor):
    """TTT step k's ``(full_correct, full_total, cond_correct, cond_total, first_cond_correct,
    first_cond_total)`` as float32 ``[6]``, with ``alive`` (bool ``[S]``: starts right so far) and
    ``run`` (float32 ``[S]``: their leading run of correct steps) updated functionally.
    ``pred``/``tgt``: ``[S]`` draft and verifier argmax (draft vocabulary); ``valid_base``: ``[S]``
    bool loss mask; ``doc``: ``[S]`` document ids; ``first``: ``[S]`` bool, the starts among an
    answer's first tokens (:func:`first_tokens`). No data-dependent shape (traceable by
    torch.compile)."""
    S = pred.shape[0]
    if k >= S:
        hit = valid = torch.zeros_like(valid_base)
    else:
        valid = F.pad(valid_base[k:] & (doc[k:] == doc[:S - k]), (0, k))
        hit = F.pad(pred[:S - k] == tgt[k:], (0, k)) & valid
    counts = torch.stack([hit.sum(), valid.sum(), (hit & alive).sum(), (valid & alive).sum(),
                          (hit & alive & first).sum(), (valid & alive & first).sum()]).float()
    alive = alive & hit
    return counts, alive, run + (alive & valid_base).float()


@torch.no_grad()
def add_batch(counts: torch.Tensor, draft_tokens: list[torch.Tensor], target_ids: torch.Tensor,
              loss_mask: torch.Tensor, document_ids: torch.Tensor,
              step_losses: list[torch.Tensor]) -> None:
    """Add one packed micro-batch to ``counts`` in place, on the device (no host sync).
    draft_tokens: per TTT step ``[1, N]`` draft-vocab argmax; target_ids: ``[1, N]`` verifier argmax
    (draft vocabulary); loss_mask: ``[1, N]`` bool; document_ids: ``[1, N]`` int64; step_losses:
    per-step scalars (``loss_{k}_sum``)."""
    valid0 = loss_mask[0].bool()
    alive, run = torch.ones_like(valid0), torch.zeros(valid0.shape, device=valid0.device)
    first = first_tokens(valid0, document_ids[0])
    for k, pred in enumerate(draft_tokens):
        c, alive, run = step_stats(pred[0], target_ids[0], valid0, document_ids[0], k, alive, run,
                                   first)
        base = k * _PER_STEP
        counts[base:base + 4] += c[:4].to(counts.dtype)
        counts[base + 4] += step_losses[k].detach().to(counts.dtype)
        # only micro-batches with a loss position count towards the mean (all cut: NaN)
        counts[base + 5] += valid0.any().to(counts.dtype)
        counts[base + 6:base + 8] += c[4:].to(counts.dtype)
    K = len(draft_tokens) * _PER_STEP
    counts[K] += (run + valid0.float()).sum()
    counts[K + 1] += valid0.sum()


def all_reduce_(counts: torch.Tensor) -> torch.Tensor:
    """Sum ``counts`` over ranks when torch.distributed is initialised (in place; returned)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    return counts


def summarize(counts: torch.Tensor, prefix: str) -> dict[str, float]:
    """Metrics from a counts vector: ``{prefix}/loss`` (sum of step losses, mean over
    micro-batches), ``{prefix}/loss_k``, ``{prefix}/acc_full_k``, ``{prefix}/acc_cond_k``,
    ``{prefix}/simulated_acceptance_length``, ``{prefix}/simulated_acceptance_length_first<N>``
    (N = :data:`FIRST_TOKENS`), ``{prefix}/chain_acceptance_length``. Ratios with an empty
    denominator are 0.0 (and the acceptance lengths 1.0)."""
    c = counts.double().cpu().tolist()
    K = (len(c) - _TAIL) // _PER_STEP
    out: dict[str, float] = {}
    first = []
    for k in range(K):
        fc, ft, cc, ct, ls, ln, c1, t1 = c[k * _PER_STEP:(k + 1) * _PER_STEP]
        out.update({f"{prefix}/loss_{k}": ls / ln if ln else math.nan,
                    f"{prefix}/acc_full_{k}": fc / ft if ft else 0.0,
                    f"{prefix}/acc_cond_{k}": cc / ct if ct else 0.0})
        first.append(c1 / t1 if t1 else 0.0)
    out[f"{prefix}/loss"] = sum(out[f"{prefix}/loss_{k}"] for k in range(K))
    out[f"{prefix}/simulated_acceptance_length"] = simulated_acceptance_length(
        [out[f"{prefix}/acc_cond_{k}"] for k in range(K)])
    out[f"{prefix}/{FIRST_KEY}"] = simulated_acceptance_length(first)
    cs, cn = c[K * _PER_STEP], c[K * _PER_STEP + 1]
    out[f"{prefix}/chain_acceptance_length"] = cs / cn if cn else 1.0
    return out


def accuracy_single_step(pred_ids: torch.Tensor, target_ids: torch.Tensor,
                         loss_mask: torch.Tensor | None, prev_correct: torch.Tensor | None):
    """speculators' ``compute_accuracy_single_step`` without data-dependent shapes. pred_ids,
    target_ids: ``[1, S]`` int64 (draft vocabulary); loss_mask: ``[1, S]`` bool/int or None;
    prev_correct: ``[1, S]`` bool or None, updated in place to ``prev_correct & (pred_ids ==
    target_ids)``. Returns float32 ``(full_correct, full_total, cond_correct, cond_total)``."""
    correct = pred_ids == target_ids
    everywhere = torch.ones_like(correct)
    cond_total = (everywhere if prev_correct is None else prev_correct).sum().float()
    if prev_correct is not None:
        correct = torch.logical_and(prev_correct, correct)
        prev_correct.copy_(correct)
    mask = everywhere if loss_mask is None else loss_mask.to(torch.bool)
    correct_sum = torch.logical_and(correct, mask).float().sum()
    return correct_sum, mask.sum().float(), correct_sum.clone(), cond_total


def install() -> None:
    """Make speculators' ``compute_metrics`` use :func:`accuracy_single_step` (idempotent)."""
    import speculators.models.eagle3.metrics as eagle3_metrics

    eagle3_metrics.compute_accuracy_single_step = accuracy_single_step
