"""PNG plots of the benchmark and the decision (matplotlib, Agg backend): each function takes plain
dicts or a file, writes one PNG to ``path`` and returns it; DataError names the empty field when
there is nothing to plot."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from eagle3.errors import DataError  # noqa: E402


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_acceptance_by_category(report: dict, path: str | Path,
                                offline: dict | None = None) -> Path:
    """Served acceptance per category (``run_bench`` report), offline beside it; dashed: overall."""
    cats = [c for c, v in report.get("per_category", {}).items()
            if v.get("acceptance_length") is not None]
    if not cats:
        raise DataError("plot_acceptance_by_category: report['per_category'] has no "
                        "acceptance_length values")
    served = [report["per_category"][c]["acceptance_length"] for c in cats]
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(cats) + 2), 3.6))
    width = 0.4 if offline else 0.7
    xs = range(len(cats))
    ax.bar([x - (width / 2 if offline else 0) for x in xs], served, width, label="served")
    if offline:
        off = [(offline.get("per_category", {}).get(c) or {}).get("acceptance_length") or 0.0
               for c in cats]
        ax.bar([x + width / 2 for x in xs], off, width, label="offline (in-process)")
    overall = report.get("summary", {}).get("acceptance_length")
    if overall is not None:
        ax.axhline(overall, ls="--", c="k", lw=1, label=f"overall {overall:.2f}")
    ax.axhline(1.0, c="grey", lw=0.8)
    ax.set_xticks(list(xs), cats, rotation=30, ha="right")
    ax.set(ylabel="acceptance length (tokens / verify pass)", title="Acceptance length by category")
    ax.legend(fontsize=8)
    return _save(fig, path)


def missing_bars(points: list[dict], kinds: list[str]) -> list[tuple[int, str]]:
    """(point index, kind) of every None figure: plotted as "not measured"."""
    return [(i, k) for i, p in enumerate(points) for k in kinds if p.get(k) is None]


def plot_served_vs_offline(points: list[dict], path: str | Path) -> Path:
    """Grouped bars of simulated / offline / served acceptance per draft; ``points``: ``{"label",
    "simulated", "offline", "served"}`` (None: "not measured")."""
    if not points:
        raise DataError("plot_served_vs_offline: no points")
    kinds = ["simulated", "offline", "served"]
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(points) + 2), 3.6))
    width = 0.8 / len(kinds)
    for j, kind in enumerate(kinds):
        vals = [p.get(kind) or 0.0 for p in points]
        ax.bar([i + (j - 1) * width for i in range(len(points))], vals, width, label=kind)
    for i, kind in missing_bars(points, kinds):  # an empty slot says why it is empty
        ax.text(i + (kinds.index(kind) - 1) * width, 0.05, "not measured", rotation=90, ha="center",
                va="bottom", fontsize=7, color="grey")
    ax.axhline(1.0, c="grey", lw=0.8)
    ax.set_xticks(range(len(points)), [p["label"] for p in points], rotation=20, ha="right")
    ax.set(ylabel="acceptance length",
           title="Simulated (training) vs offline (in-process) vs served")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _label(r: dict) -> str:
    return r.get("label") or (f"{r['data']} / {r.get('schedule', '?')}" if r.get("data")
                              else r.get("schedule", "?"))


def plot_data_scaling(results: list[dict], path: str | Path) -> Path:
    """Acceptance vs unique training tokens (log x), a line per (data, schedule); ``results``: sweep
    results. DataError when no result has both numbers."""
    pts = [r for r in results if r.get("acceptance_length") is not None and r.get("unique_tokens")]
    if not pts:
        raise DataError("plot_data_scaling: no result with both unique_tokens and "
                        "acceptance_length")
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for label in dict.fromkeys(_label(r) for r in pts):
        sel = sorted((r for r in pts if _label(r) == label), key=lambda r: r["unique_tokens"])
        ax.plot([r["unique_tokens"] for r in sel], [r["acceptance_length"] for r in sel], "-o",
                label=label)
    from matplotlib.ticker import EngFormatter, FixedLocator, NullLocator

    ax.set_xscale("log")
    sizes = sorted({r["unique_tokens"] for r in pts})
    ax.xaxis.set_major_locator(FixedLocator(sizes))  # ticks at the measured sizes only
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(EngFormatter(places=1 if len(sizes) > 1 else 0))
    ax.tick_params(axis="x", labelrotation=30)
    ax.set(xlabel="unique training tokens (log scale)",
           ylabel="acceptance length (bonus token counted)", title="Data scaling")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_training_length(curves: list[dict], path: str | Path) -> Path:
    """Acceptance vs optimizer steps, a line per run; ``curves``: ``{"label", "steps",
    "acceptance", "kind"}`` (kind ``measured``: dev/acceptance_length of training, else
    simulated on the validation split). DataError for no curve or unequal lengths."""
    if not curves:
        raise DataError("plot_training_length: no curve to draw")
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for c in curves:
        if len(c["steps"]) != len(c["acceptance"]) or not c["steps"]:
            raise DataError(f"plot_training_length: curve {c.get('label')!r}: expected as many "
                            f"steps as values (≥ 1), got {len(c['steps'])} and "
                            f"{len(c['acceptance'])}")
        ax.plot(c["steps"], c["acceptance"], "-o" if len(c["steps"]) < 30 else "-", markersize=3,
                label=c["label"])
    kinds = {c.get("kind", "simulated") for c in curves}
    ylabel = ("measured acceptance length (dev prompts)" if kinds == {"measured"} else
              "simulated acceptance length (validation)" if kinds == {"simulated"} else
              "acceptance length (measured where a run logged it, else simulated)")
    ax.set(xlabel="optimizer steps", ylabel=ylabel, title="Training length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


# the metrics.jsonl keys of one training run's acceptance along its evaluations, and their labels
def along_training() -> tuple[tuple[str, str], ...]:
    """The ``(metric key, label)`` of each figure :func:`plot_acceptance_along_training` draws."""
    from eagle3.train.metrics import FIRST_KEY, FIRST_TOKENS

    return (("val/simulated_acceptance_length", "simulated (validation, every position)"),
            (f"val/{FIRST_KEY}", f"simulated (validation, answers' first {FIRST_TOKENS} tokens)"),
            ("dev/acceptance_length_all_positions", "development, every position"),
            ("dev/acceptance_length", "development, per verify pass (as decoding counts)"))


def plot_acceptance_along_training(rows: list[dict], path: str | Path) -> Path:
    """Acceptance length (bonus token counted) against optimizer steps for one training run, a
    line per figure of :func:`along_training`, from its ``metrics.jsonl`` evaluation rows
    (``{"step", key: value}``): the gap between the lines is where simulated and measured
    acceptance part (answer position, text and scoring, then position sampling). A figure no
    row has is left out.
    DataError when no row has the development figure (``train.select_best_by=measured`` logs it).
    """
    if not any(isinstance(r.get("dev/acceptance_length"), (int, float)) for r in rows):
        raise DataError("plot_acceptance_along_training: no evaluation row has "
                        "dev/acceptance_length (train.select_best_by=measured logs it)")
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    # distinct markers and dashes: equal figures (no position sampling) stay visible
    for (key, label), style in zip(along_training(), ("-o", "-.d", "--s", ":^")):
        pts = sorted((int(r["step"]), float(r[key])) for r in rows
                     if isinstance(r.get(key), (int, float)) and "step" in r)
        if pts:
            ax.plot(*zip(*pts), style, markersize=4 if len(pts) < 30 else 0, label=label,
                    fillstyle="none")
    ax.set(xlabel="optimizer steps", ylabel="acceptance length (bonus counted)",
           title="Simulated and measured acceptance along training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)
