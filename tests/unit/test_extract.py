"""Hidden-state extraction on the tiny-random target: layout, values, speculators' reader, bad
inputs, fp8."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3.artifacts import content_hash
from eagle3.errors import ConfigError, DataError
from eagle3.extract.stage import estimate_bytes, extract
from eagle3.extract.store import (
    assign_shards,
    bytes_per_token,
    check_sample,
    decode,
    encode,
    load_sample,
    make_shards,
)


def write_convs(path: Path, n: int, words: int = 6, extra: list[str] | None = None) -> Path:
    """n ShareGPT-style conversations of growing length (+ raw extra lines)."""
    lines = [
        json.dumps(
            {
                "id": f"c{i}",
                "conversations": [
                    {"from": "human", "value": f"Question {i}: " + "why " * (i % 5 + 1)},
                    {
                        "from": "gpt",
                        "value": " ".join(f"answer{i}-{k}" for k in range(words + 3 * i)),
                    },
                ],
            }
        )
        for i in range(n)
    ]
    path.write_text("\n".join(lines + list(extra or [])) + "\n")
    return path


def file_cfg(tiny_cfg, path: Path, **over):
    """tiny_cfg reading conversations from ``path``; keyword overrides go to data.* or extract.*."""
    from eagle3.config import RunConfig

    raw = tiny_cfg.model_dump(mode="json")
    raw["data"].update(
        source="file",
        path=str(path),
        num_conversations=over.pop("n", 6),
        val_fraction=over.pop("val", 0.2),
    )
    raw["extract"]["shard_size"] = over.pop("shard", 2)
    for k, v in over.items():
        raw["extract" if k in raw["extract"] else "data"][k] = v
    return RunConfig.model_validate(raw)


def test_layout_values_and_manifest(tiny_cfg, tiny_target_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = file_cfg(
        tiny_cfg,
        write_convs(
            tmp_path / "c.jsonl",
            8,
            extra=[
                "{broken",
                json.dumps({"id": "q", "conversations": [{"from": "human", "value": "no answer"}]}),
            ],
        ),
        batch_size=3,
    )
    out = tmp_path / "hs"
    m = extract(cfg, out, progress=False)
    c = m["counts"]
    assert (c["samples"], c["train_samples"], c["val_samples"], c["records"], c["skipped"]) == (
        6,
        5,
        1,
        10,
        2,
    )
    assert m["skipped_by_reason"] == {"malformed_json_line": 1, "no_assistant_turn": 1}
    assert m["aux_layer_ids"] == [2, 4, 5] and m["num_slots"] == 4
    assert m["layer_id_convention"] == "hf_hidden_states_index"
    assert m["target"]["num_layers"] == 8 and m["target"]["hidden_size"] == 64
    assert m["splits"] == {"train": [0, 1, 2, 3, 4], "val": [5]}
    assert m["data_source"]["kind"] == "file" and len(m["data_source"]["sha256"]) == 64
    assert m["content_hash"] == content_hash(out)
    import datasets

    ds = datasets.load_from_disk(str(out / "data"))
    assert c["tokens"] == sum(int(r["seq_len"]) for r in ds)
    assert c["loss_tokens"] == sum(int(r["loss_mask"].sum()) for r in ds)
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    for i in (0, 5):
        f = load_file(out / "hidden_states" / f"hs_{i}.safetensors")
        ids = ds[i]["input_ids"]
        assert torch.equal(f["token_ids"], ids) and f["hidden_states"].shape == (len(ids), 4, 64)
        with torch.no_grad():
            ref = model(ids[None], output_hidden_states=True).hidden_states
        for slot, hf_index in enumerate([2, 4, 5]):
            torch.testing.assert_close(
                f["hidden_states"][:, slot], ref[hf_index][0], atol=1e-5, rtol=1e-5
            )
        # slot -1 is the last layer before the final norm: normalising it gives HF's (post-norm)
        # last state
        torch.testing.assert_close(
            model.model.norm(f["hidden_states"][None, :, -1]), ref[8], atol=1e-5, rtol=1e-5
        )
    freq = torch.load(out / "token_freq.pt")
    want = Counter(
        int(t) for r in range(5) for t, k in zip(ds[r]["input_ids"], ds[r]["loss_mask"]) if k
    )
    assert freq == dict(want) and len(set(freq) | {0}) > 1
    # re-running on a finished directory returns its manifest without recomputing
    assert extract(cfg, out, progress=False)["content_hash"] == m["content_hash"]


def test_speculators_offline_loader_reads_output(tiny_cfg, tmp_path):
    from hs_connectors import FileTransfer, FP8Transfer
    from speculators.train.data import ArrowDataset

    src = write_convs(tmp_path / "c.jsonl", 5)
    for dtype, transfer in (("bfloat16", FileTransfer), ("fp8", FP8Transfer)):
        out = tmp_path / dtype
        m = extract(file_cfg(tiny_cfg, src, n=5, dtype=dtype), out, progress=False)
        ratio = len(m["splits"]["train"]) / m["counts"]["samples"]
        train = ArrowDataset(
            max_len=512,
            datapath=out / "data",
            transfer=transfer(out / "hidden_states"),
            on_missing="raise",
            train_ratio=ratio,
            split="train",
        )
        val = ArrowDataset(
            max_len=512,
            datapath=out / "data",
            transfer=transfer(out / "hidden_states"),
            on_missing="raise",
            train_ratio=ratio,
            split="val",
        )
        assert len(train) == len(m["splits"]["train"]) and len(val) == len(m["splits"]["val"]) == 1
        item = val[0]
        ours = load_sample(out, m["splits"]["val"][0], torch.bfloat16)
        t = item["input_ids"].shape[0]
        assert item["hidden_states"].shape == (t, 3 * 64) and item[
            "verifier_last_hidden_states"
        ].shape == (t, 64)
        theirs = item["verifier_last_hidden_states"].to(torch.bfloat16)
        if dtype == "bfloat16":
            assert torch.equal(theirs, ours["hidden_states"][:, -1])
        else:  # speculators dequantizes in bf16 arithmetic, we in fp32: one bf16 rounding apart
            torch.testing.assert_close(theirs, ours["hidden_states"][:, -1], rtol=1e-2, atol=1e-3)
        assert item["loss_mask"].shape == (t,) and int(item["loss_mask"].sum()) > 0


def test_fp8_error_and_bytes(tiny_cfg, tmp_path):
    src = write_convs(tmp_path / "c.jsonl", 4, words=30)
    m16 = extract(file_cfg(tiny_cfg, src, n=4, dtype="bfloat16"), tmp_path / "bf16", progress=False)
    m8 = extract(file_cfg(tiny_cfg, src, n=4, dtype="fp8"), tmp_path / "fp8", progress=False)
    assert m8["bytes_per_token"] / m16["bytes_per_token"] == pytest.approx(
        bytes_per_token(4, 64, "fp8") / bytes_per_token(4, 64, "bfloat16"), rel=0.05
    )
    assert m8["bytes_per_token"] < 0.62 * m16["bytes_per_token"]
    a = load_sample(tmp_path / "bf16", 0)["hidden_states"]
    b = load_sample(tmp_path / "fp8", 0)["hidden_states"]
    rel = ((a - b).norm(dim=-1) / a.norm(dim=-1)).max().item()
    assert 0 < rel < 0.05  # e4m3 has 3 mantissa bits: ~2-3 % relative error per vector
    x = torch.randn(7, 4, 64) * torch.logspace(-3, 3, 4)[None, :, None]
    enc = encode(x, "fp8")
    assert enc["hidden_states"].dtype == torch.float8_e4m3fn and enc[
        "hidden_states_scales"
    ].shape == (7, 4, 1)
    assert ((decode(enc) - x).abs() / x.abs().amax(-1, keepdim=True)).max() < 0.07


def test_integrity_checks_name_sample_and_file(tmp_path):
    p = tmp_path / "hs_3.safetensors"
    hs = torch.zeros(4, 2, 8)
    check_sample("conv-7", p, [1, 2, 3, 4], [0, 1, 1, 1], hs)
    with pytest.raises(
        DataError, match=r"sample conv-7 .*hs_3.safetensors.*rows 4, len\(input_ids\) 3"
    ):
        check_sample("conv-7", p, [1, 2, 3], [0, 1, 1], hs)
    hs[2, 1, 5] = float("inf")
    with pytest.raises(DataError, match=r"sample conv-7 .*hs_3.safetensors.*NaN/Inf .*\[2, 1, 5\]"):
        check_sample("conv-7", p, [1, 2, 3, 4], [0, 1, 1, 1], hs)


def test_nan_target_stops_without_committing(tiny_cfg, tiny_target_dir, tmp_path):
    from eagle3.extract.hf_backend import WorkerJob, run_shards
    from eagle3.target_model import load_target

    model, _ = load_target(tiny_target_dir, "float32", "cpu")
    with torch.no_grad():
        model.model.layers[3].mlp.down_proj.weight[0, 0] = float("nan")
    out = tmp_path / "o"
    (out / "hidden_states").mkdir(parents=True)
    shards = make_shards(2, 2)
    job = WorkerJob(
        str(tiny_target_dir),
        "float32",
        "cpu",
        [2, 4, 8],
        "float32",
        2,
        str(out),
        ["a", "b"],
        [[1, 5, 9], [1, 6]],
        [[0, 1, 1], [0, 1]],
        shards,
    )
    with pytest.raises(DataError, match=r"sample [ab] .*hs_[01].safetensors.*NaN/Inf"):
        run_shards(job, model=model)
    assert not (out / ".progress" / "shard_0.json").exists()


def test_bad_inputs(tiny_cfg, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="empty file"):
        extract(file_cfg(tiny_cfg, empty), tmp_path / "o1", progress=False)
    assert not (tmp_path / "o1").exists()
    for ids, match in (
        ([0, 3], r"out of range .*8 layers"),
        ([3, 2], "strictly increasing"),
        ([2, 99], r"\[99\] out of range"),
    ):
        with pytest.raises(ConfigError, match=match):
            extract(
                file_cfg(tiny_cfg, write_convs(tmp_path / "c.jsonl", 3), aux_layer_ids=ids),
                tmp_path / "o2",
                progress=False,
            )
    src = write_convs(tmp_path / "long.jsonl", 4, words=80)
    m = extract(file_cfg(tiny_cfg, src, n=4, max_seq_len=48), tmp_path / "o3", progress=False)
    assert m["counts"]["truncated"] == 4 and m["counts"]["tokens"] == 4 * 48
    cfg = file_cfg(tiny_cfg, src, n=4)
    need = estimate_bytes(1, 4, 64, "float32")
    with pytest.raises(DataError, match=r"needs about [\d,]+ bytes but only 1,000 bytes are free"):
        extract(cfg, tmp_path / "o4", progress=False, free_bytes=1000)
    assert need > 0 and not (tmp_path / "o4" / "hidden_states").exists()
    assert not (tmp_path / "o4" / "manifest.json").exists()


def test_default_rule_on_four_layer_target_is_config_error(tiny_cfg, tmp_path):
    from eagle3.config import RunConfig

    raw = tiny_cfg.model_dump(mode="json")
    raw["target"]["tiny"]["num_hidden_layers"] = 4
    cfg = RunConfig.model_validate(raw)
    with pytest.raises(ConfigError, match=r"default EAGLE-3 rule .*4 layers"):
        extract(cfg, tmp_path / "o", progress=False)


def test_other_extraction_in_directory_is_refused(tiny_cfg, tmp_path):
    src = write_convs(tmp_path / "c.jsonl", 4)
    out = tmp_path / "o"
    extract(file_cfg(tiny_cfg, src, n=3), out, progress=False)
    with pytest.raises(DataError, match="holds an extraction with plan hash"):
        extract(file_cfg(tiny_cfg, src, n=4), out, progress=False)


def test_interrupted_run_resumes_to_identical_content(tiny_cfg, tmp_path, monkeypatch):
    import eagle3.extract.hf_backend as hf

    src = write_convs(tmp_path / "c.jsonl", 7)
    cfg = file_cfg(tiny_cfg, src, n=7, shard=2, batch_size=2)
    ref = extract(cfg, tmp_path / "ref", progress=False)["content_hash"]
    real, calls = hf.write_sample, []

    def failing(path, *a, **k):
        calls.append(path.name)
        if len(calls) == 4:
            raise DataError(f"{path}: simulated full disk")
        return real(path, *a, **k)

    monkeypatch.setattr(hf, "write_sample", failing)
    out = tmp_path / "run"
    with pytest.raises(DataError, match="simulated full disk"):
        extract(cfg, out, progress=False)
    assert sorted(p.name for p in (out / ".progress").glob("shard_*.json")) == ["shard_0.json"]
    assert not (out / "manifest.json").exists() and not (out / "data").exists()
    monkeypatch.setattr(hf, "write_sample", real)
    m = extract(cfg, out, progress=False)
    assert m["resumed"] and m["shards"] == {"total": 4, "resumed": 1}
    assert m["content_hash"] == ref


def test_assign_shards_round_robin_covers_each_once():
    shards = make_shards(23, 4)
    assert [(s.start, s.stop) for s in shards][-1] == (20, 23) and len(shards) == 6
    parts = assign_shards(shards, 4)
    assert [[s.index for s in p] for p in parts] == [[0, 4], [1, 5], [2], [3]]
    assert sorted(s.index for p in parts for s in p) == list(range(6))
    with pytest.raises(DataError):
        assign_shards(shards, 0)


def test_sglang_backend_without_sglang_environment_is_refused(tiny_cfg, tmp_path):
    from eagle3.errors import EngineUnsupported

    cfg = tiny_cfg.model_copy(deep=True)
    cfg.extract.backend = "sglang"  # validate_assignment checks the literal
    cfg.serve.sglang_python = str(tmp_path / "no-such-python")
    with pytest.raises(
        EngineUnsupported, match="serve.sglang_python: .*no-such-python is not an executable file"
    ):
        extract(cfg, tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()
    cfg.extract.num_gpus = 2
    with pytest.raises(
        ConfigError, match="extract.num_gpus: expected 1 with extract.backend='sglang'.*got 2"
    ):
        extract(cfg, tmp_path / "o", progress=False)


def test_sglang_layer_ids_are_hf_indices_minus_one_and_index_0_is_refused():
    from eagle3.extract.sglang_backend import sglang_layer_ids

    # SmolLM2-135M: 30 layers; EAGLE-3's default aux indices [2, 15, 27] + the last layer's output
    # (index 30)
    assert sglang_layer_ids([2, 15, 27, 30], 30) == [1, 14, 26, 29]
    with pytest.raises(
        ConfigError, match=r"indices \[0\] cannot be captured by SGLang.*expected 1..30"
    ):
        sglang_layer_ids([0, 15, 27, 30], 30)
    with pytest.raises(ConfigError, match=r"indices \[31\]"):
        sglang_layer_ids([2, 15, 31, 30], 30)


def test_sglang_worker_failure_is_reported_with_the_engine_error(tmp_path):
    """The worker run by an interpreter without SGLang (this one): its ERROR line becomes
    EngineUnsupported."""
    import sys

    from eagle3.errors import EngineUnsupported
    from eagle3.extract.sglang_backend import SGLangWorker

    with pytest.raises(
        EngineUnsupported,
        match="failed to start the engine: ModuleNotFoundError: No module named 'sglang'",
    ):
        SGLangWorker(
            sys.executable,
            {"target_dir": str(tmp_path), "dtype": "float32", "layer_ids": [0, 1]},
            tmp_path / "w",
            {"PATH": "/usr/bin:/bin"},
            startup_timeout_s=60,
        )
    assert (tmp_path / "w" / "sglang_job.json").is_file() and (
        tmp_path / "w" / "sglang_extract.log"
    ).is_file()
