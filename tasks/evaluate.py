"""Prefect task of a sweep's offline evaluation: every finished point's draft measured in-process on
whole prompt sets (``eagle3.measure.offline.evaluate_drafts``: the target's greedy continuations
generated once, every draft's greedy chain decoding replayed on them, bootstrap intervals), logged
on each point's MLflow run.

Metrics per point and set: ``offline.<set>.acceptance_length`` (bonus token counted), ``.ci_low`` /
``.ci_high`` (bootstrap interval over conversations), ``.acceptance_rate``, ``.per_position.<k>``,
``.num_requests``, ``.verify_ct``, ``.completion_tokens``, ``.acceptance_length_all_positions``
(averaged over every position a pass could start at, as a simulated figure averages),
``.out_of_draft_vocab_share``; for a set of several turns (MT-Bench)
the same per turn, ``offline.<set>.turn<k>.acceptance_length`` and so on; the artifact
``offline_eval.json`` holds the whole result (per category). Points that already have every set
are skipped, so a resumed sweep evaluates only its new points; a point whose draft is not on this
machine (trained on another one) is named, not skipped in silence.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from eagle3.config import RunConfig
from tasks import task_options, tracking
from tasks.reports import SWEEP_TAG
from tasks.stage_config import latest_output


def _metrics(set_name: str, group: dict) -> dict[str, float]:
    """MLflow metrics of one prompt set's group (``eagle3.measure.replay`` schema: acceptance
    figures, counts, ``ci`` {low, high})."""
    out = {}
    for k in ("acceptance_length", "acceptance_rate", "num_requests", "completion_tokens",
              "verify_ct", "acceptance_length_all_positions", "out_of_draft_vocab_share"):
        if isinstance(group.get(k), (int, float)) and not isinstance(group.get(k), bool):
            out[f"offline.{set_name}.{k}"] = float(group[k])
    ci = group.get("ci") or {}
    for k in ("low", "high"):
        if isinstance(ci.get(k), (int, float)):
            out[f"offline.{set_name}.ci_{k}"] = float(ci[k])
    for i, v in enumerate(group.get("per_position") or []):
        out[f"offline.{set_name}.per_position.{i}"] = float(v)
    return out


def points_to_evaluate(cfg: RunConfig, sweep_run_id: str, sets: list[str]
                       ) -> tuple[dict[str, tuple[str, Path]], dict[str, str]]:
    """``({point key: (its parent run id, its serving checkpoint folder)}, {point key: why it
    cannot be evaluated here})`` for the sweep's FINISHED points that lack one of ``sets``: the
    second holds those whose serving folder (``manifest.json`` included) is not on this machine,
    naming the sets they lack."""
    client, exp = tracking.client_for(cfg)
    todo, missing = {}, {}
    for r in client.search_runs([exp], filter_string=f"tags.`{SWEEP_TAG}` = '{sweep_run_id}'",
                                max_results=1000):
        if r.info.status != "FINISHED":
            continue
        if all(f"offline.{s}.acceptance_length" in r.data.metrics for s in sets):
            continue
        serving = latest_output(r.data.tags.get("eagle3.run_dir", ""), "serving")
        key = r.data.tags.get("eagle3.sweep.point", r.info.run_id)
        if (serving / "manifest.json").is_file():
            todo[key] = (r.info.run_id, serving)
        else:
            lacks = [x for x in sets if f"offline.{x}.acceptance_length" not in r.data.metrics]
            missing[key] = (f"{', '.join(lacks)} not measured: its serving checkpoint "
                            f"{serving}/manifest.json is not on this machine")
    return todo, missing


@task(name="offline-eval", task_run_name="offline-eval", **task_options(4 * 3600.0))
def evaluate_task(cfg: RunConfig, sweep_run_id: str, sets: list[str], max_new_tokens: int) -> dict:
    """Evaluate the points of :func:`points_to_evaluate` together and log each one's figures on its
    run. Returns ``{"evaluated": {point: {set: summary}}, "not_evaluated": {point: why}}`` (the
    latter also logged as a warning)."""
    import torch
    from prefect import get_run_logger

    from eagle3.assets import resolve_target
    from eagle3.measure.offline import evaluate_drafts

    todo, missing = points_to_evaluate(cfg, sweep_run_id, sets)
    for key, why in missing.items():
        get_run_logger().warning("offline evaluation of %s: left out, %s", key, why)
    if not todo:
        return {"evaluated": {}, "not_evaluated": missing}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    res = evaluate_drafts(resolve_target(cfg), {k: d for k, (_, d) in todo.items()},
                          prompt_sets=sets,
                          max_new_tokens=max_new_tokens, num_steps=cfg.serve.speculative_num_steps,
                          dtype="float32", device=device, batch_size=64 if device == "cuda" else 8,
                          include_requests=False, progress=False)
    out = {}
    for key, (run_id, _) in todo.items():
        per_set, per_turn = res[key]["per_set"], res[key].get("per_turn") or {}
        metrics = {k: v for s in sets for k, v in _metrics(s, per_set[s]).items()}
        for s in sets:
            for turn, group in (per_turn.get(s) or {}).items():  # "turn1": second turns see
                metrics.update(_metrics(f"{s}.{turn}", group))  # the target's first answer
        tracking.log_parent_metrics(cfg, run_id, metrics)
        tracking.set_parent_tags(cfg, run_id, {"eagle3.sweep.eval_primary": sets[0]})
        tracking.log_parent_artifact(cfg, run_id, res[key], "offline_eval.json")
        out[key] = {s: {"acceptance_length": per_set[s]["acceptance_length"],
                        "ci": per_set[s].get("ci")}
                    for s in sets}
    return {"evaluated": out, "not_evaluated": missing}


def evaluate_points(cfg: RunConfig, sweep_run_id: str, sets: list[str],
                    max_new_tokens: int) -> dict:
    """:func:`evaluate_task` (a function the sweep flow calls; nothing is measured when every
    point is evaluated)."""
    return evaluate_task(cfg, sweep_run_id, list(sets), int(max_new_tokens))
