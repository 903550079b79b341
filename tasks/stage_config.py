"""What each stage reads: its config sections and where its code starts, the one table that the
cache keys (tasks/caching.py), the stage runs' MLflow params (tasks/tracking.py) and the output
folders of each setting (:func:`output_dirs`) derive from.

Stages are named as their tasks and MLflow runs are (``deploy-bench``). ``sections`` are the
sections of :class:`eagle3.config.RunConfig` whose values decide the stage's output; the target
reaches train and convert through their inputs' content hashes and the target folder's fingerprint
instead. ``judge_only`` keys only judge a result (the gate's minimum), so they are logged as params
but stay out of the key; so do keys the settings leave unused (:data:`UNUSED_UNLESS`: e.g. the
cached window's size outside ``extract.mode: cached``, the dev-prompt keys outside
``train.select_best_by: measured``, ``data.path`` outside ``data.source: file``; those of
:data:`KEYED_AS_DEFAULT` are keyed at their default). ``code`` names the modules (or folders run
in another interpreter) where the stage's code starts: the key hashes their import closure
(tasks/code_closure.py). ``engine``: the key also names the serving engine by its version
(tasks/caching.py, ``engine_identity``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from eagle3.config import RunConfig
# the library's tables (their one home), read here
from eagle3.config_checks import KEYED_AS_DEFAULT, UNUSED_UNLESS


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


def used_values(section: str, values: dict) -> dict:
    """``values`` (one section's JSON form, e.g. a manifest's ``config``) without the keys its own
    settings leave unused (:data:`UNUSED_UNLESS`); those of :data:`KEYED_AS_DEFAULT` are kept at
    their default instead, so a config that leaves them unset keeps its cache keys."""
    out = dict(values)
    as_default = KEYED_AS_DEFAULT.get(section, {})
    for keys, decider, default, readers in UNUSED_UNLESS.get(section, ()):
        if out.get(decider, default) not in readers:
            for k in keys:
                if k in as_default and k in out:
                    out[k] = as_default[k]
                else:
                    out.pop(k, None)
    return out


def stage_sections(cfg: RunConfig, stage: str, *, keyed: bool = False) -> dict[str, dict]:
    """``{section: its values}`` that ``stage`` reads from the RunConfig ``cfg`` (JSON form);
    ``keyed``: without the ``judge_only`` keys and the keys the settings leave unused
    (:func:`used_values`): what the cache key hashes. KeyError for a stage not in the table."""
    spec = STAGE_CONFIG[stage]
    out = {s: getattr(cfg, s).model_dump(mode="json") for s in spec.sections}
    if not keyed:
        return out
    out = {s: used_values(s, v) for s, v in out.items()}
    for k in spec.judge_only:
        section, key = k.split(".", 1)
        out[section].pop(key, None)
    return out


def sections_hash(cfg: RunConfig, stage: str) -> str:
    """sha256 (hex, 16 chars) of ``stage_sections(cfg, stage, keyed=True)``."""
    doc = json.dumps(stage_sections(cfg, stage, keyed=True), sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


# the stages whose settings decide what an output folder holds, in pipeline order: a folder of
# other settings lives beside it (<run_dir>/train/<digest>/), so going back to earlier settings
# finds their outputs again (a cache hit) instead of retraining over them
FOLDER_STAGES: dict[str, tuple[str, ...]] = {
    "train": ("extract", "train"),
    "serving": ("extract", "train", "convert"),
    "deploy": ("extract", "train", "convert", "deploy-bench"),
    "bench": ("extract", "train", "convert", "deploy-bench"),
}
LATEST_FILE = "latest.json"  # <run_dir>/<folder>/latest.json: the settings folder used last
DIGEST_CHARS = 12


def settings_digest(cfg: RunConfig, stages: tuple[str, ...]) -> str:
    """The first ``DIGEST_CHARS`` hex characters of the sha256 of ``{stage: sections_hash(cfg,
    stage)}`` over ``stages``: the name of an output folder of those settings. The judge-only keys
    (the gate's minimum) stay out, as in the cache keys; code versions stay out (a code change
    re-runs the stage into the same folder)."""
    doc = json.dumps({s: sections_hash(cfg, s) for s in stages}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:DIGEST_CHARS]


def output_dirs(cfg: RunConfig, variant: str = "trained") -> dict[str, Path]:
    """Output folders of one pipeline run of RunConfig ``cfg`` (docs/INTERNALS.md):
    ``<run_dir>/extract`` and, one folder per settings digest (:func:`settings_digest` over
    :data:`FOLDER_STAGES`), ``<run_dir>/train[-<variant>]/<digest>``, ``serving...``,
    ``deploy...``, ``bench...``; ``variant`` other than ``"trained"`` adds ``-<variant>``."""
    suffix = "" if variant == "trained" else f"-{variant}"
    rd = cfg.run_dir()
    out = {"extract": rd / "extract"}
    for folder, stages in FOLDER_STAGES.items():
        out[folder] = rd / f"{folder}{suffix}" / settings_digest(cfg, stages)
    return out


def record_latest(out_dir: str | Path) -> None:
    """Write ``<parent of out_dir>/latest.json`` = ``{"dir": <out_dir's name>}``: the settings
    folder the last run of this name used (:func:`latest_output` reads it)."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{LATEST_FILE}.tmp"
    tmp.write_text(json.dumps({"dir": out.name}) + "\n")
    tmp.replace(out.parent / LATEST_FILE)


def latest_output(run_dir: str | Path, folder: str) -> Path:
    """The ``folder`` (``train``, ``serving``, ``bench``, ... with a variant suffix if any) the last
    pipeline run in ``run_dir`` used: ``<run_dir>/<folder>/<digest>`` named by its
    ``latest.json``, else ``<run_dir>/<folder>`` itself (no run recorded one: a folder that holds
    its manifest directly). Raises DataError naming the file when ``latest.json`` is unreadable or
    names no folder."""
    from eagle3.errors import DataError

    base = Path(run_dir) / folder
    pointer = base / LATEST_FILE
    if not pointer.is_file():
        return base
    try:
        name = json.loads(pointer.read_text()).get("dir")
    except (OSError, ValueError, AttributeError) as e:
        raise DataError(f"{pointer}: expected JSON {{\"dir\": <folder name>}}, could not read it "
                        f"({type(e).__name__}: {e})") from e
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise DataError(f"{pointer}: key 'dir': expected the name of a folder in {base}, got "
                        f"{name!r}")
    return base / name
