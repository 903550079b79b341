"""speculators' own ``Trainer`` on a hidden-states folder, as the quality peer of
``lab/gpu_quality.py`` (same draft, LR, epochs, TTT steps, loss; its own loader)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path


def do_speculators(a, target: Path, hs: Path, out_dir: Path) -> dict:
    """speculators' own Trainer on ``hs`` (same draft, LR, epochs, TTT, loss); the draft saved to
    out_dir/draft."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.trainer import Trainer, TrainerConfig

    from lab.gpu_train_speculators import speculators_loader

    from eagle3.artifacts import read_manifest
    from eagle3.train.draft_model import (
        build_draft,
        resolve_flags,
        save_draft,
        set_attention,
        use_uncompiled_forward,
    )
    from eagle3.config import load_config
    from eagle3.train.vocab import build_vocab_map, load_token_freq

    shutil.rmtree(out_dir, ignore_errors=True)
    cuda = a.device == "cuda"
    man = read_manifest(hs)
    tconf = json.loads((target / "config.json").read_text())
    vmap = build_vocab_map(
        load_token_freq(hs / "token_freq.pt"), a.draft_vocab, tconf["vocab_size"], pad=False
    )
    flags = resolve_flags(load_config(None, [f"target.path={target}", "target.kind=hf"]))
    torch.manual_seed(0)  # train.seed: the same initial weights as ours
    model = build_draft(
        target,
        aux_layer_ids=man["aux_layer_ids"],
        d2t=vmap.d2t,
        t2d=vmap.t2d,
        num_layers=1,
        ttt_steps=a.ttt,
        flags=flags,
        attn_impl="sdpa",
    )
    set_attention(model, "sdpa")
    if not a.compile:
        use_uncompiled_forward(model)
    loader = speculators_loader(hs, target, a.tokens_per_batch, a.workers)
    kwargs, _ = Eagle3DraftModel.get_trainer_kwargs(
        loss_fn="kl_div", loss_implementation="eager", ttt_steps=a.ttt, ttt_step_loss_decay=1.0
    )
    cfg = TrainerConfig(
        lr=a.lr,
        num_epochs=a.epochs,
        save_path=str(out_dir / "trainer"),
        train_call_kwargs=kwargs,
        scheduler_type="none",
        weight_decay=0.0,
        hidden_states_dtype=torch.bfloat16,
        log_freq=10**9,
        checkpoint_freq=10**9,
    )

    class _Trainer(Trainer):
        def setup_model(self):
            if not cuda:  # CPU smoke test only: speculators moves the model to device index 0
                self.local_rank, self.device_type = "cpu", "cpu"
            super().setup_model()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:  # CPU smoke test only: its step timer synchronizes "the accelerator"
        torch.accelerator.synchronize = lambda *x: None
        torch.accelerator.memory_allocated = lambda *x: 0
    from lab.gpu_train_speculators import _CountingLoader

    counting = _CountingLoader(loader)
    trainer = _Trainer(model, cfg, counting, None)
    stamps = [time.perf_counter()]

    def tick():
        if cuda:
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())

    t0 = time.perf_counter()
    for epoch in range(int(a.epochs)):
        trainer.train_epoch(epoch, step_callback=tick)
    seconds = time.perf_counter() - t0
    steps = len(stamps) - 1
    dts = [b - s for s, b in zip(stamps, stamps[1:])]
    model = trainer.model if not hasattr(trainer.model, "module") else trainer.model.module
    save_draft(model, out_dir / "draft")
    steady = sorted(dts[min(5, len(dts) - 1) :]) if dts else []
    rates = [
        t / d for t, d in zip(counting.tokens, dts)
    ]  # positions/s of each step (one sync per step)
    tps = sorted(rates[5:] or rates) or [float("nan")]  # the first 5 steps (loader start) left out
    return {
        "dir": str(out_dir / "draft"),
        "seconds": seconds,
        "steps": steps,
        "median_step_s": steady[len(steady) // 2] if steady else None,
        "positions": sum(counting.tokens),
        "train_tokens_per_s_median": tps[len(tps) // 2],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }
