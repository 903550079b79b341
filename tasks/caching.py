"""Cache keys for the Prefect tasks: content hashes of the inputs, the stage's config sections and code.

A stage's cache key is the sha256 (hex) of one JSON document::

    {"stage": name, "out_dir": where it writes (relative to paths.runs_dir),
     "config": RunConfig.section_hash(*sections),
     "inputs": {name: content_hash from the input directory's manifest.json},
     "files": {name: fingerprint of an input file or folder (dataset, target model, prompts)},
     "code": code_version(stage): the import closure of the stage's entry modules}

so a changed training setting changes only the train key (and, through the new checkpoint's content hash,
every key after it), and a changed dataset file changes the extraction key. Paths alone never make a key, and
the output folder enters it relative to the runs directory (:func:`run_relative`): workers of a work pool that
mount the shared runs directory at different places compute the same key and find each other's cached results
(:func:`relocate` re-points such a result at this machine's path of the same folder).

Fingerprints (:func:`fingerprint`) are sha256 over file bytes; files larger than ``FULL_HASH_LIMIT`` bytes
(multi-GB weights) are fingerprinted by (name, size in bytes, mtime in ns) instead, which is stated in the
key document. Fingerprints are memoised per process by (path, size, mtime).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from eagle3.artifacts import output_intact, read_manifest, sha256_file
from eagle3.errors import DataError
from tasks.code_closure import code_hash
from tasks.results import StageResult

FULL_HASH_LIMIT = 512 * 1024 * 1024  # bytes; larger files are fingerprinted by size and mtime

# Where each stage's code starts: the library modules its task calls (and modules or folders started from a
# string: a ``python -m`` entry point, the SGLang plugin that runs in SGLang's interpreter). The key hashes
# their whole import closure (tasks.code_closure), so editing any module a stage imports changes its key.
STAGE_ENTRIES: dict[str, tuple[str, ...]] = {
    "extract": ("eagle3.extract.stage", "eagle3/engines/sglang/plugin"),
    "train": ("eagle3.train.stage", "eagle3.train.worker"),
    "convert": ("eagle3.convert.stage", "eagle3.convert.validate", "eagle3.convert.equivalence"),
    "deploy": ("eagle3.measure.served", "refengine.launch_server"),
}
CODE_ROOT = Path(__file__).resolve().parents[1]  # the folder that holds eagle3/

# The config sections each stage reads (RunConfig.section_hash).
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "extract": ("target", "data", "extract"),
    "train": ("train",),
    "convert": ("convert",),
    # plus the bench settings that change the measurement (bench_settings()); the gate's minimum is not one.
    "deploy": ("target", "serve"),
}

_memo: dict[tuple[str, int, int], str] = {}


def code_version(stage: str, root: Path | None = None) -> str:
    """sha256 (hex, 16 chars) of the code ``stage`` runs: every file of the import closure of
    ``STAGE_ENTRIES[stage]`` under ``root`` (default: this checkout), names and bytes."""
    return code_hash(root or CODE_ROOT, STAGE_ENTRIES[stage])


def fingerprint(path: str | Path) -> str:
    """sha256 (hex) of a file, or of a folder's (relative path, file fingerprint) list sorted by path.

    Files above ``FULL_HASH_LIMIT`` bytes contribute ``size:<bytes>:mtime_ns:<ns>`` instead of their bytes.
    Raises DataError when ``path`` does not exist.
    """
    p = Path(path)
    if p.is_file():
        return _file_fingerprint(p)
    if not p.is_dir():
        raise DataError(f"{p}: expected an input file or folder to fingerprint, found nothing")
    h = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file() and ".tmp" not in x.name and not x.name.startswith(".")):
        h.update(str(f.relative_to(p)).encode())
        h.update(_file_fingerprint(f).encode())
    return h.hexdigest()


def _file_fingerprint(f: Path) -> str:
    st = f.stat()
    key = (str(f.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _memo:
        if st.st_size > FULL_HASH_LIMIT:
            _memo[key] = f"size:{st.st_size}:mtime_ns:{st.st_mtime_ns}"
        else:
            _memo[key] = sha256_file(f)
    return _memo[key]


def manifest_hash(directory: str | Path) -> str:
    """``kind:content_hash`` from ``<directory>/manifest.json`` (DataError when missing or unreadable)."""
    m = read_manifest(directory)
    if "content_hash" not in m:
        raise DataError(f"{Path(directory) / 'manifest.json'}: expected a 'content_hash' key, found none")
    return f"{m.get('kind')}:{m['content_hash']}"


def run_relative(path: str | Path, cfg: Any) -> str:
    """``path`` relative to the runs directory (``cfg.paths.resolved_runs_dir()``) as a POSIX string when it lies
    inside it, else its absolute path: the form in which a folder is named to other machines (cache keys,
    hand-over records), so that the same folder has the same name wherever the runs directory is mounted."""
    p = Path(path).expanduser().resolve()
    try:
        return p.relative_to(cfg.paths.resolved_runs_dir()).as_posix()
    except ValueError:
        return str(p)


def relocate(result: Any, local_dir: str | Path) -> Any:
    """A cached :class:`tasks.results.StageResult` whose ``dir`` names another machine's path of ``local_dir``
    (the runs directory mounted elsewhere: the cache key holds the folder relative to the runs directory, so the
    cache is shared), re-pointed at ``local_dir`` when the manifest there has the result's content hash.
    Anything else (same path, a folder that is gone or holds other content, not a StageResult) is returned
    unchanged, and :func:`output_matches` then decides."""
    if not isinstance(result, StageResult):
        return result
    local = Path(local_dir)
    if Path(result.dir) == local:
        return result
    try:
        if read_manifest(local).get("content_hash") != result.content_hash:
            return result
    except DataError:
        return result
    return replace(result, dir=local)


def stage_key(stage: str, cfg: Any, out_dir: str | Path, *, inputs: dict[str, str] | None = None,
              files: dict[str, str | Path] | None = None, sections: tuple[str, ...] | None = None,
              extra: dict | None = None) -> str:
    """The cache key of one stage run (see the module docstring); ``cfg`` is a RunConfig.

    Args:
        stage: one of ``STAGE_ENTRIES``. out_dir: the stage's output directory (enters the key relative to the
            runs directory, :func:`run_relative`).
        inputs: name -> input stage directory (its manifest's content hash enters the key).
        files: name -> input file/folder outside the pipeline (dataset, target model) to fingerprint.
        sections: config sections (default ``STAGE_SECTIONS[stage]``). extra: more JSON-able key material.
    Raises DataError for an unknown stage or an input without a manifest.
    """
    if stage not in STAGE_ENTRIES:
        raise DataError(f"cache key: unknown stage {stage!r}; expected one of {sorted(STAGE_ENTRIES)}")
    doc = {
        "stage": stage,
        "out_dir": run_relative(out_dir, cfg),
        "config": cfg.section_hash(*(sections or STAGE_SECTIONS[stage])),
        "inputs": {k: manifest_hash(v) for k, v in sorted((inputs or {}).items())},
        "files": {k: fingerprint(v) for k, v in sorted((files or {}).items())},
        "code": code_version(stage),
        "large_files": f"size+mtime above {FULL_HASH_LIMIT} bytes",
        "extra": extra or {},
    }
    return f"eagle3-{stage}-" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def bench_settings(cfg: Any) -> dict:
    """The bench section without the settings that only judge the result (the gate's minimum, the baseline
    switch), so changing the minimum re-runs the gate, not the measurement."""
    return cfg.bench.model_dump(mode="json", exclude={"min_acceptance_length", "baseline_untrained"})


def output_matches(result: Any) -> bool:
    """True when a (possibly cached) stage result still describes what is on disk.

    ``result`` is a stage task's :class:`tasks.results.StageResult` (anything else, e.g. a result cached by an
    older version of this project, does not match); False when the directory or its manifest is gone, its
    content hash differs (the output was rebuilt or edited since), or its files no longer add up to the count and
    bytes the manifest recorded (a file deleted or truncated: ``eagle3.artifacts.output_intact``, stat only, so
    terabytes of hidden states are not re-read).
    """
    if not isinstance(result, StageResult):
        return False
    try:
        if read_manifest(result.dir).get("content_hash") != result.content_hash:
            return False
        return output_intact(result.dir)[0]
    except DataError:
        return False
