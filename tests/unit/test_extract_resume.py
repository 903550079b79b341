"""Crash safety and data parallelism of extraction: SIGKILL at a random moment + resume, CPU
workers."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from eagle3.artifacts import content_hash
from eagle3.extract.stage import extract
from eagle3.extract.store import load_sample
from tests.unit.test_extract import file_cfg, write_convs

REPO = Path(__file__).resolve().parents[2]
CHILD = """
import sys
from pathlib import Path
from eagle3.config import RunConfig
from eagle3.extract.stage import extract
cfg = RunConfig.model_validate_json(Path(sys.argv[1]).read_text())
extract(cfg, Path(sys.argv[2]), progress=False)
"""


def _kill_at_random(
    cfg_json: Path, out: Path, after_shards: int, delay_s: float, timeout_s: float = 120
) -> str:
    """Start an extraction subprocess; once ``after_shards`` shards are committed (counting earlier
    runs'), SIGKILL it after ``delay_s`` seconds; return what it reached."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cfg_json), str(out)],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while len(list(out.glob(".progress/shard_*.json"))) < after_shards and proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("extraction subprocess did not start within the deadline")
            time.sleep(0.02)
        time.sleep(delay_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(
            f"child failed ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}"
        )
    proc.stderr.close()
    return (
        "finished"
        if proc.returncode == 0
        else f"killed after {len(list(out.glob('.progress/shard_*')))} shards"
    )


def _extract_in_fresh_process(cfg_json: Path, out: Path) -> dict:
    """One uninterrupted extraction in a new Python process; returns its manifest."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(cfg_json), str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise AssertionError(f"extraction failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.slow
def test_sigkill_at_random_moment_then_resume_gives_identical_hash(tiny_cfg, tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    cfg = file_cfg(
        tiny_cfg,
        write_convs(tmp_path / "c.jsonl", 40, words=20),
        n=40,
        shard=2,
        batch_size=2,
        max_seq_len=256,
    )
    cfg_json = tmp_path / "cfg.json"
    cfg_json.write_text(cfg.model_dump_json())
    # every extraction of this test runs in a fresh process (the reference, the killed ones, the
    # resume): float32 bits depend on torch's thread count on some CPUs, and this process's may have
    # been changed by earlier tests
    ref = _extract_in_fresh_process(cfg_json, tmp_path / "ref")
    out = tmp_path / "run"
    # first kill: in the middle of a random shard; second: anywhere from its first new shard to the
    # end
    first = rng.randint(1, 18)
    reached = [
        _kill_at_random(cfg_json, out, first, rng.uniform(0.0, 0.05)),
        _kill_at_random(cfg_json, out, first + 1, rng.uniform(0.0, ref["timings"]["extract_s"])),
    ]
    leftovers = list((out / "hidden_states").glob(".hs_*.tmp")) if out.exists() else []
    print(f"seed {seed}: {reached}; temporaries left by the kill: {len(leftovers)}")
    m = _extract_in_fresh_process(cfg_json, out)
    assert m["content_hash"] == ref["content_hash"] == content_hash(out), (seed, reached)
    assert not list((out / "hidden_states").glob(".hs_*.tmp"))
    assert len(list((out / "hidden_states").glob("hs_*.safetensors"))) == 40, (
        seed,
        reached,
        leftovers,
    )


@pytest.mark.slow
def test_cpu_data_parallel_workers_match_single_process(tiny_cfg, tmp_path):
    src = write_convs(tmp_path / "c.jsonl", 9, words=12)
    single = extract(file_cfg(tiny_cfg, src, n=9, shard=2), tmp_path / "one", progress=False)
    multi = extract(
        file_cfg(tiny_cfg, src, n=9, shard=2, device="cpu", num_gpus=2),
        tmp_path / "two",
        progress=False,
    )
    assert multi["counts"] == single["counts"] and multi["shards"]["total"] == 5
    assert (tmp_path / "one/data").exists() and sorted(
        p.name for p in (tmp_path / "two/.progress").iterdir()
    ) == sorted(p.name for p in (tmp_path / "one/.progress").iterdir())
    for i in range(9):
        a, b = load_sample(tmp_path / "one", i), load_sample(tmp_path / "two", i)
        assert torch.equal(a["token_ids"], b["token_ids"])
        torch.testing.assert_close(a["hidden_states"], b["hidden_states"], rtol=1e-5, atol=1e-5)
    marks = [
        json.loads(p.read_text()) for p in sorted((tmp_path / "two/.progress").glob("shard_*.json"))
    ]
    assert sorted(r for m in marks for r in range(*m["rows"])) == list(range(9))


def test_a_file_lost_after_the_run_finished_is_re_extracted_not_ignored(tiny_cfg, tmp_path):
    cfg = file_cfg(tiny_cfg, write_convs(tmp_path / "c.jsonl", 8, words=12), n=8, shard=2)
    ref = extract(cfg, tmp_path / "o", progress=False)
    lost = tmp_path / "o" / "hidden_states" / "hs_3.safetensors"
    lost.unlink()
    truncated = tmp_path / "o" / "hidden_states" / "hs_6.safetensors"
    truncated.write_bytes(truncated.read_bytes()[:64])
    m = extract(cfg, tmp_path / "o", progress=False)
    assert lost.is_file() and m["content_hash"] == ref["content_hash"] == content_hash(
        tmp_path / "o"
    )
    assert m["shards"] == {
        "total": 4,
        "resumed": 2,
    }  # only the two shards that lost a file ran again
    # rewritten in place, same size (e.g. a bad sector, a stray tool): found by mtime + content hash
    hit = tmp_path / "o" / "hidden_states" / "hs_0.safetensors"
    raw = bytearray(hit.read_bytes())
    raw[-200:] = b"\xff" * 200
    hit.write_bytes(bytes(raw))
    m = extract(cfg, tmp_path / "o", progress=False)
    assert m["content_hash"] == ref["content_hash"] == content_hash(tmp_path / "o")
    assert m["shards"] == {"total": 4, "resumed": 3}
    # only touched (same bytes, new mtime): intact after re-hashing, nothing re-extracted
    import os

    os.utime(hit)
    assert extract(cfg, tmp_path / "o", progress=False)["shards"] == {"total": 4, "resumed": 3}


def test_disk_full_inside_safetensors_is_a_data_error_and_leaves_no_temporary(
    tmp_path, monkeypatch
):
    """safetensors reports ENOSPC as its own error type, not OSError: still a DataError naming the
    file."""
    import safetensors.torch

    from eagle3.errors import DataError
    from eagle3.extract.store import write_sample

    def full_disk(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise RuntimeError(
            "Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
            '"No space left on device" })'
        )

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    target = tmp_path / "hs_0.safetensors"
    with pytest.raises(
        DataError,
        match=r"hs_0.safetensors: could not write hidden states \(RuntimeError: .*No "
        r"space left on device.*free disk space",
    ):
        write_sample(target, [1, 2], torch.zeros(2, 2, 4), "bfloat16")
    assert list(tmp_path.iterdir()) == []
