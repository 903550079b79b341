"""Exact resume after SIGKILL, LR continuity, and what a resume may not change."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from eagle3.errors import ConfigError, DataError
from eagle3.train.stage import train
from eagle3.train.state import lr_factor
from tests.conftest import REPO
from testkit.hs_fixture import build_hidden_states_dir, tiny_train_cfg

RESUME_OVERRIDES = [
    "train.epochs=2",
    "train.max_steps=13",
    "train.checkpoint_every=2",
    "train.eval_every=0",
    "train.max_tokens_per_batch=64",
    "train.warmup_steps=3",
    "train.keep_last=2",
]
KILL_AT = 5

CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from testkit.hs_fixture import tiny_train_cfg
    from eagle3.train.stage import train
    runs, hs, out, kill_at, *ov = sys.argv[1:]
    def on_metrics(m, step):
        if "train/loss" in m and step == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)
    train(tiny_train_cfg(Path(runs), *ov), Path(hs), Path(out), on_metrics=on_metrics,
          progress=False)
""")


@pytest.fixture(scope="module")
def hs_dir(tmp_path_factory, tiny_target_dir):
    return build_hidden_states_dir(
        tmp_path_factory.mktemp("hs") / "hs", tiny_target_dir, num_samples=14
    )


def _train_records(out):
    return {
        r["step"]: r
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    }


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_matches_uninterrupted_run(hs_dir, tmp_path):
    ref_out, cut_out = tmp_path / "ref", tmp_path / "cut"
    ref = train(
        tiny_train_cfg(tmp_path / "runs", *RESUME_OVERRIDES), hs_dir, ref_out, progress=False
    )
    per_epoch = ref["counts"]["micro_batches_per_epoch"]
    assert KILL_AT + 1 < per_epoch < ref["optimizer_steps"], (
        "the kill lands mid-epoch; the run crosses an epoch"
    )

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            str(tmp_path / "runs"),
            str(hs_dir),
            str(cut_out),
            str(KILL_AT),
            *RESUME_OVERRIDES,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    ckpts = sorted(p.name for p in (cut_out / "state").glob("ckpt-*"))
    assert ckpts[-1] == "ckpt-00000004"
    info = json.loads((cut_out / "state" / ckpts[-1] / "state.json").read_text())
    assert info["epoch"] == 0 and 0 < info["micro"] < per_epoch  # mid-epoch data position

    # the LR the resumed run starts with is the fresh schedule's value at that step
    from eagle3.train.stage import prepare

    cfg = tiny_train_cfg(tmp_path / "runs", *RESUME_OVERRIDES)
    run = prepare(
        cfg, hs_dir, cut_out, rank=0, world=1, device=torch.device("cpu"), on_metrics=None
    )
    fresh = torch.optim.lr_scheduler.LambdaLR(
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.train.lr),
        run.scheduler.lr_lambdas[0],
    )
    for _ in range(run.step):
        fresh.optimizer.step()
        fresh.step()
    assert run.step == 4
    assert run.optimizer.param_groups[0]["lr"] == pytest.approx(
        fresh.get_last_lr()[0], abs=0, rel=1e-12
    )
    assert run.optimizer.param_groups[0]["lr"] == pytest.approx(
        cfg.train.lr
        * lr_factor(
            4, schedule="epochs", warmup_steps=3, total_steps=2 * ref["counts"]["steps_per_epoch"]
        ),
        rel=1e-12,
    )  # cosine over 2 epochs

    resumed = train(cfg, hs_dir, cut_out, progress=False)
    assert resumed["optimizer_steps"] == ref["optimizer_steps"]
    a, b = load_file(ref_out / "model.safetensors"), load_file(cut_out / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k].double(), b[k].double(), rtol=0, atol=1e-6), k
    ra, rb = _train_records(ref_out), _train_records(cut_out)
    assert sorted(ra) == sorted(rb) == list(range(1, ref["optimizer_steps"] + 1))
    for step in ra:
        assert abs(ra[step]["train/loss"] - rb[step]["train/loss"]) <= 1e-6, step
        assert ra[step]["lr"] == pytest.approx(rb[step]["lr"], rel=1e-12), step


