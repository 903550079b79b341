"""Cache keys (tasks/caching.py), the transient-only retry condition, and the MLflow helpers
(tasks/tracking.py) against a real local MLflow store."""

from __future__ import annotations

import re

from pathlib import Path


import pytest

pytest.importorskip("prefect")
pytest.importorskip("mlflow")

from eagle3.artifacts import write_manifest  # noqa: E402
from eagle3.config import load_config  # noqa: E402
from eagle3.errors import DataError, GateFailed, TransientError  # noqa: E402
from tasks import caching, retry_if_transient  # noqa: E402
from tasks.results import StageResult  # noqa: E402


def _stage_dir(path, text: str):
    path.mkdir(parents=True, exist_ok=True)
    (path / "payload.txt").write_text(text)
    write_manifest(path, "hidden_states")
    return path


def test_train_key_follows_train_settings_and_input_content(tmp_path):
    data = _stage_dir(tmp_path / "extract", "v1")
    cfg = load_config(None, [f"paths.runs_dir={tmp_path}"])
    key = caching.stage_key("train", cfg, tmp_path / "train", inputs={"data": data})
    same = caching.stage_key(
        "train",
        load_config(None, [f"paths.runs_dir={tmp_path}"]),
        tmp_path / "train",
        inputs={"data": data},
    )
    other_lr = caching.stage_key(
        "train",
        load_config(None, [f"paths.runs_dir={tmp_path}", "train.lr=1e-2"]),
        tmp_path / "train",
        inputs={"data": data},
    )
    other_data_setting = caching.stage_key(
        "train",
        load_config(None, [f"paths.runs_dir={tmp_path}", "data.num_conversations=7"]),
        tmp_path / "train",
        inputs={"data": data},
    )
    assert key == same
    assert other_lr != key
    assert other_data_setting == key  # the train stage does not read the data section
    _stage_dir(data, "v2")  # new hidden states, same path
    assert caching.stage_key("train", cfg, tmp_path / "train", inputs={"data": data}) != key


def test_extract_key_follows_the_dataset_bytes_not_train_settings(tmp_path):
    ds = tmp_path / "conv.jsonl"
    ds.write_text('{"id": 1}\n')
    cfg = load_config(None, [f"paths.runs_dir={tmp_path}"])
    key = caching.stage_key("extract", cfg, tmp_path / "extract", files={"dataset": ds})
    cfg_lr = load_config(None, [f"paths.runs_dir={tmp_path}", "train.lr=1e-2"])
    assert caching.stage_key("extract", cfg_lr, tmp_path / "extract", files={"dataset": ds}) == key
    ds.write_text('{"id": 2}\n')
    assert caching.stage_key("extract", cfg, tmp_path / "extract", files={"dataset": ds}) != key


def test_extract_key_names_the_launched_regeneration_server_only_when_one_answers(tmp_path,
                                                                                monkeypatch):
    import eagle3.assets
    from tasks.extract import extract_key

    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    ds = tmp_path / "conv.jsonl"
    ds.write_text('{"id": 1}\n')
    monkeypatch.setattr(eagle3.assets, "resolve_target", lambda cfg: tmp_path / "target")
    key = lambda *o: extract_key(None, {  # noqa: E731
        "out_dir": tmp_path / "extract",
        "cfg": load_config(None, [f"paths.runs_dir={tmp_path}", "data.source=file",
                                  f"data.path={ds}", "serve.engine=reference", *o])})
    # the default serving dtype follows the CPU (bf16 only where it has bf16 instructions)
    default = load_config(None, [f"paths.runs_dir={tmp_path}", "serve.engine=reference"])
    other = "serve.dtype=" + ("bfloat16" if default.serve.dtype == "float32" else "float32")
    assert key() == key(other)  # nothing is served for extraction
    launched = ("data.regenerate=sglang",)
    assert key(*launched) != key(*launched, other)
    asked = ("data.regenerate=sglang", "data.regenerate_url=http://127.0.0.1:9")
    assert key(*asked) == key(*asked, other)  # a given server: its own dtype


