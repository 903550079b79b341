"""lab/gpu_study.py across machines: ``--store-copy`` packs the MLflow store with the sweep run's
id, ``--store-from`` unpacks it on a fresh machine under the same ``--work`` and the sweep goes on
from that run; a file that is not such a copy, another ``--work`` or a store already there is
refused before any stage runs."""

import json
import lzma
import subprocess
import sys

import pytest

from eagle3.config import load_config
from tests.conftest import CONFIGS, REPO


def _study_store(work):
    """An MLflow store as a study leaves it: a sweep run with one finished point, an artifact and
    a weights file beside it."""
    from tasks import tracking

    cfg = load_config(CONFIGS / "tiny-random.yaml", [f"paths.runs_dir={work / 'runs'}"])
    client, exp = tracking.client_for(cfg)
    sweep = client.create_run(exp).info.run_id
    point = client.create_run(exp, tags={"eagle3.sweep_run_id": sweep}).info.run_id
    client.log_metric(point, "dev/acceptance_length", 1.75, step=10)
    client.log_text(point, "table", "sweep_table.md")
    arts = work / "runs" / "mlartifacts"
    next(arts.rglob("sweep_table.md")).with_name("model.safetensors").write_bytes(b"w" * 64)
    return cfg, sweep, point


def test_the_store_goes_to_a_fresh_machine_and_its_sweep_run_goes_on(tmp_path):
    from lab.study_store import read_store_record, restore_store, write_store_copy
    from tasks import tracking

    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    cfg, sweep, point = _study_store(work)
    plan = {"data": {"as-is": []}, "schedules": {"c": ["train.epochs=1"]}, "points": []}
    copy = write_store_copy(work, out, sweep, plan)
    assert copy == out / "mlflow_store.tar.xz"
    assert read_store_record(copy) == {
        "sweep_run_id": sweep,
        "work": str(work.resolve()),
        "plan": {"data": plan["data"], "schedules": plan["schedules"]},
    }

    import shutil

    shutil.rmtree(work)  # the next machine starts without it
    changed = {**plan, "schedules": {"c": ["train.epochs=2"], "new": []}}
    with pytest.raises(
        ValueError,
        match=r"schedules.c was \['train.epochs=1'\] in the copy's "
        r"plan, got \['train.epochs=2'\]",
    ):
        restore_store(copy, work, changed)
    assert not (work / "runs").exists()  # refused before anything is unpacked
    partial = restore_store(copy, work, {**plan, "schedules": {**plan["schedules"], "new": []}})
    assert partial["parent_run_id"] == sweep and partial["from"] == str(copy)
    assert partial["mlflow_uri"] == tracking.tracking_uri(cfg)
    client, _ = tracking.client_for(cfg)
    assert [
        (m.step, m.value) for m in client.get_metric_history(point, "dev/acceptance_length")
    ] == [(10, 1.75)]
    assert list((work / "runs").rglob("sweep_table.md"))
    assert not list((work / "runs").rglob("*.safetensors"))  # records travel, weights do not
    assert not (work / "runs" / "study.json").exists()
    with pytest.raises(ValueError, match=r"mlflow.db exists already; start from an empty --work"):
        restore_store(copy, work)
    with pytest.raises(ValueError, match=rf"made under --work {work.resolve()}, got --work "):
        restore_store(copy, tmp_path / "elsewhere")


def test_no_store_or_no_sweep_run_no_copy(tmp_path, capsys):
    from lab.study_store import write_store_copy

    out = tmp_path / "out"
    out.mkdir()
    assert write_store_copy(tmp_path / "work", out, "x") is None
    assert not list(out.iterdir())
    _study_store(tmp_path / "work")
    (out / "mlflow_store.tar.xz").write_bytes(b"an earlier call's copy")
    assert write_store_copy(tmp_path / "work", out, None) is None  # could not be continued
    assert (out / "mlflow_store.tar.xz").read_bytes() == b"an earlier call's copy"
    assert (
        f"store copy: not written (no sweep run recorded in {tmp_path / 'work'}); "
        f"{out / 'mlflow_store.tar.xz'} is an earlier call's"
    ) in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["text", "cut", "no-record", "not-sqlite"])
