"""The training stage on the tiny-random target: skeleton outputs, the untrained baseline, bad
inputs."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from eagle3.errors import ConfigError, DataError, TrainingDiverged
from eagle3.train.stage import train
from testkit.hs_fixture import build_hidden_states_dir, edit_manifest, tiny_train_cfg


@pytest.fixture(scope="module")
def hs_dir(tmp_path_factory, tiny_target_dir):
    return build_hidden_states_dir(
        tmp_path_factory.mktemp("hs") / "hs", tiny_target_dir, num_samples=14
    )


@pytest.fixture
def hs_copy(hs_dir, tmp_path):
    return shutil.copytree(hs_dir, tmp_path / "hs")


def test_trains_and_writes_a_speculators_draft(hs_dir, tmp_path, tiny_target_dir):
    cfg = tiny_train_cfg(tmp_path / "runs", "train.max_steps=4", "train.eval_every=2")
    seen = []
    out = tmp_path / "train"
    man = train(cfg, hs_dir, out, on_metrics=lambda m, s: seen.append((s, m)), progress=False)
    conf = json.loads((out / "config.json").read_text())
    assert conf["speculators_model_type"] == "eagle3" and conf["architectures"] == [
        "Eagle3DraftModel"
    ]
    hs_man = json.loads((hs_dir / "manifest.json").read_text())
    assert conf["eagle_aux_hidden_state_layer_ids"] == hs_man["aux_layer_ids"]
    assert conf["norm_before_residual"] is False
    sd = load_file(out / "model.safetensors")
    for name in (
        "embed_tokens.weight",
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.hidden_norm.weight",
    ):
        assert name in sd, name
    assert sd["d2t"].shape == (128,) and int(sd["t2d"].sum()) == 128
    assert man["kind"] == "draft_checkpoint" and man["optimizer_steps"] == 4
    assert len(man["vocab_map_hash"]) == 64
    assert man["metrics"]["simulated_acceptance_length"] >= 1.0
    train_steps = [s for s, m in seen if "train/loss" in m]
    eval_steps = [s for s, m in seen if "val/loss" in m]
    assert train_steps == [1, 2, 3, 4] and eval_steps == [2, 4]
    m = dict(seen[0][1])
    for k in ("train/loss", "lr", "grad_norm", "tokens_per_s", "epochs_over_data"):
        assert k in m and m[k] == m[k], k
    for k in range(3):
        assert {f"train/loss_{k}", f"train/acc_full_{k}", f"train/acc_cond_{k}"} <= set(m)
    ev = [m for s, m in seen if "val/loss" in m][-1]
    assert {"val/simulated_acceptance_length", "train_val_gap", "val/acc_cond_2"} <= set(ev)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["kind"] == "train"] == [1, 2, 3, 4]
    # frozen parts stay the verifier's: embedding and the t2d-selected rows of the (tied) head
    target = load_file(tiny_target_dir / "model.safetensors")
    emb = target["model.embed_tokens.weight"]
    assert torch.equal(sd["embed_tokens.weight"], emb)
    assert torch.equal(sd["lm_head.weight"], emb[sd["t2d"]])


def test_untrained_baseline_has_no_optimizer_step(hs_dir, tmp_path, tiny_target_dir):
    cfg = tiny_train_cfg(tmp_path / "runs", "train.max_steps=0")
    out = tmp_path / "untrained"
    man = train(cfg, hs_dir, out, progress=False)
    assert man["optimizer_steps"] == 0 and man["exported"]["step"] == 0
    assert not list((out / "state").glob("ckpt-*"))
    sd = load_file(out / "model.safetensors")
    # same seed → the same random init of the trainable part as any run's step 0
    cfg2 = tiny_train_cfg(tmp_path / "runs", "train.max_steps=0")
    man2 = train(cfg2, hs_dir, tmp_path / "untrained2", progress=False)
    assert torch.equal(
        sd["fc.weight"], load_file(tmp_path / "untrained2" / "model.safetensors")["fc.weight"]
    )
    assert man2["vocab_map_hash"] == man["vocab_map_hash"]
    assert man["metrics"]["final_eval"]["val/simulated_acceptance_length"] >= 1.0


def test_flag_the_engine_implements_differently_is_refused(hs_dir, tmp_path):
    cfg = tiny_train_cfg(tmp_path / "runs", "train.norm_before_residual=true")
    with pytest.raises(ConfigError, match="norm_before_residual"):
        train(cfg, hs_dir, tmp_path / "t", progress=False)
    assert not (tmp_path / "t" / "model.safetensors").exists()


def test_empty_dataset(tmp_path, tiny_target_dir):
    d = build_hidden_states_dir(tmp_path / "empty", tiny_target_dir, empty=True)
    with pytest.raises(DataError, match="empty dataset"):
        train(tiny_train_cfg(tmp_path / "runs"), d, tmp_path / "t", progress=False)


def test_hidden_size_disagreeing_with_target(hs_copy, tmp_path):
    edit_manifest(hs_copy, target__hidden_size=128)
    with pytest.raises(DataError, match=r"target.hidden_size 128.*hidden_size=64"):
        train(tiny_train_cfg(tmp_path / "runs"), hs_copy, tmp_path / "t", progress=False)


def test_hidden_states_wider_than_target(hs_copy, tmp_path):
    from safetensors.torch import save_file

    for f in (hs_copy / "hidden_states").glob("hs_*.safetensors"):
        t = load_file(f)
        save_file(
            {"token_ids": t["token_ids"], "hidden_states": torch.cat([t["hidden_states"]] * 2, -1)},
            f,
        )
    with pytest.raises(DataError, match=r"shape expected \[\d+, 4, 64\]"):
        train(tiny_train_cfg(tmp_path / "runs"), hs_copy, tmp_path / "t", progress=False)


def test_dataset_from_another_target(hs_copy, tmp_path):
    edit_manifest(hs_copy, target__path=str(tmp_path / "some-other-model"))
    with pytest.raises(DataError, match="another target"):
        train(tiny_train_cfg(tmp_path / "runs"), hs_copy, tmp_path / "t", progress=False)


def test_unwritable_output_dir(hs_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="not writable"):
        train(tiny_train_cfg(tmp_path / "runs"), hs_dir, blocker / "train", progress=False)


def test_nan_loss_stops_with_step_and_keeps_last_checkpoint(hs_dir, tmp_path, monkeypatch):
    import eagle3.train.loop as loop

    cfg = tiny_train_cfg(
        tmp_path / "runs", "train.max_steps=8", "train.checkpoint_every=2", "train.epochs=3"
    )
    out = tmp_path / "t"
    real = loop.forward

    def poisoned(run, batch, counts, **kw):  # the 4th optimizer step's loss becomes NaN
        loss = real(run, batch, counts, **kw)
        return loss * float("nan") if run.step == 3 else loss

    monkeypatch.setattr(loop, "forward", poisoned)
    with pytest.raises(TrainingDiverged, match=r"optimizer step 4 .*ckpt-00000002"):
        train(cfg, hs_dir, out, progress=False)
    assert [p.name for p in (out / "state").glob("ckpt-*")] == ["ckpt-00000002"]
    assert not (out / "manifest.json").exists()


def test_keep_last_best_by_acceptance_and_bf16_autocast(hs_dir, tmp_path):
    cfg = tiny_train_cfg(
        tmp_path / "runs",
        "train.max_steps=4",
        "train.eval_every=1",
        "train.keep_last=2",
        "train.precision=bf16-autocast",
        "train.lr=3e-3",
    )
    out = tmp_path / "t"
    seen = []
    man = train(cfg, hs_dir, out, on_metrics=lambda m, s: seen.append((s, m)), progress=False)
    assert sorted(p.name for p in (out / "state").glob("ckpt-*")) == [
        "ckpt-00000003",
        "ckpt-00000004",
    ]
    sims = {s: m["val/simulated_acceptance_length"] for s, m in seen if "val/loss" in m}
    assert sorted(sims) == [1, 2, 3, 4]
    best = max(sims, key=lambda s: (sims[s], -s))  # the first evaluation with the highest value
    assert man["best"]["step"] == best and man["exported"] == {"which": "best", "step": best}
    assert man["metrics"]["simulated_acceptance_length"] == pytest.approx(sims[best])
    assert all(
        m["train/loss"] == m["train/loss"] for s, m in seen if "train/loss" in m
    )  # finite under bf16
    if best != 4:  # the exported weights are the best evaluation's, not the last step's
        assert torch.equal(
            load_file(out / "model.safetensors")["fc.weight"],
            load_file(out / "state" / "best" / "model.safetensors")["fc.weight"],
        )


def test_init_from_another_vocab_map_is_refused_unless_allowed(hs_dir, tmp_path):
    first = tmp_path / "first"
    train(tiny_train_cfg(tmp_path / "runs", "train.max_steps=1"), hs_dir, first, progress=False)
    other = shutil.copytree(hs_dir, tmp_path / "hs2")
    freq = torch.load(other / "token_freq.pt")
    torch.save({**freq, **{t: 10_000 for t in range(1000, 1040)}}, other / "token_freq.pt")
    with pytest.raises(DataError, match="init_from.*another draft vocab map"):
        train(
            tiny_train_cfg(tmp_path / "runs", "train.max_steps=1", f"train.init_from={first}"),
            other,
            tmp_path / "second",
            progress=False,
        )
    man = train(
        tiny_train_cfg(
            tmp_path / "runs",
            "train.max_steps=0",
            f"train.init_from={first}",
            "train.allow_vocab_map_change=true",
        ),
        other,
        tmp_path / "second",
        progress=False,
    )
    a, b = (
        load_file(first / "model.safetensors"),
        load_file(tmp_path / "second" / "model.safetensors"),
    )
    assert torch.equal(a["fc.weight"], b["fc.weight"])  # trained weights carried over
    assert not torch.equal(a["d2t"], b["d2t"]) and man["optimizer_steps"] == 0


def test_fp8_stored_samples_are_dequantized_with_their_scales(hs_copy, tiny_target_dir):
    from safetensors.torch import save_file

    from eagle3.train.draft_model import read_target_config
    from eagle3.extract.store import encode
    from eagle3.train.data import open_hidden_states

    conf = read_target_config(tiny_target_dir)
    ref = open_hidden_states(hs_copy, tiny_target_dir, conf, max_tokens=512).load_sample(0)
    path = hs_copy / "hidden_states" / "hs_0.safetensors"
    t = load_file(path)
    save_file({"token_ids": t["token_ids"], **encode(t["hidden_states"], "fp8")}, str(path))
    got = open_hidden_states(hs_copy, tiny_target_dir, conf, max_tokens=512).load_sample(0)
    for k in ("hidden_states", "verifier_last_hidden_states"):
        assert got[k].dtype == torch.bfloat16
        # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 of each row's amax (scale = amax / 448)
        err = (got[k].float() - ref[k].float()).abs().max()
        assert err <= ref[k].float().abs().max() / 16, (k, float(err))
        assert err > 0  # really quantized, not the bf16 path


def test_loader_worker_processes_give_the_same_run_and_report_a_bad_file(hs_dir, hs_copy, tmp_path):
    """train.loader_workers=2 (the CUDA default is 4) reads ahead in worker processes; the steps,
    losses and weights are those of the in-process reader, and a file error still stops training
    with its path."""
    runs = {}
    for workers in (0, 2):
        cfg = tiny_train_cfg(
            tmp_path / f"runs{workers}",
            "train.max_steps=5",
            "train.eval_every=5",
            f"train.loader_workers={workers}",
        )
        out = tmp_path / f"train{workers}"
        train(cfg, hs_dir, out, progress=False)
        runs[workers] = (
            [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()],
            load_file(out / "model.safetensors"),
        )
    (m0, w0), (m2, w2) = runs[0], runs[2]
    assert [(x["step"], x.get("train/loss"), x.get("val/loss")) for x in m0] == [
        (x["step"], x.get("train/loss"), x.get("val/loss")) for x in m2
    ]
    assert all(torch.equal(w0[k], w2[k]) for k in w0)
    bad = hs_copy / "hidden_states" / "hs_3.safetensors"
    bad.write_bytes(bad.read_bytes()[:100])  # truncated
    cfg = tiny_train_cfg(tmp_path / "runs-bad", "train.max_steps=20", "train.loader_workers=2")
    with pytest.raises(
        DataError,
        match=r"hs_3.safetensors: unreadable hidden-states file of sample 3 "
        r"\(SafetensorError",
    ):
        train(cfg, hs_copy, tmp_path / "train-bad", progress=False)


def test_batches_too_short_to_hold_any_loss_token_are_refused_before_training(
    tmp_path, tiny_target_dir
):
    """max_tokens_per_batch=16 cuts every sample (72-96 tokens, prompt = first quarter, >= 18
    tokens) before its first loss token: a loss of exactly 0 for the whole run used to pass silently
    and crash the decision step."""
    hs = build_hidden_states_dir(
        tmp_path / "hs", tiny_target_dir, num_samples=6, min_len=72, max_len=96
    )
    cfg = tiny_train_cfg(tmp_path / "runs", "train.max_tokens_per_batch=16", "train.max_steps=2")
    with pytest.raises(
        DataError,
        match=r"no loss-masked position within the first train.max_tokens_per_batch=16 "
        r"positions of any of the 4 train samples",
    ):
        train(cfg, hs, tmp_path / "t", progress=False)
    assert not (tmp_path / "t" / "model.safetensors").exists()
