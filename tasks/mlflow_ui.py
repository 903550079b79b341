"""What the MLflow UI shows of a pipeline run: the experiment's kind and run-list view, links into
the UI, the parent run's description and its headline metrics.

MLflow conventions used (mlflow 3.17, read from its UI bundle ``mlflow/server/js/build``:
``main.*.js``, ``3793.*.chunk.js``, ``3878.*.chunk.js``, and ``mlflow/demo/generators/traces.py``):

- experiment tag ``mlflow.experimentKind`` = ``custom_model_development``: the experiment opens in
  the model-training view (runs, metrics), not the GenAI one (traces overview, assistant panel);
  the UI's global switch is its ``workflowType`` URL parameter (``machine_learning``), which every
  link here carries (without it the UI opens the experiment on its last choice, GenAI by default);
- experiment tag ``mlflow.sharedViewState.<key>`` = the run list's view state as JSON (the keys the
  UI shares: ``selectedColumns`` with column ids ``metrics.`<key>``` / ``tags.`<key>``` /
  ``attributes.`Description```, ``columnOrder``, ``columnWidths`` {column id: pixels} applied
  to the columns of ``columnOrder`` only (``3793.*.chunk.js``), ``orderByKey``,
  ``orderByAsc``), opened by the URL ``#/experiments/<id>?viewStateShareKey=<key>`` (what the UI's
  own "Share" button makes); a metric column is 100 px wide unless set, and shows the value as
  logged (no rounding);
- run tag ``mlflow.note.content``: the run's description, markdown on the run's overview page
  (folded after a few lines: "Show more"), plain text in the run list's ``Description`` column.
"""

from __future__ import annotations

import json
import shlex
from typing import Any
from urllib.parse import quote

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
VIEW_KEY = "eagle3-runs"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
NOTE_TAG = "mlflow.note.content"
# the UI's own switch (else its last choice, GenAI by default)
ML_VIEW = "workflowType=machine_learning"
DESCRIPTION_COLUMN = "attributes.`Description`"
# short, distinct names for the run list (the full-precision ``acceptance_length*`` metrics stay):
# metric name -> AcceptanceFigures field; "AL" = acceptance length, bonus token counted
HEADLINE_METRICS = {"AL served": "served", "AL untrained": "untrained", "AL offline": "offline"}
HEADLINE_TAGS = ("eagle3.decision", "eagle3.acceptance_gate")
# pixels: a title and a 3-decimal value; "more evidence needed"; the description's 50 characters
COLUMN_WIDTHS = {"metrics.`AL served`": 95, "metrics.`AL untrained`": 105,
                 "metrics.`AL offline`": 95, "tags.`eagle3.decision`": 170,
                 "tags.`eagle3.acceptance_gate`": 120, DESCRIPTION_COLUMN: 380}
DESCRIPTION_CHARS = 50  # the run list shows a description's first 50 characters (then "...")
# the UI applies columnWidths only to the columns listed in columnOrder (its column ids for the run
# name, date and duration read from the rendered grid's header cells, ``col-id``)
LEADING_COLUMNS = ("attributes.`Run Name`", "runDateAndNestInfo", "duration")


def run_list_view() -> dict:
    """The run list's view state: after the run name, creation time and duration, the short-named
    rounded acceptance lengths (:data:`HEADLINE_METRICS`), the decision and the gate, then the
    description (:func:`headline_line` first), in that order and each wide enough for its title
    and value (:data:`COLUMN_WIDTHS`), so the figures and the decision fit on the first screen;
    MLflow's default Source / Models / Dataset columns left out; newest run first."""
    cols = ([f"metrics.`{k}`" for k in HEADLINE_METRICS] + [f"tags.`{k}`" for k in HEADLINE_TAGS]
            + [DESCRIPTION_COLUMN])
    return {"selectedColumns": cols, "columnOrder": [*LEADING_COLUMNS, *cols],
            "columnWidths": dict(COLUMN_WIDTHS), "orderByKey": "attributes.start_time",
            "orderByAsc": False, "searchFilter": ""}


