"""The hidden states as an MLflow dataset: metadata only, named after the target that made them."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow import MlflowClient

from eagle3.artifacts import read_manifest
from eagle3.errors import DataError


def dataset_target_name(manifest: dict) -> str:
    """The target's name in a hidden-states manifest: ``target.name``, else the last part of
    ``target.path`` (manifests written before the name was recorded). Raises DataError when neither
    is there (a dataset named after no target would look like every other one)."""
    t = manifest.get("target") or {}
    name = t.get("name") or (Path(t["path"]).name if t.get("path") else "")
    if not name:
        raise DataError("hidden-states manifest: key 'target.name' (or 'target.path') expected the "
                        f"target's name, got target={t!r}")
    return str(name)


def log_hidden_states(client: MlflowClient, run_id: str, directory: str | Path,
                      context: str) -> None:
    """Log an extracted hidden-state folder as an MLflow dataset input of this run.

    The dataset is an ``mlflow.data.meta_dataset.MetaDataset`` (metadata only: terabytes of states
    are never copied): source = the folder, name = ``hidden-states-<target name>``, digest = the
    first 32 hex digits of the manifest's ``content_hash`` (MLflow's SQL store holds at most 36
    characters), profile = the manifest's counts, bytes, bytes/token, dtype, aux layer ids and the
    full content hash. ``context`` becomes the input tag ``mlflow.data.context`` ("extraction" for
    the run that wrote it, "training" for the runs that read it). Raises DataError when the folder
    has no manifest or it has no content_hash.
    """
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import Dataset, DatasetInput, InputTag

    m = read_manifest(directory)
    full = m.get("content_hash")
    if not isinstance(full, str) or len(full) < 32:
        raise DataError(f"{Path(directory) / 'manifest.json'}: key 'content_hash' expected a hex "
                        f"digest of at least 32 characters, got {full!r}")
    target = dataset_target_name(m)
    # MLflow registers its local-file source twice and says so; same class
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
        source = resolve_dataset_source(str(Path(directory).resolve()))
    entity = MetaDataset(source, name=f"hidden-states-{target}",
                         digest=full[:32])._to_mlflow_entity()  # noqa: SLF001
    profile = {"content_hash": full, "counts": m.get("counts"), "bytes": m.get("bytes"),
               "bytes_per_token": m.get("bytes_per_token"), "dtype": m.get("dtype"),
               "aux_layer_ids": m.get("aux_layer_ids"),
               "layer_id_convention": m.get("layer_id_convention")}
    entity = Dataset(name=entity.name, digest=entity.digest, source_type=entity.source_type,
                     source=entity.source, schema=entity.schema,
                     profile=json.dumps(profile, default=str))
    client.log_inputs(run_id, datasets=[DatasetInput(entity, tags=[
        InputTag("mlflow.data.context", context)])])


