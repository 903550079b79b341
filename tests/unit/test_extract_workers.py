"""Extraction workers (extract.num_gpus > 1: one spawned process per device; 2 CPU workers here)
cannot hang or die silently: a worker that never gets ready, or is killed, ends the extraction with
RankFailed naming it, and a re-run extracts only the shards still missing (faults injected by
testkit/faults.py)."""

from __future__ import annotations

import time

import pytest
import torch

from eagle3.errors import RankFailed
from eagle3.extract.stage import extract
from eagle3.extract.store import load_sample
from testkit.faults import fault_env
from tests.unit.test_extract import file_cfg, write_convs


@pytest.mark.slow
def test_a_killed_worker_is_named_and_a_rerun_extracts_the_rest(tiny_cfg, tmp_path, monkeypatch):
    src = write_convs(tmp_path / "c.jsonl", 8, words=12)
    single = extract(file_cfg(tiny_cfg, src, n=8, shard=2), tmp_path / "one", progress=False)
    cfg = file_cfg(tiny_cfg, src, n=8, shard=2, device="cpu", num_gpus=2)
    out = tmp_path / "two"
    with monkeypatch.context() as m:
        for k, v in fault_env(tmp_path / "site", "extract-kill:1").items():
            m.setenv(k, v)
        with pytest.raises(
            RankFailed
        ) as e:  # worker 1 (shards 1 and 3) dies after committing shard 1
            extract(cfg, out, progress=False)
    msg = str(e.value)
    assert (e.value.kind, e.value.ranks) == ("died", [1]), msg
    assert msg.startswith(
        "extraction: worker 1 of 2 (cpu, shards [1, 3]) failed (ended by SIGKILL); expected exit "
        "code 0"
    ), msg
    log = out / ".progress" / "workers" / "worker-1.log"
    assert f"Log: {log}" in msg and log.is_file() and "Committed shards are kept" in msg
    assert (out / ".progress" / "shard_1.json").is_file() and not (
        out / ".progress" / "shard_3.json"
    ).is_file()
    m = extract(cfg, out, progress=False)  # the same command again
    assert m["shards"]["resumed"] >= 1 and m["counts"] == single["counts"]
    assert not (
        out / ".progress" / "workers"
    ).exists()  # pids and times stay out of the hashed output
    for i in range(8):
        a, b = load_sample(tmp_path / "one", i), load_sample(out, i)
        assert torch.equal(a["token_ids"], b["token_ids"])
        torch.testing.assert_close(a["hidden_states"], b["hidden_states"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_worker_that_never_gets_ready_is_named_within_the_startup_deadline(
    tiny_cfg, tmp_path, monkeypatch
):
    src = write_convs(tmp_path / "c.jsonl", 4, words=12)
    cfg = file_cfg(tiny_cfg, src, n=4, shard=2, device="cpu", num_gpus=2)
    cfg.extract.startup_timeout_s = 30
    for k, v in fault_env(tmp_path / "site", "extract-hang:1").items():
        monkeypatch.setenv(k, v)
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as e:
        extract(cfg, tmp_path / "o", progress=False)
    waited = time.monotonic() - t0
    msg = str(e.value)
    assert (e.value.kind, e.value.ranks) == ("not_arrived", [1]), msg
    assert 30 <= waited < 30 + 60, waited
    assert msg.startswith(
        "extraction: worker 1 of 2 did not arrive (ready) within extract.startup_timeout_s=30 s"
    )
    assert "worker 1: started" in msg and "expected all 2 ready, got 1 of 2" in msg, msg
    stack = tmp_path / "o" / ".progress" / "workers" / "worker-1.stack.txt"
    assert stack.is_file() and "_sleep" in stack.read_text() or "py-spy" in stack.read_text()


def test_a_workers_thread_share_holds_inside_run_shards_only(tiny_target_dir, tmp_path):
    """A CPU worker's share of the cores (``num_threads``) must not stay on the calling process:
    float32 bits of a forward depend on the thread count on AVX2 CPUs, so a later extraction here
    would differ from a fresh one (seen as a resume-hash mismatch under pytest-xdist on an AVX2
    kernel set)."""
    from eagle3.extract.hf_backend import WorkerJob, run_shards
    from eagle3.extract.store import HS_DIR, make_shards

    (tmp_path / HS_DIR).mkdir()
    (tmp_path / ".progress").mkdir()
    ids = [[1, 2, 3, 4], [5, 6, 7]]
    job = WorkerJob(
        str(tiny_target_dir),
        "float32",
        "cpu",
        [1, 2],
        "float32",
        2,
        str(tmp_path),
        ["a", "b"],
        ids,
        [[0, 1, 1, 1], [0, 1, 1]],
        make_shards(2, 2),
        num_threads=1,
    )
    before = torch.get_num_threads()
    seen = []
    written = run_shards(job, on_progress=lambda n: seen.append(torch.get_num_threads()))
    assert seen == [1] and list(written) == [0]
    assert torch.get_num_threads() == before
