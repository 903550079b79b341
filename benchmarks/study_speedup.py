"""The GPU study's speedup figures: the summary of one ``gpu_speedup.py`` result, and folding a speedup that was
measured by a direct ``gpu_speedup.py`` call into the study's ``gpu_study.json``.

The second use is for a study whose ``speedup`` stage failed or was cut off while the machine still held the best
point's draft: ``gpu_speedup.py`` is then run by hand on that draft (same engine, same settings as the stage),
and this script puts its figures where the stage would have put them::

    python benchmarks/study_speedup.py benchmarks/results/gpu_study.json /path/to/gpu_speedup.json

It refuses a speedup file whose draft is not the best point's serving folder (``.../<run>-<point>/serving``),
whose device differs from the study's, or which has no in-process ratio. Exit 0 when written; 2 on a refusal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def speedup_summary(data: dict, point: str, serving: str, file: str) -> dict:
    """The study's ``speedup`` record from one ``gpu_speedup.py`` JSON (``data``).

    Keys: ``point``, ``serving_dir``, ``file``, ``in_process_speedup`` (median of the per-round speculative /
    plain output-tokens/s ratios, batch size 1), ``acceptance_length`` (tokens per verify pass, bonus token
    counted), ``plain_tokens_per_s`` / ``speculative_tokens_per_s`` (output tokens per second), ``served_speedup``
    (the HTTP ratio at concurrency 1; None when HTTP was not run), ``served`` (HTTP figures by concurrency),
    ``timings_ms`` (device timings of one profiled round, milliseconds) and ``predicted``."""
    http = (data.get("http") or {}).get("by_concurrency") or {}
    s = data.get("summary") or {}
    return {"point": point, "serving_dir": serving, "file": file,
            "in_process_speedup": s.get("ratio_median"), "acceptance_length": s.get("acceptance_length"),
            "plain_tokens_per_s": s.get("plain_tokens_per_s"), "speculative_tokens_per_s": s.get("speculative_tokens_per_s"),
            "served_speedup": (http.get("1") or {}).get("ratio"), "served": http, "timings_ms": s.get("timings_ms"),
            "predicted": data.get("predicted")}


def add_speedup(study: dict, data: dict, file: str) -> dict:
    """``study`` (a ``gpu_study.json``) with the speedup of ``data`` (a ``gpu_speedup.json`` read from ``file``).

    Raises ValueError naming the field, expected and actual value when the speedup was measured on another
    draft than the study's best point, on another device, or has no in-process ratio."""
    point = (study.get("best") or {}).get("point")
    draft = str((data.get("settings") or {}).get("draft") or "")
    if not point or not draft.rstrip("/").endswith(f"-{point}/serving"):
        raise ValueError(f"{file}: settings.draft: expected the best point's serving folder (.../*-{point}/serving), "
                         f"got {draft!r}")
    device = (data.get("device") or {}).get("name")
    if device != study.get("device"):
        raise ValueError(f"{file}: device.name: expected the study's {study.get('device')!r}, got {device!r}")
    rec = speedup_summary(data, point, draft, file)
    if rec["in_process_speedup"] is None:
        raise ValueError(f"{file}: summary.ratio_median: expected a measured ratio, got None")
    rec["measured_by"] = "a direct benchmarks/gpu_speedup.py call on the best point's draft (not the study's stage)"
    return {**study, "speedup": rec, "served_speedup": rec["served_speedup"],
            "in_process_speedup": rec["in_process_speedup"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("study", help="gpu_study.json, rewritten in place")
    p.add_argument("speedup", help="gpu_speedup.json of the best point's draft")
    a = p.parse_args(argv)
    try:
        study = json.loads(Path(a.study).read_text())
        data = json.loads(Path(a.speedup).read_text())
        new = add_speedup(study, data, a.speedup)
    except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError
        print(f"study_speedup: {e}", file=sys.stderr)
        return 2
    Path(a.study).write_text(json.dumps(new, indent=1, default=str))
    print(f"{a.study}: in-process speedup {new['in_process_speedup']:.3f}, served speedup "
          f"{new['served_speedup'] if new['served_speedup'] is None else round(new['served_speedup'], 3)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
