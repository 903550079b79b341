"""The ``sglang`` extraction backend against the real SGLang 0.5.23 on the CPU (runs in CI:
``make sglang-env``).

The same plan is extracted by the ``hf`` backend and by SGLang's offline Engine with aux capture
(plus the project's last-layer capture plugin); every sample's states must agree, the dataset layout
and counts must be the same, and the manifest must say which backend and ids were used. One engine
start (~40 s here).
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.sglang.conftest import EXTRACT_SUMMARY, requires_sglang_env
from testkit.sglang_harness import sglang_env, sglang_python

pytestmark = [pytest.mark.sglang, requires_sglang_env]

CPU_ENGINE_ARGS = {
    "device": "cpu",
    "attention_backend": "triton",
    "disable_overlap_schedule": True,
    "disable_cuda_graph": True,
    "max_total_tokens": 4096,
    "context_length": 512,
    "mem_fraction_static": 0.3,
}


def _cfg(tmp_path, backend: str):
    from eagle3.config import load_config
    from tests.conftest import CONFIGS

    cfg = load_config(
        CONFIGS / "tiny-random.yaml",
        [
            f"paths.runs_dir={tmp_path / 'runs'}",
            "data.num_conversations=6",
            "data.max_seq_len=96",
            "extract.batch_size=3",
            "extract.shard_size=4",
            f"extract.backend={backend}",
        ],
    )
    env = {
        k: v
        for k, v in sglang_env().items()
        if k
        in (
            "TRITON_INTERPRET",
            "PYTHONPATH",
            "PYTHONWARNINGS",
            "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE",
        )
    }
    extract = cfg.extract.model_copy(
        update={
            "sglang_engine_args": CPU_ENGINE_ARGS,
            "sglang_env": env,
            "sglang_startup_timeout_s": 400.0,
        }
    )
    serve = cfg.serve.model_copy(update={"sglang_python": str(sglang_python())})
    return cfg.model_copy(update={"extract": extract, "serve": serve})


def test_sglang_backend_states_equal_hf_backend(tmp_path):
    from eagle3.extract.stage import extract
    from eagle3.extract.store import load_sample

    hf = extract(_cfg(tmp_path, "hf"), tmp_path / "hf", progress=False)
    sg = extract(_cfg(tmp_path, "sglang"), tmp_path / "sg", progress=False)

    assert sg["counts"] == hf["counts"] and sg["counts"]["samples"] >= 4
    assert sg["aux_layer_ids"] == hf["aux_layer_ids"] and sg["num_slots"] == hf["num_slots"] == 4
    assert sg["config"]["extract"]["backend"] == "sglang"
    worst = 0.0
    for i in range(sg["counts"]["samples"]):
        a, b = load_sample(tmp_path / "hf", i), load_sample(tmp_path / "sg", i)
        assert torch.equal(a["token_ids"], b["token_ids"])
        assert (
            a["hidden_states"].shape == b["hidden_states"].shape
        )  # [T, 4, 64]: 3 aux + last layer
        scale = a["hidden_states"].abs().max().item()
        worst = max(worst, (a["hidden_states"] - b["hidden_states"]).abs().max().item() / scale)
    # float32 on both sides; SGLang's attention and fused add-norm round differently from
    # transformers'
    EXTRACT_SUMMARY.update(
        samples=sg["counts"]["samples"],
        tokens=sg["counts"]["tokens"],
        slots=sg["num_slots"],
        worst=worst,
    )
    assert worst < 1e-4, f"largest relative difference between SGLang and HF states: {worst:.3g}"
    # the engine's log was kept next to the progress files, and the batches it returned were
    # consumed
    work = tmp_path / "sg" / ".progress" / "sglang"
    assert json.loads((work / "sglang_job.json").read_text())["layer_ids"] == [
        i - 1 for i in sg["aux_layer_ids"]
    ] + [sg["target"]["num_layers"] - 1]
    assert not list(work.glob("batch_*.safetensors"))
