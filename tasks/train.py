"""Prefect task of the training stage (``eagle3.train.stage.train``), trained and untrained
(max_steps=0) drafts."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from prefect import task

from eagle3.config import RunConfig
from tasks import caching, prefect_tags, stage_result, task_options, tracking
from tasks.results import StageResult

log = logging.getLogger(__name__)
TIMEOUT_S = 24 * 3600.0  # seconds


def train_key(context: Any, parameters: dict) -> str:
    """Cache key: the hidden states' content hash, the train section, the training code."""
    return caching.stage_key("train", parameters["cfg"], parameters["out_dir"],
                             inputs={"data": parameters["data"].dir})


# the train manifest's ``online`` figures -> the train run's metric names. One name per figure:
# the target tokens computed are the step metric ``extract/tokens_recomputed`` (its final value,
# the last evaluation included, is logged at the last step); the whole run's mean throughput
# (``extract_tokens_per_s``) stays in the manifest and summary.json, beside the step metric
# ``extract/tokens_per_s`` of each log window
ONLINE_METRICS = {"hidden_state_bytes_on_disk": "hidden_state_bytes_on_disk",
                  "offline_bytes_estimate": "offline_bytes_estimate",
                  "tokens_recomputed": "extract/tokens_recomputed",
                  "tokens_per_epoch": "tokens_per_epoch", "target_forward_s": "target_forward_s",
                  "cache_max_bytes": "cache_max_bytes", "cache_bytes": "cache_bytes",
                  "cache_samples": "cache_samples", "cache_hits": "cache_hits",
                  "cache_hit_tokens": "cache_hit_tokens"}
# eagle3.extract_mode tag of a train run, by the extraction's mode
MODE_TAGS = {"offline": "offline (hidden states read from the extract stage's files)",
             "online": "online (hidden states computed in training, none stored)",
             "cached": "cached (hidden states computed in training; a window of them kept on "
                       "disk while it runs, extract.cache_max_gb)"}


def online_metrics(manifest: dict) -> dict[str, float]:
    """The train manifest's ``online`` figures (``extract.mode`` online or cached, the hidden
    states computed in training: :mod:`eagle3.train.online`) as metrics named by
    :data:`ONLINE_METRICS`: ``hidden_state_bytes_on_disk`` (0), ``offline_bytes_estimate``
    (bytes an offline extraction would have stored), ``extract/tokens_recomputed`` (target tokens
    computed, every epoch and evaluation), ``tokens_per_epoch``, ``target_forward_s``, and with
    cached the window's ``cache_max_bytes``, ``cache_bytes``, ``cache_samples``, ``cache_hits``,
    ``cache_hit_tokens``; empty for states read from disk."""
    online = manifest.get("online") or {}
    return {name: float(online[k]) for k, name in ONLINE_METRICS.items()
            if isinstance(online.get(k), (int, float)) and not isinstance(online.get(k), bool)}


def supersede_finished(cfg: RunConfig, out_dir: Path) -> Path | None:
    """Move a *finished* draft in ``out_dir`` that was trained with another train section aside, to
    ``<out_dir>.superseded``; returns that folder, or None when there was nothing to move.

    The task runs only on a cache miss. ``eagle3.train.stage.train`` resumes whatever
    ``out_dir/state`` holds (the right thing after an interruption), so a finished run of other
    settings would only be re-exported, not retrained. A partial run (no manifest) is left for
    ``train`` to resume or reject. The earlier draft is kept aside until the new training has
    finished (:func:`restore_superseded` puts it back when it fails first).
    """
    from eagle3.artifacts import read_manifest
    from tasks.stage_config import used_values

    if not (out_dir / "manifest.json").is_file():
        return None
    # keys these settings leave unused (the dev prompts of a simulated selection) decide nothing
    done = read_manifest(out_dir).get("config")
    if isinstance(done, dict) and (used_values("train", done)
                                   == used_values("train", cfg.train.model_dump(mode="json"))):
        return None
    aside = out_dir.with_name(out_dir.name + ".superseded")
    shutil.rmtree(aside, ignore_errors=True)
    out_dir.rename(aside)
    return aside


def restore_superseded(aside: Path, out_dir: Path) -> bool:
    """After a training of new settings failed: put the earlier finished draft (``aside``) back in
    ``out_dir`` when the failed training saved no checkpoint (nothing of it to resume); True if
    restored. A failed training that did save checkpoints keeps them (a re-run resumes them) and the
    earlier draft stays in ``aside``."""
    from eagle3.train.state import list_checkpoints

    if list_checkpoints(out_dir / "state"):
        return False
    shutil.rmtree(out_dir, ignore_errors=True)
    aside.rename(out_dir)
    return True


