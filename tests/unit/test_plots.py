"""The PNG plots: each writes a real image from plain dicts and refuses empty input with
DataError."""

from __future__ import annotations

import pytest

from eagle3.errors import DataError
from eagle3.measure.plots import (
    missing_bars,
    plot_acceptance_by_category,
    plot_data_scaling,
    plot_served_vs_offline,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path) -> bool:
    data = path.read_bytes()
    return data[:8] == PNG_MAGIC and len(data) > 2000


def test_acceptance_by_category_with_offline(tmp_path):
    report = {
        "summary": {"acceptance_length": 1.4},
        "per_category": {
            "writing": {"acceptance_length": 1.3},
            "coding": {"acceptance_length": 1.6},
            "math": {"acceptance_length": None},
        },
    }
    offline = {"per_category": {"writing": {"acceptance_length": 1.35}}}
    assert _is_png(plot_acceptance_by_category(report, tmp_path / "a.png", offline=offline))
    with pytest.raises(DataError, match="per_category"):
        plot_acceptance_by_category(
            {"per_category": {"x": {"acceptance_length": None}}}, tmp_path / "b.png"
        )


def test_served_vs_offline_and_data_scaling(tmp_path):
    pts = [
        {"label": "trained", "simulated": 1.33, "offline": 1.31, "served": 1.30},
        {"label": "broken-aux", "simulated": 1.33, "offline": 1.31, "served": 1.0},
    ]
    assert _is_png(plot_served_vs_offline(pts, tmp_path / "s.png"))
    res = [
        {"schedule": "cosine", "unique_tokens": 5000, "acceptance_length": 1.2},
        {"schedule": "cosine", "unique_tokens": 9000, "acceptance_length": 1.3},
        {"schedule": "constant", "unique_tokens": 5000, "acceptance_length": 1.25},
    ]
    assert _is_png(plot_data_scaling(res, tmp_path / "d.png"))
    with pytest.raises(DataError):
        plot_data_scaling(
            [{"schedule": "x", "unique_tokens": 0, "acceptance_length": 1.0}], tmp_path / "e.png"
        )
    with pytest.raises(DataError):
        plot_served_vs_offline([], tmp_path / "f.png")


def test_missing_figures_are_marked_not_measured(tmp_path):
    pts = [
        {"label": "trained draft", "simulated": 1.5, "offline": 1.4, "served": 1.3},
        {"label": "untrained baseline", "simulated": None, "offline": None, "served": 1.0},
    ]
    assert missing_bars(pts, ["simulated", "offline", "served"]) == [
        (1, "simulated"),
        (1, "offline"),
    ]
    assert _is_png(plot_served_vs_offline(pts, tmp_path / "m.png"))


def test_acceptance_along_training_draws_the_three_figures_or_refuses_without_dev(tmp_path):
    import json

    from eagle3.measure.plots import plot_acceptance_along_training
    from tasks.train import _along_training_plot

    rows = [{"kind": "eval", "step": s, "val/simulated_acceptance_length": 1.5 + s / 1000,
             "val/simulated_acceptance_length_first64": 1.4 + s / 1000,
             "dev/acceptance_length_all_positions": 1.3 + s / 2000,
             "dev/acceptance_length": 1.2 + s / 3000} for s in (100, 200, 300)]
    png = plot_acceptance_along_training(rows, tmp_path / "a.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plain = [{k: v for k, v in r.items() if not k.startswith("dev/")} for r in rows]
    with pytest.raises(DataError, match="no evaluation row has dev/acceptance_length"):
        plot_acceptance_along_training(plain, tmp_path / "b.png")
    # the train task's plot: from metrics.jsonl, outside the draft folder; None without dev
    draft, dest = tmp_path / "draft", tmp_path / "dest"
    draft.mkdir()
    (draft / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in
                                                   [{"kind": "train", "step": 50}, *rows]))
    assert _along_training_plot(draft, dest) == dest / "acceptance_along_training.png"
    assert sorted(p.name for p in draft.iterdir()) == ["metrics.jsonl"]
    (draft / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in plain))
    assert _along_training_plot(draft, tmp_path / "none") is None
    (draft / "metrics.jsonl").write_text("{not json")
    assert _along_training_plot(draft, tmp_path / "none") is None
