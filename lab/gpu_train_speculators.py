"""speculators' own ``Trainer`` as ``lab/gpu_train.py`` runs it: its loader, its model-call kwargs,
its loop; tokens/s = non-padding positions per step / wall time between steps (one device sync per
step)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from lab.profiling import StepProfiler


class _CountingLoader:
    """Wraps a DataLoader: counts non-padding positions of each batch handed to the Trainer."""

    def __init__(self, loader):
        self.loader, self.tokens = loader, []

    def __len__(self):
        return len(self.loader)

    @property
    def batch_sampler(self):
        return self.loader.batch_sampler

    def __iter__(self):
        for b in self.loader:
            self.tokens.append(
                int((b["document_ids"] != -1).sum())
                if "document_ids" in b
                else int(b["input_ids"].numel())
            )
            yield b


def speculators_loader(hs: Path, target: Path, seq_len: int, workers: int):
    """speculators' own training loader over this project's offline layout in ``hs``
    (``ArrowDataset`` + ``FileTransfer`` + multipack sampler, ``shift_batch``; no vLLM endpoint: a
    missing file raises), its train split as the hidden-states manifest records it; ``seq_len``
    positions per packed batch."""
    import torch
    from hs_connectors import FileTransfer
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.dataloader import create_train_val_loaders

    from eagle3.artifacts import read_manifest

    man = read_manifest(hs)
    n_train, n = len(man["splits"]["train"]), sum(len(v) for v in man["splits"].values())
    tconf = json.loads((target / "config.json").read_text())
    loader, _ = create_train_val_loaders(
        data_path=str(hs / "data"),
        total_seq_len=seq_len,
        hidden_states_dtype=torch.bfloat16,
        transfer=FileTransfer(hs / "hidden_states"),
        vllm_endpoint="http://127.0.0.1:1/v1",
        on_missing="raise",
        verifier_name_or_path=str(target),
        request_timeout=None,
        max_retries=0,
        generation_validation_retries=0,
        max_consecutive_generation_failures=1,
        hidden_size=tconf["hidden_size"],
        num_target_layers=len(man["aux_layer_ids"]),
        num_workers=workers,
        prefetch_factor=4 if workers else None,
        preprocess=shift_batch,
        train_data_ratio=n_train / n,
        seed=0,
    )
    return loader


def run_speculators(
    a, work: Path, target: Path, hs: Path, attn: str, loss_impl: str, compiled: bool
) -> dict:
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.trainer import Trainer, TrainerConfig

    from eagle3.artifacts import read_manifest
    from eagle3.train.draft_model import build_draft, set_attention, use_uncompiled_forward
    from eagle3.train.vocab import build_vocab_map, load_token_freq

    man = read_manifest(hs)
    tconf = json.loads((target / "config.json").read_text())
    vmap = build_vocab_map(
        load_token_freq(hs / "token_freq.pt"), a.draft_vocab, tconf["vocab_size"], pad=True
    )
    torch.manual_seed(0)
    model = build_draft(
        target,
        aux_layer_ids=man["aux_layer_ids"],
        d2t=vmap.d2t,
        t2d=vmap.t2d,
        num_layers=1,
        ttt_steps=a.ttt,
        flags={},
        attn_impl="sdpa",
    )
    set_attention(model, attn)
    if not compiled:
        use_uncompiled_forward(model)
    train_loader = speculators_loader(hs, target, a.seq_len, a.workers)
    counting = _CountingLoader(train_loader)
    train_kwargs, _ = Eagle3DraftModel.get_trainer_kwargs(
        loss_fn="kl_div", loss_implementation=loss_impl, ttt_steps=a.ttt, ttt_step_loss_decay=1.0
    )
    save = work / f"out-spec-{attn}-{loss_impl}-{int(compiled)}"
    import shutil

    shutil.rmtree(save, ignore_errors=True)
    cfg = TrainerConfig(
        lr=a.lr,
        num_epochs=1000,
        save_path=str(save),
        train_call_kwargs=train_kwargs,
        scheduler_type="none",
        weight_decay=0.0,
        hidden_states_dtype=torch.bfloat16,
        log_freq=10**9,
        checkpoint_freq=10**9,
        max_steps=a.steps,
    )

    class _Trainer(Trainer):
        def setup_model(self):
            if not a.cuda:  # CPU smoke test only: speculators moves the model to device index 0
                self.local_rank, self.device_type = "cpu", "cpu"
            super().setup_model()

    if a.cuda:
        torch.cuda.reset_peak_memory_stats()
    else:  # CPU smoke test only: its step timer synchronizes "the accelerator" on step 0
        torch.accelerator.synchronize = lambda *x: None
        torch.accelerator.memory_allocated = lambda *x: 0
    trainer = _Trainer(model, cfg, counting, None)
    prof = StepProfiler(
        f"speculators-{attn}-{loss_impl}-{int(compiled)}", a.warmup, a.profile, a.out
    )
    t0 = time.perf_counter()
    stamps = [t0]

    def tick():
        if a.cuda:
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
        prof.step(len(stamps) - 1)

    epoch = 0
    while trainer.global_step < a.steps:
        trainer.train_epoch(epoch, step_callback=tick)
        epoch += 1
    dts = [b - s for s, b in zip(stamps, stamps[1:])]
    tps = [t / d for t, d in zip(counting.tokens, dts)]
    steady = [
        x
        for i, x in enumerate(tps)
        if i >= a.warmup and not a.warmup + 1 <= i + 1 <= a.warmup + a.profile
    ]
    if not steady:
        raise RuntimeError(
            f"no measured step left after {a.warmup} warm-up "
            f"and {a.profile} profiled steps: raise --steps"
        )
    peak = torch.cuda.max_memory_allocated() / 2**30 if a.cuda else float("nan")
    settings = (
        f"{attn}, {loss_impl} loss, {'compiled' if compiled else 'uncompiled'} "
        f"forward, {a.workers} workers"
    )
    return {
        "name": "speculators Trainer",
        "tokens_per_s": statistics.median(steady),
        "peak_gib": peak,
        "steps": len(tps),
        "settings": settings,
        "model": model,
        "wall_s": time.perf_counter() - t0,
        "profile": prof.result,
    }
