"""flows.common.run_concurrently: the pipeline serves the trained and the untrained draft
at once."""

import contextvars
import threading
import time

import pytest

pytest.importorskip("prefect")

from flows.common import run_concurrently  # noqa: E402

VAR = contextvars.ContextVar("VAR", default="unset")


def test_calls_overlap_see_the_callers_context_and_return_by_key():
    VAR.set("flow run context")
    started, both = (
        [],
        threading.Barrier(2, timeout=10),
    )  # each waits for the other: they must overlap

    def call(k):
        started.append(k)
        both.wait()
        return k, VAR.get(), threading.current_thread().name

    out = run_concurrently(
        {"trained": lambda: call("trained"), "untrained": lambda: call("untrained")}
    )
    assert list(out) == ["trained", "untrained"] and sorted(started) == ["trained", "untrained"]
    assert [v[:2] for v in out.values()] == [
        ("trained", "flow run context"),
        ("untrained", "flow run context"),
    ]
    assert all(v[2].startswith("eagle3-stage") for v in out.values())


def test_a_failure_is_raised_after_its_sibling_finished():
    done = []

    def fails():
        raise ValueError("stage deploy-bench failed: bad prompts file")

    def slow():
        time.sleep(0.5)
        done.append("untrained finished")
        return 1

    with pytest.raises(ValueError, match="bad prompts file"):
        run_concurrently({"trained": fails, "untrained": slow})
    assert done == [
        "untrained finished"
    ]  # nothing abandoned: its engine's teardown ran before the error


def test_one_call_runs_in_this_thread():
    assert run_concurrently({"trained": threading.current_thread}) == {
        "trained": threading.current_thread()
    }
