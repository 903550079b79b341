"""``python -m flows.sweep``'s arguments: what the user typed takes effect or is refused before any
point runs, with the argument, the expected and the actual value named."""

from __future__ import annotations

import pytest

from tests.conftest import CONFIGS

TINY = str(CONFIGS / "tiny-random.yaml")


def _refused(argv, capsys) -> str:
    from flows.sweep import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--report", ""], "--report: expected a sweep run id (32 hex digits), got an empty"),
        (["--report", "abc", "--size", "4"], "--report reads a finished sweep: --size would be"),
        (["--report", "abc", "--schedule", "a=train.epochs=2"], "--schedule would be ignored"),
        (["--plot-copy", "/tmp"], "--plot-copy: only with --report"),
        (["--size", "0"], "--size: expected a number of conversations >= 1, got [0]"),
        (["--size", "-4"], "got [-4]"),
        (["--eval-sets", ","], "--eval-sets: expected comma-separated set names, got ','"),
        (["--schedule", "long"], "--schedule 'long': expected NAME=KEY=VALUE"),
        (["--schedule", "long=train.epochs"], "expected NAME=KEY=VALUE"),
        (["--schedule", "a=train.epochs=2", "--schedule", "a=train.epochs=3"],
         "--schedule: expected distinct names, got ['a', 'a']"),
        (["--schedule", "a/b=train.epochs=2"], "expected a NAME of letters, digits"),
        (["--schedule", "a b=train.epochs=2"], "got 'a b'"),
        (["--schedule", "a=train.max_steps=3,train.max_steps=5"],
         "expected each key once, got ['train.max_steps'] more than once"),
        (["--size", "4", "--size", "4"], "--size: expected distinct sizes, got [4, 4]"),
        (["--eval-tokens", "5"], "--eval-tokens 5: only with --eval-sets"),
        (["--eval-sets", "mtbench,mtbench"], "--eval-sets: expected distinct set names"),
        (["--target", "1"], "--target: expected a finite acceptance length above 1.0"),
        (["--target", "-1"], "got -1.0"),
        (["--target", "inf"], "--target: expected a finite acceptance length above 1.0"),
        (["--report", "abc", "--eval-tokens", "8"], "--eval-tokens would be ignored"),
    ],
)
def test_arguments_that_would_be_ignored_or_cannot_work_are_refused(argv, message, capsys):
    assert message in _refused([TINY, *argv], capsys)


def test_plot_copy_must_be_a_folder_or_a_png_in_an_existing_folder(tmp_path, capsys):
    note = tmp_path / "notes.txt"
    note.write_text("keep me")
    for dest, message in ((str(note), "expected an existing folder or a path ending in .png, "
                                      "got an existing file"),
                          (str(tmp_path / "nodir"), "got a path that does not exist"),
                          (str(tmp_path / "nodir.png") + "/", "got a folder that does not exist"),
                          (str(tmp_path / "missing" / "p.png"), "expected its folder"),
                          ("", "got an empty string")):
        assert message in _refused([TINY, "--report", "0" * 32, "--plot-copy", dest], capsys)
    assert note.read_text() == "keep me"


def test_settings_the_sweep_would_override_are_refused_before_any_point(tmp_path, capsys):
    from flows.sweep import main

    runs = f"paths.runs_dir={tmp_path / 'runs'}"
    for o, message in (
        ("train.schedule=constant", "overridden by the sweep's schedules (epochs3-cosine: "
                                    "train.schedule=epochs); set it in each schedule"),
        ("train.eval_every=2", "constant-long: train.eval_every=50"),
        ("data.num_conversations=3", "the sweep sets data.num_conversations for each point"),
        ("name=mine", "the sweep sets name for each point"),
    ):
        assert main([TINY, "-o", runs, "-o", o]) == 2
        err = capsys.readouterr().err
        assert f"-o {o}: " in err and message in err, err
    # in a schedule of the user's own it is the schedule's
    assert main([TINY, "-o", runs, "-o", "train.eval_every=2", "--schedule",
                 "mine=train.epochs=1,train.eval_every=4"]) == 2
    assert "mine: train.eval_every=4" in capsys.readouterr().err
    # the same value in every schedule is no conflict
    from flows.sweep import overridden_settings

    assert overridden_settings(["train.eval_every=4"], {"a": ["train.eval_every = 4"]}) is None
    assert overridden_settings(["train.lr=0.001"], {"a": ["train.lr=1e-3"]}) is None
    assert overridden_settings(["train.lr=0.002"], {"a": ["train.lr=1e-3"]}) is not None
    assert overridden_settings(["data.on_short=fail"], {}) is None  # what the sweep sets
    # a data file that is not there is refused before Prefect starts, as `eagle3 extract` does
    for path, why in ((tmp_path / "nope.jsonl", "not found"), (tmp_path / "e.jsonl", "empty")):
        if why == "empty":
            path.write_text("")
        assert main([TINY, "-o", runs, "-o", "data.source=file", "-o", f"data.path={path}"]) == 2
        assert "data.path: expected a conversations file" in capsys.readouterr().err
    # a schedule the config refuses is named before any point trains
    assert main([TINY, "-o", runs, "--schedule", "bad=train.schedule=sometimes"]) == 2
    err = capsys.readouterr().err
    assert "--schedule bad: " in err and "train.schedule" in err
    # nor can a schedule set what the sweep sets per point
    for o in ("data.num_conversations=4", "name=foo"):
        assert main([TINY, "-o", runs, "--schedule", f"a={o}"]) == 2
        assert f"schedule a: {o}: the sweep sets" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.jsonl"))


