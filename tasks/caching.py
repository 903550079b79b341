"""Cache keys for the Prefect tasks: content hashes of the inputs, the stage's config sections and
code.

A stage's cache key is the sha256 (hex) of one JSON document::

    {"stage": name, "out_dir": where it writes (relative to paths.runs_dir),
     "config": tasks.stage_config.sections_hash(cfg, stage),
     "inputs": {name: content_hash from the input directory's manifest.json},
     "files": {name: fingerprint of an input file or folder (dataset, target model, prompts)},
     "code": code_version(stage): the import closure of the stage's entry modules,
     "engine": engine_identity(cfg) for a stage that serves (else absent)}

so a changed training setting changes only the train key (and, through the new checkpoint's content
hash, every key after it), and a changed dataset file changes the extraction key. Paths alone never
make a key; the output folder enters it relative to the runs directory (:func:`run_relative`), so
workers of a pool that mount the shared runs directory at different places share results
(:func:`relocate` re-points one).

Fingerprints are sha256 over file bytes; files over ``FULL_HASH_LIMIT`` bytes (multi-GB weights) are
fingerprinted by (name, size in bytes, mtime in ns), as the key document states. They are memoised
per process by (path, size, mtime).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from eagle3.artifacts import output_intact, read_manifest, sha256_file
from eagle3.config import RunConfig
from eagle3.errors import DataError
from tasks.code_closure import code_hash
from tasks.results import StageResult
from tasks.stage_config import STAGE_CONFIG, sections_hash

FULL_HASH_LIMIT = 512 * 1024 * 1024  # bytes; larger files are fingerprinted by size and mtime
CODE_ROOT = Path(__file__).resolve().parents[1]  # the folder that holds eagle3/
# the cached stages' code entries
STAGE_ENTRIES = {s: c.code for s, c in STAGE_CONFIG.items() if c.code}
# the reference engine's package, started by name, never imported here
REFERENCE_ENGINE = "refengine"

_memo: dict[tuple[str, int, int], str] = {}


def code_version(stage: str, root: Path | None = None) -> str:
    """sha256 (hex, 16 chars) of the code ``stage`` runs: every file of the import closure of its
    entries (``STAGE_CONFIG[stage].code``) under ``root`` (default: this checkout), names and bytes.
    """
    return code_hash(root or CODE_ROOT, STAGE_ENTRIES[stage])


def reference_engine_identity(folder: Path | None = None) -> str:
    """``refengine <__version__> <sha256[:16] of its *.py files>``, read as files from ``folder``
    (default: where Python finds the package, without importing it); ``refengine absent`` when there
    is none."""
    if folder is None:
        spec = importlib.util.find_spec(REFERENCE_ENGINE)
        locations = list(spec.submodule_search_locations or []) if spec else []
        folder = Path(locations[0]) if locations else None
    if folder is None or not (folder / "__init__.py").is_file():
        return f"{REFERENCE_ENGINE} absent"
    m = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", (folder / "__init__.py").read_text(),
                  re.M)
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*.py")):
        h.update(f"{f.relative_to(folder).as_posix()}\n".encode())
        h.update(f.read_bytes())
    return f"{REFERENCE_ENGINE} {m.group(1) if m else 'unversioned'} {h.hexdigest()[:16]}"


def engine_identity(cfg: RunConfig) -> str:
    """The serving engine ``cfg.serve.engine`` resolves to, by version: ``sglang <release>`` (the
    configured ``convert.engine_version``) or :func:`reference_engine_identity`."""
    engine: str = cfg.serve.engine
    if engine == "auto":
        from eagle3.serve.launcher import resolve_engine

        engine = resolve_engine(cfg)
    if engine == "sglang":
        return f"sglang {cfg.convert.engine_version}"
    return reference_engine_identity()


def fingerprint(path: str | Path) -> str:
    """sha256 (hex) of a file, or of a folder's (relative path, file fingerprint) list sorted by
    path.

    Files above ``FULL_HASH_LIMIT`` bytes contribute ``size:<bytes>:mtime_ns:<ns>`` instead of their
    bytes. Raises DataError when ``path`` does not exist.
    """
    p = Path(path)
    if p.is_file():
        return _file_fingerprint(p)
    if not p.is_dir():
        raise DataError(f"{p}: expected an input file or folder to fingerprint, found nothing")
    h = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*")
                    if x.is_file() and ".tmp" not in x.name and not x.name.startswith(".")):
        h.update(str(f.relative_to(p)).encode())
        h.update(_file_fingerprint(f).encode())
    return h.hexdigest()


def _file_fingerprint(f: Path) -> str:
    st = f.stat()
    key = (str(f.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _memo:
        big = st.st_size > FULL_HASH_LIMIT
        _memo[key] = f"size:{st.st_size}:mtime_ns:{st.st_mtime_ns}" if big else sha256_file(f)
    return _memo[key]


def manifest_hash(directory: str | Path) -> str:
    """``kind:content_hash`` from ``<directory>/manifest.json`` (DataError when missing or
    unreadable)."""
    m = read_manifest(directory)
    if "content_hash" not in m:
        raise DataError(f"{Path(directory) / 'manifest.json'}: expected a 'content_hash' key, "
                        "found none")
    return f"{m.get('kind')}:{m['content_hash']}"


def run_relative(path: str | Path, cfg: RunConfig) -> str:
    """``path`` relative to the runs directory as a POSIX string when it lies inside it, else its
    absolute path: how a folder is named to other machines (cache keys, hand-over records)."""
    p = Path(path).expanduser().resolve()
    try:
        return p.relative_to(cfg.paths.resolved_runs_dir()).as_posix()
    except ValueError:
        return str(p)


def relocate(result: Any, local_dir: str | Path) -> Any:
    """A cached :class:`StageResult` whose ``dir`` is another machine's path of ``local_dir``,
    re-pointed at ``local_dir`` when the manifest there has the result's content hash. Anything else
    (same path, a folder gone or of other content, not a StageResult) is returned unchanged;
    :func:`output_matches` decides."""
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


def stage_key(stage: str, cfg: RunConfig, out_dir: str | Path, *,
              inputs: dict[str, str] | None = None, files: dict[str, str | Path] | None = None,
              extra: dict | None = None) -> str:
    """The cache key of one stage run (see the module docstring); ``cfg`` is a RunConfig.

    Args:
        stage: a cached stage of ``STAGE_CONFIG``. out_dir: the stage's output directory.
        inputs: name -> input stage directory (its manifest's content hash enters the key).
        files: name -> input file/folder outside the pipeline (dataset, target model) to
        fingerprint.
        extra: more JSON-able key material.
    Raises DataError for an unknown stage or an input without a manifest.
    """
    if stage not in STAGE_ENTRIES:
        raise DataError(f"cache key: unknown stage {stage!r}; "
                        f"expected one of {sorted(STAGE_ENTRIES)}")
    doc = {
        "stage": stage,
        "out_dir": run_relative(out_dir, cfg),
        "config": sections_hash(cfg, stage),
        "inputs": {k: manifest_hash(v) for k, v in sorted((inputs or {}).items())},
        "files": {k: fingerprint(v) for k, v in sorted((files or {}).items())},
        "code": code_version(stage),
        "large_files": f"size+mtime above {FULL_HASH_LIMIT} bytes",
        "extra": extra or {},
    }
    if STAGE_CONFIG[stage].engine:
        doc["engine"] = engine_identity(cfg)
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]
    return f"eagle3-{stage}-{digest}"


def output_matches(result: Any) -> bool:
    """True when a (possibly cached) stage result still describes what is on disk.

    False for anything but a :class:`StageResult`, when its directory or manifest is gone, its
    content hash differs (rebuilt or edited since), or its files no longer add up to the count and
    bytes the manifest recorded (``eagle3.artifacts.output_intact``: stat only, so terabytes are not
    re-read).
    """
    if not isinstance(result, StageResult):
        return False
    try:
        if read_manifest(result.dir).get("content_hash") != result.content_hash:
            return False
        return output_intact(result.dir)[0]
    except DataError:
        return False
