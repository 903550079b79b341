"""The readiness gate's summary says which progress signals it watched: with none (no server pid or
log, no GPU) it names what is missing and calls the last time a phase change, not progress."""

from __future__ import annotations

from eagle3.serve.readiness import GateResult


def test_no_signal_source_names_what_is_missing():
    text = GateResult(
        verdict="timed_out",
        url="http://127.0.0.1:1",
        elapsed_s=9.0,
        last_progress_s=5.1,
        signals={"log": 0, "cpu": 0, "gpu": 0},
        signal_sources=[],
    ).summary()
    assert (
        "No progress signal (no server pid or log given, no GPU seen); last phase change at "
        "5.1 s." in text
    )
    assert "none available" not in text and "last progress" not in text


def test_watched_sources_are_counted_with_the_last_progress():
    text = GateResult(
        verdict="timed_out",
        url="http://127.0.0.1:1",
        elapsed_s=9.0,
        last_progress_s=4.0,
        signals={"log": 3, "cpu": 0, "gpu": 0},
        signal_sources=["log", "cpu"],
    ).summary()
    assert "Progress signals observed: log 3, cpu 0; last progress at 4.0 s." in text
    assert "gpu" not in text