def test_resume_with_another_vocab_map_is_refused_unless_allowed(hs_dir, tmp_path):
    out = tmp_path / "t"
    train(
        tiny_train_cfg(
            tmp_path / "runs", "train.max_steps=2", "train.checkpoint_every=1", "train.epochs=5"
        ),
        hs_dir,
        out,
        progress=False,
    )
    other = shutil.copytree(hs_dir, tmp_path / "hs2")
    freq = torch.load(other / "token_freq.pt")
    torch.save(
        {**freq, **{t: 10_000 for t in range(1000, 1040)}}, other / "token_freq.pt"
    )  # 40 new ids on top
    cfg = tiny_train_cfg(
        tmp_path / "runs",
        "train.max_steps=3",
        "train.checkpoint_every=1",
        "train.epochs=5",
        "train.on_other_checkpoint=refuse",
    )
    with pytest.raises(DataError, match="vocab map hash .* differs.*allow_vocab_map_change"):
        train(cfg, other, out, progress=False)
    cfg2 = tiny_train_cfg(
        tmp_path / "runs",
        "train.max_steps=3",
        "train.checkpoint_every=1",
        "train.epochs=5",
        "train.allow_vocab_map_change=true",
    )
    man = train(cfg2, other, out, progress=False)
    assert man["optimizer_steps"] == 3
    sd = load_file(out / "model.safetensors")
    from eagle3.train.vocab import vocab_map_hash

    assert (
        vocab_map_hash(sd["d2t"], sd["t2d"])
        == man["vocab_map_hash"]
        != json.loads((out / "state" / "ckpt-00000002" / "state.json").read_text())[
            "vocab_map_hash"
        ]
    )


def test_resume_refuses_a_changed_seed_and_continues_with_a_constant_lr(hs_dir, tmp_path):
    out = tmp_path / "t"
    first = train(
        tiny_train_cfg(tmp_path / "runs", "train.max_steps=3", "train.eval_every=3"),
        hs_dir,
        out,
        progress=False,
    )
    with pytest.raises(ConfigError, match=r"train.seed is 1, the checkpoint was trained with 0"):
        train(
            tiny_train_cfg(
                tmp_path / "runs",
                "train.max_steps=3",
                "train.seed=1",
                "train.on_other_checkpoint=refuse",
            ),
            hs_dir,
            out,
            progress=False,
        )
    more = train(
        tiny_train_cfg(
            tmp_path / "runs",
            "train.schedule=constant",
            "train.max_steps=6",
            "train.eval_every=3",
            "train.lr=5e-4",
        ),
        hs_dir,
        out,
        progress=False,
    )
    assert first["optimizer_steps"] == 3 and more["optimizer_steps"] == 6
    recs = _train_records(out)
    assert [recs[s]["lr"] for s in (4, 5, 6)] == [5e-4] * 3


def test_a_failed_checkpoint_write_is_a_data_error_and_keeps_the_older_checkpoint(
    hs_dir, tmp_path, monkeypatch
):
    """A full disk during ``torch.save`` (the H200 run's
    ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``) stops training with the
    checkpoint folder, the cause and the free space named; the partial folder is gone and the
    previous checkpoint stays complete, so a re-run resumes from it."""
    import eagle3.train.state as ts

    real_save, calls = torch.save, []

    def save(obj, f, *a, **k):
        calls.append(str(f))
        if "ckpt-00000004" in str(f):
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos 1409292032 vs "
                "1409291924"
            )
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(ts.torch, "save", save)
    out = tmp_path / "t"
    cfg = tiny_train_cfg(
        tmp_path / "runs",
        "train.max_steps=6",
        "train.checkpoint_every=2",
        "train.eval_every=0",
        "train.keep_last=3",
    )
    with pytest.raises(
        DataError,
        match=r"ckpt-00000004: could not write the training checkpoint "
        r"\(RuntimeError: .*unexpected pos.*GiB free there\); the newest complete "
        r"checkpoint, ckpt-00000002, is kept",
    ):
        train(cfg, hs_dir, out, progress=False)
    left = sorted(p.name for p in (out / "state").iterdir())
    assert "ckpt-00000002" in left and not any("00000004" in n for n in left), left
    assert (out / "state" / "ckpt-00000002" / "optimizer.pt").is_file()


def test_a_state_file_where_the_checkpoint_folder_goes_is_refused_before_training(hs_dir, tmp_path):
    out = tmp_path / "t"
    out.mkdir()
    (out / "state").write_text("x")
    with pytest.raises(
        ConfigError, match=r"checkpoint dir .*/t/state: expected a directory, found a file"
    ):
        train(tiny_train_cfg(tmp_path / "runs", "train.max_steps=2"), hs_dir, out, progress=False)
    assert not (out / "metrics.jsonl").exists()  # refused before any step


