"""Prefect task ``register-draft``: a validated draft into MLflow's model registry, alias ``best`` per target.

Runs after the acceptance gate (so only drafts that converted, validated, passed the equivalence check and the
gate get here). The serving checkpoint folder (what the engine loads: ``config.json``, ``model.safetensors``,
``manifest.json``) is logged as the artifacts ``draft/`` of a nested MLflow run ``register`` and registered as a
new version of the registered model ``eagle3-draft-<target name>`` from ``runs:/<register run id>/draft`` (the
generic run-artifact source: no ``mlflow.pyfunc`` flavour is needed; works offline on a SQLite store).

Each version carries the tags in :func:`version_tags` (served / offline / simulated acceptance length, data
size, unique tokens, schedule, config hash, serving content hash). The alias ``best`` is moved to the version
with the highest served acceptance length of that registered model. A draft whose serving content hash is
already registered is not registered again: that version's tags are refreshed instead (a re-run of a cached
pipeline adds no duplicate version).
"""

from __future__ import annotations

import re
from typing import Any

from mlflow import MlflowClient
from prefect import task

from tasks import prefect_tags, task_options, tracking
from tasks.results import AcceptanceFigures, RegisteredDraft, StageResult

BEST_ALIAS = "best"
SERVED_TAG = "eagle3.acceptance_served"
HASH_TAG = "eagle3.serving_content_hash"
CONFIG_SECTIONS = ("target", "data", "extract", "train", "convert", "serve", "bench")


def model_name(target_name: str) -> str:
    """``eagle3-draft-<target name>``, with characters other than letters, digits, ``-``, ``_``, ``.``
    replaced by ``-`` (e.g. ``smollm2-135m-instruct`` → ``eagle3-draft-smollm2-135m-instruct``)."""
    return "eagle3-draft-" + re.sub(r"[^A-Za-z0-9._-]+", "-", target_name).strip("-")


def registry_client(cfg: Any) -> MlflowClient:
    """A client whose registry is the run's tracking store (``tasks.tracking.tracking_uri``): the SQLite file
    of a local run, or the tracking server of ``make stack-up``."""
    uri = tracking.tracking_uri(cfg)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _fmt(v: Any) -> str:
    return "" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))


def version_tags(cfg: Any, serving: StageResult, train: StageResult, figures: AcceptanceFigures,
                 parent_run_id: str) -> dict[str, str]:
    """The tags of a registered version (all strings; a missing figure is the empty string).

    ``serving``/``train``: the convert and train task results; ``figures``: the run's acceptance lengths
    (served, offline, simulated; bonus token counted). Data size = ``data.num_conversations`` (conversations) and the draft manifest's
    ``counts.train_positions`` (unique training tokens); schedule = ``train.schedule`` with its epochs and LR.
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
            "eagle3.schedule": f"{t.schedule} epochs={t.epochs:g} lr={t.lr:g} precision={t.precision}",
            "eagle3.config_hash": cfg.section_hash(*CONFIG_SECTIONS), HASH_TAG: serving.content_hash,
            "eagle3.config_name": cfg.name, "eagle3.pipeline_run_id": parent_run_id}


def _served(version: Any) -> float:
    try:
        return float(version.tags.get(SERVED_TAG, ""))
    except ValueError:
        return float("-inf")


def move_best_alias(client: MlflowClient, name: str) -> str:
    """Point alias ``best`` of ``name`` at its version with the highest served acceptance length (ties: the
    newest). Returns that version (a string). Raises DataError when the model has no version."""
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


def register_draft(cfg: Any, serving: StageResult, train: StageResult, figures: AcceptanceFigures,
                   parent_run_id: str) -> RegisteredDraft:
    """Register the serving checkpoint ``serving.dir`` (see the module doc) and return the version; also tags the parent run ``eagle3.registered_model`` = ``name/version``.
    Raises MlflowException from the registry (e.g. an unreachable server), DataError for a folder without a
    manifest."""
    from mlflow.exceptions import MlflowException

    from eagle3.assets import resolve_target

    client = registry_client(cfg)
    name = model_name(resolve_target(cfg).name)
    tags = version_tags(cfg, serving, train, figures, parent_run_id)
    try:
        client.create_registered_model(name, tags={"eagle3.target": resolve_target(cfg).name},
                                       description="EAGLE-3 drafts for this target, served by eagle3-pipeline")
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    old = _existing(client, name, serving.content_hash)
    if old is not None:
        for k, v in tags.items():
            client.set_model_version_tag(name, old.version, k, v)
        version, source, new = str(old.version), old.source, False
    else:
        with tracking.stage_run(cfg, parent_run_id, "register", tags=prefect_tags()) as sr:
            sr.log_path(serving.dir, "draft")
            source = f"runs:/{sr.run_id}/draft"
            mv = client.create_model_version(name, source, run_id=sr.run_id, tags=tags)
            version, new = str(mv.version), True
            sr.set_tags({"eagle3.registered_model": f"{name}/{version}"})
    best = move_best_alias(client, name)
    tracking.set_parent_tags(cfg, parent_run_id, {"eagle3.registered_model": f"{name}/{version}",
                                                  "eagle3.registered_best": f"{name}@{BEST_ALIAS}={best}"})
    return RegisteredDraft(name, version, best, source, new)


@task(name="register-draft", task_run_name="register-draft", **task_options(1800.0))
def register_task(cfg: Any, serving: StageResult, train: StageResult, figures: AcceptanceFigures,
                  parent_run_id: str) -> RegisteredDraft:
    """:func:`register_draft` as a Prefect task (not cached: registering twice is made idempotent by the
    serving content hash)."""
    return register_draft(cfg, serving, train, figures, parent_run_id)
