"""tasks.tracking: the hidden states as an MLflow dataset named after the target that made them."""

from __future__ import annotations

import pytest

pytest.importorskip("mlflow")

from eagle3.artifacts import write_manifest  # noqa: E402
from eagle3.errors import DataError  # noqa: E402
from tasks import datasets, tracking  # noqa: E402


def _hidden_states(root, target: dict):
    d = root / "extract"
    (d / "hidden_states").mkdir(parents=True)
    (d / "hidden_states" / "hs_0.safetensors").write_bytes(b"x" * 16)
    write_manifest(d, "hidden_states", counts={"samples": 1}, target=target, dtype="float32")
    return d


def _datasets(cfg, run_id):
    client, _ = tracking.client_for(cfg)
    return [
        (i.dataset.name, {t.key: t.value for t in i.tags}["mlflow.data.context"])
        for i in client.get_run(run_id).inputs.dataset_inputs
    ]


def test_dataset_named_after_the_target(tiny_cfg, tmp_path):
    client, exp = tracking.client_for(tiny_cfg)
    parent = client.create_run(exp).info.run_id
    d = _hidden_states(tmp_path, {"name": "smollm2-135m-instruct", "path": "/elsewhere/folder"})
    with tracking.stage_run(tiny_cfg, parent, "extract") as sr:
        sr.log_dataset(d, "extraction")
    assert _datasets(tiny_cfg, sr.run_id) == [("hidden-states-smollm2-135m-instruct", "extraction")]
    # an older manifest without target.name: the folder's name, never a constant shared by every
    # target
    old = _hidden_states(tmp_path / "old", {"path": "/cache/models/tiny-random-llama"})
    with tracking.stage_run(tiny_cfg, parent, "train") as sr2:
        sr2.log_dataset(old, "training")
    assert _datasets(tiny_cfg, sr2.run_id) == [("hidden-states-tiny-random-llama", "training")]


def test_dataset_without_target_is_an_error(tmp_path):
    with pytest.raises(DataError, match=r"target.name.*got target=\{\}"):
        datasets.dataset_target_name({"target": {}})


def test_extract_manifest_records_the_target_name(tiny_target_dir, tiny_cfg):
    from eagle3.extract.stage import target_identity

    ident = target_identity(tiny_target_dir, tiny_cfg)
    assert ident["name"] == tiny_target_dir.name and ident["name"] != "target"
    assert datasets.dataset_target_name({"target": ident}) == tiny_target_dir.name
