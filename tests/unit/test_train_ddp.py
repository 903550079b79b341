"""The torch.distributed path: ``train.num_gpus=2`` launches torchrun; on CPU the backend is
gloo."""

import json

import pytest
import torch
from safetensors.torch import load_file

from eagle3.train.stage import train
from testkit.hs_fixture import build_hidden_states_dir, tiny_train_cfg


@pytest.mark.slow
def test_two_process_gloo_run_matches_one_process_with_accumulation(tmp_path, tiny_target_dir):
    hs = build_hidden_states_dir(tmp_path / "hs", tiny_target_dir, num_samples=10)
    common = [
        "train.device=cpu",
        "train.draft_vocab_size=64",
        "train.max_steps=2",
        "train.eval_every=2",
        "train.epochs=5",
    ]
    seen = []
    ddp = train(
        tiny_train_cfg(tmp_path / "runs", *common, "train.num_gpus=2"),
        hs,
        tmp_path / "ddp",
        on_metrics=lambda m, s: seen.append(s),
        progress=False,
    )
    assert ddp["world_size"] == 2 and ddp["optimizer_steps"] == 2
    assert seen[:2] == [1, 2]  # forwarded from the children's metrics.jsonl
    one = train(
        tiny_train_cfg(tmp_path / "runs", *common, "train.grad_accum=2"),
        hs,
        tmp_path / "one",
        progress=False,
    )
    # 2 ranks × 1 micro-batch averaged by DDP == 1 process × 2 accumulated micro-batches (same plan)
    assert one["counts"]["micro_batches_per_epoch"] >= 4  # 2 steps × 2 micro-batches inside epoch 0
    a, b = (
        load_file(tmp_path / "ddp" / "model.safetensors"),
        load_file(tmp_path / "one" / "model.safetensors"),
    )
    for k in ("fc.weight", "layers.0.self_attn.q_proj.weight", "norm.weight"):
        assert torch.allclose(a[k], b[k], atol=1e-5), k
    log = [json.loads(x) for x in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["kind"] == "train"] == [1, 2]
