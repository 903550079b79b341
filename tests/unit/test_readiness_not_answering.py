"""The readiness gate without a pid or log to watch: a port that accepts connections but never
sends an HTTP answer ends the wait after ``stall_timeout_s`` as ``stalled`` ("Not answering"),
not after ``timeout_s`` as a server forever warming."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

from typer.testing import CliRunner


@contextmanager
def _silent_server(close_at_once: bool = False):
    """A loopback port that accepts every connection and never writes to it (or, with
    ``close_at_once``, closes it unanswered)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            if close_at_once:
                conn.close()
            else:
                held.append(conn)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(timeout=2)
        for c in held:
            c.close()
        srv.close()


def test_a_port_that_accepts_but_never_answers_ends_stalled_after_the_stall_timeout():
    from eagle3.serve.readiness import wait_ready

    with _silent_server() as url:
        t0 = time.monotonic()
        result = wait_ready(
            url,
            timeout_s=60,
            stall_timeout_s=2,
            poll_interval_s=0.2,
            probe_timeout_s=2,
            use_gpu=False,
        )
        took = time.monotonic() - t0
    assert result.verdict == "stalled", result.detail
    assert 2 <= took < 15, took
    assert result.detail.startswith(f"Not answering: {url} accepted connections")
    assert "stall_timeout_s=2" in result.detail and "last: timeout" in result.detail
    assert result.last_health == "timeout"


def test_a_port_that_drops_every_connection_unanswered_ends_stalled():
    from eagle3.serve.readiness import wait_ready

    with _silent_server(close_at_once=True) as url:
        t0 = time.monotonic()
        result = wait_ready(
            url, timeout_s=60, stall_timeout_s=1.5, poll_interval_s=0.2, use_gpu=False
        )
        took = time.monotonic() - t0
    assert result.verdict == "stalled", result.detail
    assert took < 15, took
    assert "Not answering: " in result.detail and "last: error: " in result.detail


def test_cli_wait_ready_ends_a_silent_server_with_a_named_outcome():
    from cli.main import app

    with _silent_server() as url:
        t0 = time.monotonic()
        out = CliRunner().invoke(
            app,
            [
                "wait-ready",
                "--url",
                url,
                "--stall-timeout",
                "2",
                "--timeout",
                "60",
                "--poll-interval",
                "0.2",
                "--probe-timeout",
                "2",
            ],
        )
        took = time.monotonic() - t0
    assert took < 20, took
    assert out.exit_code == 1, out.output
    assert "STALLED after" in out.output and "Not answering: " in out.output
