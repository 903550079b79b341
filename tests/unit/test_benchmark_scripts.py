"""The GPU benchmark scripts keep working on the CPU (their smoke modes), and ``gpu_quality``'s
resume across device calls runs only the stages still missing."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_gpu_train_tiny_prints_both_trainers_and_writes_profiles(tmp_path):
    out = tmp_path / "prof"
    results = tmp_path / "gpu_train.json"
    results.write_text(json.dumps({"shapes": {"llama8b": {"kept": True}}}))
    r = subprocess.run(
        [
            sys.executable,
            "lab/gpu_train.py",
            "--tiny",
            "--work",
            str(tmp_path / "w"),
            "--profile",
            "1",
            "--out",
            str(out),
            "--rounds",
            "2",
            "--results",
            str(results),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x[4:]) for x in r.stdout.splitlines() if x.startswith("ROW ")]
    assert [(x["name"], x["round"]) for x in rows] == [
        ("speculators Trainer", 0),
        ("ours (cpu)", 0),
        ("speculators Trainer", 1),
        ("ours (cpu)", 1),
    ]
    assert all(x["tokens_per_s"] > 0 for x in rows) and all(
        x["profile"]["wall_ms"] > 0 for x in rows[:2]
    ), rows
    assert "/ speculators Trainer tokens/s = " in r.stdout and "(rounds: " in r.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu_train.json",
        "gpu_train_rounds.json",
        "profile-ours-eager.txt",
        "profile-speculators-sdpa-eager-0.txt",
        "results",
    ]
    partial = json.loads((out / "gpu_train_rounds.json").read_text())  # written after each round
    assert partial["rounds_done"] == 2 and len(partial["rows"]) == 4
    merged = json.loads(
        (out / "results" / "gpu_train.json").read_text()
    )  # --results: this shape merged in
    assert merged["shapes"]["llama8b"] == {"kept": True} and merged["written_by"].startswith(
        "lab/gpu_train.py"
    )
    tiny = merged["shapes"]["tiny"]
    assert [t["name"] for t in tiny["trainers"]] == ["speculators Trainer", "ours (cpu)"]
    assert tiny["trainers"][0]["peak_gib"] is None  # no CUDA: null, not NaN
    assert list(tiny["ratios"].values())[0]["ratio_of_medians"] > 0
    res = json.loads((out / "gpu_train.json").read_text())
    assert (
        res["rounds"] == 2
        and res["shape"] == "tiny"
        and [t["name"] for t in res["trainers"]] == ["speculators Trainer", "ours (cpu)"]
    )
    spec, ours = res["trainers"]
    assert ours["tokens_per_s_rounds"] == [rows[1]["tokens_per_s"], rows[3]["tokens_per_s"]]
    (ratio,) = res["ratios"].values()
    assert ratio["per_round"] == pytest.approx(
        [
            rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"],
            rows[3]["tokens_per_s"] / rows[2]["tokens_per_s"],
        ]
    )
    assert (
        ratio["ratio_of_medians"] == pytest.approx(ours["tokens_per_s"] / spec["tokens_per_s"])
        and ours["mfu"] > 0
    )


def test_gpu_train_refuses_an_unknown_compile_mode():
    r = subprocess.run(
        [sys.executable, "lab/gpu_train.py", "--tiny", "--modes", "default,fast"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--modes: expected a comma list of eager, default" in r.stderr, (
        r.stderr[-2000:]
    )


def test_gpu_quality_until_then_resume_runs_only_missing_stages(tmp_path):
    from lab import gpu_quality as gq

    calls = []

    def fn(name):
        return lambda: calls.append(name) or {"value": len(calls)}

    res = gq.Results(tmp_path / "work", tmp_path / "out1")
    res.until, res.stop = "extract/bf16", False
    assert gq.stage(res, "target", fn("target")) == {"value": 1}
    assert gq.stage(res, "extract/bf16", fn("extract/bf16")) == {"value": 2}
    assert gq.stage(res, "extract/fp8", fn("extract/fp8")) is None  # stopped by --until
    assert calls == ["target", "extract/bf16"]
    assert json.loads((tmp_path / "out1" / "results.json").read_text())["stages"][
        "extract/bf16"
    ] == {"value": 2}

    res = gq.Results(tmp_path / "work", tmp_path / "out2", resume=True)
    res.until, res.stop = None, False
    assert gq.stage(res, "extract/bf16", fn("again")) == {"value": 2}  # kept from the first call
    assert gq.stage(res, "extract/fp8", fn("extract/fp8")) == {"value": 3}
    assert calls == ["target", "extract/bf16", "extract/fp8"]
    both = json.loads((tmp_path / "out2" / "results.json").read_text())["stages"]
    assert set(both) == {"target", "extract/bf16", "extract/fp8"}

    res = gq.Results(tmp_path / "work", tmp_path / "out3", resume=True)
    res.until, res.stop = "target", False  # --until a stage an earlier call finished: stop at once
    assert gq.stage(res, "target", fn("again")) == {"value": 1}
    assert gq.stage(res, "train/ours-bf16", fn("train")) is None and "train" not in calls

    (tmp_path / "work" / "results.json").write_text('{"stages": {"target": ')  # cut short by a kill
    with pytest.raises(SystemExit, match=r"--resume: .*results.json cannot be resumed"):
        gq.Results(tmp_path / "work", tmp_path / "out4", resume=True)
    (tmp_path / "work" / "results.json").write_text(
        json.dumps({"stages": {}, "settings": {"max_convs": 16}})
    )
    with pytest.raises(SystemExit, match=r"made with other settings .*'max_convs': \(16, 64\)"):
        gq.Results(tmp_path / "work", tmp_path / "out4", resume=True, settings={"max_convs": 64})


@pytest.mark.parametrize(
    "args, message",
    [
        (["--until", "train/nope"], "--until: expected one of target"),
        (["--skip", "spec,foo"], "--skip: expected a comma list"),
    ],
)
def test_gpu_quality_refuses_unknown_stage_names(args, message):
    r = subprocess.run(
        [sys.executable, "lab/gpu_quality.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]


def test_gpu_speedup_tiny_cpu_runs_both_modes_through_one_engine_and_writes_every_figure(
    tmp_path, tiny_target_dir
):
    out = tmp_path / "speedup.json"
    r = subprocess.run(
        [
            sys.executable,
            "lab/gpu_speedup.py",
            "--tiny",
            "--device",
            "cpu",
            "--tokenizer",
            str(tiny_target_dir),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (
        r.stdout.count("round ") >= 6
        and "| output tokens/s |" in r.stdout
        and "predicted speedup" in r.stdout
    )
    data = json.loads(out.read_text())
    assert data["errors"] == [] and data["self_check_float32"]["verdict"] == "ok"
    assert [x["mode"] for x in data["rounds"]] == ["plain", "speculative"] * 3
    assert all(x["tokens"] == 2 * 16 and x["tokens_per_s"] > 0 for x in data["rounds"])
    s, t = data["summary"], data["summary"]["timings_ms"]
    assert s["acceptance_length"] >= 1.0 and s["verify_passes"] > 0
    assert all(
        t[k] > 0
        for k in (
            "plain_step_device_ms",
            "plain_token_wall_ms",
            "verify_ms",
            "draft_step_ms",
            "extend_ms",
            "iteration_wall_ms",
        )
    )
    assert set(data["predicted"]["at"]) == {"2.0", "2.5", "3.0"}
    assert data["predicted"]["at"]["3.0"]["speedup"] > data["predicted"]["at"]["2.0"]["speedup"] > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rounds", "2"], "--rounds: expected >= 3, got 2"),
        (["--draft", "/nonexistent"], "--target (or --gguf) and --draft: give both"),
        (["--http"], "--http: serves a trained draft"),
        (["--concurrency", "1,x"], "--concurrency: expected a comma list"),
    ],
)
def test_gpu_speedup_refuses_bad_arguments_up_front(args, message):
    r = subprocess.run(
        [sys.executable, "lab/gpu_speedup.py", "--tiny", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]


def test_offline_replay_tiny_prints_the_ratio_and_equal_requests(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "lab/offline_replay.py",
            "speed",
            "--tiny",
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "6",
            "--repeats",
            "1",
            "--work",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "requests equal 2/2" in r.stdout and "offline_acceptance / replay wall time = " in r.stdout
    )
    assert "get_cpu_capability() = " in r.stdout


@pytest.mark.parametrize(
    "override, match",
    [
        ("train.bogus=1", "train.bogus"),  # not a config key
        ("train.ttt_steps=5", "set by this benchmark for both trainers (use --ttt)"),
        ("train.max_steps=3", "(use --steps)"),
        ("train.lr=1e-3", "(use --lr)"),
    ],
)
def test_gpu_train_refuses_overrides_it_cannot_record_or_that_break_the_comparison(override, match):
    r = subprocess.run(
        [sys.executable, "lab/gpu_train.py", "--tiny", "--ours-override", override],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and match in r.stderr, r.stderr[-1500:]


def test_gpu_train_refuses_a_results_file_it_cannot_merge_into(tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text("[1, 2]")
    r = subprocess.run(
        [sys.executable, "lab/gpu_train.py", "--tiny", "--results", str(bad)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        r.returncode == 2
        and f"--results: {bad}: expected a JSON object with a 'shapes' object, got list" in r.stderr
    )


def test_gpu_forward_check_smoke_on_the_cpu(tmp_path):
    """The check itself runs where there is no GPU (eager attention, uncompiled): same loss,
    gradients and counts."""
    r = subprocess.run(
        [
            sys.executable,
            "lab/gpu_forward_check.py",
            "--shape",
            "tiny",
            "--seq-len",
            "128",
            "--device",
            "cpu",
            "--attention",
            "eager",
            "--repeats",
            "1",
            "--work",
            str(tmp_path / "w"),
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "gpu_forward_check_tiny.json").read_text())["results"]
    assert res["float32"]["counts_equal"] and res["float32"]["loss_rel_diff"] < 1e-5
    assert 0 < res["float32"]["max_grad_rel_diff"] < 1e-4 and "-> OK" in r.stdout


def test_train_forward_quality_runs_both_forwards_on_the_same_data(tmp_path):
    """Smoke test of lab/train_forward_quality.py on the tiny random target (whose drafts accept
    nothing: the real comparison is on SmolLM2, lab/NOTEBOOK.md): both runs evaluated at the same
    steps, the ratio recorded."""
    out = tmp_path / "q.json"
    r = subprocess.run(
        [
            sys.executable,
            "lab/train_forward_quality.py",
            "configs/tiny-random.yaml",
            "-o",
            "train.max_steps=4",
            "-o",
            "train.eval_every=2",
            "--work",
            str(tmp_path / "w"),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert (
        [e["step"] for e in res["runs"]["speculators"]["evals"]]
        == [2, 4]
        == [e["step"] for e in res["runs"]["project"]["evals"]]
    )
    assert (
        res["final_ratio"] == pytest.approx(1.0, abs=0.01)
        and res["runs"]["project"]["tokens_per_s_median"] > 0
    )
    assert "| 4 |" in r.stdout and "project / speculators = " in r.stdout


def test_gpu_train_checks_results_destination_and_overrides_with_num_gpus_up_front(tmp_path):
    """Found by a new user: an unwritable --results folder failed only after the whole benchmark,
    and an override that conflicts with --num-gpus passed the up-front check."""
    (tmp_path / "file").write_text("x")
    r = subprocess.run(
        [
            sys.executable,
            "lab/gpu_train.py",
            "--tiny",
            "--results",
            str(tmp_path / "file" / "x.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        r.returncode == 2 and "--results:" in r.stderr and "cannot create the folder" in r.stderr
    ), r.stderr[-800:]
    assert "ROW" not in r.stdout
    r = subprocess.run(
        [
            sys.executable,
            "lab/gpu_train.py",
            "--tiny",
            "--num-gpus",
            "2",
            "--ours-override",
            "train.forward_impl=project",
            "--ours-override",
            "train.distributed=fsdp",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        r.returncode == 2 and "train.forward_impl project with train.distributed fsdp" in r.stderr
    ), r.stderr[-800:]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "foo"], "--device: expected cuda, cuda:N or cpu, got 'foo'"),
        (
            ["--device", "cpu", "--attention", "flex"],
            "--attention flex: expected eager or sdpa with --device cpu",
        ),
        (
            ["--device", "cpu", "--draft-vocab", "1"],
            "--draft-vocab: expected at least 2 draft tokens, got 1",
        ),
        (
            ["--device", "cpu", "--draft-vocab", "2048"],
            "--draft-vocab: expected fewer than the target's 2048 tokens",
        ),
        (
            ["--device", "cpu", "--seq-len", "100000000"],
            "--seq-len: expected at most 65536 positions",
        ),
        (["--device", "cpu", "--out", "/proc/nope"], "--out /proc/nope: expected a folder"),
        # found by a new user: root may "access" /proc, a file as --work, an infinite tolerance, the
        # value not named
        (["--device", "cpu", "--out", "/proc"], "--out /proc: expected a folder"),
        (["--device", "cpu", "--work", "FILE"], "--work FILE: expected a folder"),
        (
            ["--device", "cpu", "--tol", "inf"],
            "--tol: expected a finite relative tolerance > 0, got inf",
        ),
        (["--device", "cpu", "--repeats", "0"], "--repeats: expected at least 1, got 0"),
        (
            ["--device", "cpu", "--seq-len", "63"],
            "--seq-len: expected at least 64 positions, got 63",
        ),
    ],
)
def test_gpu_forward_check_refuses_bad_arguments_without_a_traceback(
    args, message, monkeypatch, capsys, tmp_path
):
    """In this process (each run of the script as a subprocess spends its time importing torch and
    speculators): ``main`` must end by argparse's exit 2 with the message, not by an exception; the
    command line itself is checked once, in
    test_gpu_forward_check_command_line_refuses_without_a_traceback."""
    import lab.gpu_forward_check as script

    afile = tmp_path / "afile"
    afile.write_text("x")
    args = [str(afile) if x == "FILE" else x for x in args]
    message = message.replace("FILE", str(afile))
    monkeypatch.setattr(
        sys,
        "argv",
        ["gpu_forward_check.py", "--shape", "tiny", "--work", str(tmp_path / "w"), *args],
    )
    with pytest.raises(SystemExit) as e:
        script.main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err, err[-800:]


def test_gpu_forward_check_command_line_refuses_without_a_traceback():
    r = subprocess.run(
        [sys.executable, "lab/gpu_forward_check.py", "--shape", "tiny", "--device", "foo"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--device: expected cuda, cuda:N or cpu, got 'foo'" in r.stderr, (
        r.stderr[-800:]
    )
    assert "Traceback" not in r.stderr, r.stderr[-800:]


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.forward_impl=project", "this script sets train.forward_impl itself"),
        ("train.attn_implementation=flex", "the speculators run's configuration"),
        ("train.forward_impl=Bogus", "this script sets train.forward_impl itself"),
        ("train.loss_implementation=fused", "the speculators run's configuration"),
        ("train.num_gpus=2", "train.num_gpus: expected 1"),
    ],
)
def test_train_forward_quality_refuses_bad_overrides_before_extracting(tmp_path, override, message):
    r = subprocess.run(
        [
            sys.executable,
            "lab/train_forward_quality.py",
            "configs/tiny-random.yaml",
            "-o",
            override,
            "--work",
            str(tmp_path / "w"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )  # rich wraps the message at 80
    out = r.stdout + r.stderr
    assert r.returncode == 2 and message in out and "Traceback" not in out, out[-800:]
    assert not (tmp_path / "w" / "extract").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "train.attn_implementation=flex",
            "flex: expected auto, sdpa or eager with train.device cpu",
        ),
        (
            "train.loss_implementation=fused",
            "loss_implementation fused: expected eager with train.device cpu",
        ),
    ],
)
def test_gpu_train_refuses_what_its_cpu_runs_would_refuse_before_any_run(override, message):
    if __import__("torch").cuda.is_available():
        pytest.skip("these settings are valid on CUDA")
    r = subprocess.run(
        [sys.executable, "lab/gpu_train.py", "--tiny", "--ours-override", override],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and message in r.stderr and "ROW" not in r.stdout, r.stderr[-800:]
