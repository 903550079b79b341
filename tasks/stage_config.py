"""What each stage reads: its config sections and where its code starts, the one table that the
cache keys (tasks/caching.py) and the stage runs' MLflow params (tasks/tracking.py) derive from.

Stages are named as their tasks and MLflow runs are (``deploy-bench``). ``sections`` are the
sections of :class:`eagle3.config.RunConfig` whose values decide the stage's output; the target
reaches train and convert through their inputs' content hashes and the target folder's fingerprint
instead. ``judge_only`` keys only judge a result (the gate's minimum), so they are logged as params
but stay out of the key. ``code`` names the modules (or folders run in another interpreter) where
the stage's code starts: the key hashes their import closure (tasks/code_closure.py). ``engine``:
the key also names the serving engine by its version (tasks/caching.py, ``engine_identity``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StageConfig:
    sections: tuple[str, ...]
    code: tuple[str, ...] = ()
    judge_only: tuple[str, ...] = ()  # "section.key"
    engine: bool = False


STAGE_CONFIG: dict[str, StageConfig] = {
    "extract": StageConfig(("target", "data", "extract"),
                           ("eagle3.extract.stage", "eagle3/engines/sglang/plugin")),
    "train": StageConfig(("train",), ("eagle3.train.stage", "eagle3.train.worker")),
    "convert": StageConfig(("convert",), ("eagle3.convert.stage", "eagle3.convert.validate",
                                          "eagle3.convert.equivalence")),
    "preflight": StageConfig(("serve",)),  # never cached: it reads live facts of the machine
    "deploy-bench": StageConfig(("target", "serve", "bench"), ("eagle3.measure.served",),
                                ("bench.min_acceptance_length",
                                 "bench.baseline_untrained"), engine=True),
}


def stage_sections(cfg: Any, stage: str, *, keyed: bool = False) -> dict[str, dict]:
    """``{section: its values}`` that ``stage`` reads from the RunConfig ``cfg`` (JSON form);
    ``keyed``: without the ``judge_only`` keys (what the cache key hashes). KeyError for a stage not
    in the table."""
    spec = STAGE_CONFIG[stage]
    out = {s: getattr(cfg, s).model_dump(mode="json") for s in spec.sections}
    for k in spec.judge_only if keyed else ():
        section, key = k.split(".", 1)
        out[section].pop(key, None)
    return out


def sections_hash(cfg: Any, stage: str) -> str:
    """sha256 (hex, 16 chars) of ``stage_sections(cfg, stage, keyed=True)``."""
    doc = json.dumps(stage_sections(cfg, stage, keyed=True), sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]
