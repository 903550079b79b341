"""Prefect task of convert (+ its one validation) → equivalence, as one step.

A failure anywhere in the step removes the half-made serving checkpoint, so nothing downstream (nor
a re-run's cache) can pick up a checkpoint that was not validated and checked for equivalence.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from prefect import task

from eagle3.config import RunConfig
from tasks import caching, prefect_tags, stage_result, task_options, tracking
from tasks.results import StageResult

TIMEOUT_S = 3600.0  # seconds


def convert_key(context: Any, parameters: dict) -> str:
    """Cache key: the draft's and the hidden states' content hashes, the convert section, the target
    folder, the conversion/validation/equivalence code."""
    from eagle3.assets import resolve_target

    cfg = parameters["cfg"]
    return caching.stage_key("convert", cfg, parameters["out_dir"],
                             inputs={"draft": parameters["draft"].dir,
                                     "data": parameters["data"].dir},
                             files={"target": resolve_target(cfg)})


def convert_validate_check(cfg: RunConfig, draft_dir: Path, data_dir: Path,
                           out_dir: Path) -> tuple[dict, dict]:
    """Convert (which validates once, against the target and the extraction manifest:
    CheckpointInvalid listing every ``CODE: message``), then check equivalence; whether the target's
    class captures aux states in the serving engine is the pre-flight's question
    (tasks/preflight.py), asked before deploy. Returns (serving manifest, equivalence report).
    Removes ``out_dir`` when either fails."""
    from eagle3.assets import resolve_target
    from eagle3.convert.equivalence import check_equivalence
    from eagle3.convert.stage import convert

    target = resolve_target(cfg)
    try:
        # the target class's aux capture depends on the serving engine: the pre-flight checks it
        # before deploy
        manifest = convert(draft_dir, out_dir, engine=cfg.convert.engine, target_dir=target,
                           version=cfg.convert.engine_version,
                           data=Path(data_dir), aux_capture=False)
        report = check_equivalence(draft_dir, out_dir, data_dir, target_dir=target,
                                   atol=cfg.convert.equivalence_atol,
                                   engine=cfg.convert.engine, version=cfg.convert.engine_version,
                                   assume_capture=True)
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    return manifest, report


@task(name="convert-validate", cache_key_fn=convert_key, **task_options(TIMEOUT_S))
def convert_task(cfg: RunConfig, draft: StageResult, data: StageResult, out_dir: Path,
                 parent_run_id: str, variant: str = "trained") -> StageResult:
    """Convert the speculators draft ``draft.dir`` to the serving format in ``out_dir`` and check
    it."""
    with tracking.stage_run(cfg, parent_run_id, "convert", variant, tags=prefect_tags()) as sr:
        manifest, report = convert_validate_check(cfg, draft.dir, data.dir, out_dir)
        sr.log_manifest(out_dir)
        sr.log_path(out_dir / "config.json", "serving")
        sr.log_dict(report, "equivalence.json")
        nums = tracking.numeric_leaves("equivalence", report)
        sr.log_metrics(nums)
        sr.set_tags({"eagle3.validation": "passed", "eagle3.engine": f"{cfg.convert.engine} "
                     f"{cfg.convert.engine_version}"})
    return stage_result("convert", out_dir, manifest, sr.run_id, nums, variant=variant)
