"""The optimisation loop around speculators' ``Eagle3DraftModel``: micro-batches, gradient
accumulation, DDP, bf16 autocast, logging, evaluation, checkpoints and the NaN/Inf stop.

One optimizer step consumes ``grad_accum * world_size`` packed micro-batches of the epoch plan
(:func:`eagle3.train.data.plan_epoch`); rank r takes every world_size-th one. The loss of each
micro-batch is speculators' (KL to the verifier's distribution over the draft vocabulary, summed
over TTT steps, mean over loss-masked positions), divided by the number of micro-batches the rank
accumulates.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from eagle3.errors import TrainingDiverged
from eagle3.train.data import HiddenStatesData, iterate_micro_batches, pack, plan_epoch, to_device
from eagle3.train.metrics import FIRST_KEY, add_batch, all_reduce_, new_counts, summarize
from eagle3.train.parallel import Whole
from eagle3.train.state import list_checkpoints, save_best, save_checkpoint
from eagle3.train.ttt_forward import uses_project_forward


@dataclass
class Run:
    """Everything the loop mutates; ``model`` is the bare draft, ``module`` what is called (DDP)."""

    cfg: object
    data: HiddenStatesData
    model: torch.nn.Module
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    device: torch.device
    out_dir: Path
    rank: int = 0
    world: int = 1
    total_steps: int = 0
    step: int = 0
    epoch: int = 0
    micro: int = 0
    tokens_seen: int = 0
    best: dict | None = None
    last_eval: dict | None = None
    last_train: dict | None = None
    info_extra: dict = field(default_factory=dict)
    on_metrics: Callable | None = None
    plan: list = field(default_factory=list)
    dropped_microbatches: int = 0
    bar: object = None
    loss_config: dict | None = None
    stream: object = None  # this rank's (ids, host batch) iterator over the rest of the plan
    stream_epoch: int = -1  # the epoch the stream was made for
    parallel: Whole = field(default_factory=Whole)  # ddp / fsdp: eagle3.train.parallel
    heartbeat: Callable | None = None  # called with the step after each optimizer step
    dev: object = None  # rank 0, select_best_by=measured: dev_acceptance.DevAcceptance
    warnings: list = field(default_factory=list)  # "CODE: message", recorded in the manifest

    @property
    def pad_to(self) -> int | None:
        """Positions every micro-batch is padded to: ``train.max_tokens_per_batch`` when
        ``train.pad_to_max_tokens`` (None = on exactly when ``train.compile``), else None."""
        pad = self.t.pad_to_max_tokens if self.t.pad_to_max_tokens is not None else self.t.compile
        return self.data.max_tokens if pad else None

    def rank_batches(self) -> list[list[int]]:
        """This rank's micro-batches from ``micro`` to the end of the plan: of each group of
        ``grad_accum * world``, every ``world``-th one from ``rank``."""
        G = self.t.grad_accum * self.world
        return [ids for g in range(self.micro, len(self.plan), G)
                for ids in self.plan[g:g + G][self.rank::self.world]]

    def next_batch(self) -> tuple[list[int], dict]:
        """The next micro-batch of this rank (read ahead by ``train.loader_workers``)."""
        if self.stream_epoch != self.epoch:
            self.stream = iter(iterate_micro_batches(self.data, self.rank_batches(), self.device,
                                                     self.t.loader_workers, self.pad_to))
            self.stream_epoch = self.epoch
        return next(self.stream)

    @property
    def t(self):
        return self.cfg.train

    @property
    def states_dtype(self) -> torch.dtype | None:
        """The hidden states' dtype on the device: None (as stored) under bf16 autocast with this
        project's forward, which casts where speculators' computes in float32; else float32."""
        keep = self.t.precision == "bf16-autocast" and uses_project_forward(self.model)
        return None if keep else torch.float32

    @property
    def state_dir(self) -> Path:
        return self.out_dir / "state"

    def _plan(self, epoch: int) -> tuple[list, int]:
        """Epoch ``epoch``'s plan trimmed to a multiple of world_size, and how many were cut."""
        plan = plan_epoch(self.data, self.t.seed, epoch)
        keep = len(plan) - len(plan) % self.world
        return plan[:keep], len(plan) - keep

    def set_plan(self) -> None:
        """Build the current epoch's plan (the micro-batches trimmed away are counted)."""
        self.plan, self.dropped_microbatches = self._plan(self.epoch)

    def steps_per_epoch(self) -> int:
        """Optimizer steps of epoch 0's plan: the unit of ``train.epochs`` (fixed, so a fresh and
        a resumed run share the schedule horizon)."""
        return math.ceil(len(self._plan(0)[0]) / (self.t.grad_accum * self.world))

    def emit(self, kind: str, metrics: dict[str, float]) -> None:
        """Rank 0: append to ``metrics.jsonl`` and call ``on_metrics(metrics, step)``."""
        if self.rank != 0:
            return
        with open(self.out_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": self.step, "kind": kind, **metrics}) + "\n")
        if self.on_metrics is not None:
            self.on_metrics(dict(metrics), self.step)


def autocast(run: Run):
    if run.t.precision == "bf16-autocast":
        return torch.autocast(device_type=run.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def forward(run: Run, batch: dict, counts: torch.Tensor, *, train: bool = True) -> torch.Tensor:
    """One micro-batch through the draft; adds its accuracy counts; returns the (scalar) loss.
    ``train=False`` calls the bare model, not DDP (ranks may hold different numbers of validation
    micro-batches, and DDP's forward synchronises buffers)."""
    m = run.model
    if run.t.compile and run.t.compile_mode == "reduce-overhead" and run.device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()  # the previous call's outputs are consumed
    keys = ("hidden_states", "input_ids", "document_ids", "loss_mask", "position_ids",
            "verifier_last_hidden_states")
    with autocast(run):
        out = (run.module if train else m)(**{k: batch[k] for k in keys},
                                           ttt_steps=run.t.ttt_steps, loss_config=run.loss_config)
    if uses_project_forward(m):  # eagle3.train.ttt_forward: the counts come out of the same graph
        loss, stats = out
        counts.add_(stats.detach().to(counts.dtype))
        return loss
    draft_tokens, loss, met = out
    with autocast(run), torch.no_grad():  # verifier argmax in the draft vocabulary, [1, N]
        target_ids = m.verifier_lm_head(
            m.verifier_norm(batch["verifier_last_hidden_states"])).argmax(-1)
    add_batch(counts, draft_tokens, target_ids, batch["loss_mask"], batch["document_ids"],
              [met[f"loss_{k}_sum"].detach() for k in range(run.t.ttt_steps)])
    return loss


def _finite_flags(run: Run, values: list[torch.Tensor]) -> tuple[list[bool], float]:
    """Whether each of ``values`` is finite on every rank, and this rank's last value: one sync."""
    ok = torch.stack([torch.isfinite(v.detach().float()).all() for v in values]).float()
    if run.world > 1:
        torch.distributed.all_reduce(ok, op=torch.distributed.ReduceOp.MIN)
    host = torch.cat([ok, values[-1].detach().float().reshape(1)]).tolist()
    return [x > 0 for x in host[:-1]], host[-1]


def _diverged(run: Run, what: str, value: float, ids: list[int]) -> TrainingDiverged:
    last = next((f"{c} (kept)" for c in list_checkpoints(run.state_dir)[-1:]), "none written yet")
    return TrainingDiverged(f"non-finite {what} ({value}) at optimizer step {run.step + 1} (epoch "
                            f"{run.epoch}, micro-batch {run.micro}, samples {ids[:8]}); last good "
                            f"checkpoint: {last}")


def optimizer_step(run: Run, window: torch.Tensor) -> tuple[float, int]:
    """Accumulate this rank's micro-batches of the next group and take one optimizer step.
    Returns ``(grad_norm, tokens in the group over all ranks)``. TrainingDiverged on a NaN/Inf
    loss or gradient norm, before the optimizer step (weights stay at the last good step)."""
    G = run.t.grad_accum * run.world
    group = run.plan[run.micro:run.micro + G]
    share = group[run.rank::run.world]
    params = [p for p in run.model.parameters() if p.requires_grad]
    losses: list[tuple[list[int], torch.Tensor]] = []
    for j in range(len(share)):
        ids, host = run.next_batch()
        batch = to_device(host, run.device, run.states_dtype)
        sync = j == len(share) - 1 or run.world == 1
        with contextlib.nullcontext() if sync else run.module.no_sync():
            loss = forward(run, batch, window)
            (loss / len(share)).backward()
        losses.append((ids, loss.detach().clone()))  # a CUDA-graph replay reuses the memory
    grad_norm = run.parallel.clip_grad_norm_(params, run.t.grad_clip)
    # before the step (weights stay good); the only device→host sync of the step
    flags, norm = _finite_flags(run, [loss for _, loss in losses] + [grad_norm])
    for (ids, loss), ok in zip(losses, flags):
        if not ok:
            raise _diverged(run, "loss", float(loss), ids)
    if not flags[-1]:
        raise _diverged(run, "gradient norm", norm, share[0])
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    tokens = sum(run.data.positions(i) for ids in group for i in ids)
    run.step += 1
    run.micro += len(group)
    run.tokens_seen += tokens
    return norm, tokens


# the metric that picks the best checkpoint, by train.select_best_by
SELECT_KEYS = {"simulated": "val/simulated_acceptance_length",
               "measured": "dev/acceptance_length"}


@torch.no_grad()
def evaluate(run: Run) -> dict[str, float]:
    """Validation metrics over the val split (the train split, flagged, when val is empty), plus
    :func:`dev_metrics`. Saves ``state/best`` when the :data:`SELECT_KEYS` metric beats the best so
    far (a measured tie: when the simulated figure does); ``run.best``: ``step``,
    ``simulated_acceptance_length``, ``simulated_first`` (over answers' first tokens,
    ``metrics.FIRST_KEY``), ``selected_by``, ``score`` and, when measured,
    ``measured_acceptance_length`` and ``measured_all_positions``."""
    ids = (run.data.val_ids or run.data.train_ids)[:run.t.max_eval_samples or None]
    plan = pack(ids, [run.data.positions(i) for i in ids], run.data.max_tokens)
    counts = new_counts(run.t.ttt_steps, run.device)
    run.model.eval()
    try:  # ranks may hold different numbers of micro-batches
        with run.parallel.evaluating(run.model):
            for _, host in iterate_micro_batches(run.data, plan[run.rank::run.world], run.device,
                                                 run.t.loader_workers, run.pad_to):
                forward(run, to_device(host, run.device, run.states_dtype), counts, train=False)
    finally:
        run.model.train()
    out = {**summarize(all_reduce_(counts), "val"),
           "val/on_train_split": 0.0 if run.data.val_ids else 1.0}
    if run.last_train is not None:
        out["train_val_gap"] = run.last_train["train/loss"] - out["val/loss"]
    out.update(dev_metrics(run))
    run.last_eval = out
    sim = out["val/simulated_acceptance_length"]
    key = SELECT_KEYS[run.t.select_best_by]
    # a best chosen by the other figure (a resume with another select_best_by) is not comparable
    prev = run.best if run.best and run.best.get("selected_by", SELECT_KEYS["simulated"]) == key \
        else None
    score = None if prev is None else prev.get("score", prev["simulated_acceptance_length"])
    # a measured tie (a few development prompts often give equal figures) goes to the higher
    # simulated figure, the finer one
    if prev is None or out[key] > score or (key != SELECT_KEYS["simulated"] and out[key] == score
                                            and sim > prev["simulated_acceptance_length"]):
        run.best = {"step": run.step, "simulated_acceptance_length": sim, "selected_by": key,
                    "score": out[key], "simulated_first": out[f"val/{FIRST_KEY}"]}
        if run.t.select_best_by == "measured":
            run.best["measured_acceptance_length"] = out[key]
            every = out.get("dev/acceptance_length_all_positions")
            if every is not None:  # the same measurement over every position (simulated's mean)
                run.best["measured_all_positions"] = every
        with run.parallel.gathered(run.model) as (weights, _):  # every rank (fsdp: a collective)
            if run.rank == 0:
                save_best(run.state_dir, model=run.model, info={**run.best, "metrics": out},
                          model_state=weights)
    out["best/simulated_acceptance_length"] = run.best["simulated_acceptance_length"]
    if "measured_acceptance_length" in run.best:
        out["best/dev_acceptance_length"] = run.best["measured_acceptance_length"]
    out["best/step"] = float(run.best["step"])
    run.emit("eval", out)
    return out


def dev_metrics(run: Run) -> dict[str, float]:
    """With ``train.select_best_by=measured``: the current weights' acceptance on the dev prompts
    (:mod:`eagle3.measure.dev_acceptance`; ``dev/acceptance_length``, ...), computed on rank 0 and
    broadcast (every rank takes part: fsdp gathers); else ``{}``."""
    if run.t.select_best_by != "measured":
        return {}
    out: list = [None]
    with run.parallel.gathered(run.model) as (weights, _):
        if run.rank == 0:
            res = run.dev.measure_training_draft(run.model, run.info_extra["target_dir"],
                                                 state_dict=weights, work_dir=run.state_dir)
            out[0] = run.dev.metrics(res)
    if run.world > 1:
        torch.distributed.broadcast_object_list(out, src=0)
    return out[0]


def checkpoint(run: Run) -> None:
    """Rank 0 writes ``state/ckpt-<step>``; all ranks wait (and under fsdp gather the state)."""
    with run.parallel.gathered(run.model, run.optimizer) as (weights, moments):
        if run.rank == 0:
            info = {"step": run.step, "epoch": run.epoch, "micro": run.micro,
                    "tokens_seen": run.tokens_seen, "best": run.best, "last_eval": run.last_eval,
                    "last_train": run.last_train, **run.data.checkpoint_info(),
                    **run.info_extra}
            save_checkpoint(run.state_dir, model=run.model, optimizer=run.optimizer,
                            scheduler=run.scheduler, info=info, keep_last=run.t.keep_last,
                            model_state=weights, optimizer_state=moments)
    if run.world > 1:
        torch.distributed.barrier()


def run_loop(run: Run) -> None:
    """Train until ``run.total_steps``; evaluate, log and checkpoint on the configured cadence."""
    t = run.t
    if run.step >= run.total_steps:
        if run.last_eval is None:  # the untrained draft (max_steps=0): the pipeline's baseline
            evaluate(run)
        return
    unique = max(1, run.data.unique_train_tokens())
    window, win_tokens, win_time = new_counts(t.ttt_steps, run.device), 0, 0.0
    while run.step < run.total_steps:
        if run.micro >= len(run.plan):
            run.epoch, run.micro = run.epoch + 1, 0
            run.set_plan()
        lr = run.scheduler.get_last_lr()[0]
        t0 = time.perf_counter()
        grad_norm, tokens = optimizer_step(run, window)  # one sync, before the optimizer update
        if run.heartbeat is not None:
            run.heartbeat(run.step)
        win_time += time.perf_counter() - t0
        win_tokens += tokens
        epoch_end, last = run.micro >= len(run.plan), run.step == run.total_steps
        if run.bar is not None:
            run.bar.update(1)
        if run.step % t.log_every == 0 or last:
            m = {**summarize(all_reduce_(window), "train"), "lr": lr, "grad_norm": grad_norm,
                 "tokens_per_s": win_tokens / max(win_time, 1e-9),
                 "epochs_over_data": run.tokens_seen / unique,
                 "epoch": run.epoch + min(1.0, run.micro / max(1, len(run.plan))),
                 **run.data.take_window()}
            run.last_train = m
            run.emit("train", m)
            if run.bar is not None:
                run.bar.set_postfix(loss=f"{m['train/loss']:.3f}",
                                    acc0=f"{m['train/acc_full_0']:.3f}")
            window, win_tokens, win_time = new_counts(t.ttt_steps, run.device), 0, 0.0
        do_eval = last or (run.step % t.eval_every == 0 if t.eval_every else epoch_end)
        if do_eval:
            evaluate(run)
        if do_eval or (t.checkpoint_every and run.step % t.checkpoint_every == 0):
            checkpoint(run)
