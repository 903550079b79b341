"""Hand-over records: what a stage flow run tells the orchestrator that started it on another
machine.

``<run_dir>/handover/<stage>.json`` holds the stage's task results (tasks/results.py types, written
with their type name and every ``dir`` relative to the runs directory), its ``record`` of ran/cached
lines, its flow run id and host. The orchestrator reads them back as the same types through its own
mount of the runs directory, wherever that is.
"""

from __future__ import annotations

import json
import socket
from dataclasses import asdict
from pathlib import Path
from typing import Any

from eagle3.config import RunConfig
from eagle3.errors import DataError
from tasks import caching
from tasks.results import AcceptanceFigures, StageResult


def handover_path(cfg: RunConfig, stage: str) -> Path:
    """``<run_dir>/handover/<stage>.json``."""
    return cfg.run_dir() / "handover" / f"{stage}.json"


def portable(cfg: RunConfig, result: Any) -> dict:
    """The JSON form of a stage result in a record (or a flow parameter): ``{"type": name, ...}``, a
    :class:`StageResult`'s ``dir`` relative to the runs directory; an :class:`AcceptanceFigures` as
    its fields; a dict (the pre-flight report) as ``{"type": "dict", "value": ...}``. DataError
    otherwise."""
    if isinstance(result, StageResult):
        return {"type": "StageResult", **asdict(result),
                "dir": caching.run_relative(result.dir, cfg)}
    if isinstance(result, AcceptanceFigures):
        return {"type": "AcceptanceFigures", **asdict(result)}
    if isinstance(result, dict):
        return {"type": "dict", "value": result}
    raise DataError("hand-over: a result of type StageResult, AcceptanceFigures or dict expected, "
                    f"got {type(result).__name__}: {result!r:.200}")


def localized(cfg: RunConfig, doc: dict) -> Any:
    """The inverse of :func:`portable` here: a relative ``dir`` joined to this machine's runs
    directory. Raises DataError for an unknown ``type`` or fields that do not fit it."""
    kind = doc.get("type") if isinstance(doc, dict) else None
    fields = {k: v for k, v in doc.items() if k != "type"} if kind else {}
    try:
        if kind == "StageResult":
            d = Path(fields.pop("dir"))
            return StageResult(dir=d if d.is_absolute() else cfg.paths.resolved_runs_dir() / d,
                               **fields)
        if kind == "AcceptanceFigures":
            return AcceptanceFigures(**fields)
        if kind == "dict":
            return fields["value"]
    except (KeyError, TypeError) as e:
        raise DataError(f"hand-over: {kind} fields {sorted(fields)} do not make a {kind} "
                        f"({e})") from e
    raise DataError("hand-over: type StageResult, AcceptanceFigures or dict expected, "
                    f"got {kind!r} (a record of another version of flows/handover.py? "
                    "re-run the stage)")


def write_handover(cfg: RunConfig, stage: str, record: dict, results: dict) -> dict:
    """Write this stage flow run's record (see the module doc); returns it."""
    from prefect.runtime import flow_run

    from eagle3.artifacts import atomic_write_json, utc_now

    doc = {"stage": stage, "config": cfg.name, "flow_run_id": str(flow_run.id),
           "host": socket.gethostname(), "written_at": utc_now(), "record": dict(record),
           "results": {k: portable(cfg, v) for k, v in results.items()}}
    atomic_write_json(handover_path(cfg, stage), doc)
    return doc


def read_handover(cfg: RunConfig, stage: str, flow_run_id: str) -> dict:
    """The record ``stage``'s flow run ``flow_run_id`` wrote, its results localized to this machine.
    Raises DataError when the file is missing or unreadable, or was written by another flow run."""
    path, runs = handover_path(cfg, stage), cfg.paths.resolved_runs_dir()
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise DataError(f"{path}: no hand-over record; expected stage {stage}'s flow run "
                        f"{flow_run_id} to write it (is {runs} the storage the stage's worker "
                        "mounts?)") from e
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: unreadable hand-over record ({type(e).__name__}: {e})") from e
    if doc.get("flow_run_id") != flow_run_id:
        raise DataError(f"{path}: flow_run_id expected {flow_run_id} (the stage run just "
                        f"finished), got {doc.get('flow_run_id')!r}: a record of another run (does "
                        f"the stage's worker mount another runs directory than {runs}?)")
    doc["results"] = {k: localized(cfg, v) for k, v in (doc.get("results") or {}).items()}
    return doc
