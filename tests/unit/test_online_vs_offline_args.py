"""lab/online_vs_offline.py checks its arguments before any case process starts: a bad config path,
``--epochs``, override or device is one argparse error (exit 2) naming it, not a child's traceback;
a case's project error is one line; ``--help`` shows an example."""

from __future__ import annotations

import subprocess

import pytest

from lab import online_vs_offline as ovo
from tests.conftest import CONFIGS

TINY = str(CONFIGS / "tiny-random.yaml")


class _Started(Exception):
    pass


@pytest.fixture
def no_cases(monkeypatch):
    """Any case process started is a test failure (raises _Started)."""

    def run(*a, **k):
        raise _Started(a, k)

    monkeypatch.setattr(subprocess, "Popen", run)


def _error(capsys, tmp_path, *argv: str, out: str | None = None) -> str:
    with pytest.raises(SystemExit) as e:
        ovo.main(
            [*argv, "--work", str(tmp_path / "work"), "--out", out or str(tmp_path / "o.json")]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_a_missing_config_is_refused_up_front(no_cases, capsys, tmp_path):
    missing = tmp_path / "nope.yaml"
    err = _error(capsys, tmp_path, str(missing))
    assert f"error: config file {missing}: not found" in err


@pytest.mark.parametrize(
    "epochs, shown", [("0", "0"), ("-1", "-1"), ("nan", "nan"), ("inf", "inf")]
)
def test_epochs_must_be_positive_and_finite(no_cases, capsys, tmp_path, epochs, shown):
    err = _error(capsys, tmp_path, TINY, "--epochs", "1", epochs)
    assert "--epochs: expected positive, finite numbers of epochs" in err
    assert f"({shown} is not)" in err


def test_an_override_or_mode_that_does_not_load_is_named(no_cases, capsys, tmp_path):
    err = _error(capsys, tmp_path, TINY, "-o", "train.nope=1")
    assert "train.nope" in err
    err = _error(capsys, tmp_path, TINY, "--modes", "offline", "cached", "--epochs", "2")
    assert "case cached x 2 epochs: " in err and "extract.cache_max_gb" in err


@pytest.mark.parametrize(
    "flag, values, shown",
    [("--modes", ["offline", "offline"], "offline"), ("--epochs", ["1", "2", "1"], "1")],
)
def test_a_case_given_twice_is_refused(no_cases, capsys, tmp_path, flag, values, shown):
    err = _error(capsys, tmp_path, TINY, flag, *values)
    assert f"{flag}: expected each value once (a case runs once)" in err
    assert f"({shown} more than once)" in err


def test_an_out_that_cannot_take_the_results_is_refused_before_any_case(no_cases, capsys, tmp_path):
    err = _error(capsys, tmp_path, TINY, out=str(tmp_path))
    assert f"--out {tmp_path}: expected a results file (JSON), got a folder" in err
    (tmp_path / "file").write_text("")
    err = _error(capsys, tmp_path, TINY, out=str(tmp_path / "file" / "r.json"))
    assert (
        f"--out {tmp_path / 'file' / 'r.json'}: expected a file in a folder, got "
        f"{tmp_path / 'file'}, a file, above it"
    ) in err
    assert not list(tmp_path.glob(".*probe*"))
    assert not (tmp_path / "work").exists()  # refused before --work is made


def test_the_window_size_goes_to_the_cached_cases_only():
    ov = ["train.max_steps=2", "extract.cache_max_gb=0.5"]
    assert ovo.case_overrides(ov, "offline", 1.0) == [
        "train.max_steps=2",
        "extract.mode=offline",
        "train.epochs=1.0",
    ]
    assert ovo.case_overrides(ov, "cached", 2.0) == [*ov, "extract.mode=cached", "train.epochs=2.0"]


def test_the_device_goes_where_each_mode_reads_it():
    assert ovo.case_overrides([], "offline", 1.0, "cpu")[:2] == [
        "train.device=cpu",
        "extract.device=cpu",
    ]
    assert ovo.case_overrides([], "online", 1.0, "cpu")[:2] == [
        "train.device=cpu",
        "extract.mode=online",
    ]


@pytest.mark.parametrize("key", ["extract.mode=online", "train.epochs=3"])
def test_what_each_case_sets_is_not_an_override(no_cases, capsys, tmp_path, key):
    err = _error(capsys, tmp_path, TINY, "-o", key)
    assert f"-o {key}: expected no extract.mode or train.epochs override" in err


def test_epochs_that_print_alike_are_one_case(no_cases, capsys, tmp_path):
    err = _error(capsys, tmp_path, TINY, "--epochs", "1", "1.0000000000001")
    assert "--epochs: expected each value once" in err


def test_relative_paths_mean_the_same_to_the_case_process(no_cases, tmp_path, monkeypatch):
    import shutil

    shutil.copy(TINY, tmp_path / "mine.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(_Started) as e:
        ovo.main(["mine.yaml", "--epochs", "1", "--work", "w", "--out", "r.json"])
    (cmd,), kwargs = e.value.args
    assert "cwd" not in kwargs  # the case runs in this folder: "mine.yaml" is the same file
    assert cmd[cmd.index("--work") + 1] == str(tmp_path / "w" / "offline-1ep")


def test_a_device_this_machine_lacks_is_refused(no_cases, capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    err = _error(capsys, tmp_path, TINY, "--device", "cuda")
    assert "train.device: expected a device this machine has, got 'cuda'" in err


def test_good_arguments_reach_the_cases(no_cases, tmp_path):
    with pytest.raises(_Started):
        ovo.main(
            [
                TINY,
                "--epochs",
                "1",
                "--device",
                "cpu",
                "--work",
                str(tmp_path / "work"),
                "--out",
                str(tmp_path / "o.json"),
            ]
        )


def test_the_default_results_file_is_new_for_each_run(no_cases, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(ovo, "check_arguments", lambda ap, a, ov: seen.append(a.out))
    monkeypatch.setattr("eagle3.assets.resolve_target", lambda cfg: "t")
    for _ in range(2):
        with pytest.raises(_Started):
            ovo.main([TINY, "--epochs", "1", "--work", str(tmp_path / "work")])
    assert seen[0].parent == ovo.ROOT / "lab" / "results"
    assert seen[0].name.endswith("Z_online_vs_offline.json") and "T" in seen[0].name


def test_a_case_that_fails_on_a_project_error_prints_one_line(monkeypatch, capsys, tmp_path):
    from eagle3.errors import DataError

    def fail(*a, **k):
        raise DataError("data.path: expected a JSONL file, got a folder")

    monkeypatch.setattr(ovo, "run_case", fail)
    rc = ovo.main(
        [TINY, "--work", str(tmp_path), "--case", "online", "2", str(tmp_path / "c.json")]
    )
    assert rc == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "error: case online x 2 epochs: data.path: expected a JSONL file, got a folder"
    )


def test_help_shows_an_example(capsys):
    with pytest.raises(SystemExit) as e:
        ovo.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "python lab/online_vs_offline.py configs/tiny-random.yaml" in out


def _row(mode, epochs, total, hs_bytes, sim, window=None):
    return {
        "mode": mode,
        "epochs": epochs,
        "seconds": {"total": total},
        "disk_bytes": {"hidden_states": hs_bytes},
        "simulated_acceptance_length": sim,
        "dev_acceptance_length": None,
        "peak_window_bytes": window,
    }


def test_comparisons_pair_each_mode_with_the_offline_case_of_its_epochs():
    rows = [
        _row("offline", 1.0, 100.0, 5000, 2.0),
        _row("online", 1.0, 80.0, 0, 2.02),
        _row("offline", 3.0, 200.0, 5000, 2.5),
        _row("cached", 3.0, 210.0, 0, None, 1234),
        _row("online", 5.0, 50.0, 0, 2.0),
    ]  # no offline case of 5 epochs: not compared
    got = ovo.comparisons(rows)
    assert [(c["mode"], c["epochs"]) for c in got] == [("online", 1.0), ("cached", 3.0)]
    assert got[0]["time_vs_offline"] == pytest.approx(0.8)
    assert got[0]["acceptance_rel_diff"]["simulated"] == pytest.approx(0.01)
    assert got[0]["hidden_state_bytes"] == 0 and got[0]["offline_hidden_state_bytes"] == 5000
    assert got[1]["time_vs_offline"] == pytest.approx(1.05)
    assert got[1]["acceptance_rel_diff"] == {"simulated": None, "dev": None}
    assert got[0]["peak_window_bytes"] is None and got[1]["peak_window_bytes"] == 1234


@pytest.mark.parametrize(
    "x, shown", [(0.0027, "+0.27 %"), (0.0, "+0.00 %"), (-0.01, "-1.00 %"), (None, "n/a")]
)
def test_acceptance_differences_print_as_percentages(x, shown):
    assert ovo.percent(x) == shown


def test_sigterm_to_the_driver_ends_its_case_process(tmp_path):
    import os
    import signal
    import sys
    import time

    import psutil

    from tests.conftest import REPO

    driver = subprocess.Popen(
        [
            sys.executable,
            "lab/online_vs_offline.py",
            TINY,
            "--epochs",
            "1",
            "--modes",
            "offline",
            "--device",
            "cpu",
            "--work",
            str(tmp_path / "w"),
            "--out",
            str(tmp_path / "r.json"),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline, children = time.monotonic() + 120, []
        while not children and time.monotonic() < deadline:
            children = psutil.Process(driver.pid).children(recursive=True)
            time.sleep(0.2)
        assert children, "the case process never started"
        driver.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        driver.send_signal(signal.SIGTERM)  # a second one (a double Ctrl-C) changes nothing
        assert driver.wait(timeout=60) == 128 + signal.SIGTERM
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert alive == []
    finally:
        if driver.poll() is None:
            driver.kill()
