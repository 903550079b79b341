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
