"""The readiness gate without a pid or log to watch: a port where nothing listens ends the wait
after ``stall_timeout_s`` (saying the connection was refused that long), not after ``timeout_s``."""

from __future__ import annotations

import socket
import time

from typer.testing import CliRunner


def _closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_only_wait_ends_after_the_stall_timeout():
    from eagle3.serve.readiness import wait_ready

    url = f"http://127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    result = wait_ready(url, timeout_s=60, stall_timeout_s=2, poll_interval_s=0.2, use_gpu=False)
    took = time.monotonic() - t0
    assert result.verdict == "stalled", result.detail
    assert 2 <= took < 10, took
    assert "Connection refused for " in result.detail and "stall_timeout_s=2" in result.detail
    assert f"Connection refused at {url}: every one of" in result.detail


def test_cli_wait_ready_honours_stall_timeout_when_every_probe_is_refused():
    from cli.main import app

    url = f"http://127.0.0.1:{_closed_port()}"
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
        ],
    )
    assert time.monotonic() - t0 < 15
    assert out.exit_code == 1, out.output
    assert "STALLED after" in out.output and "Connection refused for " in out.output
    assert "(stall_timeout_s=2.0)" in out.output


def test_a_log_still_waits_for_its_progress(tmp_path):
    # with a server log to watch, refusals alone do not end the wait at stall_timeout_s when the
    # log grows (a server loading weights binds its port late)
    import threading

    from eagle3.serve.readiness import wait_ready

    log = tmp_path / "server.log"
    log.write_text("start\n")
    stop = threading.Event()

    def grow():
        while not stop.wait(0.3):
            with log.open("a") as f:
                f.write("loading\n")

    threading.Thread(target=grow, daemon=True).start()
    try:
        result = wait_ready(
            f"http://127.0.0.1:{_closed_port()}",
            log_path=log,
            timeout_s=4,
            stall_timeout_s=1.5,
            poll_interval_s=0.2,
            use_gpu=False,
        )
    finally:
        stop.set()
    assert result.verdict == "timed_out", result.detail
