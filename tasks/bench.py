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
    logs (eagle3.train_loop). Epochs = the manifest's ``epochs_over_data``; unique tokens = its
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


@task(name="acceptance-gate", task_run_name="acceptance-gate", **task_options(3600.0))
def gate_task(cfg: Any, trained: dict, untrained: dict | None, serving_dir: str, parent_run_id: str) -> dict:
    """Pass when the trained draft's served acceptance length ≥ ``bench.min_acceptance_length``.

    Below the minimum the offline (in-process) figure of the same draft is computed so the error says
    whether serving or the draft is at fault (``eagle3.bench.check_acceptance``). Raises AcceptanceTooLow.
    Returns ``{"served", "untrained", "gain", "beats_baseline", "offline"}`` and logs them on the parent run.
    """
    from eagle3.assets import resolve_target
    from eagle3.bench import check_acceptance, offline_acceptance

    served = trained.get("acceptance_length")
    base = untrained.get("acceptance_length") if untrained else None
    out = {"served": served, "untrained": base, "offline": None,
           "gain": (served - base) if served is not None and base is not None else None}
    out["beats_baseline"] = out["gain"] is not None and out["gain"] > 0
    tracking.log_parent_metrics(cfg, parent_run_id, {"acceptance_length": served,
                                                     "acceptance_length_untrained": base,
                                                     "acceptance_gain_over_untrained": out["gain"]})
    tracking.set_parent_tags(cfg, parent_run_id, {"eagle3.beats_untrained": str(out["beats_baseline"]).lower(),
                                                  **prefect_tags()})
    minimum = cfg.bench.min_acceptance_length
    if served is None or served < minimum:
        b = cfg.bench
        off = offline_acceptance(resolve_target(cfg), serving_dir, b.prompts, num_prompts=b.num_prompts,
                                 max_new_tokens=b.max_new_tokens, num_steps=cfg.serve.speculative_num_steps,
                                 temperature=b.temperature)
        out["offline"] = off["acceptance_length"]
        tracking.log_parent_metrics(cfg, parent_run_id, {"acceptance_length_offline": out["offline"]})
        check_acceptance(served, out["offline"], minimum)
    return out


@task(name="decision", task_run_name="decision", **task_options(600.0))
def decision_task(cfg: Any, train_dir: str, train_result: dict, gate: dict, parent_run_id: str) -> dict:
    """``eagle3.decide.recommend`` on the training history and the acceptance figures; stored on the parent run
    as tags (``eagle3.decision``, ``eagle3.decision.rule``, ...) and the artifacts ``decision.json`` /
    ``decision.md``. Returns the decision as a dict."""
    from eagle3.decide import recommend

    simulated = (train_result.get("metrics") or {}).get("simulated_acceptance_length")
    decision = recommend(training_history(train_dir), {"served": gate.get("served"), "offline": gate.get("offline"),
                                                       "simulated": simulated})
    tracking.set_parent_tags(cfg, parent_run_id, {f"eagle3.{k}": v for k, v in decision.tags().items()})
    tracking.log_parent_artifact(cfg, parent_run_id, decision.to_dict(), "decision.json")
    client, _ = tracking.client_for(cfg)
    client.log_text(parent_run_id, decision.to_markdown(), "decision.md")
    return decision.to_dict()
