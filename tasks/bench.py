"""Prefect tasks after the measurement: the acceptance figures, the decision and the acceptance
gate.

In that order, so a run whose gate fails still records its decision ("more data / longer training /
fix serving") - when it is needed most. None is cached: all are cheap and read only what the cached
stages returned, so changing the gate's minimum re-runs the gate alone.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from prefect import task

from eagle3.config import RunConfig
from tasks import mlflow_ui, prefect_tags, task_options, tracking
from tasks.results import AcceptanceFigures, StageResult


def offline_settings(cfg: RunConfig) -> dict:
    """The in-process decoding settings that match the served measurement: the bench's prompts,
    number of prompts, max new tokens (tokens) and temperature, the engine's
    ``speculative_num_steps``, and the dtype the reference engine serves in (``serve.dtype``;
    ``auto`` = bf16 where it is fast on that device, else float32: eagle3.precision), its device
    (``serve.device``) and, on a CPU, its torch threads (``serve.cpu_threads``)."""
    from eagle3.precision import resolve_dtype
    from eagle3.serve.launcher import reference_device

    b = cfg.bench
    device = reference_device(cfg.serve.device)
    return {"prompts": b.prompts, "num_prompts": b.num_prompts, "max_new_tokens": b.max_new_tokens,
            "temperature": b.temperature, "num_steps": cfg.serve.speculative_num_steps,
            "topk": cfg.serve.speculative_eagle_topk,
            "chat_template_kwargs": dict(cfg.data.chat_template_kwargs),
            "dtype": resolve_dtype(cfg.serve.dtype, device), "device": device,
            "cpu_threads": cfg.serve.cpu_threads if device.startswith("cpu") else None}


def offline_figure(cfg: RunConfig, serving_dir: Path) -> dict:
    """``eagle3.measure.offline.offline_acceptance`` of the serving checkpoint with
    :func:`offline_settings`, memoised in ``<run_dir>/gate/offline_acceptance.json`` by (serving
    manifest content hash, settings).

    Costs one in-process generation pass over the bench prompts (SmolLM2 on 2 CPU cores, 8 prompts x
    64 tokens: ≈ 30-40 s). Returns the offline result (``acceptance_length``, ``per_position``,
    ``wall_s`` seconds, ...). Raises DataError when the serving folder has no manifest.
    """
    from eagle3.artifacts import atomic_write_json, read_manifest
    from eagle3.assets import resolve_target
    from eagle3.measure.offline import offline_acceptance

    st = offline_settings(cfg)
    key = {"serving_content_hash": read_manifest(serving_dir)["content_hash"], **st}
    memo = cfg.run_dir() / "gate" / "offline_acceptance.json"
    if memo.is_file():
        old = json.loads(memo.read_text())
        if old.get("key") == key:
            return old["result"]
    res = offline_acceptance(resolve_target(cfg), serving_dir, st["prompts"],
                             num_prompts=st["num_prompts"],
                             max_new_tokens=st["max_new_tokens"], num_steps=st["num_steps"],
                             dtype=st["dtype"], temperature=st["temperature"], topk=st["topk"],
                             device=st["device"], chat_template_kwargs=st["chat_template_kwargs"],
                             cpu_threads=st["cpu_threads"])
    memo.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(memo, {"key": key, "result": res})
    return res


def prefetch_offline_figure(cfg: RunConfig, serving_dir: Path) -> bool:
    """:func:`offline_figure` computed ahead (its memo is what the acceptance task then reads), e.g.
    while the engines are benchmarked; True when it is ready. A failure here is only logged: the
    acceptance task computes the figure again and fails there, as a task, with the error recorded on
    its run."""
    try:
        offline_figure(cfg, serving_dir)
        return True
    # caught broadly: re-raised by the acceptance task, which repeats the computation
    except Exception as e:  # noqa: BLE001
        logging.getLogger(__name__).warning("offline acceptance computed ahead failed (%s: %s); "
                                            "the acceptance task computes it again",
                                            type(e).__name__, e)
        return False


def train_figure(train: StageResult | None, name: str) -> float | None:
    """An acceptance length the training run recorded for its exported checkpoint (bonus token
    counted): ``simulated_acceptance_length`` (validation, eagle3.train.metrics) or
    ``dev_acceptance_length`` (measured on the development prompts,
    eagle3.measure.dev_acceptance); None when it has none."""
    v = train.metric(name) if train is not None else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def log_acceptance_plot(cfg: RunConfig, parent_run_id: str, fig: AcceptanceFigures) -> Path:
    """``<run_dir>/gate/served_vs_offline.png`` (simulated / offline / served bars of the trained
    draft, and the untrained baseline's served bar when measured), logged on the parent run under
    ``plots/``."""
    from eagle3.measure.plots import plot_served_vs_offline

    points = [{"label": "trained draft", "simulated": fig.simulated, "offline": fig.offline,
               "served": fig.served}]
    if fig.untrained is not None:
        points.append({"label": "untrained baseline", "simulated": None, "offline": None,
                       "served": fig.untrained})
    path = plot_served_vs_offline(points, cfg.run_dir() / "gate" / "served_vs_offline.png")
    client, _ = tracking.client_for(cfg)
    client.log_artifact(parent_run_id, str(path), "plots")
    return path


@task(name="acceptance", task_run_name="acceptance", **task_options(3600.0))
def acceptance_task(cfg: RunConfig, trained: StageResult, untrained: StageResult | None,
                    serving: StageResult,
                    parent_run_id: str, train: StageResult | None = None) -> AcceptanceFigures:
    """The acceptance figures of the run, logged on the parent run whatever they are: served (the
    trained draft's benchmark), untrained (the baseline's), offline (:func:`offline_figure`:
    in-process, same draft and prompts), simulated (training validation) and dev (measured in
    training on the development prompts) — metrics ``acceptance_length``,
    ``acceptance_length_untrained``, ``acceptance_length_offline``, ``acceptance_length_simulated``,
    ``acceptance_length_dev``, ``acceptance_gap_offline_minus_served`` — with the plot
    ``plots/served_vs_offline.png``, so a serving gap is visible even when the gate passes. Also the
    gate's verdict against ``bench.min_acceptance_length`` (``passed``, ``failure``: the diagnosis),
    which :func:`gate_task` enforces after the decision is recorded."""
    from eagle3.measure.bench import acceptance_verdict

    off = offline_figure(cfg, serving.dir)
    served, minimum = trained.acceptance_length, cfg.bench.min_acceptance_length
    failure = acceptance_verdict(served, off["acceptance_length"], minimum,
                                 off.get("unlike_served"))
    fig = AcceptanceFigures(served=served,
                            untrained=untrained.acceptance_length if untrained else None,
                            offline=off["acceptance_length"],
                            simulated=train_figure(train, "simulated_acceptance_length"),
                            offline_wall_s=off.get("wall_s"), minimum=minimum,
                            passed=failure is None, failure=failure,
                            dev=train_figure(train, "dev_acceptance_length"))
    tracking.log_parent_metrics(cfg, parent_run_id, {
        "acceptance_length": fig.served, "acceptance_length_untrained": fig.untrained,
        "acceptance_gain_over_untrained": fig.gain, "acceptance_length_offline": fig.offline,
        "acceptance_length_simulated": fig.simulated, "acceptance_length_dev": fig.dev,
        "acceptance_gap_offline_minus_served":
            fig.offline - fig.served if fig.served is not None else None,
        "offline_acceptance_wall_s": fig.offline_wall_s})
    tracking.set_parent_tags(cfg, parent_run_id,
                             {"eagle3.beats_untrained": str(fig.beats_baseline).lower(),
                              "eagle3.acceptance_gate": "passed" if fig.passed else "failed",
                              **prefect_tags()})
    tracking.log_parent_artifact(cfg, parent_run_id, {k: v for k,
                                                      v in off.items() if k != "per_request"},
                                 "offline_acceptance.json")
    log_acceptance_plot(cfg, parent_run_id, fig)
    return fig


@task(name="acceptance-gate", task_run_name="acceptance-gate", **task_options(60.0))
def gate_task(cfg: RunConfig, figures: AcceptanceFigures) -> AcceptanceFigures:
    """Pass when the trained draft's served acceptance length ≥ ``bench.min_acceptance_length``;
    else raise AcceptanceTooLow with the diagnosis (served far below offline: a serving fault;
    both low: the draft or data)."""
    from eagle3.errors import AcceptanceTooLow

    if not figures.passed:
        raise AcceptanceTooLow(figures.failure)
    return figures


@task(name="decision", task_run_name="decision", **task_options(600.0))
def decision_task(cfg: RunConfig, train: StageResult | None, figures: AcceptanceFigures,
                  parent_run_id: str,
                  preflight: dict | None = None):
    """``eagle3.decide.recommend`` on the training history (``eagle3.decide.read_training_history``;
    none when the training output is not at hand) and the acceptance figures; stored on the parent
    run as tags (``eagle3.decision``, ``eagle3.decision.rule``, ...), its description
    (``mlflow.note.content``: ``tasks.mlflow_ui.parent_note``) and the artifacts ``decision.json`` /
    ``decision.md``. ``preflight``: the pre-flight report (dict), whose checks become evidence of a
    "fix serving" decision. Returns the ``eagle3.decide.Decision``."""
    from eagle3.decide import read_training_history, recommend

    history = read_training_history(train.dir) if train is not None else {}
    checks = {c["name"]: f"{c['status']}: {c['detail']}"
              for c in (preflight or {}).get("checks", [])}
    decision = recommend(history, {"served": figures.served, "offline": figures.offline,
                                   "simulated": figures.simulated, "preflight": checks})
    tracking.set_parent_tags(cfg, parent_run_id, {f"eagle3.{k}": v for k,
                                                  v in decision.tags().items()})
    # the run's description on its MLflow page: the decision with its evidence, the acceptance
    # lengths
    tracking.set_parent_tags(cfg, parent_run_id,
                             {mlflow_ui.NOTE_TAG: mlflow_ui.parent_note(cfg.name, figures,
                                                                        decision)})
    # the run list's short-named, rounded acceptance columns (tasks.mlflow_ui.HEADLINE_METRICS)
    tracking.log_parent_metrics(cfg, parent_run_id, mlflow_ui.headline_metrics(figures))
    tracking.log_parent_artifact(cfg, parent_run_id, decision.to_dict(), "decision.json")
    client, _ = tracking.client_for(cfg)
    client.log_text(parent_run_id, decision.to_markdown(), "decision.md")
    return decision