def test_too_little_disk_for_the_checkpoints_is_refused_before_training(
    hs_dir, tmp_path, monkeypatch
):
    """The needed bytes (keep_last + 1 checkpoints of weights + AdamW moments, best/ and the export)
    are compared with the free space before the first step; the message gives both and the knob."""
    import collections

    import eagle3.train.state as ts

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(
        ts.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 2**20, 2**20)
    )  # 1 MiB free
    out = tmp_path / "t"
    with pytest.raises(
        DataError,
        match=r"/t/state: the run needs about [\d.]+ MiB for checkpoints "
        r"\(train.keep_last=2: 3 x [\d.]+ MiB .*only 1.0 MiB are free",
    ):
        train(
            tiny_train_cfg(tmp_path / "runs", "train.max_steps=2", "train.keep_last=2"),
            hs_dir,
            out,
            progress=False,
        )
    assert not (out / "metrics.jsonl").exists()
    import eagle3.train.stage as train_mod

    needs = []
    real_check = train_mod.check_checkpoint_space
    monkeypatch.setattr(
        train_mod, "check_checkpoint_space", lambda *a, **k: needs.append(real_check(*a, **k))
    )
    monkeypatch.setattr(ts.shutil, "disk_usage", lambda p: usage(10**12, 0, 10**12))
    train(
        tiny_train_cfg(
            tmp_path / "runs", "train.max_steps=2", "train.keep_last=2", "train.checkpoint_every=1"
        ),
        hs_dir,
        out,
        progress=False,
    )
    ckpt = max(p for p in (out / "state").iterdir() if p.name.startswith("ckpt-"))
    one = sum(
        f.stat().st_size for f in ckpt.iterdir() if f.name in ("model.safetensors", "optimizer.pt")
    )
    weights = (ckpt / "model.safetensors").stat().st_size
    # the estimate is the written sizes to within headers/pickling (a few %)
    assert needs and needs[0] == pytest.approx(3 * one + 2 * weights, rel=0.05), (
        needs,
        one,
        weights,
    )


@pytest.mark.parametrize("lost", ["optimizer.pt", "trainer.pt"])
def test_resume_from_a_checkpoint_missing_its_optimizer_or_scheduler_file_is_a_named_error(
    hs_dir, tmp_path, lost
):
    out = tmp_path / "t"
    train(
        tiny_train_cfg(
            tmp_path / "runs",
            "train.max_steps=2",
            "train.checkpoint_every=1",
            "train.keep_last=2",
            "train.epochs=5",
        ),
        hs_dir,
        out,
        progress=False,
    )
    newest = out / "state" / "ckpt-00000002"
    (newest / lost).unlink()
    cfg = tiny_train_cfg(
        tmp_path / "runs", "train.max_steps=3", "train.checkpoint_every=1", "train.epochs=5"
    )
    with pytest.raises(DataError) as e:  # was: FileNotFoundError from torch.load, with a traceback
        train(cfg, hs_dir, out, progress=False)
    msg = str(e.value)
    assert f"checkpoint {newest} is incomplete" in msg and f"missing ['{lost}']" in msg
    assert "previous complete checkpoint ckpt-00000001" in msg and "train.resume=false" in msg
    shutil.rmtree(newest)  # the way on that the message names
    assert train(cfg, hs_dir, out, progress=False)["optimizer_steps"] == 3


def test_a_checkpoint_of_other_inputs_is_another_training_and_restarts_from_step_0(
    hs_dir, tmp_path, caplog
):
    """The pipeline re-run with other data or frozen settings writes to the same train folder: its
    old state is not this training's (found by a new-user trial: -o data.num_conversations=24 failed
    on the old checkpoint)."""
    out = tmp_path / "t"
    train(
        tiny_train_cfg(tmp_path / "runs", "train.max_steps=3", "train.eval_every=3"),
        hs_dir,
        out,
        progress=False,
    )
    old = json.loads((out / "state" / "ckpt-00000003" / "state.json").read_text())
    with caplog.at_level("WARNING", logger="eagle3"):
        again = train(
            tiny_train_cfg(
                tmp_path / "runs", "train.max_steps=2", "train.eval_every=2", "train.seed=1"
            ),
            hs_dir,
            out,
            progress=False,
        )
    assert (
        again["optimizer_steps"] == 2
    )  # from step 0: a resume of the 3-step run would have nothing to do
    assert "not resuming: resume: train.seed is 1, the checkpoint was trained with 0" in caplog.text
    assert not (
        out / "state" / "ckpt-00000003"
    ).exists()  # the other training's checkpoints are gone
    assert sorted(_train_records(out)) == [1, 2]
    assert (
        json.loads((out / "state" / "ckpt-00000002" / "state.json").read_text())["train_config"][
            "seed"
        ]
        == 1
    )
    assert old["train_config"]["seed"] == 0
