"""What the MLflow UI shows of a pipeline run: the experiment's kind and run-list view, links into
the UI, the parent run's description.

MLflow conventions used (mlflow 3.17, read from its UI bundle ``mlflow/server/js/build`` and
``mlflow/demo/generators/traces.py``):

- experiment tag ``mlflow.experimentKind`` = ``custom_model_development``: the experiment opens in
  the
  model-training view (runs, metrics), not the GenAI one (traces overview, assistant panel); the
  UI's
  global switch is its ``workflowType`` URL parameter (``machine_learning``), which every link here
  carries
  (without it the UI opens the experiment on its last choice, GenAI by default);
- experiment tag ``mlflow.sharedViewState.<key>`` = the run list's view state as JSON
  (``selectedColumns`` with
  column ids ``metrics.`<key>``` / ``tags.`<key>```, ``orderByKey``, ``orderByAsc``), opened by the
  URL
  ``#/experiments/<id>?viewStateShareKey=<key>`` (what the UI's own "Share" button makes);
- run tag ``mlflow.note.content``: the run's description (markdown) on its overview page.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
VIEW_KEY = "eagle3-runs"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
NOTE_TAG = "mlflow.note.content"
# the UI's own switch (else its last choice, GenAI by default)
ML_VIEW = "workflowType=machine_learning"
HEADLINE_METRICS = ("acceptance_length", "acceptance_length_untrained", "acceptance_length_offline")
HEADLINE_TAGS = ("eagle3.decision", "eagle3.acceptance_gate")


def run_list_view() -> dict:
    """The run list's view state: the acceptance lengths and the decision as the columns after the
    run name, creation time and duration (MLflow's default Source / Models / Dataset columns left
    out, so they fit on one screen), newest run first."""
    cols = [f"metrics.`{k}`" for k in HEADLINE_METRICS] + [f"tags.`{k}`" for k in HEADLINE_TAGS]
    return {"selectedColumns": cols, "orderByKey": "attributes.start_time", "orderByAsc": False,
            "searchFilter": ""}


def experiment_tags() -> dict[str, str]:
    """Tags every experiment of the pipeline carries (see the module doc)."""
    return {EXPERIMENT_KIND_TAG: MODEL_TRAINING, VIEW_TAG: json.dumps(run_list_view(),
                                                                      sort_keys=True)}


def ensure_experiment_ui(client: Any, experiment: Any) -> None:
    """Set :func:`experiment_tags` on ``experiment`` (an ``mlflow.entities.Experiment``) where they
    differ (nothing is written when they are already there)."""
    have = dict(getattr(experiment, "tags", None) or {})
    for k, v in experiment_tags().items():
        if have.get(k) != v:
            client.set_experiment_tag(experiment.experiment_id, k, v)


def ui_base(tracking_uri: str) -> str | None:
    """The MLflow UI's base URL when the tracking store is a server (``http(s)://…``), else None."""
    return tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else None


def ui_command(tracking_uri: str, port: int = 5000) -> str:
    """The command that opens the UI on a local store (``mlflow ui --backend-store-uri … --host
    127.0.0.1``)."""
    return f"mlflow ui --backend-store-uri {tracking_uri} --host 127.0.0.1 --port {port}"


def run_url(base: str, experiment_id: str, run_id: str, tab: str = "") -> str:
    """``<base>/#/experiments/<exp>/runs/<run>[/<tab>]?workflowType=machine_learning`` (tab e.g.
    ``artifacts``)."""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}" + (f"/{tab}" if tab else "") + f"?{ML_VIEW}"


def experiment_url(base: str, experiment_id: str) -> str:
    """The experiment's run list in the model-training view with :func:`run_list_view` (acceptance
    and decision columns)."""
    return f"{base}/#/experiments/{experiment_id}/runs?{ML_VIEW}&viewStateShareKey={quote(VIEW_KEY)}"


def model_version_url(base: str, name: str, version: str) -> str:
    return f"{base}/#/models/{quote(name)}/versions/{version}?{ML_VIEW}"


def prefect_ui_base() -> str | None:
    """The Prefect UI's base URL when a Prefect server is used (``PREFECT_UI_URL``, derived by
    Prefect from ``PREFECT_API_URL``), else None (the ephemeral API has no UI)."""
    import os

    from prefect.settings import PREFECT_UI_URL

    if not os.environ.get("PREFECT_API_URL"):
        return None
    url = PREFECT_UI_URL.value()
    return url.rstrip("/") if url else None


def parent_note(config_name: str, figures: Any, decision: Any) -> str:
    """The parent run's description (``mlflow.note.content``): the acceptance lengths and the gate,
    then the decision with its rule, confidence and evidence lines. ``figures``:
    ``tasks.results.AcceptanceFigures``; ``decision``: ``eagle3.decide.Decision``."""
    fmt = (lambda v: "n/a" if v is None else f"{v:.3f}")
    lines = [f"**{config_name}** — decision: **{decision.recommendation}** (rule `{decision.rule}`, "
             f"confidence {decision.confidence})", "",
             "| acceptance length (bonus token counted) | value |", "|---|---|",
             f"| served, trained draft | {fmt(figures.served)} |",
             f"| offline, same draft and prompts | {fmt(figures.offline)} |",
             f"| simulated, training validation | {fmt(figures.simulated)} |",
             f"| served, untrained baseline | {fmt(figures.untrained)} |", "",
             f"Acceptance gate (minimum {figures.minimum:g}): "
             + ("passed" if figures.passed else f"**failed** — {figures.failure}"), "", "Evidence:", ""]
    lines += [f"- {r}" for r in decision.reasons]
    return "\n".join(lines)
