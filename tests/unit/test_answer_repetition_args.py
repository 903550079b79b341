"""lab/answer_repetition.py refuses bad arguments (argparse, exit 2, the flag and value named)
before it loads a tokenizer."""

from __future__ import annotations

import pytest

from lab.answer_repetition import main


@pytest.mark.parametrize("argv, says", [
    ([], "--file: expected at least one NAME=FILE"),
    (["--file", "x"], "--file: expected NAME=FILE with an existing file, got 'x'"),
    (["--file", "=FILE"], "got '=FILE'"),
    (["--file", "a=/nonexistent.jsonl"], "got 'a=/nonexistent.jsonl'"),
])
def test_bad_files_are_refused(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--out", "/tmp/x.json", *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_a_missing_ids_file_is_refused(tmp_path, capsys):
    f = tmp_path / "c.jsonl"
    f.write_text("")
    with pytest.raises(SystemExit):
        main(["--out", "/tmp/x.json", "--file", f"a={f}", "--ids-from", str(tmp_path / "no")])
    assert "--ids-from: expected a file, got " in capsys.readouterr().err


def test_repeated_names_and_an_out_folder_are_refused(tmp_path, capsys):
    f = tmp_path / "c.jsonl"
    f.write_text("")
    for argv, says in ((["--file", f"a={f}", "--file", f"a={f}", "--out", str(tmp_path / "o")],
                        "--file: expected each NAME once, got ['a', 'a']"),
                       (["--file", f"a={f}", "--out", str(tmp_path)],
                        "--out: expected a file path in a folder")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("manifest, says", [
    ("{not json", "could not read it (JSONDecodeError"),
    ("[1, 2]", "got list '[1, 2]'"),
    ('{"regeneration": null}', "regeneration.kept_turns"),
])
def test_a_manifest_that_is_not_a_regeneration_one_is_named(tmp_path, capsys, manifest, says):
    f = tmp_path / "r.jsonl"
    f.write_text("")
    (tmp_path / "r.jsonl.manifest.json").write_text(manifest)
    assert main(["--file", f"r={f}", "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert f"error: {tmp_path / 'r.jsonl.manifest.json'}: expected a regeneration manifest" in err
    assert says in err and not (tmp_path / "o.json").exists()
