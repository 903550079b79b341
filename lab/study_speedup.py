"""Join a speedup measured by a direct ``gpu_speedup.py`` call to the GPU study's
``gpu_study.json``.

Also the summary of one ``gpu_speedup.py`` result that the study's speedup stage records. A direct
call is for a study whose ``speedup`` stage failed or was cut off while the machine still held the
best point's draft: ``gpu_speedup.py`` is then run by hand on that draft (same engine, same settings
as the stage), and this script puts its figures where the stage would have put them::

    python lab/study_speedup.py lab/results/DATE_gpu_study.json /path/to/gpu_speedup.json

Identity: both files carry the sha256 of the draft's serving folder (``best.serving_sha256`` written
by the study's report, ``draft_sha256`` by ``gpu_speedup.py``); they must be equal. Files written
without those fields (older study results) can only be matched by the draft's path and the device,
which is weaker (the same path recurs on every machine): that needs ``--match-by-path`` and is
recorded as ``identity: "path"``. Exit 0 when written; 2 on a refusal (the message names the file
and the field).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path


def draft_digest(serving: Path) -> str | None:
    """sha256 (hex) over the names and bytes of a serving folder's ``*.safetensors`` and
    ``config.json`` files, in name order; None when the folder has no such file."""
    files = (
        sorted([*serving.glob("*.safetensors"), *serving.glob("config.json")])
        if serving.is_dir()
        else []
    )
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def speedup_summary(data: dict, point: str, serving: str, file: str) -> dict:
    """The study's ``speedup`` record from one ``gpu_speedup.py`` JSON (``data``).

    Keys: ``point``, ``serving_dir``, ``file``, ``in_process_speedup`` (median of the per-round
    speculative / plain output-tokens/s ratios, batch size 1), ``acceptance_length`` (tokens per
    verify pass, bonus token counted), ``plain_tokens_per_s`` / ``speculative_tokens_per_s`` (output
    tokens per second), ``served_speedup`` (the HTTP ratio at concurrency 1; None when HTTP was not
    run), ``served`` (HTTP figures by concurrency), ``timings_ms`` (device timings of one profiled
    round, milliseconds) and ``predicted``."""
    http = (data.get("http") or {}).get("by_concurrency") or {}
    s = data.get("summary") or {}
    return {
        "point": point,
        "serving_dir": serving,
        "file": file,
        "in_process_speedup": s.get("ratio_median"),
        "acceptance_length": s.get("acceptance_length"),
        "plain_tokens_per_s": s.get("plain_tokens_per_s"),
        "speculative_tokens_per_s": s.get("speculative_tokens_per_s"),
        "served_speedup": (http.get("1") or {}).get("ratio"),
        "served": http,
        "timings_ms": s.get("timings_ms"),
        "predicted": data.get("predicted"),
    }


def _ratio(value, where: str, required: bool) -> float | None:
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
    if ok or (value is None and not required):
        return value
    raise ValueError(f"{where}: expected a positive number, got {value!r}")


def add_speedup(
    study: dict, data: dict, study_file: str, file: str, match_by_path: bool = False
) -> dict:
    """``study`` (a ``gpu_study.json`` read from ``study_file``) with the speedup of ``data`` (a
    ``gpu_speedup.json`` read from ``file``).

    Raises ValueError naming the file, field, expected and actual value when either is not a JSON
    object, the study has no best point, the draft digests differ (or are missing without
    ``match_by_path``), the draft path is not the best point's serving folder, the device differs,
    or a ratio is not a positive number."""
    for name, obj in ((study_file, study), (file, data)):
        if not isinstance(obj, dict):
            raise ValueError(f"{name}: expected a JSON object, got {type(obj).__name__}")
    point = (study.get("best") or {}).get("point") if isinstance(study.get("best"), dict) else None
    if not isinstance(point, str) or not point:
        raise ValueError(
            f"{study_file}: best.point: expected the study's best point, got "
            f"{point!r} (is this a gpu_study.json? the study file comes first)"
        )
    settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
    draft = str(settings.get("draft") or "")
    if not draft.rstrip("/").endswith(f"-{point}/serving"):
        raise ValueError(
            f"{file}: settings.draft: expected the best point's "
            f"serving folder (.../*-{point}/serving), got {draft!r}"
        )
    want, got = study["best"].get("serving_sha256"), data.get("draft_sha256")
    if want and got and want != got:
        raise ValueError(
            f"{file}: draft_sha256: expected the study's best.serving_sha256 {want}, got {got}"
        )
    if not (want and got) and not match_by_path:
        raise ValueError(
            f"{file}: draft_sha256 / {study_file}: best.serving_sha256: both are needed to tell "
            f"the draft apart (got {got!r} and {want!r}); --match-by-path accepts the path alone"
        )
    device = (
        (data.get("device") or {}).get("name") if isinstance(data.get("device"), dict) else None
    )
    study_device = str(study.get("device") or "")
    if not device or not (study_device == device or study_device.startswith(f"{device} (")):
        raise ValueError(
            f"{file}: device.name: expected the study's {study_device!r}, got {device!r}"
        )
    if not isinstance(data.get("summary"), dict):
        raise ValueError(
            f"{file}: summary: expected an object, got {type(data.get('summary')).__name__}"
        )
    rec = speedup_summary(data, point, draft, Path(file).name)
    _ratio(rec["in_process_speedup"], f"{file}: summary.ratio_median", True)
    _ratio(rec["served_speedup"], f"{file}: http.by_concurrency.1.ratio", False)
    rec["measured_by"] = (
        "a direct lab/gpu_speedup.py call on the best point's draft (not the study's stage)"
    )
    rec["identity"] = "sha256" if want and got else "path"
    return {
        **study,
        "speedup": rec,
        "served_speedup": rec["served_speedup"],
        "in_process_speedup": rec["in_process_speedup"],
    }


def _read(path: str):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: cannot be read as JSON ({e})") from e


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Join a speedup measured by a direct gpu_speedup.py call to "
        "gpu_study.json (rewritten in place)."
    )
    p.add_argument("study", help="gpu_study.json, rewritten in place")
    p.add_argument("speedup", help="gpu_speedup.json of the best point's draft")
    p.add_argument(
        "--match-by-path",
        action="store_true",
        help="accept files without draft digests, matched by the draft's path and the device only",
    )
    a = p.parse_args(argv)
    try:
        new = add_speedup(_read(a.study), _read(a.speedup), a.study, a.speedup, a.match_by_path)
    except ValueError as e:
        print(f"study_speedup: {e}", file=sys.stderr)
        return 2
    Path(a.study).write_text(json.dumps(new, indent=1, default=str))
    served = new["served_speedup"]
    print(
        f"{a.study}: in-process speedup {new['in_process_speedup']:.3f}, served "
        f"speedup {'not measured' if served is None else f'{served:.3f}'} "
        f"(identity: {new['speedup']['identity']})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
