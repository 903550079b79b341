"""lab/sglang_speedup.py refuses a bad --draft, --modes or --concurrency with an argparse error
(exit 2, the flag and the value named) before it loads anything."""

from __future__ import annotations

import pytest

from lab.sglang_speedup import parse


def _error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        parse(["--out", "/tmp/x.json", *argv])
    assert e.value.code == 2
    return capsys.readouterr().err


def _serving(tmp_path, *files: str):
    d = tmp_path / "serving"
    d.mkdir()
    for f in files:
        (d / f).write_text("{}")
    return d


def test_draft_that_is_not_a_serving_folder_is_refused(tmp_path, capsys):
    missing = tmp_path / "nope"
    err = _error(capsys, "--draft", str(missing))
    assert f"--draft {missing}: " in err and "does not exist" in err
    f = tmp_path / "model.safetensors"
    f.write_text("")
    assert "got a file" in _error(capsys, "--draft", str(f))
    empty = _serving(tmp_path)
    err = _error(capsys, "--draft", str(empty))
    assert "missing config.json and *.safetensors" in err and "holds nothing" in err


def test_draft_without_weights_or_config_names_what_is_missing(tmp_path, capsys):
    only_config = _serving(tmp_path, "config.json")
    err = _error(capsys, "--draft", str(only_config))
    assert "missing *.safetensors" in err and "['config.json']" in err
    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / "config.json").write_text("{}")
    (ok / "model.safetensors").write_text("")
    assert parse(["--out", "/tmp/x.json", "--draft", str(ok)]).draft == str(ok)


@pytest.mark.parametrize("raw, item", [("1,x", "'x'"), ("0", "'0'"), ("1,,4", "''"),
                                       ("2.5", "'2.5'"), ("-1", "'-1'")])
def test_concurrency_must_be_a_comma_list_of_positive_ints(capsys, raw, item):
    err = _error(capsys, "--shape", "smollm2", f"--concurrency={raw}")
    assert "--concurrency: expected a comma list of positive integers" in err
    assert f"got {raw!r} ({item} is not a positive integer)" in err


@pytest.mark.parametrize("raw, what", [("plain,fast", "unknown ['fast']"), (",", "no mode"),
                                       ("", "no mode")])
def test_modes_must_name_known_modes(capsys, raw, what):
    err = _error(capsys, "--shape", "smollm2", f"--modes={raw}")
    assert "--modes: expected a comma list of plain, chain, tree" in err and what in err


def test_good_arguments_parse_as_before(tmp_path):
    a = parse(["--out", "/tmp/x.json", "--shape", "llama8b", "--modes", "plain, chain",
               "--concurrency", "1,4,16"])
    assert a.modes == ["plain", "chain"] and a.concurrency == [1, 4, 16]
