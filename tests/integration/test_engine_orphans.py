"""Every engine the launcher starts ends within seconds of its parent's death, whatever killed the
parent (failure class 25): a parent process starts an engine through ``start_engine`` (a fake
multi-process server whose children ignore SIGTERM, one of them outside the group, like SGLang's
scheduler/detokenizer), the test kills the parent with SIGKILL or SIGTERM (a Python process without
a handler: ``atexit`` never runs), and checks that the engine's group and every child are gone. The
fakes live 300 s by themselves, so "gone" is the watch's doing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.conftest import REPO

PARENT = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from tests.support.fake_servers import fake_argv
    from eagle3.serve.launcher import start_engine
    from eagle3.procs import free_port
    port = free_port()
    extra = ["--children", "2", "--child-ignores-term", "--max-life", "300"] + sys.argv[3:]
    eng = start_engine(fake_argv("hang_after_load", port, *extra), {"PYTHONUNBUFFERED": "1"},
                       host="127.0.0.1", port=port, log_path=sys.argv[2], engine="fake",
                       grace_s=1.0)
    print(json.dumps({"pid": eng.pid, "port": port}), flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _children_logged(log, n: int, timeout_s: float = 30.0) -> list[int]:
    import re

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [
            int(p)
            for p in re.findall(r"\] child (\d+) started", log.read_text() if log.exists() else "")
        ]
        if len(found) >= n:
            return found
        time.sleep(0.1)
    raise AssertionError(f"children did not start; log:\n{log.read_text() if log.exists() else ''}")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("setsid", [False, True], ids=["children-in-group", "children-left-group"])
def test_engine_group_ends_within_seconds_of_its_parents_death(tmp_path, sig, setsid):
    log = tmp_path / "engine.log"
    extra = ["--child-setsid"] if setsid else []
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(REPO), str(log), *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        info = json.loads(parent.stdout.readline())
        engine = info["pid"]
        kids = _children_logged(log, 2)
        time.sleep(1.5)  # the watch has recorded the tree by now (it snapshots every second)
        tree = [engine, *kids]
        assert all(_alive(p) for p in tree)  # running, so the test can fail
        assert os.getpgid(engine) == engine and (
            all(os.getpgid(k) != engine for k in kids)
            if setsid
            else all(os.getpgid(k) == engine for k in kids)
        )
        t0 = time.monotonic()
        parent.send_signal(sig)
        parent.wait(timeout=10)
        assert parent.returncode == -sig  # died by the signal: no atexit ran
        while any(_alive(p) for p in tree) and time.monotonic() - t0 < 15:
            time.sleep(0.1)
        gone_after = time.monotonic() - t0
        assert not any(_alive(p) for p in tree), (
            f"still alive {gone_after:.1f} s after the parent's death: "
            f"{[p for p in tree if _alive(p)]}"
        )
        assert (
            gone_after < 5.0
        )  # poll 0.2 s + SIGTERM + 1 s grace + SIGKILL for the children that ignore SIGTERM
        assert "launcher" in log.read_text() and "is gone: ending engine group" in log.read_text()
    finally:
        if parent.poll() is None:
            parent.kill()
        for p in psutil.process_iter(
            ["pid", "cmdline"]
        ):  # never leave a fake behind, whatever failed
            cmd = " ".join(p.info["cmdline"] or [])
            if "fake_servers.py" in cmd and str(info.get("port") if "info" in dir() else "") in cmd:
                try:
                    p.kill()
                except psutil.Error:
                    pass


def test_engine_still_ends_with_a_live_parent_and_its_watch_follows(tmp_path):
    """The normal stop is unchanged (the launcher ends the group) and the watch exits with the
    engine."""
    from tests.support.fake_servers import start_fake

    with start_fake("hang_after_load", tmp_path, "--children", "1") as eng:
        time.sleep(0.5)
        watchers = [
            p
            for p in psutil.process_iter(["pid", "cmdline"])
            if "--watch" in (p.info["cmdline"] or []) and str(eng.pid) in (p.info["cmdline"] or [])
        ]
        assert len(watchers) == 1 and watchers[0].pid not in [
            c.pid for c in psutil.Process(eng.pid).children(True)
        ]
        assert (
            os.getpgid(watchers[0].pid) != eng.pid
        )  # outside the engine's group: group signals never hit it
    assert eng.returncode == -signal.SIGTERM
    deadline = time.monotonic() + 5
    while (
        watchers[0].is_running()
        and watchers[0].status() != psutil.STATUS_ZOMBIE
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not watchers[0].is_running() or watchers[0].status() == psutil.STATUS_ZOMBIE
