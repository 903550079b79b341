"""The validation conversion records: given the extraction folder, the warnings
``eagle3 validate DST --data EXTRACT`` gives (VOCAB_COVERAGE counted from its token_freq.pt),
each code once, with a control that records none."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3.convert.coverage import read_data
from eagle3.convert.stage import convert
from eagle3.convert.validate import validate_report
from eagle3.errors import ConfigError
from testkit.broken_corpus import good_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target_dir):
    return good_pair(tmp_path_factory.getbasetemp() / "eagle3-good", tiny_target_dir)


def _prefix_source(pair, path):
    """The speculators draft with the identity-prefix vocabulary (d2t all zeros)."""
    shutil.copytree(pair[0], path)
    cfg = json.loads((path / "config.json").read_text())
    dv, vocab = cfg["draft_vocab_size"], cfg["transformer_layer_config"]["vocab_size"]
    t = load_file(str(path / "model.safetensors"))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:dv] = True
    t.update(d2t=torch.zeros(dv, dtype=torch.long), t2d=t2d)
    save_file(t, str(path / "model.safetensors"))
    return path, dv


def _extract(path, counts):
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"kind": "hidden_states"}))
    torch.save(counts, path / "token_freq.pt")
    return path


def _codes(items):
    return [str(w).split(":")[0] for w in items]


def test_convert_records_the_warnings_validate_gives_with_the_data(pair, tmp_path, tiny_target_dir):
    src, dv = _prefix_source(pair, tmp_path / "prefix")
    # 70 % of 1000 data tokens inside the draft vocabulary: served, with VOCAB_COVERAGE
    ext = _extract(tmp_path / "extract", {1: 700, dv + 5: 300})
    out = tmp_path / "out"
    man = convert(src, out, target_dir=tiny_target_dir, data=ext)
    recorded = man["validation"]["warnings"]
    assert man["validation"]["data_checked"] is True
    data_manifest, counts, _ = read_data(ext, tiny_target_dir)
    found = validate_report(
        out, target_dir=tiny_target_dir, data_manifest=data_manifest, token_counts=counts
    )
    assert found.problems == []
    assert "VOCAB_COVERAGE" in _codes(found.warnings)
    assert [str(w) for w in found.warnings] == recorded
    assert man["validation"]["figures"]["vocab_coverage"] == pytest.approx(0.7)
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["validation"]["warnings"] == recorded
    assert validate_report(out).problems == []  # the rewritten manifest keeps its content hash
    # control: data the draft vocabulary covers adds no coverage warning
    ext_ok = _extract(tmp_path / "extract-ok", {1: 1000})
    man = convert(src, tmp_path / "out-ok", target_dir=tiny_target_dir, data=ext_ok)
    assert "VOCAB_COVERAGE" not in _codes(man["validation"]["warnings"])
    assert man["validation"]["figures"]["vocab_coverage"] == 1.0


def test_convert_takes_the_data_folder_or_its_manifest_not_both(pair, tmp_path):
    ext = _extract(tmp_path / "extract", {1: 10})
    with pytest.raises(ConfigError, match="got both"):
        convert(pair[0], tmp_path / "out", data=ext, data_manifest={"kind": "hidden_states"})
    assert not (tmp_path / "out").exists()


def test_each_warning_code_is_recorded_once(pair, tmp_path, tiny_target_dir):
    # a bare sliding_window in a serving-layout source: the source's warning and the output's
    # (the config is copied) are one finding
    src = tmp_path / "window"
    shutil.copytree(pair[1], src)
    (src / "manifest.json").unlink()
    cfg = json.loads((src / "config.json").read_text())
    cfg["sliding_window"] = 4096
    (src / "config.json").write_text(json.dumps(cfg))
    man = convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    codes = _codes(man["validation"]["warnings"])
    assert codes.count("SLIDING_WINDOW") == 1, man["validation"]["warnings"]
    assert f"{src}/config.json sliding_window=4096" in man["validation"]["warnings"][0]


def test_the_convert_command_prints_each_warning_once(pair, tmp_path, tiny_target_dir):
    # convert logs its warnings and the CLI prints the recorded ones: a warning must show once
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]

    src = tmp_path / "bare-window"
    shutil.copytree(pair[1], src)
    (src / "manifest.json").unlink()
    cfg = json.loads((src / "config.json").read_text())
    cfg["sliding_window"] = 4096  # a window without the switch: warned, not refused
    (src / "config.json").write_text(json.dumps(cfg))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "convert",
            str(src),
            str(tmp_path / "out"),
            "--to",
            "sglang",
            "--target",
            str(tiny_target_dir),
        ],
        cwd=root,
        capture_output=True,
        text=True,
    )
    both = res.stdout + res.stderr
    assert res.returncode == 0, both
    assert both.count("SLIDING_WINDOW") == 1, both
