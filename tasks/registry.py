"""Prefect task ``register-draft``: a validated draft into MLflow's model registry, alias ``best``
per target.

Runs after the acceptance gate (so only drafts that converted, validated, passed the equivalence
check and the gate get here). The serving checkpoint folder (what the engine loads: ``config.json``,
``model.safetensors``, ``manifest.json``) is logged as the artifacts ``draft/`` of the pipeline's
parent MLflow run (so its run page lists the registered model; a nested run ``register`` records the
step) and registered as a new version of the registered model ``eagle3-draft-<target name>`` from
``<parent run's artifact uri>/draft`` (the run's own artifact location; an ``MLmodel`` file with the
flavour ``eagle3_draft`` makes it a loadable MLflow model for the UI; no ``mlflow.pyfunc`` flavour
is needed; works offline on a SQLite store).

Each version carries the tags in :func:`version_tags` (served / offline / simulated acceptance
length, data size, unique tokens, schedule, config hash, serving content hash). The alias ``best``
is moved to the version with the highest served acceptance length of that registered model. A draft
whose serving content hash is already registered is not registered again: that version's figures are
refreshed instead (a re-run of a cached pipeline adds no duplicate version), its provenance
(``eagle3.pipeline_run_id``) is kept.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from prefect import task

from eagle3.config import RunConfig
from tasks import prefect_tags, task_options, tracking
from tasks.results import AcceptanceFigures, RegisteredDraft, StageResult

BEST_ALIAS = "best"
SERVED_TAG = "eagle3.acceptance_served"
HASH_TAG = "eagle3.serving_content_hash"
# who made the version: never refreshed
PROVENANCE_TAGS = ("eagle3.pipeline_run_id", "eagle3.config_name")
CONFIG_SECTIONS = ("target", "data", "extract", "train", "convert", "serve", "bench")


def model_name(target_name: str) -> str:
    """``eagle3-draft-<target name>``, with characters other than letters, digits, ``-``, ``_``,
    ``.`` replaced by ``-`` (e.g. ``smollm2-135m-instruct`` →
    ``eagle3-draft-smollm2-135m-instruct``)."""
    return "eagle3-draft-" + re.sub(r"[^A-Za-z0-9._-]+", "-", target_name).strip("-")


def registry_client(cfg: RunConfig) -> MlflowClient:
    """A client whose registry is the run's tracking store (``tasks.tracking.tracking_uri``): the
    SQLite file of a local run, or the tracking server of ``make stack-up``."""
    uri = tracking.tracking_uri(cfg)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _fmt(v: Any) -> str:
    return "" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))


def version_tags(cfg: RunConfig, serving: StageResult, train: StageResult,
                 figures: AcceptanceFigures, parent_run_id: str) -> dict[str, str]:
    """The tags of a registered version (all strings; a missing figure is the empty string).

    ``serving``/``train``: the convert and train task results; ``figures``: the run's acceptance
    lengths (served, offline, simulated; bonus token counted). Data size =
    ``data.num_conversations`` (conversations) and the draft manifest's ``counts.train_positions``
    (unique training tokens); schedule = ``train.schedule`` with its epochs and LR.
    """
    from eagle3.artifacts import read_manifest

    m = read_manifest(train.dir)
    t = cfg.train
    return {SERVED_TAG: _fmt(figures.served), "eagle3.acceptance_offline": _fmt(figures.offline),
            "eagle3.acceptance_simulated": _fmt(figures.simulated),
            "eagle3.data_conversations": str(cfg.data.num_conversations),
            "eagle3.unique_tokens": _fmt((m.get("counts") or {}).get("train_positions")),
            "eagle3.epochs_over_data": _fmt(m.get("epochs_over_data")),
            "eagle3.optimizer_steps": _fmt(m.get("optimizer_steps")),
            "eagle3.schedule":
                f"{t.schedule} epochs={t.epochs:g} lr={t.lr:g} precision={t.precision}",
            "eagle3.config_hash": cfg.section_hash(*CONFIG_SECTIONS),
            HASH_TAG: serving.content_hash,
            "eagle3.config_name": cfg.name, "eagle3.pipeline_run_id": parent_run_id}


def refreshed_tags(tags: dict[str, str], parent_run_id: str) -> dict[str, str]:
    """The tags a re-registration of an already registered checkpoint writes: the new figures, but
    never the version's provenance: ``eagle3.pipeline_run_id`` stays the run that made the draft;
    the re-run goes to ``eagle3.last_pipeline_run_id``."""
    return {**{k: v for k, v in tags.items() if k not in PROVENANCE_TAGS},
            "eagle3.last_pipeline_run_id": parent_run_id}


def _mlmodel_file(serving: StageResult, run_id: str, into: Path) -> Path:
    """``<into>/MLmodel`` for the draft folder, so MLflow's model version page finds the file it
    reads (flavour ``eagle3_draft``: the engine's format and the content hash; not a pyfunc, nothing
    to predict with)."""
    from mlflow.models import Model

    from eagle3.artifacts import read_manifest

    m = read_manifest(serving.dir)
    flavor = {"format": "sglang", "content_hash": serving.content_hash, "kind": m.get("kind"),
              "files": sorted(p.name for p in serving.dir.iterdir() if p.is_file())}
    path = into / "MLmodel"
    Model(artifact_path="draft", run_id=run_id, flavors={"eagle3_draft": flavor}).save(str(path))
    return path


def _artifact_source(client: MlflowClient, run_id: str) -> str:
    """The version's source: the run's own artifact location + ``/draft`` (e.g.
    ``mlflow-artifacts:/1/<run>/artifacts/draft`` on a tracking server, ``file:///…`` on a local
    store), not ``runs:/<run>/draft``: a tracking server with a SQLite backend cannot resolve
    ``runs:/`` when it serves the model version's files (its own tracking URI is not http, so the
    UI's ``get-artifact`` request failed with HTTP 500)."""
    return client.get_run(run_id).info.artifact_uri.rstrip("/") + "/draft"


