"""What the running engine really runs (its /server_info), read back before the benchmark: a changed
setting, a request limit below the benchmark's concurrency, or an exposed simulated-acceptance
variable is refused with the setting, the asked and the running value; the scheduler it got is
recorded."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eagle3.config import load_config
from eagle3.errors import ConfigError
from eagle3.serve.engine_settings import check_running_settings


@pytest.fixture
def server():
    state = {"info": {}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps(state["info"]).encode()
            self.send_response(200 if self.path == "/server_info" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _sglang_info(**changes):
    info = {
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "max_running_requests": 48,
        "disable_overlap_schedule": False,
        "internal_states": [{}],
    }
    return {**info, **changes}


def test_matching_engine_records_its_scheduler(server, tmp_path):
    state, url = server
    state["info"] = _sglang_info()
    rec = check_running_settings(
        url, load_config(None, ["serve.engine=sglang"]), "sglang", tmp_path
    )
    assert rec["scheduler"] == "overlap" and rec["changed"] == {}
    assert (
        json.loads((tmp_path / "engine_settings.json").read_text())["reported"][
            "max_running_requests"
        ]
        == 48
    )


def test_a_setting_the_engine_changed_is_refused(server, tmp_path):
    state, url = server
    state["info"] = _sglang_info(max_running_requests=48)
    cfg = load_config(
        None, ["serve.engine=sglang", "serve.max_running_requests=64", "bench.concurrency=64"]
    )
    with pytest.raises(ConfigError) as e:
        check_running_settings(url, cfg, "sglang", tmp_path)
    assert "max_running_requests: asked 64, the engine runs 48" in str(e.value)
    assert "max_running_requests 48 < concurrency 64" in str(e.value)
    state["info"] = _sglang_info(speculative_num_draft_tokens=6)
    with pytest.raises(
        ConfigError, match="speculative_num_draft_tokens: asked 4, the engine runs 6"
    ):
        check_running_settings(url, load_config(None, ["serve.engine=sglang"]), "sglang", tmp_path)


def test_exposed_simulated_acceptance_is_refused(server, tmp_path):
    state, url = server
    state["info"] = _sglang_info(internal_states=[{"env_vars": {"SGLANG_SIMULATE_ACC_LEN": "3.5"}}])
    with pytest.raises(ConfigError, match="SGLANG_SIMULATE_ACC_LEN='3.5'.*simulated acceptance"):
        check_running_settings(url, load_config(None, ["serve.engine=sglang"]), "sglang", tmp_path)
    from eagle3.measure.bench import (
        run_bench,
    )  # `eagle3 bench --url` refuses it too, before any request

    with pytest.raises(ConfigError, match="simulated acceptance"):
        run_bench(url, prompts=[{"id": "a", "category": "c", "text": "hi"}], tokenizer_dir=tmp_path)


def test_a_server_that_reports_nothing_is_recorded_not_refused(server, tmp_path):
    state, url = server
    state["info"] = {"engine": "eagle3-reference", "speculative_num_steps": 3}
    rec = check_running_settings(
        url, load_config(None, ["serve.engine=reference"]), "reference", tmp_path
    )
    assert (
        rec["scheduler"] is None
        and rec["reported"]["max_running_requests"] is None
        and rec["changed"] == {}
    )
