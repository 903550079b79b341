"""The hand-over to the server re-checks the serving folder against the content hash its manifest
records: a draft changed after conversion is refused before any engine starts, whatever the
convert stage's cache said."""

from __future__ import annotations

import pytest

from eagle3.artifacts import write_manifest
from eagle3.errors import CheckpointInvalid
from eagle3.serve import launcher
from eagle3.serve.launcher import launch_ready


@pytest.fixture
def cfg(tmp_path):
    from eagle3.config import load_config

    return load_config(None, [f"paths.runs_dir={tmp_path / 'runs'}"])


def _serving(tmp_path):
    d = tmp_path / "serving"
    d.mkdir()
    (d / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    (d / "model.safetensors").write_bytes(b"\x00" * 4096)
    write_manifest(d, "serving_checkpoint")
    return d


def test_changed_draft_is_refused_before_launch(cfg, tmp_path, monkeypatch):
    d = _serving(tmp_path)
    (d / "model.safetensors").write_bytes(b"\x01" * 4096)  # same size, other weights
    launched = []
    monkeypatch.setattr(launcher, "launch_engine", lambda *a, **k: launched.append(a))
    with pytest.raises(CheckpointInvalid) as ei:
        with launch_ready(cfg, tmp_path / "t", d, tmp_path / "deploy", use_gpu=False):
            pytest.fail("a changed draft must not be served")
    msg = str(ei.value)
    assert msg.startswith(f"CONTENT_HASH_MISMATCH: refusing to serve {d}: ")
    assert "changed after conversion" in msg and launched == []
    assert [p.code for p in ei.value.problems] == ["CONTENT_HASH_MISMATCH"]


def test_unchanged_draft_and_foreign_draft_pass_the_check(tmp_path):
    d = _serving(tmp_path)
    launcher.check_draft_content(d)  # matches its manifest: nothing raised
    (d / "manifest.json").unlink()
    (d / "model.safetensors").write_bytes(b"\x02" * 4096)
    launcher.check_draft_content(d)  # no manifest (another tool's draft): nothing to compare