def test_deploy_key_ignores_the_gate_minimum(tmp_path):
    serving = _stage_dir(tmp_path / "serving", "s")
    key = lambda *o: caching.stage_key(  # noqa: E731
        "deploy-bench",
        load_config(None, [f"paths.runs_dir={tmp_path}", "serve.engine=reference", *o]),
        tmp_path / "bench",
        inputs={"serving": serving},
    )
    assert key() == key("bench.min_acceptance_length=3.5")
    assert key() != key("bench.num_prompts=3")
    assert key() != key("serve.speculative_num_steps=2", "serve.speculative_num_draft_tokens=3")


def test_editing_any_module_a_stage_imports_changes_that_stage_key(tmp_path):
    """The key hashes the import closure of the stage's entries (tasks/code_closure.py): every file
    in it, one edit at a time in a copy of the library, changes that stage's code version — and
    nothing else's file does."""
    import shutil

    from tasks.code_closure import closure

    shutil.copytree(
        caching.CODE_ROOT / "eagle3",
        tmp_path / "eagle3",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for stage in caching.STAGE_ENTRIES:
        before = caching.code_version(stage, tmp_path)
        files = closure(tmp_path, caching.STAGE_ENTRIES[stage])
        assert len(files) > 10
        for name, f in files.items():
            text = f.read_bytes()
            f.write_bytes(text + b"\n# edited\n")
            try:
                assert caching.code_version(stage, tmp_path) != before, (
                    f"{stage}: editing {name} left the key"
                )
            finally:
                f.write_bytes(text)
        assert caching.code_version(stage, tmp_path) == before
        outside = sorted(set((tmp_path / "eagle3").rglob("*.py")) - set(files.values()))
        if outside:
            outside[0].write_bytes(outside[0].read_bytes() + b"\n# edited\n")
            assert caching.code_version(stage, tmp_path) == before, (
                f"{stage}: {outside[0]} is not in its closure"
            )


def test_closures_hold_the_modules_the_old_hand_kept_lists_missed():
    """The drift the hand-kept lists had: the convert key left out the validation checks and
    SGLang's loader rules, the deploy key the acceptance figures and the engine's start and
    readiness."""
    from tasks.code_closure import closure

    names = {s: set(closure(caching.CODE_ROOT, e)) for s, e in caching.STAGE_ENTRIES.items()}
    assert {"eagle3.convert.checks", "eagle3.engines.sglang.draft_load"} <= names["convert"]
    assert {
        "eagle3.measure.acceptance",
        "eagle3.serve.launcher",
        "eagle3.serve.readiness",
    } <= names["deploy-bench"]
    # the reference engine is named by its version and a digest of its files, not by a module path
    assert not any(n.startswith("refengine") for s in names.values() for n in s)
    assert any(n.startswith("eagle3/engines/sglang/plugin:") for n in names["extract"])
    assert "eagle3.train.worker" in names["train"] and "eagle3.train.loop" in names["train"]


def test_deploy_key_names_the_engine_by_its_version(tmp_path):
    import shutil
    import sys

    from eagle3.engines.sglang.profile import VERSION

    ref = tmp_path / "refengine"
    shutil.copytree(
        caching.CODE_ROOT / "refengine", ref, ignore=shutil.ignore_patterns("__pycache__")
    )
    init = ref / "__init__.py"
    text = init.read_text()
    assert "__version__" in text, init
    init.write_text(re.sub(r"^__version__\s*=.*$", '__version__ = "9.9.9"', text, flags=re.M))
    before = caching.reference_engine_identity(ref)
    assert before.startswith("refengine 9.9.9 ")  # read from the file's text
    for f in sorted(ref.glob("*.py")):  # any edit of the engine changes its identity
        text = f.read_bytes()
        f.write_bytes(text + b"\n# edited\n")
        assert caching.reference_engine_identity(ref) != before, f.name
        f.write_bytes(text)
    assert caching.reference_engine_identity(tmp_path / "nothing") == "refengine absent"

    def cfg(e):
        return load_config(None, [f"paths.runs_dir={tmp_path}", f"serve.engine={e}"])

    assert caching.engine_identity(cfg("sglang")) == f"sglang {VERSION}"
    older = load_config(
        None, [f"paths.runs_dir={tmp_path}", "serve.engine=sglang", "convert.engine_version=0.5.16"]
    )
    assert caching.engine_identity(older) == "sglang 0.5.16"  # the configured release
    assert caching.engine_identity(cfg("reference")) == caching.reference_engine_identity(
        caching.CODE_ROOT / "refengine"
    )
    loaded = "refengine" in sys.modules
    serving = _stage_dir(tmp_path / "serving", "s")
    keys = {
        e: caching.stage_key(
            "deploy-bench", cfg(e), tmp_path / "bench", inputs={"serving": serving}
        )
        for e in ("sglang", "reference")
    }
    assert keys["sglang"] != keys["reference"]
    assert ("refengine" in sys.modules) == loaded  # located and read, never imported


def test_closure_follows_lazy_and_relative_imports(tmp_path):
    from tasks.code_closure import closure

    pkg = tmp_path / "eagle3" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "eagle3" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from eagle3.sub import b\n    from . import c\n")
    (pkg / "b.py").write_text("import os\n")
    (pkg / "c.py").write_text("from .b import x\n")
    (pkg / "d.py").write_text("")
    got = set(closure(tmp_path, ["eagle3.sub.a"]))
    assert got == {"eagle3", "eagle3.sub", "eagle3.sub.a", "eagle3.sub.b", "eagle3.sub.c"}
    with pytest.raises(FileNotFoundError, match="eagle3.sub.nope"):
        closure(tmp_path, ["eagle3.sub.nope"])


def test_missing_input_manifest_is_a_named_error(tmp_path):
    cfg = load_config(None, [f"paths.runs_dir={tmp_path}"])
    with pytest.raises(DataError, match="manifest"):
        caching.stage_key("train", cfg, tmp_path / "train", inputs={"data": tmp_path / "nothing"})


def test_output_matches_detects_a_rebuilt_output(tmp_path):
    d = _stage_dir(tmp_path / "x", "a")
    from eagle3.artifacts import read_manifest

    result = StageResult("extract", d, read_manifest(d)["content_hash"], "r")
    assert caching.output_matches(result)
    _stage_dir(d, "b")
    assert not caching.output_matches(result)
    assert not caching.output_matches(StageResult("extract", tmp_path / "gone", "x", "r"))
    assert not caching.output_matches(
        {"dir": str(d), "content_hash": read_manifest(d)["content_hash"]}
    )  # an old-style dict


def test_output_matches_detects_a_deleted_or_truncated_file_with_the_manifest_intact(tmp_path):
    from eagle3.artifacts import output_intact, read_manifest, write_manifest

    d = tmp_path / "hs"
    (d / "hidden_states").mkdir(parents=True)
    for i in range(3):
        (d / "hidden_states" / f"hs_{i}.safetensors").write_bytes(bytes(100 + i))
    (d / ".progress").mkdir()
    write_manifest(d, "hidden_states", exclude=("manifest.json", ".progress"))
    result = StageResult("extract", d, read_manifest(d)["content_hash"], "r")
    files = read_manifest(d)["files"]
    assert (files["count"], files["bytes"], files["exclude"]) == (
        3,
        303,
        [".progress", "manifest.json"],
    )
    (d / ".progress" / "note.json").write_text("{}")  # excluded folders may change
    assert caching.output_matches(result)
    (d / "hidden_states" / "hs_1.safetensors").unlink()
    assert not caching.output_matches(result)
    assert output_intact(d) == (
        False,
        f"{d / 'manifest.json'}: 'files' expected 3 files of 303 bytes, found 2 files of 202 bytes",
    )
    (d / "hidden_states" / "hs_1.safetensors").write_bytes(bytes(50))  # back, but truncated
    assert not caching.output_matches(result)
    (d / "hidden_states" / "hs_1.safetensors").write_bytes(
        bytes(101)
    )  # the right bytes again: intact
    assert caching.output_matches(result)
    (d / "hidden_states" / "hs_2.safetensors").write_bytes(
        b"\x01" * 102
    )  # same size, other content
    ok, why = output_intact(d)
    assert not ok and "'content_hash' expected" in why and not caching.output_matches(result)


def test_retry_only_transient_errors():
    from prefect.states import Failed

    assert retry_if_transient(None, None, Failed(data=TransientError("port in use")))
    assert not retry_if_transient(None, None, Failed(data=GateFailed("crashed", verdict="crashed")))
    assert not retry_if_transient(None, None, Failed(data=ValueError("bug")))


def test_tracking_parent_reuse_nested_runs_and_redaction(tmp_path):
    from tasks import tracking

    cfg = load_config(None, [f"paths.runs_dir={tmp_path}", "serve.env.HF_TOKEN=hf_secret_value"])
    parent = tracking.start_pipeline_run(cfg, flow_run_id="flow-123", flow_name="t")
    assert (
        tracking.start_pipeline_run(cfg, flow_run_id="flow-123", flow_name="t") == parent
    )  # retry → reuse
    assert tracking.start_pipeline_run(cfg, flow_run_id="flow-456", flow_name="t") != parent
    with tracking.stage_run(cfg, parent, "train") as sr:
        sr.on_metrics({"train/loss": 2.5, "train/acc_0": 0.25}, 1)
        sr.on_metrics({"train/loss": 2.0, "train/acc_0": 0.5}, 2)
    with pytest.raises(DataError):
        with tracking.stage_run(cfg, parent, "convert") as sr:
            raise DataError("boom")
    tracking.record_cached_stage(
        cfg,
        parent,
        "extract",
        "trained",
        StageResult("extract", Path("/x"), "h", "producer", {"n": 3}),
    )
    tracking.log_parent_metrics(
        cfg, parent, {"acceptance_length": 1.5, "acceptance_length_untrained": None}
    )
    tracking.finish_run(cfg, parent)
    s = tracking.summarize_run(parent, cfg.mlflow_uri())
    assert s["status"] == "FINISHED" and s["flow_run_id"] == "flow-123"
    assert [(x["stage"], x["status"], x["cached"]) for x in s["stages"]] == [
        ("train", "FINISHED", False),
        ("convert", "FAILED", False),
        ("extract", "FINISHED", True),
    ]
    assert s["stages"][2]["produced_by"] == "producer" and s["stages"][2]["metrics"] == {"n": 3.0}
    assert tracking.metric_history(s["stages"][0]["run_id"], "train/loss", cfg.mlflow_uri()) == [
        (1, 2.5),
        (2, 2.0),
    ]
    assert s["metrics"] == {"acceptance_length": 1.5}
    from mlflow import MlflowClient

    params = MlflowClient(cfg.mlflow_uri()).get_run(parent).data.params
    assert params["serve.env.HF_TOKEN"] == "***" and params["train.lr"] == "0.0003"
    assert "hf_secret_value" not in str(params)


def test_mlflow_failing_while_a_stage_fails_does_not_hide_the_stage_error(tmp_path, monkeypatch):
    """A full disk also breaks MLflow's SQLite store: the stage's DataError must stay the error
    raised (not a TransientError from MLflow, which would be retried as if the disk could heal)."""
    from eagle3.errors import TransientError
    from tasks import tracking

    cfg = load_config(None, [f"paths.runs_dir={tmp_path}"])
    with pytest.raises(DataError, match="No space left") as info:
        with tracking.stage_run(cfg, "0" * 32, "extract") as sr:

            def broken(*a, **k):
                raise TransientError(
                    "MLflow tracking server: (sqlite3.OperationalError) database or disk is full"
                )

            monkeypatch.setattr(tracking, "finish_run", broken)
            raise DataError(
                "hs_3.safetensors: could not write hidden states (No space left on device)"
            )
    assert sr.run_id
    assert any("database or disk is full" in n for n in info.value.__notes__)
