"""A killed ``eagle3 run`` leaves nothing behind: SIGTERM ends its children (the ephemeral Prefect
server).

Prefect's flow engine turns SIGTERM into an exception raised wherever the main thread is; one that
lands inside an import's module-lock callback is swallowed by CPython ("Exception ignored in ...
_get_module_lock"), and the run goes on. The test therefore signals while extraction is computing
(after the imports), and a second SIGTERM — what a supervisor such as Kubernetes or systemd sends
again before its SIGKILL — must always end the run.
"""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import CONFIGS, REPO


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, to_group, command",
    [(signal.SIGTERM, False, "run"), (signal.SIGTERM, True, "run"), (signal.SIGINT, True, "run"),
     (signal.SIGTERM, True, "sweep")],
    ids=["to-the-run", "to-its-process-group", "ctrl-c-to-its-process-group",
         "a-sweep-to-its-process-group"],
)
def test_sigterm_during_a_run_stops_every_child(tmp_path, sig, to_group, command,
                                                ephemeral_prefect):
    """SIGTERM to the run alone, or to its whole process group (a supervisor ending the group), or
    SIGINT to the group (a terminal's Ctrl-C): the ephemeral Prefect server then dies at the same
    moment, and the run must not hang draining logs to it (a Ctrl-C took 2 min 20 s before SIGINT
    started the deadline too). The deadline is ``EAGLE3_STOP_GRACE_S`` (default 30 s), 8 s here.
    ``python -m flows.sweep`` stops the same way (it once hung retrying its dead API server)."""
    entry = (["-m", "cli.main", "run"] if command == "run"
             else ["-m", "flows.sweep", "--size", "8"])
    cmd = [
        sys.executable,
        *entry,
        str(CONFIGS / "tiny-random.yaml"),
        "-o",
        f"paths.runs_dir={tmp_path / 'runs'}",
    ]
    log = open(tmp_path / "run.log", "w")
    # as from a terminal: a test runner started in the background (`cmd &`) passes SIGINT on as
    # ignored, and a Python started with SIGINT ignored keeps ignoring it
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "EAGLE3_STOP_GRACE_S": "8"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        children = []
        while time.monotonic() < deadline and proc.poll() is None:
            children = psutil.Process(proc.pid).children(recursive=True)
            if children and "extract:" in (tmp_path / "run.log").read_text():
                break
            time.sleep(0.5)
        assert children, (
            f"no child process seen; log:\n{(tmp_path / 'run.log').read_text()[-2000:]}"
        )
        if to_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        signalled = time.monotonic()
        # one Ctrl-C must do: the 8 s deadline ends the run (+ engine stops; 2 min 20 s before the
        # fix)
        try:
            rc = proc.wait(timeout=50 if sig == signal.SIGINT else 45)
        except subprocess.TimeoutExpired:
            if sig == signal.SIGINT:
                raise AssertionError(
                    f"still running 50 s after one Ctrl-C (deadline 8 s); log:\n"
                    f"{(tmp_path / 'run.log').read_text()[-1500:]}"
                ) from None
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=60)
        assert rc != 0, (
            f"exit code {rc} after SIGTERM; log:\n{(tmp_path / 'run.log').read_text()[-1500:]}"
        )
        text = (tmp_path / "run.log").read_text()
        if (
            "did not stop within" in text
        ):  # ended by the deadline: EAGLE3_STOP_GRACE_S's, not the default 30 s
            assert "did not stop within 8 s" in text and time.monotonic() - signalled >= 7.5, text[
                -1500:
            ]
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"left behind: {[(p.pid, p.cmdline()[:4]) for p in alive]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_a_lost_sigterm_interrupt_still_fails_the_run():
    """When the KeyboardInterrupt a SIGTERM raises is swallowed inside the run (CPython's
    module-lock callback, or an ``except`` in a library), or another handler (Prefect's flow engine
    installs its own) takes the signal, the run must still end as interrupted, not exit 0."""
    from flows import stopping as run

    record = run.SignalRecord()
    assert record.install()
    previous = signal.signal(
        signal.SIGTERM, lambda *_: None
    )  # a handler that swallows it, like Prefect's path
    try:
        run.raise_if_terminated(record)  # nothing received: no error
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handler runs at the next bytecode boundary
        with pytest.raises(
            KeyboardInterrupt, match=r"received SIGTERM during the run; the interrupt was lost"
        ):
            run.raise_if_terminated(record)
    finally:
        signal.signal(signal.SIGTERM, previous)
        record.uninstall()


def test_the_stop_grace_comes_from_its_environment_variable_and_is_checked():
    from flows import stopping as run
    from eagle3.errors import ConfigError

    assert run.stop_grace_s({}) == 30.0 and run.stop_grace_s({"EAGLE3_STOP_GRACE_S": " "}) == 30.0
    assert run.stop_grace_s({"EAGLE3_STOP_GRACE_S": "8"}) == 8.0
    assert run.stop_grace_s({"EAGLE3_STOP_GRACE_S": "2.5"}) == 2.5
    for bad in ("0", "-3", "abc", "nan", "inf", "7200"):
        with pytest.raises(
            ConfigError, match=rf"EAGLE3_STOP_GRACE_S='{bad}': expected seconds between 1 and 3600"
        ):
            run.stop_grace_s({"EAGLE3_STOP_GRACE_S": bad})


def test_terminate_as_interrupt_raises_keyboard_interrupt():
    from flows import stopping as run

    previous = run.terminate_as_interrupt()
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_the_deadline_exit_is_bounded_when_an_exit_handler_blocks(tmp_path):
    """Past the grace time the run ends even when an exit handler never returns (logging's flush to
    Prefect's API server that died with the process group hung a Ctrl-C'd run for over 75 s): the
    handlers get ``EXIT_HANDLERS_S``, children are ended, and the exit code is 128 + the signal."""
    script = tmp_path / "hang.py"
    script.write_text(
        "import atexit, signal, subprocess, sys, time\n"
        "from flows import stopping as run\n"
        "run.EXIT_HANDLERS_S = 1.0\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(child.pid, flush=True)\n"
        "atexit.register(time.sleep, 600)\n"
        "run._end_now(signal.SIGTERM, 0.0)\n"
    )
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    took = time.monotonic() - started
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert "exit handlers still running after 1 s" in proc.stderr
    assert took < 30, f"took {took:.1f} s"
    child_pid = int(proc.stdout.split()[0])
    assert (
        not psutil.pid_exists(child_pid)
        or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE
    )
