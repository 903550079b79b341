"""The status files of multi-process jobs and the deadlines the parent holds them to
(eagle3.workers), without starting any process; the processes themselves: test_train_ranks.py,
test_extract_workers.py."""

import json
import os
import subprocess
import sys
import time

import pytest

from eagle3.workers import Deadlines, WorkerStatus, describe, end_processes, overdue, read_statuses

D = Deadlines(startup_s=30, first_step_s=60, stall_s=90)
T0 = 1_000_000.0


def st(phase, t, step=None, pid=10, ready_time=None):
    return {"phase": phase, "time": t, "step": step, "pid": pid, "ready_time": ready_time}


def test_a_rank_missing_at_the_rendezvous_is_named_only_after_the_startup_deadline():
    s = {0: st("arriving", T0 + 5), 1: st("started", T0 + 4)}
    assert overdue(s, launched_at=T0, now=T0 + 29, deadlines=D) is None
    od = overdue(s, launched_at=T0, now=T0 + 31, deadlines=D)
    assert (od.kind, od.workers, od.deadline_s, od.key) == (
        "not_arrived",
        [1],
        30,
        "startup_timeout_s",
    )
    # no status file at all: the process never ran its first line
    od = overdue({0: st("arriving", T0 + 5), 1: None}, launched_at=T0, now=T0 + 31, deadlines=D)
    assert od.workers == [1]
    # every rank at the rendezvous and still no group: all of them are named
    od = overdue(
        {0: st("arriving", T0 + 5), 1: st("arriving", T0 + 6)},
        launched_at=T0,
        now=T0 + 31,
        deadlines=D,
    )
    assert od.workers == [0, 1]


def test_first_step_deadline_counts_from_last_rank_ready_then_stalls_from_last_progress():
    ready = {
        0: st("ready", T0 + 10, ready_time=T0 + 10),
        1: st("ready", T0 + 20, ready_time=T0 + 20),
    }
    assert (
        overdue(ready, launched_at=T0, now=T0 + 79, deadlines=D) is None
    )  # 59 s after the last ready
    od = overdue(ready, launched_at=T0, now=T0 + 81, deadlines=D)
    assert (od.kind, od.workers, od.key) == ("no_first_step", [0, 1], "first_step_timeout_s")
    one = {
        0: st("step", T0 + 70, step=1, ready_time=T0 + 10),
        1: st("ready", T0 + 20, ready_time=T0 + 20),
    }
    assert overdue(one, launched_at=T0, now=T0 + 81, deadlines=D).workers == [1]
    going = {0: st("step", T0 + 200, step=9), 1: st("step", T0 + 150, step=9)}
    assert overdue(going, launched_at=T0, now=T0 + 239, deadlines=D) is None
    od = overdue(going, launched_at=T0, now=T0 + 241, deadlines=D)
    assert (od.kind, od.workers, od.key, round(od.waited_s)) == (
        "stalled",
        [1],
        "stall_timeout_s",
        91,
    )
    # a finished or failed rank is never overdue: the parent reads its exit instead
    assert (
        overdue(
            {0: st("done", T0), 1: st("failed", T0)}, launched_at=T0, now=T0 + 10_000, deadlines=D
        )
        is None
    )


def test_the_message_names_ranks_deadline_key_expected_actual_last_status_and_logs(tmp_path):
    s = {0: st("arriving", T0 + 5, pid=11), 1: st("started", T0 + 4, pid=12)}
    od = overdue(s, launched_at=T0, now=T0 + 31, deadlines=D)
    msg = describe(
        od,
        section="train",
        noun="rank",
        total=2,
        now=T0 + 31,
        logs={0: [tmp_path / "0.log"], 1: []},
        stacks={1: tmp_path / "rank-1.stack.txt"},
    )
    assert msg.startswith(
        "rank 1 of 2 did not arrive (ready) within train.startup_timeout_s=30 s (waited 31 s)"
    )
    assert "expected all 2 ready, got 1 of 2" in msg
    assert (
        "rank 0: waiting at the rendezvous (26 s ago, pid 11)" in msg
        and "rank 1: started (27 s ago, pid 12)" in msg
    )
    assert f"rank 0: {tmp_path / '0.log'}" in msg and "rank 1: no log file" in msg
    assert f"Stacks: rank 1: {tmp_path / 'rank-1.stack.txt'}" in msg


def test_status_writes_are_atomic_throttled_and_read_back(tmp_path):
    w = WorkerStatus(tmp_path, 3, min_interval_s=60)
    w.mark("ready", device="cpu")
    first = json.loads((tmp_path / "rank-3.json").read_text())
    assert first["phase"] == "ready" and first["pid"] == os.getpid() and first["ready_time"] > 0
    w.progress(1)  # the first step is written at once
    assert json.loads((tmp_path / "rank-3.json").read_text())["step"] == 1
    w.progress(2)  # within min_interval_s: not written
    assert json.loads((tmp_path / "rank-3.json").read_text())["step"] == 1
    w.failed(ValueError("boom"))
    got = read_statuses(tmp_path, 5)
    assert (
        got[3]["phase"] == "failed"
        and got[3]["error_type"] == "ValueError"
        and got[3]["message"] == "boom"
    )
    assert got[0] is None and not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(ValueError, match="expected one of"):
        w.mark("running")


def test_end_processes_reaches_children_in_sessions_of_their_own():
    """torchrun starts each rank in a new session: ending torchrun's group alone would orphan
    them."""
    code = (
        "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(60)'], start_new_session=True); print(c.pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child = int(parent.stdout.readline())
    t0 = time.monotonic()
    end_processes(parent, [child], grace_s=5)
    assert parent.poll() is not None and time.monotonic() - t0 < 10
    import psutil

    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