def headline_metrics(figures: Any) -> dict[str, float]:
    """The run list's metrics (:data:`HEADLINE_METRICS`) from ``figures``
    (``tasks.results.AcceptanceFigures``): acceptance lengths (bonus token counted, unitless)
    rounded to 3 decimals, as the UI shows a metric as logged; a figure that is None is left out."""
    return {k: round(float(getattr(figures, f)), 3) for k, f in HEADLINE_METRICS.items()
            if getattr(figures, f) is not None}


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def headline_line(figures: Any, decision: Any) -> str:
    """The description's first line, plain text of at most :data:`DESCRIPTION_CHARS` characters for
    every decision (the run list shows that many): the decision, then the served acceptance length
    (AL, bonus token counted) and the untrained baseline's, to 3 decimals, e.g. ``more evidence
    needed; AL 1.210, untrained 1.010``."""
    return (f"{decision.recommendation}; AL {_fmt(figures.served)}, "
            f"untrained {_fmt(figures.untrained)}")


def figures_line(figures: Any) -> str:
    """The description's second line: what AL means, all four figures labelled, the gate."""
    gate = ("passed" if figures.passed else "FAILED")
    return (f"AL = acceptance length, bonus token counted: served {_fmt(figures.served)}, "
            f"untrained baseline {_fmt(figures.untrained)}, offline {_fmt(figures.offline)}, "
            f"simulated {_fmt(figures.simulated)}; acceptance gate (minimum {figures.minimum:g}) "
            f"{gate}.")


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
    """The MLflow UI's base URL when the tracking store is a server (``http(s)://``), else
    None."""
    return tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else None


def ui_command(tracking_uri: str, port: int = 5000) -> str:
    """The command that opens the UI on a local store (``mlflow ui --backend-store-uri … --host
    127.0.0.1``), the store quoted for a POSIX shell when it holds spaces or shell characters."""
    return (f"mlflow ui --backend-store-uri {shlex.quote(tracking_uri)} --host 127.0.0.1 "
            f"--port {port}")


def run_url(base: str, experiment_id: str, run_id: str, tab: str = "") -> str:
    """``<base>/#/experiments/<exp>/runs/<run>[/<tab>]?workflowType=machine_learning`` (tab e.g.
    ``artifacts``)."""
    tail = f"/{tab}" if tab else ""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}{tail}?{ML_VIEW}"


def experiment_url(base: str, experiment_id: str) -> str:
    """The experiment's run list in the model-training view with :func:`run_list_view` (acceptance
    and decision columns)."""
    return (f"{base}/#/experiments/{experiment_id}/runs?{ML_VIEW}"
            f"&viewStateShareKey={quote(VIEW_KEY)}")


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
    """The parent run's description (``mlflow.note.content``). First, in the lines the run page
    shows before "Show more" (the list's Description column shows the first line):
    :func:`headline_line` and :func:`figures_line`; then the rule and confidence; the table of the
    four acceptance lengths; the gate with its diagnosis; the decision's evidence lines.
    ``figures``: ``tasks.results.AcceptanceFigures``; ``decision``: ``eagle3.decide.Decision``."""
    lines = [headline_line(figures, decision), "", figures_line(figures), "",
             f"**{config_name}** - decision **{decision.recommendation}** (rule `{decision.rule}`, "
             f"confidence {decision.confidence}).", "",
             "| acceptance length (bonus token counted) | value |", "|---|---|",
             f"| served, trained draft | {_fmt(figures.served)} |",
             f"| offline, same draft and prompts | {_fmt(figures.offline)} |",
             f"| simulated, training validation | {_fmt(figures.simulated)} |",
             f"| served, untrained baseline | {_fmt(figures.untrained)} |", "",
             f"Acceptance gate (minimum {figures.minimum:g}): "
             + ("passed" if figures.passed else f"**failed** — {figures.failure}"), "",
             "Evidence:", ""]
    lines += [f"- {r}" for r in decision.reasons]
    return "\n".join(lines)
