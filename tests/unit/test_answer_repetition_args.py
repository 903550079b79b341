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
