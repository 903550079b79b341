"""The launcher with real subprocesses: own process group, log file, teardown with terminate→kill
that leaves nothing in the process table, ``launch_ready``'s GateFailed and its one retry after a
CUDA-graph crash."""

from __future__ import annotations

import json
import os
import re
import time

import psutil
import pytest

from eagle3.serve.launcher import build_command, launch_engine, launch_ready
from eagle3.errors import GateFailed
from tests.support.fake_servers import fake_argv, leftovers

pytestmark = pytest.mark.timeout(60)


def _alive(pid: int) -> bool:
    """In the process table and not a zombie (an orphaned zombie waits for init, which may be slow
    to reap)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_children(eng, n: int, timeout_s: float = 30.0) -> list[int]:
    """Pids of the ``n`` children of the fake server once each has logged that it started (signal
    handlers installed). Bounded wait, shorter than the test's timeout so that a failure shows the
    log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        started = [
            int(pid) for pid in re.findall(r"\] child (\d+) started", eng.log_path.read_text())
        ]
        if len(started) >= n:
            return started
        time.sleep(0.1)
    raise AssertionError(
        f"{eng.pid} did not log {n} started children within {timeout_s} s; log:\n"
        f"{eng.log_path.read_text()[-3000:]}"
    )


FAST_GATE = [
    "serve.startup_timeout_s=20",
    "serve.stall_timeout_s=2",
    "serve.poll_interval_s=0.25",
    "serve.probe_timeout_s=8",
    "serve.stop_grace_s=1",
]


@pytest.fixture
def cfg(tmp_path):
    from eagle3.config import load_config

    return load_config(None, [f"paths.runs_dir={tmp_path / 'runs'}", *FAST_GATE])


def fake_builder(behaviour: str, *extra: str):
    """A command builder that keeps the real SGLang flags of ``build_command`` behind a fake
    server's argv."""

    def build(cfg, target_dir, draft_dir, port):
        argv, env = build_command(cfg, target_dir, draft_dir, port, engine="sglang")
        return fake_argv(behaviour, port, *extra, *argv[3:]), env

    return build


def test_launch_engine_own_group_log_and_clean_teardown(cfg, tmp_path):
    cfg.serve.env = {"EAGLE3_TEST_MARK": "xyz"}
    with launch_engine(
        cfg,
        tmp_path / "target",
        tmp_path / "draft",
        tmp_path / "logs",
        command_builder=fake_builder("slow_warmup", "--warm-s", "0.5", "--children", "2"),
    ) as eng:
        assert eng.url == f"http://127.0.0.1:{eng.port}" and eng.port > 0
        assert os.getpgid(eng.pid) == eng.pid != os.getpgid(0)  # its own process group
        kids = _wait_children(eng, 2)
        assert all(os.getpgid(k) == eng.pid for k in kids)
        assert psutil.Process(eng.pid).environ()["EAGLE3_TEST_MARK"] == "xyz"
        record = json.loads(eng.log_path.with_name(eng.log_path.stem + ".command.json").read_text())
        assert record["pid"] == eng.pid and "--speculative-algorithm" in record["argv"]
    assert eng.returncode == -15  # ended by SIGTERM, not killed
    assert "server_args" in eng.log_path.read_text()
    assert leftovers(eng.port) == [] and not any(_alive(k) for k in kids)


def test_teardown_kills_what_ignores_sigterm_and_left_the_group(cfg, tmp_path):
    builder = fake_builder(
        "hang_after_load", "--children", "2", "--child-ignores-term", "--child-setsid"
    )
    eng = launch_engine(cfg, tmp_path / "t", None, tmp_path, command_builder=builder)
    kids = _wait_children(eng, 2)
    assert all(os.getpgid(k) != eng.pid for k in kids)  # they left the group (setsid)
    t0 = time.monotonic()
    report = eng.stop()
    assert sorted(report["killed"]) == sorted(
        kids
    )  # SIGTERM ignored → SIGKILL after the grace period
    assert 1.0 <= time.monotonic() - t0 < 5.0
    assert leftovers(eng.port) == []
    assert eng.stop() is report  # idempotent


def test_teardown_on_exception_inside_the_with_block(cfg, tmp_path):
    with pytest.raises(RuntimeError, match="benchmark blew up"):
        with launch_engine(
            cfg,
            tmp_path / "t",
            None,
            tmp_path,
            command_builder=fake_builder("ready_then_hang", "--children", "1"),
        ) as eng:
            raise RuntimeError("benchmark blew up")
    assert eng.returncode is not None and leftovers(eng.port) == []


