"""The readiness gate keeps a deadline shorter than its per-check health timeout (each check waits
at most the time left before the nearest deadline), and a timed-out wait says what the health
checks met: a port that accepted connections and never answered, a server that answered 503, or
a refused connection, each named differently."""

from __future__ import annotations

import re
import socket
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from tests.unit.test_readiness_not_answering import _silent_server


def _closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _status_server(status: int):
    """A loopback HTTP server that answers every GET with ``status``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the name http.server calls
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):  # keep the test output quiet
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=2)


def test_a_stall_timeout_shorter_than_the_health_check_timeout_is_kept():
    # the default poll interval gives each health check up to 5 s; a 2 s stall timeout must not
    # wait for that check to run out
    from eagle3.serve.readiness import wait_ready

    with _silent_server() as url:
        t0 = time.monotonic()
        result = wait_ready(url, timeout_s=60, stall_timeout_s=2, use_gpu=False)
        took = time.monotonic() - t0
    assert result.verdict == "stalled", result.detail
    assert 2 <= took < 4, took
    assert result.detail.startswith(f"Not answering: {url} accepted connections")
    assert "each check waited up to 2.0 s" in result.detail


def test_an_overall_timeout_shorter_than_the_health_check_timeout_names_a_silent_port():
    from eagle3.serve.readiness import wait_ready

    with _silent_server() as url:
        t0 = time.monotonic()
        result = wait_ready(url, timeout_s=2, stall_timeout_s=100, use_gpu=False)
        took = time.monotonic() - t0
    assert result.verdict == "timed_out", result.detail
    assert 2 <= took < 4, took
    assert result.last_health == "timeout"
    # the seconds measured: 2.0 and a little more on a loaded machine
    assert re.search(
        rf"Not answering: {re.escape(url)} accepted connections but gave no HTTP answer within "
        r"2\.\d s to 1 health checks of /health_generate", result.detail), result.detail
    assert "Connection refused" not in result.detail


def test_a_timed_out_wait_with_a_log_names_a_silent_port(tmp_path):
    # with a log to watch, a silent port never ends the wait as stalled; the timed-out verdict
    # still says the port accepted connections and never answered
    from eagle3.serve.readiness import wait_ready

    log = tmp_path / "server.log"
    log.write_text("start\n")
    with _silent_server() as url:
        result = wait_ready(
            url,
            log_path=log,
            timeout_s=2.5,
            stall_timeout_s=100,
            poll_interval_s=0.2,
            use_gpu=False,
        )
    assert result.verdict == "timed_out", result.detail
    assert f"Not answering: {url} accepted connections but gave no HTTP answer" in result.detail


def test_a_timed_out_wait_on_a_503_server_names_the_answer_not_a_silent_port():
    from eagle3.serve.readiness import wait_ready

    with _status_server(503) as url:
        result = wait_ready(
            url, timeout_s=1.5, stall_timeout_s=100, poll_interval_s=0.2, use_gpu=False
        )
    assert result.verdict == "timed_out", result.detail
    assert result.last_health == 503
    assert (
        f"The last health check of {url}/health_generate answered HTTP 503 (the server is up, "
        "not ready yet)."
    ) in result.detail
    assert "Not answering" not in result.detail and "Connection refused" not in result.detail


def test_a_timed_out_wait_on_a_closed_port_says_refused_not_silent():
    from eagle3.serve.readiness import wait_ready

    url = f"http://127.0.0.1:{_closed_port()}"
    result = wait_ready(url, timeout_s=1, stall_timeout_s=100, poll_interval_s=0.2, use_gpu=False)
    assert result.verdict == "timed_out", result.detail
    assert f"Connection refused at {url}: every one of" in result.detail
    assert "Not answering" not in result.detail and "answered HTTP" not in result.detail


def test_cli_wait_ready_keeps_a_short_timeout_and_names_a_silent_port():
    from cli.main import app

    with _silent_server() as url:
        t0 = time.monotonic()
        out = CliRunner().invoke(app, ["wait-ready", "--url", url, "--timeout", "2"])
        took = time.monotonic() - t0
    assert took < 4, took
    assert out.exit_code == 1, out.output
    assert "TIMED_OUT after" in out.output
    assert "accepted connections but gave no HTTP answer" in out.output


def test_a_connect_timeout_is_named_apart_from_a_silent_port(monkeypatch):
    # a host that drops connection attempts never accepted one: the note must not say it did
    import httpx

    from eagle3.serve import readiness

    def drop(self, request):
        raise httpx.ConnectTimeout("timed out", request=request)

    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", drop)
    assert readiness.http_status("http://127.0.0.1:9/health", 0.5) == "connect timeout"
    st = {"last_health": "connect timeout", "health_path": "/health", "silent": 3}
    note = readiness._health_note("http://127.0.0.1:9", st, 0.0, "")
    assert "did not accept a connection (connect timeout" in note, note
    assert "accepted connections but" not in note


def test_work_under_a_watchdog_hands_back_its_result_and_its_own_error():
    import os

    from eagle3.serve.watchdog import Watchdog

    with Watchdog("http://127.0.0.1:9", pid=os.getpid(), stall_timeout_s=60,
                  check_interval_s=0.05, use_gpu=False) as wd:
        assert wd.call(lambda a, b=0: a + b, 2, b=3) == 5

        def fails():
            raise KeyError("the work's own")

        with pytest.raises(KeyError, match="the work's own"):
            wd.call(fails)
