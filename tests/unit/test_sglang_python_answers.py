"""What the SGLang-environment probe says of interpreters that are not Pythons or never answer."""

from __future__ import annotations

import os
import time

import psutil

from eagle3.engines.sglang import environment


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_a_program_that_is_no_python_is_named_so(tmp_path):
    silent = _script(tmp_path, "silent", "exit 0")
    failing = _script(tmp_path, "failing", "exit 3")
    assert "not a Python 3 interpreter" in environment.sglang_unusable_reason(silent)
    why = environment.sglang_unusable_reason(failing)
    assert "not a Python 3 interpreter" in why and "exit code 3" in why


def test_a_program_that_never_answers_is_ended_with_its_children(tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "ANSWER_TIMEOUT_S", 1)
    pidfile = tmp_path / "child.pid"
    hang = _script(tmp_path, "hang", f"sleep 300 & echo $! > {pidfile}; wait")
    t0 = time.monotonic()
    why = environment.sglang_unusable_reason(hang)
    assert "did not answer within 1 s" in why
    assert time.monotonic() - t0 < 20
    child = int(pidfile.read_text())
    for _ in range(50):
        if not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie":
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        raise AssertionError(f"the probe's child {child} was left running")