def _along_training_plot(out_dir: Path, dest: Path) -> Path | None:
    """``<dest>/acceptance_along_training.png`` from ``<out_dir>/metrics.jsonl``'s evaluation rows
    (:func:`eagle3.measure.plots.plot_acceptance_along_training`), or None when the run measured
    no development acceptance or its metrics file is unreadable (the plot is optional; the
    figures themselves are MLflow metrics). ``dest`` is outside the draft folder, whose files its
    manifest lists."""
    from eagle3.errors import DataError
    from eagle3.measure.plots import plot_acceptance_along_training

    try:
        rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()
                if x.strip()]
        evals = [r for r in rows if isinstance(r, dict) and r.get("kind") == "eval"]
        return plot_acceptance_along_training(evals, dest / "acceptance_along_training.png")
    except (OSError, ValueError, DataError):
        return None


@task(name="train", cache_key_fn=train_key, **task_options(TIMEOUT_S))
def train_task(cfg: RunConfig, data: StageResult, out_dir: Path, parent_run_id: str,
               variant: str = "trained") -> StageResult:
    """Train a draft on the hidden states ``data.dir`` into ``out_dir``; step metrics (loss,
    per-position accuracy) go to MLflow through ``on_metrics`` as they happen, the manifest and
    metrics.jsonl when done."""
    from eagle3.precision import summary_line
    from eagle3.train.online import check_data_mode
    from eagle3.train.stage import check_settings, train

    with tracking.stage_run(cfg, parent_run_id, "train", variant, tags=prefect_tags()) as sr:
        # a refused setting must not cost the finished draft of earlier settings
        check_settings(cfg)
        mode = check_data_mode(cfg, data.dir)
        sr.set_tags({"eagle3.extract_mode": MODE_TAGS.get(mode, mode)})
        aside = supersede_finished(cfg, out_dir)
        if aside is not None:
            sr.set_tags({"eagle3.superseded":
                         "a finished draft of other train settings was replaced"})
        sr.log_dataset(data.dir, "training")
        try:
            manifest = train(cfg, data.dir, out_dir, on_metrics=sr.on_metrics, progress=True)
        except BaseException:
            if aside is not None and restore_superseded(aside, out_dir):
                log.warning("training of the new settings failed before its first checkpoint: the "
                            "finished draft of the earlier settings is back in %s", out_dir)
            raise
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        sr.log_manifest(out_dir)
        # which forward, attention, optimizer and precision `auto` chose
        if manifest.get("auto_resolved"):
            sr.set_tags({"eagle3.auto_resolved": summary_line(manifest["auto_resolved"])[:5000]})
        sr.log_path(out_dir / "metrics.jsonl")
        with tempfile.TemporaryDirectory(prefix=".plots.") as tmp:
            if (plot := _along_training_plot(out_dir, Path(tmp))) is not None:
                sr.log_path(plot, "plots")
        sr.log_path(out_dir / "config.json", "draft")
        from eagle3.train.metrics import FIRST_KEY

        summary = tracking.numeric_leaves("final", manifest.get("metrics"))
        for key in ("simulated_acceptance_length", "dev_acceptance_length",  # exported weights'
                    "dev_acceptance_length_all_positions", FIRST_KEY):
            v = (manifest.get("metrics") or {}).get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                summary[key] = float(v)
        summary["optimizer_steps"] = float(manifest.get("optimizer_steps", 0))
        online = online_metrics(manifest)
        summary.update(online)  # extraction folded into this stage: its figures are this run's
        if manifest.get("warnings"):
            sr.set_tags({"eagle3.warnings": "; ".join(manifest["warnings"])})
        # the end-of-training figures as one artifact, with the whole run's mean target
        # throughput; as metrics only those no step metric already charts (a single-point
        # ``final.*`` metric would be a chart duplicating the last point of train/* and val/*)
        mean = (manifest.get("online") or {}).get("extract_tokens_per_s")
        sr.log_dict({**summary, **({"extract_tokens_per_s": mean} if mean is not None else {})},
                    "summary.json")
        step_named = {k: v for k, v in online.items() if "/" in k}  # ends its step series
        sr.log_metrics({k: v for k, v in tracking.chartable(summary).items()
                        if k not in step_named})
        if step_named:
            sr.log_metrics(step_named, step=int(manifest.get("optimizer_steps") or 0))
    return stage_result("train", out_dir, manifest, sr.run_id, summary, variant=variant)