def _version_description(cfg: RunConfig, figures: AcceptanceFigures, parent_run_id: str) -> str:
    return (f"EAGLE-3 draft from config {cfg.name} (pipeline run {parent_run_id}): acceptance "
            f"length served {_fmt(figures.served) or 'n/a'}, offline "
            f"{_fmt(figures.offline) or 'n/a'}, simulated {_fmt(figures.simulated) or 'n/a'} "
            "(bonus token counted).")


def _served(version: Any) -> float:
    try:
        return float(version.tags.get(SERVED_TAG, ""))
    except ValueError:
        return float("-inf")


def move_best_alias(client: MlflowClient, name: str) -> str:
    """Point alias ``best`` of ``name`` at its version with the highest served acceptance length
    (ties: the newest). Returns that version (a string). Raises DataError when the model has no
    version."""
    from eagle3.errors import DataError

    versions = client.search_model_versions(f"name='{name}'")
    if not versions:
        raise DataError(f"registered model {name!r}: no version to point alias {BEST_ALIAS!r} at")
    best = max(versions, key=lambda v: (_served(v), int(v.version)))
    client.set_registered_model_alias(name, BEST_ALIAS, best.version)
    return str(best.version)


def _existing(client: MlflowClient, name: str, content_hash: str) -> Any | None:
    for v in client.search_model_versions(f"name='{name}'"):
        if v.tags.get(HASH_TAG) == content_hash:
            return v
    return None


def register_draft(cfg: RunConfig, serving: StageResult, train: StageResult,
                   figures: AcceptanceFigures, parent_run_id: str) -> RegisteredDraft:
    """Register the serving checkpoint ``serving.dir`` (see the module doc) and return the version;
    also tags the parent run ``eagle3.registered_model`` = ``name/version``. Raises MlflowException
    from the registry (e.g. an unreachable server), DataError for a folder without a manifest."""
    from mlflow.exceptions import MlflowException

    from eagle3.assets import resolve_target

    client = registry_client(cfg)
    name = model_name(resolve_target(cfg).name)
    tags = version_tags(cfg, serving, train, figures, parent_run_id)
    try:
        client.create_registered_model(name, tags={"eagle3.target": resolve_target(cfg).name},
                                       description="EAGLE-3 drafts for this target, served by "
                                                   "eagle3-pipeline")
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    old = _existing(client, name, serving.content_hash)
    if old is not None:
        for k, v in refreshed_tags(tags, parent_run_id).items():
            client.set_model_version_tag(name, old.version, k, v)
        version, source, new = str(old.version), old.source, False
    else:
        with tracking.stage_run(cfg, parent_run_id, "register", tags=prefect_tags()) as sr:
            # into the parent run: the version's run is the pipeline run, whose page then lists the
            # model
            home = tracking.StageRun(sr.client, parent_run_id)
            home.log_path(serving.dir, "draft")
            with tempfile.TemporaryDirectory(prefix="eagle3-mlmodel-") as tmp:
                home.log_path(_mlmodel_file(serving, parent_run_id, Path(tmp)), "draft")
            source = _artifact_source(client, parent_run_id)
            mv = client.create_model_version(name, source, run_id=parent_run_id, tags=tags,
                                             description=_version_description(cfg, figures,
                                                                              parent_run_id))
            version, new = str(mv.version), True
            sr.set_tags({"eagle3.registered_model": f"{name}/{version}"})
    best = move_best_alias(client, name)
    tracking.set_parent_tags(cfg, parent_run_id,
                             {"eagle3.registered_model": f"{name}/{version}",
                              "eagle3.registered_best": f"{name}@{BEST_ALIAS}={best}"})
    return RegisteredDraft(name, version, best, source, new)


@task(name="register-draft", task_run_name="register-draft", **task_options(1800.0))
def register_task(cfg: RunConfig, serving: StageResult, train: StageResult,
                  figures: AcceptanceFigures, parent_run_id: str) -> RegisteredDraft:
    """:func:`register_draft` as a Prefect task (not cached: registering twice is made idempotent by
    the serving content hash)."""
    return register_draft(cfg, serving, train, figures, parent_run_id)
