"""tasks.registry: validated drafts into MLflow's model registry (SQLite store, offline), alias
``best`` on the version with the highest served acceptance, idempotent by serving content hash."""

from __future__ import annotations

import pytest

pytest.importorskip("mlflow")

from mlflow import MlflowClient  # noqa: E402

from eagle3.artifacts import write_manifest  # noqa: E402
from tasks import tracking  # noqa: E402
from tasks.registry import BEST_ALIAS, model_name, register_draft  # noqa: E402
from tasks.results import AcceptanceFigures, StageResult  # noqa: E402


def _stage_dirs(root, tag: str, payload: bytes):
    """A serving folder (weights bytes ``payload``) and a train folder with a draft manifest."""
    serving, train = root / f"serving-{tag}", root / f"train-{tag}"
    serving.mkdir(parents=True)
    train.mkdir(parents=True)
    (serving / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    (serving / "model.safetensors").write_bytes(payload)
    sm = write_manifest(serving, "serving_checkpoint")
    write_manifest(
        train, "draft", counts={"train_positions": 1234}, epochs_over_data=3.0, optimizer_steps=45
    )
    return (
        StageResult("convert", serving, sm["content_hash"], "run-c"),
        StageResult("train", train, "h", "run-t"),
    )


def _fig(
    served: float, offline: float | None = None, simulated: float | None = None
) -> AcceptanceFigures:
    return AcceptanceFigures(served, None, offline, simulated, None, minimum=1.0, passed=True)


def _parent(cfg) -> str:
    client, exp = tracking.client_for(cfg)
    return client.create_run(exp, run_name="pipeline").info.run_id


def test_model_name_sanitises():
    assert model_name("smollm2-135m-instruct") == "eagle3-draft-smollm2-135m-instruct"
    assert model_name("org/My Model:v1") == "eagle3-draft-org-My-Model-v1"


def test_register_versions_alias_and_idempotence(tiny_cfg, tiny_target_dir, tmp_path):
    uri = tracking.tracking_uri(tiny_cfg)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    name = model_name(tiny_target_dir.name)

    s1, t1 = _stage_dirs(tmp_path, "a", b"weights-a")
    r1_parent = _parent(tiny_cfg)
    r1 = register_draft(tiny_cfg, s1, t1, _fig(1.40, 1.42, 1.55), r1_parent)
    assert (r1.name, r1.version, r1.best_version, r1.new) == (name, "1", "1", True)
    v1 = client.get_model_version(name, "1")
    assert v1.tags["eagle3.acceptance_served"] == "1.4000"
    assert v1.tags["eagle3.acceptance_offline"] == "1.4200"
    assert v1.tags["eagle3.acceptance_simulated"] == "1.5500"
    assert v1.tags["eagle3.unique_tokens"] == "1234" and v1.tags["eagle3.optimizer_steps"] == "45"
    assert v1.tags["eagle3.data_conversations"] == str(tiny_cfg.data.num_conversations)
    assert v1.tags["eagle3.schedule"].startswith(tiny_cfg.train.schedule)
    assert v1.tags["eagle3.serving_content_hash"] == s1.content_hash
    # the checkpoint folder itself is what was registered
    files = {f.path for f in client.list_artifacts(v1.run_id, "draft")}
    assert files == {
        "draft/config.json",
        "draft/model.safetensors",
        "draft/manifest.json",
        "draft/MLmodel",
    }
    # the source is the run's own artifact location (not runs:/, which a SQLite-backed server cannot
    # serve), the run is the pipeline's parent run (its page lists the model), MLmodel makes it a
    # loadable model
    assert v1.source == client.get_run(v1.run_id).info.artifact_uri.rstrip("/") + "/draft"
    assert v1.run_id == v1.tags["eagle3.pipeline_run_id"]
    assert client.get_run(v1.run_id).data.tags.get("mlflow.parentRunId") is None
    from mlflow.models import Model

    local = client.download_artifacts(v1.run_id, "draft/MLmodel", str(tmp_path / "dl"))
    assert Model.load(local).flavors["eagle3_draft"]["content_hash"] == s1.content_hash

    # a worse draft: new version, alias stays on version 1
    s2, t2 = _stage_dirs(tmp_path, "b", b"weights-b")
    r2 = register_draft(tiny_cfg, s2, t2, _fig(1.20, 1.21, 1.3), _parent(tiny_cfg))
    assert (r2.version, r2.best_version) == ("2", "1")
    assert str(client.get_model_version_by_alias(name, BEST_ALIAS).version) == "1"

    # a better draft: the alias moves
    s3, t3 = _stage_dirs(tmp_path, "c", b"weights-c")
    r3 = register_draft(tiny_cfg, s3, t3, _fig(1.60, 1.61, 1.7), _parent(tiny_cfg))
    assert (r3.version, r3.best_version) == ("3", "3")
    assert str(client.get_model_version_by_alias(name, BEST_ALIAS).version) == "3"

    # the same checkpoint again (a re-run with every stage cached): no new version, figures
    # refreshed, provenance kept (the version still points at the run that made it; the re-run is
    # recorded beside it)
    made_by = client.get_model_version(name, "2").tags["eagle3.pipeline_run_id"]
    later = _parent(tiny_cfg)
    again = register_draft(tiny_cfg, s2, t2, _fig(1.70, 1.7, 1.3), later)
    assert (again.version, again.new, again.best_version) == ("2", False, "2")
    assert len(client.search_model_versions(f"name='{name}'")) == 3
    v2 = client.get_model_version(name, "2")
    assert v2.tags["eagle3.acceptance_served"] == "1.7000"
    assert made_by != later and v2.tags["eagle3.pipeline_run_id"] == made_by == v2.run_id
    assert v2.tags["eagle3.last_pipeline_run_id"] == later
    # the other versions keep theirs too
    assert client.get_model_version(name, "1").tags["eagle3.pipeline_run_id"] == r1_parent


def test_register_without_manifest_is_an_error(tiny_cfg, tiny_target_dir, tmp_path):
    from eagle3.errors import DataError

    s1, _ = _stage_dirs(tmp_path, "a", b"w")
    with pytest.raises(DataError, match="manifest not found"):
        register_draft(
            tiny_cfg,
            s1,
            StageResult("train", tmp_path / "nowhere", "h", "r"),
            _fig(1.2),
            _parent(tiny_cfg),
        )
