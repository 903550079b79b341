"""Prefect tasks after the measurement: the acceptance gate and the decision.

Neither is cached: both are cheap and read only what the cached stages returned, so changing the gate's
minimum re-runs the gate alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task

from tasks import prefect_tags, task_options, tracking


def training_history(train_dir: str | Path) -> dict:
    """``{"val_loss": [...], "train_loss": [...], "epochs", "unique_tokens"}`` for ``eagle3.decide.recommend``,
    from the draft's ``metrics.jsonl`` (one JSON object per logged step) and ``manifest.json``.

    Rows ``{"step", "kind": "eval", "val/loss", ...}`` are evaluations, ``{"kind": "train", "train/loss"}`` training
    logs (eagle3.train.loop). Epochs = the manifest's ``epochs_over_data``; unique tokens = its
    ``counts.train_positions``. Raises DataError when the folder has no manifest.
    """
    from eagle3.artifacts import read_manifest

    d = Path(train_dir)
    manifest = read_manifest(d)
    val, train = [], []
    path = d / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("kind") == "eval" and isinstance(row.get("val/loss"), (int, float)):
                val.append(float(row["val/loss"]))
            elif row.get("kind") == "train" and isinstance(row.get("train/loss"), (int, float)):
                train.append(float(row["train/loss"]))
    return {"val_loss": val, "train_loss": train, "epochs": manifest.get("epochs_over_data"),
            "unique_tokens": (manifest.get("counts") or {}).get("train_positions")}


def offline_settings(cfg: Any) -> dict:
    """The in-process decoding settings that match the served measurement: the bench's prompts, number of
    prompts, max new tokens (tokens) and temperature, the engine's ``speculative_num_steps``, and the dtype the
    CPU reference engine serves in (``serve.dtype``; ``auto`` = float32, eagle3.serve.reference)."""
    b = cfg.bench
    return {"prompts": b.prompts, "num_prompts": b.num_prompts, "max_new_tokens": b.max_new_tokens,
            "temperature": b.temperature, "num_steps": cfg.serve.speculative_num_steps,
            "dtype": "float32" if cfg.serve.dtype == "auto" else cfg.serve.dtype}


def offline_figure(cfg: Any, serving_dir: str | Path) -> dict:
    """``eagle3.measure.bench.offline_acceptance`` of the serving checkpoint with :func:`offline_settings`, memoised in
    ``<run_dir>/gate/offline_acceptance.json`` by (serving manifest content hash, settings).

    Costs one in-process generation pass over the bench prompts (SmolLM2 on 2 CPU cores, 8 prompts × 64
    tokens: ≈ 30-40 s). Returns the offline result (``acceptance_length``, ``per_position``, ``wall_s`` seconds,
    ...). Raises DataError when the serving folder has no manifest.
    """
    from eagle3.artifacts import atomic_write_json, read_manifest
    from eagle3.assets import resolve_target
    from eagle3.measure.bench import offline_acceptance

    key = {"serving_content_hash": read_manifest(serving_dir)["content_hash"], **offline_settings(cfg)}
    memo = cfg.run_dir() / "gate" / "offline_acceptance.json"
    if memo.is_file():
        old = json.loads(memo.read_text())
        if old.get("key") == key:
            return old["result"]
    st = offline_settings(cfg)
    res = offline_acceptance(resolve_target(cfg), serving_dir, st["prompts"], num_prompts=st["num_prompts"],
                             max_new_tokens=st["max_new_tokens"], num_steps=st["num_steps"], dtype=st["dtype"],
                             temperature=st["temperature"])
    memo.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(memo, {"key": key, "result": res})
    return res


def simulated_figure(train_result: dict | None) -> float | None:
    """The training run's simulated acceptance length (validation, bonus token counted; eagle3.train.metrics)
    from the train task's result, or None."""
    v = ((train_result or {}).get("metrics") or {}).get("simulated_acceptance_length")
    return float(v) if isinstance(v, (int, float)) else None


