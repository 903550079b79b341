"""The hint appended to a failed flow's error: a retry command for transient failures only."""

from types import SimpleNamespace

import pytest

pytest.importorskip("prefect")

from eagle3.errors import DataError, GateFailed  # noqa: E402
from cli.run import _with_retry_hint  # noqa: E402


def _state(exc):
    return SimpleNamespace(
        result=lambda raise_on_failure=False: exc,
        name="Failed",
        message="boom",
        state_details=SimpleNamespace(flow_run_id="1234"),
    )


def test_permanent_error_gets_fix_advice_not_a_retry_command():
    exc = _with_retry_hint(
        _state(DataError("data/x.jsonl: empty file")), "pipeline", {"PREFECT_HOME": "/h"}
    )
    assert isinstance(exc, DataError)
    assert str(exc) == (
        "data/x.jsonl: empty file — fix what is named above, then re-run the same command "
        "(finished stages are cached)"
    )


def test_user_timeout_setting_gets_fix_advice_not_a_retry_command():
    from eagle3.errors import ConfigError
    from eagle3.measure.bench import _too_slow

    exc = _with_retry_hint(
        _state(_too_slow("http://127.0.0.1:1", 0.01, "ReadTimeout")), "pipeline", {}
    )
    assert isinstance(exc, ConfigError) and "retry" not in str(exc)
    assert "raise bench.request_timeout_s" in str(exc) and str(exc).endswith(
        "(finished stages are cached)"
    )


def test_gate_failure_gets_the_retry_command():
    exc = _with_retry_hint(
        _state(GateFailed("engine stalled", verdict="stalled", diagnostics_dir=None)), "train", {}
    )
    assert str(exc).startswith(
        "engine stalled — re-run the same command (cached stages are skipped) or retry this "
        "flow run: prefect flow-run retry 1234 --entrypoint flows/stages.py:train_flow"
    )


def test_stage_hint_repeats_the_users_overrides(tmp_path):
    """`eagle3 train` before `eagle3 extract`: the hint is the extract command with the same -o
    overrides."""
    from eagle3.errors import DataError
    from flows.common import finished_output
    from flows.stages import _command

    hint = _command(
        "extract", "configs/tiny-random.yaml", ["data.num_conversations=4", "name=my run"]
    )
    assert (
        hint
        == "eagle3 extract configs/tiny-random.yaml -o data.num_conversations=4 -o 'name=my run'"
    )
    with pytest.raises(
        DataError, match="run `eagle3 extract configs/tiny-random.yaml -o data.num_conversations=4"
    ):
        finished_output(tmp_path / "extract", "extract", hint)


def test_console_leaves_out_tracebacks_of_known_errors_only():
    import logging
    import sys

    from cli.run import _KnownErrorsWithoutTraceback

    fmt = _KnownErrorsWithoutTraceback(logging.Formatter("%(message)s"))

    def record(exc):
        try:
            raise exc
        except Exception:
            return logging.LogRecord(
                "prefect.flow_runs", logging.ERROR, __file__, 1, "failed", None, sys.exc_info()
            )

    known = record(DataError("x.jsonl: empty file"))
    assert fmt.format(known) == "failed"
    assert known.exc_info[0] is DataError  # restored: Prefect's API log still gets the traceback
    bug = record(ValueError("a bug"))
    assert "Traceback (most recent call last)" in fmt.format(
        bug
    ) and "ValueError: a bug" in fmt.format(bug)
