"""The readiness gate against real subprocess servers imitating each start-up behaviour
(tests/support/ fake_servers.py). Each verdict must come within stall_timeout + two poll intervals
of the last progress, with diagnostics saved and no process of the server's tree left in the process
table afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest

from eagle3.serve.readiness import wait_ready
from tests.support.fake_servers import leftovers, start_fake

STALL, POLL = 2.0, 0.25
GATE = dict(
    timeout_s=20.0, stall_timeout_s=STALL, poll_interval_s=POLL, probe_timeout_s=8.0, use_gpu=False
)
SLACK_S = 0.5  # scheduling jitter of a loaded 2-core machine

pytestmark = pytest.mark.timeout(60)


def _gate(server, tmp_path, name="diag", **kw):
    return wait_ready(
        server.url,
        pid=server.pid,
        log_path=server.log_path,
        diagnostics_dir=tmp_path / name,
        **{**GATE, **kw},
    )


def _assert_all_gone(server):
    """The process table holds nothing of the server's tree (root, children, orphans) after
    teardown."""
    tree = set(server.stop_report["pids"]) if server.stop_report else set()
    server.stop()
    assert server.returncode is not None
    assert leftovers(server.port) == [], f"processes left behind: {leftovers(server.port)}"
    alive = [
        p
        for p in tree
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert alive == []


def _assert_within_stall_bound(res):
    # both times are rounded to the millisecond: their difference may fall 1 ms short of STALL
    silent_for = res.elapsed_s - res.last_progress_s
    assert STALL - 1e-3 <= silent_for <= STALL + 2 * POLL + SLACK_S, res.summary()


def test_slow_warmup_with_growing_log_is_ready(tmp_path):
    with start_fake(
        "slow_warmup", tmp_path, "--warm-s", "3.5", "--progress", "log", "--children", "1"
    ) as srv:
        res = _gate(srv, tmp_path)
        assert res.verdict == "ready", res.summary()
        assert res.phases["warming"] > STALL  # 503 for longer than stall_timeout was not a failure
        assert list(res.phases)[:2] == ["launching", "loading"] or list(res.phases)[0] == "loading"
        assert "probing" in res.phases and res.signals["log"] > 0
        assert len(res.probe) == 2 and all(
            p["tokens"] == 4 and p["spec"]["spec_verify_ct"] >= 1 for p in res.probe
        )
        assert json.loads((tmp_path / "diag" / "gate.json").read_text())["verdict"] == "ready"
        assert not (tmp_path / "diag" / "index.json").exists()  # no diagnostics for a ready server
        m = res.metrics()
        assert m["gate_ready"] == 1.0 and m["gate_warming_s"] == res.phases["warming"]
    _assert_all_gone(srv)


def test_slow_warmup_with_cpu_only_progress_is_ready(tmp_path):
    """Silent log while warming (only the gate's own access-log lines), CPU busy: still ready."""
    with start_fake("slow_warmup", tmp_path, "--warm-s", "3.0", "--progress", "cpu") as srv:
        res = _gate(srv, tmp_path)
        assert res.verdict == "ready", res.summary()
        assert res.phases["warming"] > STALL and res.signals["cpu"] > 0
    _assert_all_gone(srv)


def test_hang_after_loading_is_stalled_with_diagnostics(tmp_path):
    with start_fake("hang_after_load", tmp_path, "--children", "2", "--child-ignores-term") as srv:
        res = _gate(srv, tmp_path)
        assert res.verdict == "stalled", res.summary()
        _assert_within_stall_bound(res)
        assert res.phases["warming"] >= STALL - POLL
        diag = tmp_path / "diag"
        index = json.loads((diag / "index.json").read_text())
        assert len(index["pyspy"]) == 3  # the server and both children
        root_dump = (diag / f"pyspy-{srv.pid}.txt").read_text()
        assert "_block_forever" in root_dump  # where the main thread hangs
        assert "Load weight end" in (diag / "tail-hang_after_load.log.txt").read_text()
        assert "stalled" in res.summary().lower() and str(diag) in res.summary()
    _assert_all_gone(srv)
    assert len(srv.stop_report["killed"]) == 2  # the children ignored SIGTERM and had to be killed


def test_crash_during_startup_is_crashed_with_exit_code_and_log_tail(tmp_path):
    with start_fake(
        "crash_startup", tmp_path, "--exit-code", "3", "--children", "1", "--child-ignores-term"
    ) as srv:
        res = _gate(srv, tmp_path)
        assert res.verdict == "crashed", res.summary()
        assert res.exit_code == 3
        assert "RuntimeError: Weight lm_head.weight" in res.log_tail
        assert res.elapsed_s <= 0.6 + 1.5 + 2 * POLL + SLACK_S  # load time + interpreter start-up
        assert (tmp_path / "diag" / "index.json").exists()
    _assert_all_gone(
        srv
    )  # the orphaned child (parent died) was found by its process group and killed


def test_health_green_while_generation_hangs_is_not_ready(tmp_path):
    with start_fake("health_ok_generate_hangs", tmp_path) as srv:
        assert _wait_http(srv.url + "/health") == 200
        res = _gate(srv, tmp_path)
        assert res.verdict in ("stalled", "timed_out"), res.summary()
        assert "probing" in res.phases and res.phases["probing"] >= STALL - POLL
        _assert_within_stall_bound(res)
    _assert_all_gone(srv)


def test_never_binding_the_port_is_stalled(tmp_path):
    with start_fake("never_bind", tmp_path) as srv:
        res = _gate(srv, tmp_path)
        assert res.verdict in ("stalled", "timed_out"), res.summary()
        assert "warming" not in res.phases and "probing" not in res.phases
        _assert_within_stall_bound(res)
        assert (tmp_path / "diag" / f"pyspy-{srv.pid}.txt").exists()
    _assert_all_gone(srv)


def test_deadline_gives_timed_out_while_progress_continues(tmp_path):
    with start_fake("slow_warmup", tmp_path, "--warm-s", "20", "--progress", "log") as srv:
        res = _gate(srv, tmp_path, timeout_s=3.0)
        assert res.verdict == "timed_out", res.summary()
        assert 3.0 <= res.elapsed_s <= 3.0 + 2 * POLL + SLACK_S
    _assert_all_gone(srv)


def test_server_without_speculative_fields_fails_the_probe(tmp_path):
    with start_fake("no_spec", tmp_path) as srv:
        res = _gate(srv, tmp_path)
        assert res.verdict == "probe_failed" and "not speculating" in res.detail
        assert _gate(srv, tmp_path, name="diag2", require_spec_fields=False).verdict == "ready"
    _assert_all_gone(srv)


def _wait_http(url: str, timeout_s: float = 10.0) -> int | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return httpx.get(url, timeout=1.0, trust_env=False).status_code
        except httpx.HTTPError:
            time.sleep(0.1)
    return None


def _grep_ok_check(url: str) -> bool:
    """The check from the story: fetch the health endpoint, grep the body for "ok"."""
    try:
        r = httpx.get(url + "/health", timeout=1.0, trust_env=False)
    except httpx.HTTPError:
        return False
    return "ok" in r.text.lower()


def test_story_hung_server_and_warming_server_are_told_apart(tmp_path):
    """Story, part 1: a silent server (weights loaded, answers 503, log not growing, processes
    sleeping). Part 2: a server that answers 503 while it warms up (log growing). A grep-for-"ok"
    check calls both hung; the gate stalls the first and waits the second through to ready — run
    side by side."""
    hung = start_fake("hang_after_load", tmp_path / "hung", "--children", "1")
    warm = start_fake(
        "slow_warmup", tmp_path / "warm", "--warm-s", "4", "--progress", "log", "--children", "1"
    )
    with hung, warm:
        assert _wait_http(hung.url + "/health") == 503 and _wait_http(warm.url + "/health") == 503
        assert not _grep_ok_check(hung.url) and not _grep_ok_check(
            warm.url
        )  # the naive check: both "hung"
        results = {}
        threads = [
            threading.Thread(
                target=lambda n=n, s=s: results.__setitem__(n, _gate(s, tmp_path, name=n))
            )
            for n, s in (("hung", hung), ("warm", warm))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert results["hung"].verdict == "stalled", results["hung"].summary()
        assert results["warm"].verdict == "ready", results["warm"].summary()
        assert results["warm"].phases["warming"] > STALL
    _assert_all_gone(hung)
    _assert_all_gone(warm)


def test_wait_ready_command_end_to_end(tmp_path):
    """`eagle3 wait-ready` (the CLI) against a warming server (exit 0) and a crashing one (exit
    1)."""
    with start_fake("slow_warmup", tmp_path, "--warm-s", "2.5") as srv:
        cp = _cli(srv, tmp_path / "d1")
        assert cp.returncode == 0, cp.stdout + cp.stderr
        assert "READY" in cp.stdout and "warming" in cp.stdout
    with start_fake("crash_startup", tmp_path) as bad:
        cp = _cli(bad, tmp_path / "d2")
        assert cp.returncode == 1 and "CRASHED" in cp.stdout and "exited" in cp.stdout
    _assert_all_gone(srv)
    _assert_all_gone(bad)


def _cli(server, diag) -> subprocess.CompletedProcess:
    argv = [
        sys.executable,
        "-m",
        "cli.main",
        "wait-ready",
        "--url",
        server.url,
        "--pid",
        str(server.pid),
        "--log",
        str(server.log_path),
        "--stall-timeout",
        str(STALL),
        "--poll-interval",
        str(POLL),
        "--timeout",
        "20",
        "--probe-timeout",
        "8",
        "--diagnostics",
        str(diag),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=40)
