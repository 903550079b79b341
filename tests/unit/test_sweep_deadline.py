"""The sweep's per-call deadline: no point starts after it, except the first of a call
(flows/sweep._run_points)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import flows.sweep as S


class _Pipeline:
    def __init__(self):
        self.started = []

    def with_options(self, flow_run_name):
        def run(**kw):
            self.started.append(flow_run_name)
            return SimpleNamespace(
                is_completed=lambda: True, result=lambda: {"point": flow_run_name}
            )

        return run


def _run(monkeypatch, deadline, gave=None, tagged=None):
    pipe = _Pipeline()
    monkeypatch.setattr(S, "eagle3_pipeline", pipe)
    monkeypatch.setattr(S, "_point_overrides", lambda *a: [])
    monkeypatch.setattr(
        S,
        "point_result",
        lambda summary, d, size, s: {
            "point": S.point_key(d, size, s),
            "conversations": size if gave is None else gave,
        },
    )
    monkeypatch.setattr(S, "tag_point", lambda cfg, parent, row: (tagged or []).append(row))
    cfg = SimpleNamespace(name="c", run_dir=lambda: __import__("pathlib").Path("/nonexistent"))
    todo = [["regenerated", 3000, "cosine-20ep"], ["regenerated", 3000, "cosine-10ep"]]
    scheds = {"cosine-20ep": [], "cosine-10ep": []}
    res, failed, pending = S._run_points(
        cfg, "c.yaml", [], todo, scheds, {"regenerated": []}, "parent", deadline
    )
    return pipe.started, [r["point"] for r in res], failed, pending


def test_first_point_of_a_call_starts_even_when_the_deadline_has_passed(monkeypatch):
    started, done, failed, pending = _run(monkeypatch, time.monotonic() - 5)
    assert started == done == ["regenerated-n3000-cosine-20ep"]
    assert pending == ["regenerated-n3000-cosine-10ep"] and failed == {}


def test_every_point_runs_before_the_deadline(monkeypatch):
    started, done, _, pending = _run(monkeypatch, time.monotonic() + 600)
    assert (
        started == ["regenerated-n3000-cosine-20ep", "regenerated-n3000-cosine-10ep"]
        and pending == []
    )


def test_every_point_fails_before_extraction_when_its_data_is_short():
    point = S._point_overrides(["-o-base"], "c", ["data.source=file"], 3000, "k", ["x=1"])
    assert "data.num_conversations=3000" in point and "data.on_short=fail" in point
    assert S.overridden_settings(["data.on_short=warn"], {}) is not None


def test_a_failed_point_keeps_the_flow_s_message(monkeypatch):
    pipe = _Pipeline()
    failed_state = SimpleNamespace(is_completed=lambda: False, name="Failed",
                                   message="DATA_SHORT: data.num_conversations=3000 asked")
    pipe.with_options = lambda flow_run_name: (lambda **kw: failed_state)
    monkeypatch.setattr(S, "eagle3_pipeline", pipe)
    monkeypatch.setattr(S, "_point_overrides", lambda *a: [])
    cfg = SimpleNamespace(name="c", run_dir=lambda: __import__("pathlib").Path("/nonexistent"))
    res, failed, pending = S._run_points(cfg, "c.yaml", [], [["regenerated", 3000, "s"]],
                                         {"s": []}, {"regenerated": []}, "parent", None)
    assert res == [] and pending == []
    assert failed == {"regenerated-n3000-s": "DATA_SHORT: data.num_conversations=3000 asked"}


def test_no_point_starts_after_a_termination_signal(monkeypatch):
    """Ctrl-C or SIGTERM during a point: that point may catch the interrupt as its own failure,
    but the sweep starts no further point."""
    import pytest

    from flows import stopping

    pipe = _Pipeline()
    inner = pipe.with_options

    def with_options(flow_run_name):
        run = inner(flow_run_name)

        def signalled(**kw):
            stopping._STOP.set()  # what SignalRecord's reader does when a signal arrives
            return run(**kw)

        return signalled

    pipe.with_options = with_options
    monkeypatch.setattr(S, "eagle3_pipeline", pipe)
    monkeypatch.setattr(S, "_point_overrides", lambda *a: [])
    monkeypatch.setattr(S, "point_result", lambda summary, d, size, s: {"point": "x"})
    monkeypatch.setattr(S, "tag_point", lambda *a: None)
    cfg = SimpleNamespace(name="c", run_dir=lambda: __import__("pathlib").Path("/nonexistent"))
    todo = [["regenerated", 3000, "a"], ["regenerated", 3000, "b"]]
    try:
        with pytest.raises(KeyboardInterrupt, match="regenerated-n3000-b and the points after"):
            S._run_points(cfg, "c.yaml", [], todo, {"a": [], "b": []}, {"regenerated": []},
                          "parent", None)
        assert pipe.started == ["regenerated-n3000-a"]
    finally:
        stopping._STOP.clear()
    assert not stopping.stop_requested()


def test_a_signal_seen_by_an_earlier_record_does_not_stop_a_later_run():
    """The stop flag belongs to the installed record: a record that saw a signal and was then
    uninstalled (its run ended) leaves no flag for the next run in the same process."""
    import os
    import signal

    from flows import stopping

    record = stopping.SignalRecord(grace_s=600)
    assert record.install()
    previous = signal.signal(signal.SIGHUP, lambda *_: None)  # a Python handler: the byte is sent
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        end = time.monotonic() + 10  # the reader thread takes the byte when it is scheduled
        while not record.received() and time.monotonic() < end:
            time.sleep(0.05)
        assert record.received() == [signal.SIGHUP]
        assert stopping.stop_requested()
    finally:
        record.uninstall()
        signal.signal(signal.SIGHUP, previous)
    assert not stopping.stop_requested()