def test_launch_ready_retries_once_without_cuda_graphs(cfg, tmp_path):
    cfg.serve.engine = "sglang"
    cfg.serve.retry_without_cuda_graph = True
    with launch_ready(
        cfg,
        tmp_path / "t",
        tmp_path / "d",
        tmp_path / "deploy",
        use_gpu=False,
        command_builder=fake_builder("cuda_graph_crash", "--warm-s", "0.5"),
    ) as (eng, gate):
        assert gate.verdict == "ready" and "--disable-cuda-graph" in eng.argv
    attempts = json.loads((tmp_path / "deploy" / "attempts.json").read_text())
    assert [a["verdict"] for a in attempts] == ["crashed", "ready"]
    assert (
        attempts[0]["retry"] == "cuda_graph" and "--disable-cuda-graph" not in attempts[0]["argv"]
    )
    assert "Capture cuda graph failed" in (tmp_path / "deploy" / "engine-sglang.log").read_text()
    assert leftovers(eng.port) == []


def test_launch_ready_without_retry_raises_gate_failed(cfg, tmp_path):
    cfg.serve.engine = "sglang"
    with pytest.raises(GateFailed) as ei:
        with launch_ready(
            cfg,
            tmp_path / "t",
            tmp_path / "d",
            tmp_path / "deploy",
            use_gpu=False,
            command_builder=fake_builder("cuda_graph_crash"),
        ):
            pytest.fail("a crashed engine must not be yielded")
    assert ei.value.verdict == "crashed" and "Capture cuda graph failed" in str(ei.value)
    assert len(json.loads((tmp_path / "deploy" / "attempts.json").read_text())) == 1


def test_launch_ready_stalled_engine_is_ended_with_diagnostics(cfg, tmp_path):
    cfg.serve.engine = "sglang"
    with pytest.raises(GateFailed) as ei:
        with launch_ready(
            cfg,
            tmp_path / "t",
            tmp_path / "d",
            tmp_path / "deploy",
            use_gpu=False,
            command_builder=fake_builder("hang_after_load", "--children", "1"),
        ):
            pytest.fail("a stalled engine must not be yielded")
    assert ei.value.verdict == "stalled"
    diag = tmp_path / "deploy" / "diagnostics"
    assert ei.value.diagnostics_dir == str(diag) and len(list(diag.glob("pyspy-*.txt"))) == 2
    argv = json.loads((tmp_path / "deploy" / "attempts.json").read_text())[0]["argv"]
    assert leftovers(int(argv[argv.index("--port") + 1])) == []


def test_watchdog_fails_a_benchmark_whose_server_stops_answering(cfg, tmp_path):
    import httpx

    from eagle3.serve.watchdog import Watchdog

    with launch_ready(
        cfg.model_copy(update={"serve": cfg.serve.model_copy(update={"engine": "sglang"})}),
        tmp_path / "t",
        tmp_path / "d",
        tmp_path / "deploy",
        use_gpu=False,
        command_builder=fake_builder("ready_then_hang", "--hang-after-s", "1.0"),
    ) as (eng, _):

        def bench(on_request_done):
            done = 0
            for _ in range(1000):  # bounded; the server stops answering after ~1 s
                body = {"text": "hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
                httpx.post(
                    eng.url + "/generate", json=body, timeout=60, trust_env=False
                ).raise_for_status()
                done += 1
                on_request_done()
                time.sleep(0.05)
            return done

        t0 = time.monotonic()
        with pytest.raises(GateFailed) as ei:
            with Watchdog(
                eng.url,
                pid=eng.pid,
                log_path=eng.log_path,
                stall_timeout_s=2.0,
                check_interval_s=0.25,
                diagnostics_dir=tmp_path / "watchdog",
                use_gpu=False,
            ) as wd:
                wd.call(bench, on_request_done=wd.beat)
        assert ei.value.verdict == "stalled" and wd.beats >= 3
        assert (
            time.monotonic() - t0 < 1.0 + 2.0 + 2 * 0.25 + 2.0
        )  # hang + stall + polls + diagnostics
        assert (tmp_path / "watchdog" / f"pyspy-{eng.pid}.txt").exists()
    assert leftovers(eng.port) == []
