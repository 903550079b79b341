"""Prefect task of the extraction stage (``eagle3.extract.stage.extract``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from prefect import task

from eagle3.config import RunConfig
from tasks import caching, prefect_tags, stage_result, task_options, tracking
from tasks.results import StageResult

TIMEOUT_S = 6 * 3600.0  # seconds: a large extraction on one GPU
# the regeneration's turn counts logged as metrics (the manifest's ``regeneration.turns``)
REGEN_HEADLINE = ("input", "succeeded", "failed", "skipped", "truncated")
# eagle3.extract_mode tag of an extract run, by extract.mode
MODE_TAGS = {"offline": "offline: the hidden states are written here",
             "online": "online: tokenized samples only; the hidden states are computed by the "
                       "train stage",
             "cached": "cached: tokenized samples only; the hidden states are computed by the "
                       "train stage, which keeps a window of them (extract.cache_max_gb)"}


def dataset_file(cfg: RunConfig) -> Path:
    """The conversations file extraction reads (``eagle3.extract.stage.data_source_path``)."""
    from eagle3.extract.plan import data_source_path

    return data_source_path(cfg)[1]


def extract_key(context: Any, parameters: dict) -> str:
    """Cache key: target + data + extract sections, the dataset file's bytes, the target folder, the
    code; with ``data.regenerate=sglang`` and no URL, also the engine (by version) and dtype of the
    server launched to answer (its answers are the training data)."""
    from eagle3.assets import resolve_target

    cfg = parameters["cfg"]
    d = cfg.data
    launched = d.regenerate == "sglang" and not d.regenerate_url
    extra = ({"regenerated_by": {"engine": caching.engine_identity(cfg), "dtype": cfg.serve.dtype}}
             if launched else None)
    return caching.stage_key("extract", cfg, parameters["out_dir"], extra=extra,
                             files={"dataset": dataset_file(cfg), "target": resolve_target(cfg)})


def extract_superseding(cfg: RunConfig, out_dir: Path) -> dict:
    """``eagle3.extract.stage.extract``, replacing an extraction of another plan that ``out_dir``
    still holds.

    The task runs only on a cache miss, i.e. when the data, target, settings or code changed. An
    output of the same plan is reused or resumed by ``extract`` itself; one of a different plan
    (finished or partial) is superseded: it is removed and the extraction starts over (``extract``
    refuses to mix plans, with a DataError naming the plan hashes, which is what is recognised
    here).
    """
    from eagle3.errors import DataError
    from eagle3.extract.stage import extract

    try:
        return extract(cfg, out_dir, progress=True)
    except DataError as e:
        if "plan hash" not in str(e) or not out_dir.is_dir():
            raise
    shutil.rmtree(out_dir)
    # the same plan again: its data warnings were logged by the first call
    return extract(cfg, out_dir, progress=True, warn=False)


@task(name="extract", cache_key_fn=extract_key, **task_options(TIMEOUT_S))
def extract_task(cfg: RunConfig, out_dir: Path, parent_run_id: str,
                 variant: str = "trained") -> StageResult:
    """Extract hidden states into ``out_dir``; log the counts (samples, tokens, truncated) to
    MLflow, and with ``data.regenerate`` the regenerated assistant turns
    (``regeneration.turns.{input,succeeded,failed,skipped,truncated}``). With
    ``extract.mode`` online or cached only the tokenized samples are written (the train stage
    computes the states) and the run records that, with the bytes an offline run would store
    (and the cached window's size). The tag ``eagle3.extract_mode`` names the mode.

    ``variant`` is accepted for a uniform call signature; extraction is shared by both drafts."""
    with tracking.stage_run(cfg, parent_run_id, "extract", tags=prefect_tags()) as sr:
        manifest = extract_superseding(cfg, out_dir)
        sr.log_manifest(out_dir)
        sr.log_dataset(out_dir, "extraction")
        metrics = {f"counts.{k}": float(v) for k, v in manifest.get("counts", {}).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        unstable = manifest.get("template_unstable") or {}
        if unstable:  # conversations dropped as not prefix-stable: metrics and a tag
            sr.log_metrics({f"template_unstable.{k}": float(unstable[k]) for k in
                            ("conversations", "tokens", "share_conversations", "share_tokens")})
        if unstable.get("conversations"):
            sr.set_tags({"eagle3.template_unstable": (
                f"{unstable['conversations']} of {unstable['tried']} conversations, "
                f"{unstable['share_tokens']:.1%} of tokens dropped")})
        mode = manifest.get("mode", "offline")
        sr.set_tags({"eagle3.extract_mode": MODE_TAGS.get(mode, mode)})
        if mode == "offline" and isinstance(manifest.get("bytes"), (int, float)):
            # the same name as online's 0, so the modes' runs compare in one column
            metrics["hidden_state_bytes_on_disk"] = float(manifest["bytes"])
            sr.log_metrics({"hidden_state_bytes_on_disk": metrics["hidden_state_bytes_on_disk"]})
        if mode != "offline":  # no forward here: training computes the states
            metrics.update(hidden_state_bytes_on_disk=0.0,
                           offline_bytes_estimate=float(manifest["offline_bytes_estimate"]))
            cache = (manifest.get("online") or {}).get("cache_max_bytes")
            if isinstance(cache, (int, float)):
                metrics["cache_max_bytes"] = float(cache)
            sr.log_metrics({k: metrics[k] for k in ("hidden_state_bytes_on_disk",
                                                    "offline_bytes_estimate", "cache_max_bytes")
                            if k in metrics})
        turns = (manifest.get("regeneration") or {}).get("turns")
        if isinstance(turns, dict):  # data.regenerate: how the target's answers went
            regen = {f"regeneration.turns.{k}": float(turns[k]) for k in REGEN_HEADLINE
                     if isinstance(turns.get(k), (int, float))}
            metrics.update(regen)
            sr.log_metrics(regen)
        if isinstance(manifest.get("tokens_per_s"), (int, float)):
            metrics["tokens_per_s"] = float(manifest["tokens_per_s"])
            sr.log_metrics({"tokens_per_s": metrics["tokens_per_s"]})
    return stage_result("extract", out_dir, manifest, sr.run_id, metrics)