def test_a_file_that_is_not_a_store_copy_is_refused_before_any_stage(tmp_path, kind):
    import io
    import tarfile

    bad = tmp_path / "mlflow_store.tar.xz"
    if kind == "text":
        bad.write_text("not a tar")
    else:
        buf = io.BytesIO()
        db = b"random bytes, not SQLite" if kind == "not-sqlite" else b"SQLite format 3\x00"
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in (("mlflow.db", db), ("study.json", b'{"sweep_run_id": "S"}')):
                if name == "study.json" and kind == "no-record":
                    continue
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        data = lzma.compress(buf.getvalue())
        bad.write_bytes(data[:30] if kind == "cut" else data)
    r = subprocess.run(
        [
            sys.executable,
            "lab/gpu_study.py",
            "--tiny",
            "--device",
            "cpu",
            "--work",
            str(tmp_path / "w"),
            "--store-from",
            str(bad),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"--store-from {bad}: expected" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "w").exists()
    if kind == "no-record":
        assert "expected mlflow.db and study.json with a sweep_run_id" in r.stderr
    if kind == "not-sqlite":
        assert "its mlflow.db is not an SQLite database" in r.stderr


def test_the_rebuild_command_trains_the_point_into_its_own_run_folder(tmp_path):
    import shlex

    from lab.gpu_study import base_overrides, parse_args
    from lab.study_inputs import rebuild_command

    plan = REPO / "lab" / "plans" / "study-at-scale-tiny.json"
    a = parse_args(["--tiny", "--device", "cpu", "--plan", str(plan)])
    base = base_overrides(a, tmp_path, None, tmp_path / "pool.jsonl")
    row = {
        "point": "regenerated-n6-cosine-s-n6",
        "data": "regenerated",
        "data_size": 6,
        "schedule": "cosine-s-n6",
    }
    words = shlex.split(rebuild_command(a, base, {"path": "/x/regen.jsonl"}, row))
    assert words[:3] == ["eagle3", "run", str(CONFIGS / "tiny-random.yaml")]
    assert words[3::2] == ["-o"] * (len(words[3:]) // 2)
    cfg = load_config(words[2], words[4::2])
    assert cfg.name == "tiny-random-regenerated-n6-cosine-s-n6"
    assert cfg.run_dir() == tmp_path / "runs" / cfg.name  # where the sweep ran it
    assert (cfg.data.path, cfg.data.num_conversations) == ("/x/regen.jsonl", 6)
    assert (cfg.train.schedule, cfg.train.epochs, cfg.train.max_steps) == ("epochs", 4.0, 12)


def test_a_store_that_cannot_be_restored_stops_the_study_before_the_sweep(
    tmp_path, monkeypatch, capsys
):
    import lab.gpu_study as G
    from lab import study_inputs
    from lab.study_store import write_store_copy

    work = tmp_path / "work"
    _study_store(work)
    copy = write_store_copy(work, tmp_path, "S")
    argv = ["--tiny", "--device", "cpu", "--work", str(work), "--store-from", str(copy), "--quiet"]
    with pytest.raises(SystemExit) as e:  # the store is still in --work: refused up front
        G.main(argv)
    assert e.value.code == 2 and "exists already" in capsys.readouterr().err
    import shutil

    shutil.rmtree(work)
    swept = []
    monkeypatch.setattr(G, "do_sweep", lambda *a: swept.append(a))
    monkeypatch.setattr(study_inputs, "_cached_sharegpt", lambda work: str(copy))
    monkeypatch.setattr(G, "do_regen", lambda *a: {"path": "r"})

    def unpack_fails(*a):
        raise ValueError("unpacking failed")

    monkeypatch.setattr(G, "restore_store", unpack_fails)
    assert G.main([*argv, "--store-copy"]) == 1 and swept == []
    assert not (tmp_path / "work" / "mlflow_store.tar.xz").exists()  # no copy of nothing


def test_a_copy_with_an_escaping_member_leaves_nothing_unpacked(tmp_path):
    import io
    import tarfile

    from lab.study_store import restore_store

    work = tmp_path / "work"
    bad = tmp_path / "mlflow_store.tar.xz"
    with tarfile.open(bad, "w:xz") as tar:
        for name, data in (
            ("mlflow.db", b"SQLite format 3\x00"),
            ("mlartifacts/a.txt", b"a"),
            ("../../escape.txt", b"x"),
            ("study.json", json.dumps({"sweep_run_id": "S", "work": str(work.resolve())}).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.TarError):
        restore_store(bad, work)
    assert list((work / "runs").iterdir()) == [] and not (work / ".store-restoring").exists()
    assert not (tmp_path.parent / "escape.txt").exists()
    assert not (work / "runs" / "mlflow.db").exists()  # a next --store-from is not refused


def test_copies_taken_while_the_sweep_writes_are_consistent_and_go_on(tmp_path):
    """``StoreSnapshots`` writes a store copy every tick while another thread writes to the store;
    every copy opens as a database and restores (a point finished mid-way is in the later ones)."""
    import shutil
    import time

    from lab.study_store import StoreSnapshots, read_store_record, restore_store
    from tasks import tracking

    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    cfg, sweep, point = _study_store(work)
    client, _ = tracking.client_for(cfg)
    with StoreSnapshots(work, out, lambda: sweep, None, every_s=0.2) as snaps:
        for step in range(40):
            client.log_metric(point, "train/loss", 1.0 / (step + 1), step=step)
            time.sleep(0.02)
        client.set_terminated(point)
        written, deadline = snaps.written, time.monotonic() + 60
        while snaps.written < max(2, written + 1) and time.monotonic() < deadline:  # one after it
            time.sleep(0.1)
    assert snaps.written >= 2
    assert read_store_record(out / "mlflow_store.tar.xz")["sweep_run_id"] == sweep
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary left
    shutil.rmtree(work)
    restore_store(out / "mlflow_store.tar.xz", work)
    client, _ = tracking.client_for(cfg)
    assert client.get_run(point).info.status == "FINISHED"
    assert len(client.get_metric_history(point, "train/loss")) == 40


def test_no_copy_before_the_sweep_run_exists(tmp_path):
    import time

    from lab.study_store import StoreSnapshots

    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    _study_store(work)
    with StoreSnapshots(work, out, lambda: None, None, every_s=0.05) as snaps:
        time.sleep(0.3)
    assert snaps.written == 0 and not list(out.iterdir())


def test_wait_brings_back_the_newest_copy_at_every_poll(tmp_path):
    """``h200_sglang.sh wait SECONDS DIR``: a call ended while the study still runs has DIR's small
    files in its output already (hidden temporaries and .jsonl left out)."""
    import os
    import signal
    import time

    h, out, keep = tmp_path / "h", tmp_path / "out", tmp_path / "study-out"
    for d in (h, out, keep):
        d.mkdir()
    (h / "run.log").write_text("running\n")
    (keep / "mlflow_store.tar.xz").write_bytes(b"copy 1")
    (keep / ".mlflow_store.tar.xz.tmp").write_bytes(b"half")
    (keep / "regenerated.jsonl").write_text("{}\n")
    env = {**os.environ, "H200_DIR": str(h), "OUT": str(out), "EAGLE3_CACHE": str(tmp_path / "c")}
    proc = subprocess.Popen(["bash", str(REPO / "lab/gpu/h200_sglang.sh"), "wait", "120",
                             str(keep)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (out / "mlflow_store.tar.xz").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert (out / "mlflow_store.tar.xz").read_bytes() == b"copy 1"
        time.sleep(1.1)  # cp -u compares modification times (whole seconds on some systems)
        (keep / "mlflow_store.tar.xz").write_bytes(b"copy 2")
        deadline = time.monotonic() + 30
        while (out / "mlflow_store.tar.xz").read_bytes() != b"copy 2":
            assert time.monotonic() < deadline, "the newer copy was not brought back"
            time.sleep(0.5)
        assert sorted(p.name for p in out.iterdir()) == ["mlflow_store.tar.xz"]
        assert proc.poll() is None  # still waiting: the copies came at the polls
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


def test_a_store_copy_refuses_a_call_measuring_with_other_settings(tmp_path):
    """The settings a copy's points were measured with (``args``) travel in its record; a call
    going on from it with another ``--dev-prompts`` is refused before anything is unpacked, one
    with the same settings (or a copy recording none) is not."""
    from lab.study_store import read_store_record, store_problem, write_store_copy

    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    _, sweep, _ = _study_store(work)
    args = {"dev_holdout": 200, "dev_prompts": 64, "eval_sets": "mtbench2", "eval_tokens": 256,
            "all_size": 10915}
    plan = {"data": {"as-is": []}, "schedules": {"c": ["train.epochs=1"]}, "args": args}
    copy = write_store_copy(work, out, sweep, plan)
    assert read_store_record(copy)["plan"]["args"] == args
    import shutil

    shutil.rmtree(work)
    other = {**plan, "args": {**args, "dev_prompts": 32}}
    assert store_problem(copy, work, other) == (
        f"--store-from {copy}: its finished points were measured with --dev-prompts 64, got "
        "--dev-prompts 32; give 64 (figures measured otherwise would stand in one table with "
        "them)")
    assert store_problem(copy, work, plan) is None
    assert store_problem(copy, work, {k: v for k, v in plan.items() if k != "args"}) is None
