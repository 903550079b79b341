"""``eagle3 doctor``: one line per check; a configured but unreachable server is a FAIL."""

from __future__ import annotations

import socket

from eagle3.doctor import run_doctor


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_doctor_reports_each_check_and_fails_on_a_configured_dead_server(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_closed_port()}")
    lines: list[str] = []
    ok = run_doctor(echo=lines.append)
    text = "\n".join(lines)
    assert not ok
    assert any(ln.startswith("FAIL") and "MLflow server configured by MLFLOW_TRACKING_URI" in ln for ln in lines)
    assert "torch " in text and "SGLang" in text and "GiB free" in text
    assert any("Prefect" in ln and ln.startswith("OK") for ln in lines)  # not configured: ephemeral API


def test_doctor_passes_with_a_local_store(monkeypatch, tmp_path):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    lines: list[str] = []
    assert run_doctor(echo=lines.append), "\n".join(lines)
    assert any("a local store, no server needed" in ln for ln in lines)