def test_a_failed_points_reason_is_cut_at_a_word_with_an_ellipsis():
    from flows.sweep_decision import _shorten

    text = "stage train failed: set train.draft_vocab_size<=111 " + "x" * 500
    short = _shorten(text, 60)
    assert short.endswith(" …") and "<=111" in short and len(short) <= 62
    assert _shorten("short", 60) == "short"


@pytest.mark.parametrize("uri,message", [
    ("file:///tmp/mlruns", "got 'file' (MLflow's retired file store)"),
    ("bogus://x", "expected a URI of scheme sqlite, http, https"),
])
def test_a_uri_that_is_not_a_store_is_named_without_a_traceback(uri, message):
    from eagle3.errors import DataError
    from tasks.reports import decision_text

    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        decision_text("0" * 32, uri)


def test_default_sizes_are_half_and_all_and_never_zero():
    from flows.sweep import default_sizes

    assert default_sizes(128) == [64, 128] and default_sizes(3) == [1, 3]
    assert default_sizes(1) == [1]


def test_a_config_that_asks_to_warn_on_short_data_is_told_the_sweep_fails_instead(tmp_path,
                                                                                 capsys):
    from flows.sweep import main

    warn = tmp_path / "warn.yaml"
    warn.write_text(open(TINY).read().replace("\ndata:\n", "\ndata:\n  on_short: warn\n", 1))
    assert "on_short: warn" in warn.read_text()
    runs = f"paths.runs_dir={tmp_path / 'runs'}"
    assert main([str(warn), "-o", runs, "--eval-sets", "no-such-set"]) == 2  # stops before Prefect
    assert "data.on_short=warn is replaced by fail for every point" in capsys.readouterr().err
    assert main([TINY, "-o", runs, "--eval-sets", "no-such-set"]) == 2
    assert "on_short" not in capsys.readouterr().err


def test_a_point_larger_than_its_data_file_is_refused_before_the_sweep(tmp_path, capsys):
    import json

    from flows.sweep import main

    convs, other = tmp_path / "convs.jsonl", tmp_path / "other.jsonl"
    convs.write_text("\n".join(json.dumps({"conversations": [
        {"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]})
        for i in range(3)) + "\n{garbled\n")
    other.write_text("\n".join(convs.read_text().splitlines()[:2]))
    base = [TINY, "-o", f"paths.runs_dir={tmp_path / 'runs'}", "-o", "data.source=file",
            "-o", f"data.path={convs}", "--eval-sets", "no-such-set"]  # stops before Prefect
    assert main([*base, "--size", "2", "--size", "5"]) == 2
    err = capsys.readouterr().err
    assert (f"DATA_SHORT: point as-is-n5-epochs3-cosine: data.path {convs} holds 3 usable "
            "conversations, fewer than the point's size 5") in err
    assert main([*base, "--size", "3"]) == 2
    assert "DATA_SHORT" not in capsys.readouterr().err  # the set name stops it, nothing else
    # a schedule with its own data file is checked against that file
    assert main([*base, "--size", "3", "--schedule", f"s=data.path={other}"]) == 2
    assert (f"DATA_SHORT: --schedule s: point as-is-n3-s: data.path {other} holds 2 usable"
            in capsys.readouterr().err)
    convs.write_text("\n\n{garbled\n")
    assert main([*base, "--size", "3"]) == 2
    err = capsys.readouterr().err
    assert f"error: data.path: {convs}: no usable conversation among 1 records" in err


def test_every_points_config_is_loaded_before_the_sweep_starts(tmp_path, capsys):
    from flows.sweep import main

    runs = f"paths.runs_dir={tmp_path / 'runs'}"
    # size 1 leaves no validation split for measured selection: refused for that point, now
    assert main([TINY, "-o", runs, "-o", "train.select_best_by=measured", "--size", "1",
                 "--size", "4"]) == 2
    err = capsys.readouterr().err
    assert "error: point as-is-n1-" in err and "NO_DEV_PROMPTS" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.db"))
    with pytest.raises(SystemExit) as ended:  # argparse's own refusal
        main([TINY, "-o", runs, "--report", "x", "--plot-copy", str(tmp_path / "no") + "/"])
    assert ended.value.code == 2
    assert "expected an existing folder, got a folder that does not exist" in \
        capsys.readouterr().err
