"""extract.mode=online: training computes the hidden states itself (eagle3.train.online).

The same samples and order give the same draft as offline training on the stored states; a SIGKILL
mid-run resumes to the uninterrupted run's weights; offline configs keep their keys; a changed
extract setting changes what keys training; the task reports the online figures."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3.config import load_config
from eagle3.errors import ConfigError, DataError
from eagle3.extract.stage import extract
from eagle3.train.data import read_ahead_groups
from eagle3.train.stage import train
from tests.conftest import REPO

CONFIG = REPO / "configs" / "tiny-random.yaml"
BASE = [
    "data.num_conversations=12",
    "data.max_seq_len=64",
    "train.draft_vocab_size=32",
    "train.max_tokens_per_batch=64",
    "train.epochs=2",
    "train.log_every=1",
]


# extract.mode=cached: about 4 of the 11 train samples' states (64 tokens x 4 slots x 64 x float32)
WINDOW = ["extract.cache_max_gb=0.0003"]


def _cfg(runs: Path, mode: str, *more: str):
    window = WINDOW if mode == "cached" else []
    return load_config(
        CONFIG, [f"paths.runs_dir={runs}", *BASE, f"extract.mode={mode}", *window, *more]
    )


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    """{mode: (runs dir, extract dir, manifest)} of an offline, an online and a cached
    extraction."""
    root = tmp_path_factory.mktemp("online")
    out = {}
    for mode in ("offline", "online", "cached"):
        d = root / mode / "extract"
        out[mode] = (root / "runs", d, extract(_cfg(root / "runs", mode), d, progress=False))
    return out


def _weights_close(a_dir: Path, b_dir: Path, atol: float) -> None:
    a, b = load_file(a_dir / "model.safetensors"), load_file(b_dir / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k].double(), b[k].double(), rtol=0, atol=atol), k


def _losses(out: Path) -> dict[int, float]:
    rows = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["train/loss"] for r in rows if r["kind"] == "train"}


def test_online_writes_no_hidden_states_and_records_what_offline_would(extracted):
    _, off_dir, off = extracted["offline"]
    _, on_dir, on = extracted["online"]
    assert "mode" not in off and (off_dir / "hidden_states").is_dir() and off["bytes"] > 0
    assert on["mode"] == "online" and on["folded_into"] == "train" and on["bytes"] == 0
    assert not (on_dir / "hidden_states").exists()
    assert not list(on_dir.rglob("*.safetensors"))
    # same tokenized samples, same split, same vocabulary counts
    for key in ("splits", "aux_layer_ids", "counts", "target", "dtype"):
        assert on[key] == off[key], key
    assert torch.load(on_dir / "token_freq.pt") == torch.load(off_dir / "token_freq.pt")
    # the estimate is the sample files' payload (offline adds a safetensors header per file)
    assert 0.97 * off["bytes"] <= on["offline_bytes_estimate"] <= off["bytes"]


def test_online_training_gives_the_offline_draft(extracted, tmp_path):
    runs, off_dir, _ = extracted["offline"]
    _, on_dir, on_extract = extracted["online"]
    off = train(_cfg(runs, "offline"), off_dir, tmp_path / "off", progress=False)
    on = train(_cfg(runs, "online"), on_dir, tmp_path / "on", progress=False)
    assert on["optimizer_steps"] == off["optimizer_steps"] > 0
    _weights_close(tmp_path / "off", tmp_path / "on", atol=1e-5)  # float32 on a CPU
    lo, ln = _losses(tmp_path / "off"), _losses(tmp_path / "on")
    assert lo.keys() == ln.keys()
    assert all(abs(lo[s] - ln[s]) <= 1e-5 for s in lo)
    assert "online" not in off
    fig = on["online"]
    assert fig["hidden_state_bytes_on_disk"] == 0
    assert fig["offline_bytes_estimate"] == on_extract["offline_bytes_estimate"]
    # 2 epochs of the train split, plus the evaluations' validation samples
    assert fig["tokens_recomputed"] >= 2 * fig["tokens_per_epoch"] > 0
    assert fig["extract_tokens_per_s"] > 0
    steps = [json.loads(r) for r in (tmp_path / "on" / "metrics.jsonl").read_text().splitlines()]
    rates = [
        r["extract/tokens_per_s"]
        for r in steps
        if r["kind"] == "train" and "extract/tokens_per_s" in r
    ]
    assert rates and all(x > 0 for x in rates)


def test_next_micro_batches_share_one_target_forward(extracted, tmp_path):
    """A micro-batch of this config holds one or two samples; the target computes the samples of
    consecutive micro-batches together, extract.batch_size (4) at a time."""
    runs, _, _ = extracted["online"]
    _, on_dir, _ = extracted["online"]
    on = train(_cfg(runs, "online"), on_dir, tmp_path / "on", progress=False)
    fig = on["online"]
    assert on["optimizer_steps"] >= 8
    assert fig["target_forwards"] <= on["optimizer_steps"] // 2


def _open_online(extracted):
    from eagle3.assets import resolve_target
    from eagle3.train.draft_model import read_target_config
    from eagle3.train.online import open_online

    runs, on_dir, _ = extracted["online"]
    target = resolve_target(_cfg(runs, "online"))
    return open_online(
        on_dir,
        target,
        read_target_config(target),
        max_tokens=64,
        device=torch.device("cpu"),
        warn=False,
    )


def test_counters_cover_the_whole_training_across_a_resume(extracted):
    from eagle3.train.online import OnlineStats

    data = _open_online(extracted)
    data.stats = OnlineStats(tokens=100, seconds=1.0, forwards=2)
    assert data.take_window() == {"extract/tokens_recomputed": 100.0, "extract/tokens_per_s": 100.0}
    data.stats.tokens, data.stats.seconds = 400, 2.0
    # the rate of the whole training, not of the last window (300 tokens in 1 s): the last one
    # logged is the manifest's
    assert data.take_window()["extract/tokens_per_s"] == 200.0
    assert data.summary(None)["extract_tokens_per_s"] == 200.0
    info = json.loads(json.dumps(data.checkpoint_info()))  # as state.json keeps it

    resumed = _open_online(extracted)
    resumed.restore(info)
    one = int(resumed.input_ids[resumed.train_ids[0]].numel())
    resumed.load_samples([resumed.train_ids[0]])
    s = resumed.summary(None)
    assert (s["tokens_recomputed"], s["target_forwards"]) == (400 + one, 3)
    assert s["target_forward_s"] > 2.0
    resumed.restore({"online_tokens_recomputed": 7})  # a checkpoint with only the token count
    assert (resumed.stats.tokens, resumed.stats.forwards, resumed.stats.seconds) == (7, 0, 0.0)


def test_window_hits_are_kept_across_a_resume(extracted, tmp_path):
    from eagle3.assets import resolve_target
    from eagle3.train.draft_model import read_target_config
    from eagle3.train.online import open_online

    runs, cached_dir, _ = extracted["cached"]
    target = resolve_target(_cfg(runs, "cached"))
    data = open_online(
        cached_dir,
        target,
        read_target_config(target),
        max_tokens=64,
        device=torch.device("cpu"),
        cache_dir=tmp_path / "win",
        warn=False,
    )
    data.restore(
        {"online_tokens_recomputed": 50, "online_cache_hits": 3, "online_cache_hit_tokens": 99}
    )
    s = data.summary(None)
    assert (s["tokens_recomputed"], s["cache_hits"], s["cache_hit_tokens"]) == (50, 3, 99)
    info = data.checkpoint_info()
    assert (info["online_cache_hits"], info["online_cache_hit_tokens"]) == (3, 99)


def test_read_ahead_groups_keep_order_and_bound_the_samples():
    batches = [[0], [1, 2], [3], [4, 5, 6, 7, 8], [9], [10]]
    assert list(read_ahead_groups(batches, 4)) == [
        [[0], [1, 2], [3]],
        [[4, 5, 6, 7, 8]],
        [[9], [10]],
    ]
    assert list(read_ahead_groups(batches, 0)) == [[b] for b in batches]
    assert list(read_ahead_groups([], 4)) == []


def test_offline_settings_keep_their_keys(tmp_path):
    from tasks.stage_config import sections_hash, settings_digest

    plain = load_config(CONFIG, [f"paths.runs_dir={tmp_path}"])
    offline = load_config(CONFIG, [f"paths.runs_dir={tmp_path}", "extract.mode=offline"])
    online = load_config(CONFIG, [f"paths.runs_dir={tmp_path}", "extract.mode=online"])
    assert plain.extract.mode == "offline"
    # a config that does not name the mode hashes as it did before the field existed
    assert "mode" not in plain.extract.model_dump(mode="json")
    assert "mode" not in plain.model_dump(mode="json")["extract"]
    assert "cache_max_gb" not in plain.model_dump(mode="json")["extract"]
    assert sections_hash(plain, "extract") == sections_hash(offline, "extract")
    assert sections_hash(online, "extract") != sections_hash(plain, "extract")
    assert settings_digest(online, ("extract", "train")) != settings_digest(
        plain, ("extract", "train")
    )


def test_a_changed_extract_setting_changes_what_keys_training(extracted, tmp_path):
    from eagle3.artifacts import content_hash
    from tasks import caching

    runs, on_dir, on = extracted["online"]
    other_dir = tmp_path / "extract"
    other = extract(
        _cfg(runs, "online", "extract.aux_layer_ids=[1,4,5]"), other_dir, progress=False
    )
    # the same tokens, so data/ is byte-identical: online.json carries the setting
    assert content_hash(other_dir / "data") == content_hash(on_dir / "data")
    assert other["content_hash"] != on["content_hash"]
    cfg = _cfg(runs, "online")
    out = tmp_path / "train"
    assert caching.stage_key("train", cfg, out, inputs={"data": other_dir}) != caching.stage_key(
        "train", cfg, out, inputs={"data": on_dir}
    )


def test_refusals(extracted, tmp_path):
    from eagle3.assets import resolve_target
    from eagle3.train.data import open_hidden_states
    from eagle3.train.draft_model import read_target_config
    from eagle3.train.online import open_online

    runs, on_dir, _ = extracted["online"]
    _, off_dir, _ = extracted["offline"]
    target = resolve_target(_cfg(runs, "online"))
    conf = read_target_config(target)
    with pytest.raises(DataError, match="mode expected 'offline'.*got 'online'"):
        open_hidden_states(on_dir, target, conf, max_tokens=64)
    with pytest.raises(DataError, match="mode expected 'online' or 'cached', got 'offline'"):
        open_online(off_dir, target, conf, max_tokens=64, device=torch.device("cpu"))
    edited = tmp_path / "edited"
    import shutil

    shutil.copytree(on_dir, edited)
    spec = json.loads((edited / "online.json").read_text())
    (edited / "online.json").write_text(json.dumps({**spec, "dtype": "bfloat16"}))
    with pytest.raises(DataError, match=r"online.json: dtype expected 'float32'.*got 'bfloat16'"):
        open_online(edited, target, conf, max_tokens=64, device=torch.device("cpu"))
    with pytest.raises(ConfigError, match="extract.backend: expected .hf. with extract.mode="):
        extract(_cfg(runs, "online", "extract.backend=sglang"), tmp_path / "x", progress=False)


def test_cached_window_recomputes_only_what_fell_out_of_it(extracted, tmp_path):
    runs, off_dir, _ = extracted["offline"]
    _, on_dir, _ = extracted["online"]
    _, cached_dir, ex = extracted["cached"]
    cfg = _cfg(runs, "cached")
    assert ex["mode"] == "cached" and ex["online"]["cache_max_bytes"] == 300_000
    assert not (cached_dir / "hidden_states").exists()
    off = train(_cfg(runs, "offline"), off_dir, tmp_path / "off", progress=False)
    on = train(_cfg(runs, "online"), on_dir, tmp_path / "on", progress=False)
    got = train(cfg, cached_dir, tmp_path / "cached", progress=False)
    assert got["optimizer_steps"] == off["optimizer_steps"]
    _weights_close(tmp_path / "off", tmp_path / "cached", atol=1e-5)
    fig = got["online"]
    assert 0 < fig["cache_bytes"] <= fig["cache_max_bytes"] == 300_000
    assert (
        0
        < fig["cache_samples"]
        < len(json.loads((cached_dir / "manifest.json").read_text())["splits"]["train"])
    )
    # every token asked for was either read from the window or recomputed
    assert fig["cache_hit_tokens"] > 0
    assert fig["tokens_recomputed"] + fig["cache_hit_tokens"] == on["online"]["tokens_recomputed"]
    assert fig["tokens_recomputed"] < on["online"]["tokens_recomputed"]
    assert not list((tmp_path / "cached" / "state").glob("hs_cache*"))  # removed when finished
    with pytest.raises(ConfigError, match="extract.cache_max_gb: expected the window's size"):
        load_config(CONFIG, [f"paths.runs_dir={runs}", "extract.mode=cached"])


def test_train_task_reports_the_online_figures(extracted, tmp_path):
    from tasks.train import online_metrics

    assert online_metrics(
        {
            "online": {
                "hidden_state_bytes_on_disk": 0,
                "tokens_recomputed": 10,
                "offline_bytes_estimate": 99,
                "store_dtype": "float32",
                "extract_tokens_per_s": 5.0,
                "cache_hits": 3,
            }
        }
    ) == {
        "hidden_state_bytes_on_disk": 0.0,
        "extract/tokens_recomputed": 10.0,
        "offline_bytes_estimate": 99.0,
        "cache_hits": 3.0,
    }
    assert online_metrics({"optimizer_steps": 3}) == {}


RESUME = [
    "train.max_steps=14",
    "train.checkpoint_every=2",
    "train.eval_every=0",
    "train.warmup_steps=3",
    "train.keep_last=2",
    "train.export=last",
]
KILL_AT = 5

CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import torch
    from eagle3.config import load_config
    from eagle3.train.stage import train
    threads, config, hs, out, kill_at, *ov = sys.argv[1:]
    torch.set_num_threads(int(threads))
    def on_metrics(m, step):
        if "train/loss" in m and step == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)
    train(load_config(config, ov), Path(hs), Path(out), on_metrics=on_metrics, progress=False)
""")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["online", "cached"])
def test_sigkill_mid_online_run_then_resume_matches_uninterrupted(extracted, tmp_path, mode):
    runs, on_dir, _ = extracted[mode]
    cfg = _cfg(runs, mode, *RESUME)
    ref = train(cfg, on_dir, tmp_path / "ref", progress=False)
    per_epoch = ref["counts"]["micro_batches_per_epoch"]
    assert KILL_AT + 1 < per_epoch < ref["optimizer_steps"], "killed mid-epoch, crossing one"

    cut = tmp_path / "cut"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    ov = [
        f"paths.runs_dir={runs}",
        *BASE,
        f"extract.mode={mode}",
        *(WINDOW if mode == "cached" else []),
        *RESUME,
    ]
    proc = subprocess.Popen(
        [
            sys.executable,
            str(script),
            str(torch.get_num_threads()),
            str(CONFIG),
            str(on_dir),
            str(cut),
            str(KILL_AT),
            *ov,
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    ckpts = sorted(p.name for p in (cut / "state").glob("ckpt-*"))
    assert ckpts[-1] == "ckpt-00000004"
    info = json.loads((cut / "state" / ckpts[-1] / "state.json").read_text())
    assert info["epoch"] == 0 and 0 < info["micro"] < per_epoch  # the data position
    assert info["online_tokens_recomputed"] > 0
    if mode == "cached":  # the killed run's window is still there, and the resume reads it
        assert list((cut / "state" / "hs_cache-rank0").glob("hs_*.safetensors"))

    resumed = train(cfg, on_dir, cut, progress=False)
    assert resumed["optimizer_steps"] == ref["optimizer_steps"]
    _weights_close(tmp_path / "ref", cut, atol=1e-6)
    lr, lc = _losses(tmp_path / "ref"), _losses(cut)
    assert sorted(lr) == sorted(lc) == list(range(1, ref["optimizer_steps"] + 1))
    assert all(abs(lr[s] - lc[s]) <= 1e-6 for s in lr)
    assert resumed["online"]["tokens_recomputed"] > info["online_tokens_recomputed"]
    assert resumed["online"]["target_forwards"] > info["online_target_forwards"] > 0
    assert resumed["online"]["target_forward_s"] > info["online_target_forward_s"] > 0
    if mode == "cached":
        assert resumed["online"]["cache_hit_tokens"] > 0
    # every token the training needed was computed or read from the window, counted once
    needed = [
        r["online"]["tokens_recomputed"] + r["online"].get("cache_hit_tokens", 0)
        for r in (ref, resumed)
    ]
    assert needed[0] == needed[1]


def test_lab_benchmark_writes_its_results(tmp_path):
    out = tmp_path / "r.json"
    ov = [x for o in BASE[:4] for x in ("-o", o)]
    r = subprocess.run(
        [
            sys.executable,
            "lab/online_vs_offline.py",
            str(CONFIG),
            "--epochs",
            "1",
            "--modes",
            "online",
            "--device",
            "cpu",
            "--work",
            str(tmp_path / "w"),
            "--out",
            str(out),
            *ov,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (case,) = json.loads(out.read_text())["cases"]
    assert case["mode"] == "online" and case["disk_bytes"]["hidden_states"] == 0
    assert case["tokens"]["target_tokens_computed"] >= case["tokens"]["samples"] > 0
    assert case["seconds"]["total"] > 0 and case["peak_gpu_bytes"] is None
    assert len(case["load_average_1_5_15min"]["after"]) == 3 and case["cpu_count"] >= 1


def test_a_window_larger_than_the_free_disk_is_refused(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from eagle3.errors import DataError
    from eagle3.train.online import _check_window_disk
    from eagle3.train.online_cache import StateCache

    cache = StateCache(tmp_path / "window", 10**14, "id")  # 100 TB
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(10**12, 0, 5 * 10**9))
    with pytest.raises(
        DataError,
        match=r"extract.cache_max_gb: expected a window that fits the "
        r"free disk of .*window \(5,000,000,000 bytes free, 0 already in it\), "
        r"got 100000 GB, of which this data fills about 100,000,000,000,000 bytes",
    ):
        _check_window_disk(cache, None)
    _check_window_disk(cache, 4 * 10**9)  # the data fills 4 GB of it: fits
    with pytest.raises(DataError, match="fills about 6,000,000,000 bytes"):
        _check_window_disk(cache, 6 * 10**9)


def test_the_checkpoints_space_check_counts_the_window(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from eagle3.errors import DataError
    from eagle3.train.state import check_checkpoint_space

    model = torch.nn.Linear(256, 256)  # 257 kB of float32 weights
    state = tmp_path / "state"
    state.mkdir()
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(10**9, 0, 3 * 2**20))
    need = check_checkpoint_space(state, model, keep_last=1)
    assert need < 3 * 2**20  # the checkpoints alone fit
    with pytest.raises(
        DataError,
        match=r"plus 2\.0 MiB for the window of states, "
        r"extract.cache_max_gb\), but only 3\.0 MiB are free .* or "
        r"extract.cache_max_gb$",
    ):
        check_checkpoint_space(state, model, keep_last=1, window_bytes=2 * 2**20)
