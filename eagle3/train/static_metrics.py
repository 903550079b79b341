"""Static-shape accuracy counts for speculators' training forward (issue 17: no recompiles per micro-batch).

speculators 0.9.0 counts the per-TTT-step accuracy in ``speculators.models.metrics.compute_accuracy_single_step``
with ``torch.masked_select(correct, loss_mask)``: its output length is the number of loss positions of the
micro-batch, a data-dependent shape. Under ``torch.compile`` that is a graph break, and the code after it is
compiled once per distinct loss-token count — a new graph for almost every micro-batch until dynamo's recompile
limit (8) is reached and that frame runs eagerly for the rest of the run (measured on the CPU with a counting
backend: tests/unit/test_train_fixed_shapes.py).

:func:`accuracy_single_step` gives the same four counts with masked sums (every shape fixed by the micro-batch's
padded length); :func:`install` binds it where speculators' Eagle-3 metrics look it up. speculators' module
definitions, losses and checkpoint format are untouched.
"""

from __future__ import annotations

import torch


def accuracy_single_step(pred_ids: torch.Tensor, target_ids: torch.Tensor, loss_mask: torch.Tensor | None,
                         prev_correct: torch.Tensor | None):
    """Full and conditional accuracy counts of one TTT step, as speculators' ``compute_accuracy_single_step``.

    Args:
        pred_ids, target_ids: ``[1, S]`` int64 draft / verifier argmax token ids (draft vocabulary).
        loss_mask: ``[1, S]`` bool/int or None: positions that count.
        prev_correct: ``[1, S]`` bool or None: positions whose earlier TTT steps were all correct; updated in place
            to ``prev_correct & (pred_ids == target_ids)`` (speculators' contract: the caller reads it next step).

    Returns:
        ``(full_correct, full_total, cond_correct, cond_total)``, float32 scalars on the inputs' device:
        correct chain positions among the loss positions, the number of loss positions (S without a mask), the
        same correct count again, and the number of positions correct before this step (S at step 0) — the
        values speculators' version returns, with no data-dependent shape.
    """
    correct = pred_ids == target_ids
    if prev_correct is not None:
        cond_total = prev_correct.sum().float()
        correct = torch.logical_and(prev_correct, correct)
        prev_correct.copy_(correct)
    else:
        cond_total = torch.tensor(correct.numel(), dtype=torch.float, device=correct.device)
    if loss_mask is not None:
        mask = loss_mask.to(torch.bool)
        correct_sum = torch.logical_and(correct, mask).float().sum()
        full_total = mask.sum().float()
    else:
        correct_sum = correct.float().sum()
        full_total = torch.tensor(correct.numel(), dtype=torch.float, device=correct.device)
    return correct_sum, full_total, correct_sum.clone(), cond_total


def install() -> None:
    """Make speculators' Eagle-3 ``compute_metrics`` use :func:`accuracy_single_step` (idempotent; process-wide)."""
    import speculators.models.eagle3.metrics as eagle3_metrics

    eagle3_metrics.compute_accuracy_single_step = accuracy_single_step
