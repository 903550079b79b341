"""The figures of ``lab/gpu_train.py``: per trainer the median tokens/s over alternating rounds,
peak memory and MFU, ours / speculators' ``Trainer`` ratios, printed as a table and written as JSON
(``gpu_train.json``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def summarize(rows: list[dict], fpt: float, peak_flops: float) -> dict:
    """Group the runs (``rows``: one dict per trainer and round, with ``name``, ``settings``,
    ``round``, ``tokens_per_s``, ``peak_gib``) by trainer; returns ``{"trainers": [...], "ratios":
    {...}}``.

    Each trainer: the median of its rounds' tokens/s (``tokens_per_s``), every round's figure, the
    largest peak memory (GiB) and MFU = ``fpt`` (model FLOPs per token) × tokens/s ÷ ``peak_flops``
    (FLOP/s). Each of ours, against the first speculators trainer: the ratio of the medians and the
    per-round ratios (same round index: the runs alternate within a round, so a drift of the machine
    hits both)."""
    trainers: dict[tuple, dict] = {}
    for r in rows:
        t = trainers.setdefault(
            (r["name"], r["settings"]),
            {"name": r["name"], "settings": r["settings"], "rounds": {}, "peak_gib": float("nan")},
        )
        t["rounds"][r.get("round", 0)] = r["tokens_per_s"]
        peak = r.get("peak_gib", float("nan"))
        if peak == peak:
            t["peak_gib"] = peak if t["peak_gib"] != t["peak_gib"] else max(t["peak_gib"], peak)
    out = []
    for t in trainers.values():
        vals = [t["rounds"][k] for k in sorted(t["rounds"])]
        out.append(
            {
                "name": t["name"],
                "settings": t["settings"],
                "tokens_per_s": statistics.median(vals),
                "tokens_per_s_rounds": vals,
                "peak_gib": t["peak_gib"],
                "mfu": fpt * statistics.median(vals) / peak_flops,
            }
        )
    spec = next((t for t in trainers.values() if t["name"].startswith("speculators")), None)
    ratios = {}
    if spec is not None:
        s_med = statistics.median(spec["rounds"].values())
        for t in trainers.values():
            if t is spec or t["name"].startswith("speculators"):
                continue
            per = [
                t["rounds"][k] / spec["rounds"][k]
                for k in sorted(t["rounds"])
                if k in spec["rounds"]
            ]
            ratios[f"{t['name']} [{t['settings']}]"] = {
                "ratio_of_medians": statistics.median(t["rounds"].values()) / s_med,
                "per_round": per,
                "peak_gib_ours": t["peak_gib"],
                "peak_gib_speculators": spec["peak_gib"],
            }
    return {"trainers": out, "ratios": ratios}


def print_table(summary: dict, rows: list[dict], echo=print) -> None:
    """The markdown table (one line per trainer: median tokens/s, rounds, peak GiB, MFU, round-0
    profile) and one ``ours / speculators`` line per ratio."""
    prof = {(r["name"], r["settings"]): r.get("profile") for r in rows if r.get("round", 0) == 0}
    echo(
        "| trainer | settings | tokens/s (median) | rounds | peak GiB "
        "| MFU | profiled step: wall ms, kernel ms, GPU busy, kernels |"
    )
    echo("|---|---|---|---|---|---|---|")
    for t in summary["trainers"]:
        pr = prof.get((t["name"], t["settings"]))
        pcol = (
            f"{pr['wall_ms']:.1f}, {pr['kernel_ms']:.1f}, "
            f"{pr['gpu_busy']:.0%}, {pr['kernels_per_step']:.0f}"
            if pr
            else ""
        )
        rounds = ", ".join(f"{x:,.0f}" for x in t["tokens_per_s_rounds"])
        echo(
            f"| {t['name']} | {t['settings']} | {t['tokens_per_s']:,.0f} "
            f"| {rounds} | {t['peak_gib']:.1f} | {t['mfu']:.1%} | {pcol} |"
        )
    for name, r in summary["ratios"].items():
        per = ", ".join(f"{x:.2f}" for x in r["per_round"])
        echo(f"{name} / speculators Trainer tokens/s = {r['ratio_of_medians']:.2f} (rounds: {per})")


def _finite(x):
    """NaN (no CUDA: no peak memory) as JSON null, recursively."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def write_json(path: Path, summary: dict, meta: dict) -> None:
    """``summary`` and ``meta`` (device, shape, settings, failures) as one JSON file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite({**meta, **summary}), indent=1, default=str))


def shape_record(summary: dict, meta: dict) -> dict:
    """One shape's entry of the results file: each trainer's median tokens/s, rounds, peak GiB and
    MFU, and each of ours / speculators (ratio of medians, per-round ratios), with the run's
    settings."""
    return _finite(
        {
            "device": meta["device"],
            "torch": meta["torch"],
            "rounds": meta["rounds"],
            "steps": meta["steps"],
            "warmup": meta["warmup"],
            "seq_len": meta["seq_len"],
            "draft_vocab": meta["draft_vocab"],
            "ttt": meta["ttt"],
            "model_flops_per_token": meta["model_flops_per_token"],
            "trainers": [
                {
                    k: t[k]
                    for k in (
                        "name",
                        "settings",
                        "tokens_per_s",
                        "tokens_per_s_rounds",
                        "peak_gib",
                        "mfu",
                    )
                }
                for t in summary["trainers"]
            ],
            "ratios": summary["ratios"],
            "failures": meta["failures"],
        }
    )


def read_results(path: Path) -> dict:
    """A results file's content (``{"shapes": {}}`` when it does not exist yet). Raises ValueError
    naming the file when it is not a JSON object with a ``shapes`` object (checked before a
    benchmark spends its time)."""
    if not path.exists():
        return {"shapes": {}}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("shapes"), dict):
        got = (
            f"an object with keys {sorted(data)[:5]}"
            if isinstance(data, dict)
            else type(data).__name__
        )
        raise ValueError(f"{path}: expected a JSON object with a 'shapes' object, got {got}")
    return data


def results_destination(path: Path, out: Path | None) -> Path:
    """Where :func:`merge_results` will write: ``out/results/<path name>`` (``out`` given) or
    ``path``. Creates the folder and raises ValueError naming it when it cannot be created or
    written (checked before a benchmark spends its time, so its figures are not lost at the end)."""
    import os

    dest = out / "results" / path.name if out is not None else path
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{dest.parent}: cannot create the folder for {dest.name} ({e})") from e
    if not os.access(dest.parent, os.W_OK) or dest.is_dir():
        raise ValueError(
            f"{dest}: expected a writable file path, got "
            f"{'a folder' if dest.is_dir() else 'a folder without write permission'}"
        )
    return dest


def merge_results(path: Path, out: Path | None, summary: dict, meta: dict) -> Path:
    """Read ``path`` (a results file, or nothing yet), set ``shapes[<shape>]`` to this run's
    :func:`shape_record`, and write the whole file to ``out/results/<path name>`` (``out`` given) or
    back to ``path``. Returns where it was written. Raises ValueError naming the file when it exists
    but is not a JSON object with a ``shapes`` object."""
    data = read_results(path)
    data["shapes"][meta["shape"]] = shape_record(summary, meta)
    data["written_by"] = "lab/gpu_train.py --results"
    dest = results_destination(path, out)
    dest.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return dest
