"""Stage 2, train: a speculators EAGLE-3 draft from a hidden-states directory (docs/INTERNALS.md).

``train(cfg, data_dir, out_dir)`` checks what it can before the first step, runs
:mod:`eagle3.train.loop` and writes ``config.json`` + ``model.safetensors`` (speculators format,
d2t/t2d, top-level ``eagle_aux_hidden_state_layer_ids`` as HF indices), ``metrics.jsonl``,
``state/`` and ``manifest.json`` (kind ``draft_checkpoint``). ``train.max_steps = 0`` writes the
untrained draft (the baseline). ``train.num_gpus > 1`` outside torchrun: :mod:`eagle3.train.launch`.
``extract.mode: online`` / ``cached`` folders: the target computes the states here
(:mod:`eagle3.train.online`).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from eagle3.artifacts import sha256_file, write_manifest
from eagle3.errors import ConfigError
from eagle3.train import ttt_forward
from eagle3.train.data import data_identity, open_hidden_states
from eagle3.train.draft_model import (build_draft, compile_forward, read_target_config,
                                      resolve_flags, save_draft, use_uncompiled_forward)
from eagle3.train.loop import Run, evaluate, run_loop
from eagle3.train.metrics import FIRST_KEY
from eagle3.train.online import check_data_mode, is_online, open_online, window_to_come
from eagle3.train.parallel import make_parallel
from eagle3.train.state import (check_checkpoint_space, check_complete, ensure_writable,
                                list_checkpoints, load_checkpoint, load_init_from, load_weights,
                                lr_factor, make_scheduler, read_info, resume_conflict,
                                truncate_metrics)
from eagle3.train.vocab import build_vocab_map, load_token_freq

OnMetrics = Callable[[dict, int], None]
log = logging.getLogger(__name__)


def train(cfg, data_dir: Path, out_dir: Path, *, on_metrics: OnMetrics | None = None,
          progress: bool = True) -> dict:
    """Train (or resume) the draft; returns the ``draft_checkpoint`` manifest (``{}`` on ranks other
    than 0). ``on_metrics(metrics, step)``: per log step and evaluation (rank 0).

    Raises ConfigError (unwritable ``out_dir``, engine flag, incompatible resume,
    ``EXTRACT_MODE_MISMATCH``: data extracted under another ``extract.mode``;
    ``EXTRACT_CACHE_MISMATCH``: a ``cached`` folder of another ``extract.cache_max_gb``), DataError
    (empty or foreign dataset, too few distinct tokens, another vocab map on resume),
    TrainingDiverged (NaN/Inf loss or gradient norm; the last checkpoint is kept)."""
    from eagle3.precision import resolved

    cfg = resolved(cfg)  # train.precision concrete (load_config has done it already)
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    check_data_mode(cfg, data_dir)
    if cfg.train.num_gpus > 1 and "LOCAL_RANK" not in os.environ:
        from eagle3.train.launch import launch

        return launch(cfg, data_dir, out_dir, on_metrics=on_metrics)
    from eagle3.train.distributed import setup_distributed, teardown_distributed

    rank, world, device = setup_distributed(cfg.train)
    try:
        t_start = time.perf_counter()
        run = prepare(cfg, data_dir, out_dir, rank=rank, world=world, device=device,
                      on_metrics=on_metrics)
        if world > 1:
            from eagle3.workers import rank_status

            run.heartbeat = rank_status().progress  # the launcher's first-step and stall deadlines
        if progress and rank == 0:
            from tqdm.auto import tqdm

            run.bar = tqdm(total=run.total_steps, initial=run.step, desc="train", unit="step")
        try:
            run_loop(run)
        finally:
            if run.bar is not None:
                run.bar.close()
        manifest = finish(run, seconds=time.perf_counter() - t_start)
        run.data.close()
        return manifest
    finally:
        teardown_distributed()


def check_settings(cfg) -> None:
    """The checks of ``cfg.train`` needing neither data nor a model, run before an earlier output is
    touched: the training device exists, the forward and loss can run there
    (:func:`eagle3.train.ttt_forward.choose`; ``fused`` losses need CUDA and Triton), and
    ``train.dev_prompts_file`` is a file when ``train.select_best_by`` is measured. ConfigError."""
    from eagle3.train.distributed import device_for

    device_type = device_for(cfg.train, 0).type
    ttt_forward.choose(cfg.train, device_type, cfg.train.num_gpus)
    _check_loss_implementation(cfg.train, device_type)
    _check_dev_prompts_file(cfg.train)


def _check_dev_prompts_file(t) -> None:
    """ConfigError ``DEV_PROMPTS_FILE`` (:mod:`eagle3.config_checks`)."""
    from eagle3.config_checks import dev_prompts_file_problem

    problem = dev_prompts_file_problem(t)
    if problem:
        raise ConfigError(problem)


def _check_loss_implementation(t, device_type: str) -> None:
    """ConfigError unless ``fused`` losses (CUDA, Triton) can run here."""
    if t.loss_implementation != "fused":
        return
    if device_type != "cuda":
        raise ConfigError(f"train.loss_implementation=fused: expected eager on a {device_type} "
                          "training device (speculators' fused losses are Triton kernels for "
                          "CUDA), got fused")
    try:
        import speculators.losses.fused  # noqa: F401
    except ImportError as e:
        raise ConfigError("train.loss_implementation=fused: expected eager in this environment: "
                          "speculators' fused losses need Triton, which does not import here "
                          f"({e}), got fused") from e


def prepare(cfg, data_dir: Path, out_dir: Path, *, rank: int, world: int, device: torch.device,
            on_metrics: OnMetrics | None) -> Run:
    """All checks, the model, optimizer, schedule and resumed state: a ready :class:`Run`."""
    from eagle3.assets import resolve_target

    t = cfg.train
    ensure_writable(out_dir)
    _check_dev_prompts_file(t)
    flags = resolve_flags(cfg)
    target_dir = resolve_target(cfg)
    tconf = read_target_config(target_dir)
    # the cut's warning once: from rank 0 of a run that trains (not the untrained baseline)
    warn = rank == 0 and t.max_steps != 0
    if is_online(data_dir):
        data = open_online(data_dir, target_dir, tconf, max_tokens=t.max_tokens_per_batch,
                           device=device, trust_remote_code=cfg.target.trust_remote_code,
                           cache_dir=out_dir / "state" / f"hs_cache-rank{rank}", warn=warn)
    else:
        data = open_hidden_states(data_dir, target_dir, tconf, max_tokens=t.max_tokens_per_batch,
                                  warn=warn)
    vmap = build_vocab_map(load_token_freq(data_dir / "token_freq.pt"), t.draft_vocab_size,
                           int(tconf.vocab_size), pad=t.pad_draft_vocab)
    state_dir = out_dir / "state"
    ckpts = list_checkpoints(state_dir) if t.resume else []
    info = read_info(ckpts[-1]) if ckpts else None
    parallel = make_parallel(t.distributed, world)
    identity = {"vocab_map_hash": vmap.hash(), "data_content_hash": data_identity(data),
                "flags": flags, "world_size": world, "distributed": parallel.name}
    if info is not None:
        check_complete(ckpts[-1], state_dir)  # before any model or data is built from it
        other = resume_conflict(info, identity, cfg, ckpts[-1])
        if other is not None and t.on_other_checkpoint == "refuse":
            raise other
        if other is not None:  # another training's state (e.g. re-run on other data): start over
            if rank == 0:
                log.warning("not resuming: %s. Starting from step 0 and removing the old "
                            "checkpoints (train.on_other_checkpoint=restart)", other)
            info = None
        elif rank == 0:
            log.warning("resuming from %s (optimizer step %s of this run)", ckpts[-1],
                        info.get("step"))
    if info is None and rank == 0:  # a fresh start (launch files stay)
        for old in list_checkpoints(state_dir) + [state_dir / "best"]:
            shutil.rmtree(old, ignore_errors=True)
        truncate_metrics(out_dir / "metrics.jsonl", -1)
    torch.manual_seed(t.seed)
    impl, attention = ttt_forward.choose(t, device.type, world)
    _check_loss_implementation(t, device.type)
    model = build_draft(target_dir, aux_layer_ids=data.aux_layer_ids, d2t=vmap.d2t, t2d=vmap.t2d,
                        num_layers=t.num_layers, ttt_steps=t.ttt_steps, flags=flags,
                        attn_impl=attention if impl == "speculators" else "sdpa")
    if t.init_from and info is None:
        load_init_from(model, Path(t.init_from), vmap, allow_change=t.allow_vocab_map_change)
    compiled = t.compile and device.type == "cuda"
    if impl == "project":
        ttt_forward.install(model, attention=attention,
                            compile_mode=t.compile_mode if compiled else None)
    elif compiled:
        compile_forward(model, t.compile_mode)
    else:
        use_uncompiled_forward(model)
    if rank == 0:
        log.info("training forward: %s, attention %s%s", impl, attention,
                 f", compiled ({t.compile_mode})" if compiled else "")
        if not t.compile and t.compile_mode != "default":
            log.warning("train.compile_mode=%s has no effect: train.compile is false",
                        t.compile_mode)
        elif t.compile and not compiled and t.max_steps != 0:  # max_steps=0: nothing to compile
            padded = (f" (micro-batches are still padded to {t.max_tokens_per_batch} positions)"
                      if t.pad_to_max_tokens is not False else "")
            log.warning("train.compile=true compiles the draft's forward only on CUDA; on %s it "
                        "runs eagerly%s", device.type, padded)
        check_checkpoint_space(out_dir / "state", model, keep_last=t.keep_last,
                               trains=t.max_steps != 0, window_bytes=window_to_come(data))
    model.to(device)
    remapped = _resume_weights(model, ckpts[-1], info, vmap, device) if info is not None else False
    module = parallel.wrap(model, device)  # after the weights are final: fsdp shards them in place
    params = [p for p in model.parameters() if p.requires_grad]
    opt = ttt_forward.optimizer_impl(t, device.type)
    optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay,
                                  **({} if opt == "default" else {opt: True}))
    run = Run(cfg=cfg, data=data, model=model, module=module, optimizer=optimizer, scheduler=None,
              device=device, out_dir=out_dir, rank=rank, world=world, on_metrics=on_metrics,
              parallel=parallel, loss_config=_loss_config(t))
    run.set_plan()
    horizon = math.ceil(t.epochs * run.steps_per_epoch())
    run.total_steps = horizon if t.max_steps is None else (t.max_steps if t.schedule == "constant"
                                                           else min(horizon, t.max_steps))
    run.scheduler = make_scheduler(optimizer, schedule=t.schedule, warmup_steps=t.warmup_steps,
                                   total_steps=horizon, min_ratio=t.lr_min_ratio)
    run.info_extra = {**identity,
                      "vocab": {"num_from_data": vmap.num_from_data, "coverage": vmap.coverage},
                      "target_dir": str(target_dir), "train_config": t.model_dump(mode="json")}
    if info is not None:
        _resume(run, ckpts[-1], remapped)
    if t.select_best_by == "measured" and rank == 0:  # target continuations once, before step 1
        from eagle3.measure.dev_acceptance import meter_for_training

        run.dev = meter_for_training(t, data, target_dir, device)
        if _dev_prompt_count(run) == 1:
            run.warnings.append(
                "DEV_ONE_PROMPT: train.select_best_by=measured picks the best checkpoint by the "
                f"acceptance on 1 dev prompt ({run.dev.dropped_too_long} left out as too long); "
                "one prompt's figure is noise: expected more (train.dev_prompts, "
                "data.val_fraction, train.dev_prompts_file)")
            log.warning("%s", run.warnings[-1])
    return run


def _dev_prompt_count(run: Run) -> int | None:
    """The dev prompts the meter of ``train.select_best_by=measured`` replays; None without one."""
    requests = getattr(run.dev, "requests", None)
    return None if requests is None else len(requests)


def _loss_config(t) -> dict:
    from speculators.losses import resolve_loss_config

    try:
        return resolve_loss_config(t.loss, t.loss_implementation)
    except ValueError as e:
        raise ConfigError(f"train.loss={t.loss!r} / "
                          f"train.loss_implementation={t.loss_implementation!r}: {e}") from e


def _resume_weights(model, ckpt: Path, info: dict, vmap, device: torch.device) -> bool:
    """Load the weights of ``ckpt`` into the bare draft (before any sharding); with an allowed new
    vocabulary map, install it and its LM-head rows. Returns True when the map changed."""
    from eagle3.train.verifier_weights import verifier_notices

    load_weights(model, ckpt)
    if info.get("vocab_map_hash") == vmap.hash():
        return False
    model.load_vocab_mappings(vmap.t2d, vmap.d2t)
    with verifier_notices(model.config.speculators_config.verifier.name_or_path):
        model._load_verifier_weights(overwrite_lm_head=True)  # noqa: SLF001
    model.to(device)
    return True


def _resume(run: Run, ckpt: Path, remapped: bool) -> None:
    """Restore optimizer, schedule, RNG and position from ``ckpt`` (weights loaded already); the LR
    is re-derived from the (possibly new) schedule."""
    t, model, opt = run.t, run.model, run.optimizer

    def load_optimizer(st):
        return run.parallel.load_optimizer_state(model, opt, st)

    info = load_checkpoint(ckpt, model=None, optimizer=opt, scheduler=run.scheduler,
                           load_optimizer=load_optimizer)
    run.step, run.epoch, run.micro = int(info["step"]), int(info["epoch"]), int(info["micro"])
    run.tokens_seen = int(info["tokens_seen"])
    run.data.restore(info)
    run.best, run.last_eval, run.last_train = (info.get(k) for k in ("best", "last_eval",
                                                                     "last_train"))
    if remapped:  # evaluations under the old map are not comparable (its weights carry that map)
        run.best = None
        if run.rank == 0:
            shutil.rmtree(run.state_dir / "best", ignore_errors=True)
    sched = run.scheduler
    sched.base_lrs = [t.lr] * len(sched.base_lrs)
    for g in opt.param_groups:
        g["initial_lr"] = t.lr
        g["lr"] = t.lr * sched.lr_lambdas[0](run.step)
    sched._last_lr = [g["lr"] for g in opt.param_groups]  # noqa: SLF001
    run.set_plan()
    if run.rank == 0:
        truncate_metrics(run.out_dir / "metrics.jsonl", run.step)


def finish(run: Run, *, seconds: float) -> dict:
    """Export the draft (best or last weights) and write ``manifest.json``; returns the manifest on
    rank 0. Every rank takes part (under fsdp the last weights are gathered to rank 0)."""
    from safetensors.torch import load_file

    best_dir = run.state_dir / "best"
    best = run.t.export == "best" and run.best is not None
    exported = {"which": "best" if best else "last", "step": run.best["step"] if best else run.step}
    manifest: dict = {}
    with run.parallel.gathered(run.model) as (weights, _):  # fsdp: a collective, rank 0 whole
        if run.rank == 0:
            if best and run.best["step"] != run.step and (best_dir / "model.safetensors").is_file():
                if weights is None:
                    load_weights(run.model, best_dir)
                else:
                    weights = load_file(str(best_dir / "model.safetensors"))
            _export_files(run.model, run.out_dir, weights)
            manifest = _write_manifest(run, exported, seconds)
    if run.world > 1:
        torch.distributed.barrier()
    return manifest


def _export_files(model, out_dir: Path, weights: dict | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix=".export.", suffix=".tmp", dir=out_dir) as tmp:
        save_draft(model, tmp, state_dict=weights)
        for f in ("config.json", "model.safetensors"):
            os.replace(Path(tmp) / f, out_dir / f)


def _write_manifest(run: Run, exported: dict, seconds: float) -> dict:
    t, d, ex = run.t, run.data, run.info_extra
    final_eval, best = run.last_eval or {}, run.best or {}

    def figure(best_key: str, eval_key: str):  # the exported weights' figure
        got = best.get(best_key) if exported["which"] == "best" else None
        return final_eval.get(eval_key) if got is None else got

    return write_manifest(
        run.out_dir, "draft_checkpoint", exclude=("manifest.json", "state"),
        config=t.model_dump(mode="json"),
        inputs={"hidden_states": d.manifest.get("content_hash")},
        counts={"train_samples": len(d.train_ids), "val_samples": len(d.val_ids),
                "skipped_samples": len(d.skipped), "truncated_samples": d.truncated,
                "train_positions": d.unique_train_tokens(),
                "micro_batches_per_epoch": len(run.plan),
                "dropped_micro_batches_per_epoch": run.dropped_microbatches,
                "optimizer_steps": run.step, "tokens_seen": run.tokens_seen,
                "steps_per_epoch": run.steps_per_epoch()},
        timings={"seconds": seconds},
        optimizer_steps=run.step,
        epochs_over_data=run.tokens_seen / max(1, d.unique_train_tokens()),
        vocab_map_hash=ex["vocab_map_hash"],
        data_manifest_hash=sha256_file(d.root / "manifest.json"),
        target=dict(d.manifest.get("target") or {}), aux_layer_ids=d.aux_layer_ids,
        layer_id_convention="hf_hidden_states_index", flags=ex["flags"],
        engine={"name": run.cfg.convert.engine, "version": run.cfg.convert.engine_version},
        vocab={"draft_vocab_size": t.draft_vocab_size, **ex["vocab"]},
        exported=exported, best=run.best,
        metrics={"simulated_acceptance_length": figure("simulated_acceptance_length",
                                                       "val/simulated_acceptance_length"),
                 "dev_acceptance_length": figure("measured_acceptance_length",
                                                 "dev/acceptance_length"),
                 # strict: a best saved without it (an older run resumed) has none
                 "dev_acceptance_length_all_positions": best.get("measured_all_positions")
                 if exported["which"] == "best"
                 else final_eval.get("dev/acceptance_length_all_positions"),
                 # the simulated figure over the answers' first tokens (metrics.FIRST_KEY)
                 FIRST_KEY: best.get("simulated_first") if exported["which"] == "best"
                 else final_eval.get(f"val/{FIRST_KEY}"),
                 "best_selected_by": best.get("selected_by"),
                 "final_eval": final_eval,
                 "final_train": run.last_train or {},
                 "acceptance_length_counts_bonus_token": True},
        device=str(run.device), world_size=run.world, precision=t.precision,
        extract_mode=d.manifest.get("mode", "offline"), warnings=list(run.warnings),
        dev_prompts=_dev_prompt_count(run),
        # states computed in training (OnlineHiddenStates.summary); nothing for files
        **({"online": d.summary(d.manifest.get("offline_bytes_estimate"))}
           if d.in_process else {}),
        auto_resolved={**{k: v for k, v in getattr(run.cfg, "auto_resolved", {}).items()
                          if k.startswith("train.")},
                       **ttt_forward.resolved_settings(t, run.device.type, run.world)})


__all__ = ["train", "check_settings", "ensure_writable", "prepare", "finish", "evaluate",
           "lr_factor"]
