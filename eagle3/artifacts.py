"""Manifests and content hashes for every on-disk hand-over between stages.

Each stage output directory holds ``manifest.json``::

    {"kind": "hidden_states" | "draft_checkpoint" | "serving_checkpoint" | ...,
     "schema_version": 1, "created_at": ISO-8601 UTC, "inputs": {name: content_hash},
     "config": {...the stage's config section...}, "counts": {...}, "timings": {... seconds ...},
     "content_hash": sha256 over the files (manifest excluded), ...stage-specific keys}

Writes are atomic (a temporary sibling, renamed): a reader never sees half a file."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from eagle3.errors import DataError

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


_WEIGHTS_MEMO: dict[tuple, str] = {}


def weights_hash(model_dir: str | Path) -> str | None:
    """sha256 (hex) over ``"<name>:<file sha256>"`` of a folder's ``*.safetensors`` in name order
    (``target.weights_hash``); None if none. Memoised by path, name, size, mtime."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    key = tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    if key not in _WEIGHTS_MEMO:
        _WEIGHTS_MEMO[key] = hashlib.sha256(
            "".join(f"{p.name}:{sha256_file(p)}" for p in files).encode()).hexdigest()
    return _WEIGHTS_MEMO[key]


def _hashed_files(directory: str | Path, exclude: tuple[str, ...]) -> dict[str, Path]:
    """``{relative path: file}`` that :func:`content_hash` covers, sorted by path."""
    root = Path(directory)
    if not root.is_dir():
        raise DataError(f"{root}: expected a directory to hash, found none")
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in exclude and ".tmp" not in p.name
            and not any(part in exclude for part in p.relative_to(root).parts[:-1])}


def content_hash(directory: str | Path, exclude: tuple[str, ...] = (MANIFEST,)) -> str:
    """sha256 over (relative path, file sha256) of every file under ``directory``, sorted by path,
    skipping ``exclude`` names (any depth, folders too) and ``*.tmp*``. DataError if
    ``directory`` is missing."""
    h = hashlib.sha256()
    for rel, p in _hashed_files(directory, exclude).items():
        h.update(rel.encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()


def file_stats(directory: str | Path, exclude: tuple[str, ...] = (MANIFEST,)) -> dict:
    """``{"count", "bytes", "stat_digest", "exclude"}`` over :func:`content_hash`'s files, a
    stat-only record; ``stat_digest`` = sha256 over (relative path, size, mtime ns). DataError if no
    directory."""
    stats = {rel: p.stat() for rel, p in _hashed_files(directory, exclude).items()}
    h = hashlib.sha256()
    for rel, st in stats.items():
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return {"count": len(stats), "bytes": sum(st.st_size for st in stats.values()),
            "stat_digest": h.hexdigest(), "exclude": sorted(exclude)}


def output_intact(directory: str | Path) -> tuple[bool, str]:
    """``(ok, why not)``: does a finished output still hold what its manifest was written over?
    Count and bytes must match ``files``; if ``files.stat_digest`` differs, the content hash is
    recomputed and must equal ``content_hash``. No ``files``: pass. DataError without a manifest."""
    m = read_manifest(directory)
    if not isinstance(want := m.get("files"), dict):
        return True, ""
    exclude = tuple(want.get("exclude") or (MANIFEST,))
    got = file_stats(directory, exclude)
    if (got["count"], got["bytes"]) != (want.get("count"), want.get("bytes")):
        return False, (f"{Path(directory) / MANIFEST}: 'files' expected {want.get('count')} files "
                       f"of {want.get('bytes')} bytes, found {got['count']} files of "
                       f"{got['bytes']} bytes")
    if want.get("stat_digest") in (None, got["stat_digest"]):
        return True, ""
    if (now := content_hash(directory, exclude)) != m.get("content_hash"):
        return False, (f"{Path(directory) / MANIFEST}: 'content_hash' expected "
                       f"{m.get('content_hash')}, the files now hash to {now} (a file was "
                       f"rewritten after the manifest)")
    return True, ""


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary sibling and ``os.replace`` (fsync'd)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; servers run as others read it
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Atomically write ``obj`` as indented, key-sorted JSON."""
    return atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str)
                                  + "\n").encode())


@contextmanager
def atomic_directory(final: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling; on success rename it to ``final`` (an existing ``final`` is
    replaced once the new one is complete), on error delete it."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
    try:
        yield tmp
        old = final.with_name(f".{final.name}.old.tmp")
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_manifest(directory: str | Path, kind: str, *, config: dict | None = None,
                   inputs: dict[str, str] | None = None, counts: dict | None = None,
                   timings: dict | None = None, exclude: tuple[str, ...] = (MANIFEST,),
                   **extra: Any) -> dict:
    """Write ``<directory>/manifest.json`` with the content hash; returns the manifest."""
    manifest = {"kind": kind, "schema_version": SCHEMA_VERSION, "created_at": utc_now(),
                "inputs": dict(inputs or {}), "config": dict(config or {}),
                "counts": dict(counts or {}), "timings": dict(timings or {}), **extra,
                "files": file_stats(directory, exclude=exclude),
                "content_hash": content_hash(directory, exclude=exclude)}
    atomic_write_json(Path(directory) / MANIFEST, manifest)
    return manifest


def read_jsonl(path: str | Path, opener=open) -> list:
    """The records of a JSON Lines file (blank lines skipped). DataError names the file and line of
    a record that is not JSON."""
    out = []
    with opener(path, "rt", encoding="utf-8-sig") as fh:  # a leading BOM dropped
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{n}: not valid JSON ({e})") from e
    return out


def read_json_object(path: str | Path, what: str) -> dict:
    """The JSON object in the file ``path``; ``what`` names the file in errors (e.g. ``"target
    config.json"``). DataError naming the file when it is missing, unreadable (not UTF-8, not
    JSON) or holds another JSON value than an object."""
    path = Path(path)
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise DataError(f"{path}: {what} not found") from e
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: {what} unreadable ({e})") from e
    if not isinstance(value, dict):
        raise DataError(f"{path}: {what} expected a JSON object, got {type(value).__name__}")
    return value


def read_manifest(directory: str | Path, kind: str | None = None) -> dict:
    """Read ``<directory>/manifest.json`` (a JSON object, as :func:`write_manifest` writes it).
    DataError naming the file: missing, not JSON, not a JSON object (a list, a number, ...), or a
    ``kind`` field other than ``kind`` (when given)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise DataError(f"{path}: manifest not found (is {directory} a finished stage output?)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(manifest, dict):
        raise DataError(f"{path}: expected a JSON object (the manifest's fields), got a "
                        f"{_json_type(manifest)}")
    if kind is not None and manifest.get("kind") != kind:
        raise DataError(f"{path}: kind expected {kind!r}, got {manifest.get('kind')!r}")
    return manifest


def _json_type(value: object) -> str:
    """The JSON name of a decoded value's type (``list`` -> "list", ``str`` -> "string")."""
    names = {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
