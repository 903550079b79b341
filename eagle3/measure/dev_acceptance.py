"""The development-set acceptance meter: the measured acceptance length of the draft being trained,
for choosing the best checkpoint and drawing the training-length curve during training.

The simulated acceptance of the validation split (``1 + c0 + c0*c1 + ...`` from teacher-forced
accuracies, :mod:`eagle3.train.metrics`) overestimates what serving gives. This meter measures
instead, by the exact greedy chain replay of the offline figure (:mod:`eagle3.measure.replay`,
temperature 0, topk 1): the target's greedy continuations of the dev prompts are computed once
(they do not depend on the draft), then each checkpoint's draft, converted as the convert stage
converts it (:func:`serving_draft`), is replayed over them. Acceptance length counts the bonus token
(``eagle3.measure.acceptance.exact_acceptance_length``); the figure equals
:func:`eagle3.measure.offline.offline_acceptance` on the same prompts, draft and batch size.

Dev prompts: the prompt part (every token before the first loss token: system prompt, first user
turn, generation prompt, as the chat template rendered them) of the validation split's samples
(:func:`split_prompts`), or a prompts file (:func:`file_prompt_ids`). Benchmark prompt sets
(MT-Bench, GSM8K) stay report-only.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch

from eagle3.errors import DataError
from eagle3.measure.acceptance import ACCEPTANCE_CONVENTION
from eagle3.measure.offline import offline_row, offline_summary
from eagle3.measure.replay import (Request, check_lengths, greedy_continuations,
                                   replay_requests)

log = logging.getLogger(__name__)


def split_prompts(input_ids: Sequence[torch.Tensor], loss_masks: Sequence[torch.Tensor],
                  rows: Sequence[int], cap: int) -> tuple[list[list[int]], list[int]]:
    """The prompt of each sample ``rows[i]`` (in order, at most ``cap``): its tokens before the
    first loss token (``input_ids[r]`` int64 ``[T]``, ``loss_masks[r]`` ``[T]``, nonzero = loss).
    Samples whose first token is already in the loss (plain text: no prompt) are passed over.
    Returns ``(prompts as id lists, their row numbers)``."""
    prompts, kept = [], []
    for r in rows:
        if len(prompts) >= cap:
            break
        nz = torch.nonzero(torch.as_tensor(loss_masks[r])).flatten()
        first = int(nz[0]) if nz.numel() else 0
        if first > 0:
            prompts.append([int(t) for t in torch.as_tensor(input_ids[r])[:first]])
            kept.append(int(r))
    return prompts, kept


def file_prompt_ids(path: str | Path, tokenizer, cap: int) -> list[list[int]]:
    """The first ``cap`` prompts of a prompts file (``eagle3.measure.prompts.file_prompts``'
    formats), each as one user turn with the chat template and generation prompt."""
    from eagle3.measure.prompts import encode_prompts, file_prompts

    return encode_prompts(file_prompts(str(path))[:cap], tokenizer)


class DevAcceptance:
    """Measured acceptance of drafts on fixed dev prompts against one target.

    ``target``: the HF target (eval mode, any device); ``prompts``: templated prompt ids;
    ``num_steps``: chain draft steps (``train.ttt_steps``); ``max_new_tokens``: greedy tokens per
    prompt. Prompts that would exceed the target's context (prompt + ``max_new_tokens`` +
    ``num_steps``) are left out and counted (``dropped_too_long``). The continuations are
    generated here, once. Raises DataError when no prompt is left. The conversion warnings of
    :meth:`measure_training_draft` are logged once per meter (:attr:`warned`: their codes), not
    at every evaluation.
    """

    def __init__(self, target, prompts: list[list[int]], *, num_steps: int, max_new_tokens: int,
                 batch_size: int = 16, pad_id: int | None = None):
        limit = int(getattr(target.config, "max_position_embeddings", 1 << 30))
        fits = [p for p in prompts if p and len(p) + max_new_tokens + num_steps <= limit]
        self.dropped_too_long = len(prompts) - len(fits)
        if not fits:
            raise DataError(f"dev acceptance: expected at least one prompt within the target's "
                            f"context {limit} (with max_new_tokens {max_new_tokens} and num_steps "
                            f"{num_steps}), got {len(prompts)} prompts, none fitting")
        check_lengths(target, fits, max_new_tokens, num_steps)
        self.target, self.num_steps, self.max_new_tokens = target, num_steps, max_new_tokens
        self.batch_size = batch_size
        self.warned: set[str] = set()  # conversion warning codes logged so far
        t0 = time.perf_counter()
        conts = greedy_continuations(target, fits, max_new_tokens, batch_size=batch_size,
                                     pad_id=pad_id)
        self.continuation_s = time.perf_counter() - t0
        self.requests = [Request(f"dev-{i}", "dev", "dev", 1, f"dev-{i}", p, c)
                         for i, (p, c) in enumerate(zip(fits, conts))]

    @torch.no_grad()
    def measure(self, draft) -> dict:
        """Acceptance of ``draft`` (an :class:`~eagle3.engines.sglang.draft.SGLangEagle3Draft` on
        the target's device): :func:`eagle3.measure.offline.offline_summary`'s keys
        (``acceptance_length``, ``per_position[k]`` = passes accepting draft k+1 / passes, ...).
        """
        t0 = time.perf_counter()
        results = replay_requests(self.target, {"d": draft}, self.requests, self.num_steps,
                                  batch_size=self.batch_size,
                                  max_new_tokens=self.max_new_tokens)[0]["d"]
        rows = [offline_row({"id": r.id, "category": r.category}, res)
                for r, res in zip(self.requests, results)]
        return offline_summary(rows, time.perf_counter() - t0, {
            "num_steps": self.num_steps, "max_new_tokens": self.max_new_tokens,
            "num_prompts": len(self.requests), "convention": ACCEPTANCE_CONVENTION,
            "method": "replay (eagle3.measure.replay)"})

    def measure_training_draft(self, model, target_dir: str | Path, *,
                               state_dict: dict | None = None,
                               work_dir: str | Path | None = None) -> dict:
        """:meth:`measure` of a speculators ``Eagle3DraftModel`` being trained (``state_dict``:
        its full weights where the model holds shards), converted by :func:`serving_draft`; a
        conversion warning whose code this meter logged before is not logged again."""
        p, t0 = next(self.target.parameters()), time.perf_counter()
        draft = serving_draft(model, target_dir, self.target, state_dict=state_dict,
                              work_dir=work_dir, dtype=p.dtype, device=str(p.device),
                              warned=self.warned)
        convert_s = time.perf_counter() - t0
        return {**self.measure(draft), "convert_s": convert_s}

    def metrics(self, result: dict, prefix: str = "dev") -> dict[str, float]:
        """Flat metrics of a :meth:`measure` result: ``<prefix>/acceptance_length``,
        ``<prefix>/per_position_<k>`` (k 0-based), ``<prefix>/num_prompts``, ``<prefix>/seconds``
        (the replay) and, for a training draft, ``<prefix>/convert_seconds``.
        """
        out = {f"{prefix}/acceptance_length": float(result["acceptance_length"]),
               f"{prefix}/num_prompts": float(len(self.requests)),
               f"{prefix}/seconds": float(result["wall_s"])}
        if "convert_s" in result:
            out[f"{prefix}/convert_seconds"] = float(result["convert_s"])
        out.update({f"{prefix}/per_position_{k}": float(v)
                    for k, v in enumerate(result["per_position"])})
        return out


def serving_draft(model, target_dir: str | Path, target, *, state_dict: dict | None = None,
                  work_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                  device: str = "cpu", warned: set[str] | None = None):
    """The engine-semantics draft of a speculators ``Eagle3DraftModel``, made as the pipeline makes
    it: :func:`eagle3.train.draft_model.save_draft`, then the convert stage's
    :func:`eagle3.convert.stage.convert` (with the target, validation included), then
    ``SGLangEagle3Draft.from_dir`` sharing the target's embedding and head as SGLang does. The
    files live in a temporary folder under ``work_dir`` (None: the system's), removed on return:
    the conversion reads and writes folders only. ``warned`` None: the conversion logs its
    warnings (``CODE: message``) as the convert stage does; a set of codes: only warnings whose
    code is not in it are logged, and their codes are added (the draft's vocabulary map and config
    stay the same through a training run, so a repeat says nothing new). Raises what those raise
    (CheckpointInvalid for a draft the convert stage would refuse)."""
    from eagle3.convert.stage import convert
    from eagle3.engines.sglang.draft import SGLangEagle3Draft
    from eagle3.train.draft_model import save_draft

    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".dev-acceptance.", dir=work_dir) as tmp:
        src, dst = Path(tmp) / "speculators", Path(tmp) / "serving"
        save_draft(model, src, state_dict=state_dict)
        manifest = convert(src, dst, engine="sglang", target_dir=Path(target_dir),
                           aux_capture=False, log_warnings=warned is None)
        for w in manifest["validation"]["warnings"] if warned is not None else ():
            code = w.split(":", 1)[0]
            if code not in warned:
                warned.add(code)
                log.warning("dev acceptance: converting the training draft: %s (logged once "
                            "per run)", w)
        return SGLangEagle3Draft.from_dir(
            dst, dtype=dtype, device=device,
            target_embed=target.get_input_embeddings().weight.detach(),
            target_head=target.get_output_embeddings().weight.detach())


def meter_for_training(t, data, target_dir: str | Path, device: torch.device) -> DevAcceptance:
    """The meter of a training run: ``t`` = ``cfg.train`` (``dev_prompts``, ``dev_max_new_tokens``,
    ``dev_prompts_file``, ``ttt_steps``), ``data``: the opened hidden states (``input_ids``,
    ``loss_mask``, ``val_ids``). The target is loaded on ``device`` in float32 on a CPU, bfloat16
    elsewhere. Raises DataError when neither ``train.dev_prompts_file`` nor the validation split
    gives a prompt."""
    from eagle3.target_model import load_target

    dtype = "float32" if device.type == "cpu" else "bfloat16"
    target, tok = load_target(target_dir, dtype=dtype, device=str(device))
    if t.dev_prompts_file:
        prompts, where = file_prompt_ids(t.dev_prompts_file, tok, t.dev_prompts), \
            f"train.dev_prompts_file {t.dev_prompts_file}"
    else:
        prompts, _ = split_prompts(data.input_ids, data.loss_mask, data.val_ids, t.dev_prompts)
        where = f"the validation split ({len(data.val_ids)} samples)"
    if not prompts:
        raise DataError(f"train.select_best_by=measured: expected dev prompts from {where}, got "
                        "none (a validation split of chat samples needs data.val_fraction > 0; "
                        "else set train.dev_prompts_file)")
    meter = DevAcceptance(target, prompts, num_steps=t.ttt_steps,
                          max_new_tokens=t.dev_max_new_tokens, pad_id=tok.pad_token_id)
    log.info("dev acceptance: %d prompts from %s (%d too long left out), %d greedy tokens each, "
             "continuations in %.1f s", len(meter.requests), where, meter.dropped_too_long,
             t.dev_max_new_tokens, meter.continuation_s)
    return meter
