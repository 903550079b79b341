"""The development-set acceptance meter: the measured acceptance length of the draft being trained,
for choosing the best checkpoint and the training-length curve.

The simulated acceptance from teacher-forced accuracies (:mod:`eagle3.train.metrics`)
overestimates serving; this meter measures by the exact greedy chain replay
(:mod:`eagle3.measure.replay`): the target's continuations of the dev prompts are computed once,
then each checkpoint's draft, converted as the convert stage does (:func:`serving_draft`), is
replayed over them. The figure equals :func:`eagle3.measure.offline.offline_acceptance` on the
same prompts, draft and batch size (bonus token counted).

Dev prompts: the tokens before the first loss token of the validation split's samples
(:func:`split_prompts`), or a prompts file (:func:`file_prompt_ids`).
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
from eagle3.measure.offline import REPLAY_METHOD, replay_summaries
from eagle3.measure.replay import context_limit, prompt_requests

log = logging.getLogger(__name__)


def split_prompts(input_ids: Sequence[torch.Tensor], loss_masks: Sequence[torch.Tensor],
                  rows: Sequence[int], cap: int) -> tuple[list[list[int]], list[int]]:
    """``(prompts, their rows)``: the tokens before the first loss token of samples ``rows`` (in
    order, at most ``cap``; ``input_ids[r]`` int64 ``[T]``, ``loss_masks[r]`` ``[T]``, nonzero =
    loss); samples without a prompt are passed over."""
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
    """Measured acceptance of drafts on fixed dev prompts (templated ids) against one HF
    ``target``; ``num_steps``: ``train.ttt_steps``. Prompts past the target's context are left
    out (``dropped_too_long``); DataError when none is left. Continuations are generated once;
    conversion warnings are logged once per meter (:attr:`warned`: their codes).
    """

    def __init__(self, target, prompts: list[list[int]], *, num_steps: int, max_new_tokens: int,
                 batch_size: int = 16, pad_id: int | None = None):
        limit = context_limit(target)
        fits = [p for p in prompts if p and len(p) + max_new_tokens + num_steps <= limit]
        self.dropped_too_long = len(prompts) - len(fits)
        if not fits:
            raise DataError(f"dev acceptance: expected at least one prompt within the target's "
                            f"context {limit} (with max_new_tokens {max_new_tokens} and num_steps "
                            f"{num_steps}), got {len(prompts)} prompts, none fitting")
        self.target, self.num_steps, self.max_new_tokens = target, num_steps, max_new_tokens
        self.batch_size = batch_size
        self.warned: set[str] = set()  # conversion warning codes logged so far
        t0 = time.perf_counter()
        self.requests = prompt_requests(target, fits, [(f"dev-{i}", "dev", "dev")
                                                       for i in range(len(fits))],
                                        max_new_tokens, num_steps, batch_size=batch_size,
                                        pad_id=pad_id)
        self.continuation_s = time.perf_counter() - t0

    @torch.no_grad()
    def measure(self, draft) -> dict:
        """The summary (:func:`eagle3.measure.offline.replay_summaries`) of an
        ``SGLangEagle3Draft`` on the target's device replayed over the dev prompts."""
        return replay_summaries(self.target, {"d": draft}, self.requests, self.num_steps,
                                max_new_tokens=self.max_new_tokens, batch_size=self.batch_size,
                                settings={"num_steps": self.num_steps,
                                          "max_new_tokens": self.max_new_tokens,
                                          "num_prompts": len(self.requests),
                                          "convention": ACCEPTANCE_CONVENTION,
                                          "method": REPLAY_METHOD})["d"]

    def measure_training_draft(self, model, target_dir: str | Path, *,
                               state_dict: dict | None = None,
                               work_dir: str | Path | None = None) -> dict:
        """:meth:`measure` of a speculators ``Eagle3DraftModel`` being trained (``state_dict``:
        its full weights where the model holds shards), converted by :func:`serving_draft`."""
        p, t0 = next(self.target.parameters()), time.perf_counter()
        draft = serving_draft(model, target_dir, self.target, state_dict=state_dict,
                              work_dir=work_dir, dtype=p.dtype, device=str(p.device),
                              warned=self.warned)
        convert_s = time.perf_counter() - t0
        return {**self.measure(draft), "convert_s": convert_s}

    def metrics(self, result: dict, prefix: str = "dev") -> dict[str, float]:
        """Flat metrics of a :meth:`measure` result: ``<prefix>/acceptance_length``,
        ``/per_position_<k>`` (k 0-based), ``/num_prompts``, ``/seconds`` (the replay), for a
        training draft ``/convert_seconds``, and from replay ``/acceptance_length_all_positions``
        (every position a pass could start at: the average a simulated figure takes) and
        ``/out_of_draft_vocab_share`` (continuation tokens the draft cannot propose)."""
        out = {f"{prefix}/acceptance_length": float(result["acceptance_length"]),
               f"{prefix}/num_prompts": float(len(self.requests)),
               f"{prefix}/seconds": float(result["wall_s"])}
        if "convert_s" in result:
            out[f"{prefix}/convert_seconds"] = float(result["convert_s"])
        for key in ("acceptance_length_all_positions", "out_of_draft_vocab_share"):
            if result.get(key) is not None:
                out[f"{prefix}/{key}"] = float(result[key])
        out.update({f"{prefix}/per_position_{k}": float(v)
                    for k, v in enumerate(result["per_position"])})
        return out


def serving_draft(model, target_dir: str | Path, target, *, state_dict: dict | None = None,
                  work_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                  device: str = "cpu", warned: set[str] | None = None):
    """The engine-semantics draft of a speculators ``Eagle3DraftModel``, made as the pipeline does:
    :func:`eagle3.train.draft_model.save_draft`, :func:`eagle3.convert.stage.convert` (with the
    target, validated), ``SGLangEagle3Draft.from_dir`` sharing the target's embedding and head.
    Files live in a temporary folder under ``work_dir``, removed on return. ``warned`` None:
    conversion logs its warnings; a set of codes: only new codes are logged, then added. Raises
    what those raise (CheckpointInvalid for a draft conversion refuses)."""
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
    """The meter of a training run: ``t`` = ``cfg.train``, ``data``: the opened hidden states
    (``input_ids``, ``loss_mask``, ``val_ids``); the target in float32 on a CPU, else bfloat16.
    DataError when neither ``train.dev_prompts_file`` nor the validation split gives a prompt."""
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
