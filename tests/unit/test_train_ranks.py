"""A multi-process training run that cannot hang silently, and its resume after a rank is killed:
torchrun with 2 CPU processes on gloo, faults injected into one rank (testkit/faults.py). DDP and
FSDP."""

import json
import re
import time

import psutil
import pytest
import torch
from safetensors.torch import load_file

from eagle3.errors import RankFailed
from eagle3.train.launch import rank_logs
from eagle3.train.stage import train
from testkit.faults import fault_env
from testkit.hs_fixture import build_hidden_states_dir, tiny_train_cfg

COMMON = [
    "train.device=cpu",
    "train.draft_vocab_size=64",
    "train.max_steps=4",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.keep_last=3",
    "train.epochs=5",
    "train.num_gpus=2",
]


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_target_dir):
    root = tmp_path_factory.mktemp("ranks")
    return root, build_hidden_states_dir(root / "hs", tiny_target_dir, num_samples=10)


@pytest.fixture(scope="module")
def uninterrupted(work):
    """The reference of each device: the same 2-process DDP run, never interrupted (made once, on
    first use)."""
    root, hs = work
    made: dict = {}

    def ref(device: str):
        if device not in made:
            out = root / f"base-{device}"
            man = train(
                tiny_train_cfg(root / "runs", *COMMON, f"train.device={device}"),
                hs,
                out,
                progress=False,
            )
            made[device] = man, load_file(out / "model.safetensors")
        return made[device]

    return ref


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (NCCL)")


def _statuses(out):
    return [
        json.loads(p.read_text()) for p in sorted((out / "state" / "launch").glob("rank-*.json"))
    ]


def _gone(pids):
    return all(
        not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids
    )


@pytest.mark.slow
def test_a_rank_that_never_arrives_is_named_within_the_startup_deadline(work, monkeypatch):
    root, hs = work
    for k, v in fault_env(root / "site-never", "train-never-arrive:1").items():
        monkeypatch.setenv(k, v)
    out = root / "never"
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as e:
        train(
            tiny_train_cfg(root / "runs", *COMMON, "train.startup_timeout_s=40"),
            hs,
            out,
            progress=False,
        )
    waited = time.monotonic() - t0
    assert 40 <= waited < 40 + 45, waited  # the deadline, its poll and the teardown
    err = e.value
    msg = str(err)
    assert (err.kind, err.ranks) == ("not_arrived", [1]), msg
    assert msg.startswith(
        "train under torchrun: rank 1 of 2 did not arrive (ready) within "
        "train.startup_timeout_s=40 s"
    ), msg
    assert "expected all 2 ready, got 1 of 2" in msg and "rank 1: started" in msg, msg
    assert "rank 0: waiting at the rendezvous" in msg, msg
    assert str(out / "state" / "launch" / "rank-1.stack.txt") in msg or "Stacks" not in msg
    assert all(p.name.endswith(".log") for p in err.logs[1]) and err.logs[1], (
        err.logs
    )  # torchrun's rank log
    assert _gone([s["pid"] for s in _statuses(out)])  # no rank outlives the error


@pytest.mark.slow
@pytest.mark.parametrize(
    "device,mode",
    [
        ("cpu", "ddp"),
        ("cpu", "fsdp"),
        pytest.param("cuda", "ddp", marks=TWO_GPUS),
        pytest.param("cuda", "fsdp", marks=TWO_GPUS),
    ],
)
def test_a_rank_killed_mid_run_is_named_and_a_rerun_resumes_to_the_uninterrupted_result(
    work, uninterrupted, monkeypatch, device, mode
):
    """On the CPU: gloo, 2 processes. On 2 GPUs: NCCL, the same test (run where such a machine is
    lent)."""
    root, hs = work
    cfg = tiny_train_cfg(
        root / "runs", *COMMON, f"train.device={device}", f"train.distributed={mode}"
    )
    out = root / f"killed-{device}-{mode}"
    with monkeypatch.context() as m:
        for k, v in fault_env(root / f"site-kill-{device}-{mode}", "train-kill:1:3").items():
            m.setenv(k, v)
        with pytest.raises(
            RankFailed
        ) as e:  # rank 1 dies after step 3, before the checkpoint of step 4
            train(cfg, hs, out, progress=False)
    msg = str(e.value)
    assert (e.value.kind, e.value.ranks) == ("died", [1]), msg
    assert (
        "rank 1 of 2 failed first (ended by SIGKILL (killed: the OOM killer, a preemption or a "
        "kill))" in msg
    )
    assert re.search(r"rank 1: step [123] \(", msg), (
        msg
    )  # its last recorded step (written at most once a second)
    assert (
        f"{out / 'state' / 'ckpt-00000002'}: re-running the same command resumes from it" in msg
    ), msg
    assert _gone([s["pid"] for s in _statuses(out)])
    man = train(cfg, hs, out, progress=False)  # the same command again
    assert man["optimizer_steps"] == 4 and man["world_size"] == 2
    rank0 = [p for p in rank_logs(out / "state" / "launch", 2)[0] if p.name == "stderr.log"][
        0
    ].read_text()
    assert f"resuming from {out / 'state' / 'ckpt-00000002'}" in rank0  # not started over
    info = json.loads((out / "state" / "ckpt-00000004" / "state.json").read_text())
    assert info["distributed"] == mode
    ref_man, ref = uninterrupted(device)
    got = load_file(out / "model.safetensors")
    assert sorted(got) == sorted(ref)
    if mode == "ddp" and device == "cpu":  # the same arithmetic in the same order: bit for bit
        assert all(torch.equal(got[k], ref[k]) for k in ref), [
            k for k in ref if not torch.equal(got[k], ref[k])
        ]
        assert man["metrics"]["final_eval"] == ref_man["metrics"]["final_eval"]
    # fsdp: reduce-scatter instead of all-reduce; CUDA: kernels free to reorder sums; equal up to
    # rounding
    else:
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-5)
        fe, rfe = man["metrics"]["final_eval"], ref_man["metrics"]["final_eval"]
        assert fe["val/loss"] == pytest.approx(rfe["val/loss"], rel=1e-4)
    if mode == "fsdp":
        moments = torch.load(out / "state" / "ckpt-00000004" / "optimizer.pt", weights_only=True)
        assert (
            "fc.weight" in moments["state"]
        )  # torch's full optimizer state dict, keyed by parameter name


def test_resume_in_another_distributed_mode_is_refused(tmp_path):
    from eagle3.train.state import resume_conflict

    cfg = tiny_train_cfg(tmp_path, "train.num_gpus=2", "train.distributed=fsdp")
    info = {
        "vocab_map_hash": "v",
        "data_content_hash": "d",
        "flags": {},
        "world_size": 2,
    }  # before the key existed
    ident = {**info, "distributed": "fsdp"}
    problem = resume_conflict(info, ident, cfg, tmp_path / "ckpt-00000002")
    assert type(problem).__name__ == "ConfigError"
    assert "train.distributed='fsdp', the checkpoint was written under 'ddp'" in str(problem)
    # same mode: allowed
    assert resume_conflict({**info, "distributed": "fsdp"}, ident, cfg,
                           tmp_path / "ckpt-00000002") is None