def log_acceptance_plot(cfg: Any, parent_run_id: str, out: dict) -> Path:
    """``<run_dir>/gate/served_vs_offline.png`` (simulated / offline / served bars of the trained draft, and the
    untrained baseline's served bar when measured), logged on the parent run under ``plots/``."""
    from eagle3.measure.plots import plot_served_vs_offline

    points = [{"label": "trained draft", "simulated": out["simulated"], "offline": out["offline"],
               "served": out["served"]}]
    if out.get("untrained") is not None:
        points.append({"label": "untrained baseline", "simulated": None, "offline": None, "served": out["untrained"]})
    path = plot_served_vs_offline(points, cfg.run_dir() / "gate" / "served_vs_offline.png")
    client, _ = tracking.client_for(cfg)
    client.log_artifact(parent_run_id, str(path), "plots")
    return path


@task(name="acceptance-gate", task_run_name="acceptance-gate", **task_options(3600.0))
def gate_task(cfg: Any, trained: dict, untrained: dict | None, serving_dir: str, parent_run_id: str,
              train_result: dict | None = None) -> dict:
    """Pass when the trained draft's served acceptance length ≥ ``bench.min_acceptance_length``.

    The offline (in-process, no server) figure of the same draft on the same prompts (:func:`offline_figure`)
    and the simulated (training validation) figure are always logged beside the served one
    (``acceptance_length``, ``acceptance_length_offline``, ``acceptance_length_simulated``,
    ``acceptance_gap_offline_minus_served``) with the plot ``plots/served_vs_offline.png``, so a serving gap is
    visible even when the gate passes. Below the minimum ``eagle3.measure.bench.check_acceptance`` says whether serving
    or the draft is at fault. Raises AcceptanceTooLow. Returns ``{"served", "untrained", "gain",
    "beats_baseline", "offline", "simulated", "offline_wall_s"}``.
    """
    from eagle3.measure.bench import check_acceptance

    served = trained.get("acceptance_length")
    base = untrained.get("acceptance_length") if untrained else None
    off = offline_figure(cfg, serving_dir)
    out = {"served": served, "untrained": base, "offline": off["acceptance_length"],
           "simulated": simulated_figure(train_result), "offline_wall_s": off.get("wall_s"),
           "gain": (served - base) if served is not None and base is not None else None}
    out["beats_baseline"] = out["gain"] is not None and out["gain"] > 0
    gap = out["offline"] - served if served is not None else None
    tracking.log_parent_metrics(cfg, parent_run_id, {
        "acceptance_length": served, "acceptance_length_untrained": base,
        "acceptance_gain_over_untrained": out["gain"], "acceptance_length_offline": out["offline"],
        "acceptance_length_simulated": out["simulated"], "acceptance_gap_offline_minus_served": gap,
        "offline_acceptance_wall_s": out["offline_wall_s"]})
    tracking.set_parent_tags(cfg, parent_run_id, {"eagle3.beats_untrained": str(out["beats_baseline"]).lower(),
                                                  **prefect_tags()})
    tracking.log_parent_artifact(cfg, parent_run_id, {k: v for k, v in off.items() if k != "per_request"},
                                 "offline_acceptance.json")
    log_acceptance_plot(cfg, parent_run_id, out)
    check_acceptance(served, out["offline"], cfg.bench.min_acceptance_length)
    return out


@task(name="decision", task_run_name="decision", **task_options(600.0))
def decision_task(cfg: Any, train_dir: str, train_result: dict, gate: dict, parent_run_id: str) -> dict:
    """``eagle3.decide.recommend`` on the training history and the acceptance figures; stored on the parent run
    as tags (``eagle3.decision``, ``eagle3.decision.rule``, ...) and the artifacts ``decision.json`` /
    ``decision.md``. Returns the decision as a dict."""
    from eagle3.decide import recommend

    simulated = simulated_figure(train_result)
    decision = recommend(training_history(train_dir), {"served": gate.get("served"), "offline": gate.get("offline"),
                                                       "simulated": simulated})
    tracking.set_parent_tags(cfg, parent_run_id, {f"eagle3.{k}": v for k, v in decision.tags().items()})
    tracking.log_parent_artifact(cfg, parent_run_id, decision.to_dict(), "decision.json")
    client, _ = tracking.client_for(cfg)
    client.log_text(parent_run_id, decision.to_markdown(), "decision.md")
    return decision.to_dict()
