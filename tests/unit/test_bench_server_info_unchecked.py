"""A benchmark against a server that does not report the settings the benchmark checks
(/server_info answering {}, 404 or non-JSON) still measures, and says in one line which fields it
lacked and what could not be checked: on stderr (CLI) and in report.json's summary."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest
from typer.testing import CliRunner

from cli.main import app
from eagle3.measure.bench import run_bench
from tests.support.handover import loopback

PROMPTS = [{"id": "a", "category": "c", "text": "hi"}, {"id": "b", "category": "c", "text": "yo"}]
META = {
    "prompt_tokens": 5,
    "completion_tokens": 7,
    "finish_reason": {"type": "length"},
    "spec_verify_ct": 4,
    "spec_accept_length": 1.75,
    "spec_num_correct_drafts": 3,
    "spec_num_proposed_drafts": 12,
    "spec_accept_rate": 0.25,
}
SGLANG_INFO = {
    "version": "0.5.23",
    "max_running_requests": 48,
    "internal_states": [{"avg_spec_accept_length": 1.75, "env_vars": {}}],
}


@pytest.fixture
def server():
    """/generate with fixed speculative fields (not streamed); /server_info as ``state`` says:
    ("json", obj), ("status", code) or ("text", body). 127.0.0.1 only."""
    state = {"info": ("json", {})}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code, body, ctype="application/json"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path not in ("/server_info", "/get_server_info"):
                return self._send(404, "{}")
            kind, value = state["info"]
            if kind == "json":
                return self._send(200, json.dumps(value))
            if kind == "status":
                return self._send(value, "not here", "text/plain")
            return self._send(200, value, "text/html")

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(200, json.dumps({"text": "x" * 7, "meta_info": META}))

        def log_message(self, *a):
            pass

    httpd, url = loopback(Handler)
    yield state, url
    httpd.shutdown()
    httpd.server_close()


def _bench(url, tok, tmp_path, concurrency=4):
    return run_bench(
        url,
        prompts=PROMPTS,
        max_new_tokens=7,
        concurrency=concurrency,
        tokenizer_dir=tok,
        out_dir=tmp_path / "bench",
        request_timeout_s=30,
    )


def test_empty_server_info_names_every_missing_field(server, smollm2_dir, tmp_path):
    state, url = server
    rep = _bench(url, smollm2_dir, tmp_path)
    assert rep["summary"]["acceptance_length"] == pytest.approx(1.75)
    (w,) = rep["summary"]["warnings"]
    assert w.startswith(
        f"SERVER_INFO_UNCHECKED: {url}/server_info lacks version, "
        "max_running_requests, internal_states[].env_vars, "
        "internal_states[].avg_spec_accept_length: could not check "
    )
    assert "concurrency 4 requests at once" in w and "SGLANG_SIMULATE_ACC_LEN" in w
    saved = json.loads((tmp_path / "bench" / "report.json").read_text())
    assert saved["summary"]["warnings"] == [w] and saved["settings"]["engine_version"] is None


def test_a_server_info_reporting_everything_gives_no_warning(server, smollm2_dir, tmp_path):
    state, url = server
    state["info"] = ("json", SGLANG_INFO)
    rep = _bench(url, smollm2_dir, tmp_path)
    assert rep["summary"]["warnings"] == [] and rep["settings"]["engine_version"] == "0.5.23"


def test_concurrency_one_needs_no_running_request_limit(server, smollm2_dir, tmp_path):
    state, url = server
    state["info"] = ("json", {k: v for k, v in SGLANG_INFO.items() if k != "max_running_requests"})
    assert _bench(url, smollm2_dir, tmp_path, concurrency=1)["summary"]["warnings"] == []
    (w,) = _bench(url, smollm2_dir, tmp_path, concurrency=2)["summary"]["warnings"]
    assert f"{url}/server_info lacks max_running_requests: could not check" in w


def test_reference_engine_needs_no_environment_report(server, smollm2_dir, tmp_path):
    state, url = server
    state["info"] = (
        "json",
        {
            "engine": "eagle3-reference",
            "version": "0.5.23-compatible",
            "internal_states": [{"avg_spec_accept_length": 1.75}],
        },
    )
    assert _bench(url, smollm2_dir, tmp_path, concurrency=1)["summary"]["warnings"] == []


@pytest.mark.parametrize(
    "info, answered",
    [
        (("status", 404), "(/get_server_info answered 404, /server_info answered 404)"),
        (
            ("text", "<html>hi</html>"),
            "(/get_server_info answered non-JSON '<html>hi</html>', "
            "/server_info answered non-JSON '<html>hi</html>')",
        ),
        (
            ("json", [1]),
            "(/get_server_info answered a JSON list, not an object, /server_info "
            "answered a JSON list, not an object)",
        ),
    ],
)
def test_no_server_info_object_is_named_the_same_way(server, smollm2_dir, tmp_path, info, answered):
    state, url = server
    state["info"] = info
    (w,) = _bench(url, smollm2_dir, tmp_path)["summary"]["warnings"]
    assert w.startswith(
        f"SERVER_INFO_UNCHECKED: {url}/server_info lacks version, "
        "max_running_requests, internal_states[].env_vars, "
        f"internal_states[].avg_spec_accept_length {answered}: could not check "
    )


def test_cli_prints_the_warning_and_exits_0(server, smollm2_dir, tmp_path):
    state, url = server
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "--url",
            url,
            "--prompts",
            str(prompts),
            "--num-prompts",
            "2",
            "--concurrency",
            "4",
            "--max-new-tokens",
            "7",
            "--tokenizer",
            str(smollm2_dir),
        ],
    )
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if "SERVER_INFO_UNCHECKED" in ln]
    assert len(lines) == 2, res.output  # the stderr line, and the summary's warnings list
    assert lines[0].startswith(f"warning: SERVER_INFO_UNCHECKED: {url}/server_info lacks version")


def test_an_environment_checked_at_launch_needs_no_env_vars():
    # the pipeline's launcher refuses a simulated-acceptance variable before the server starts
    from eagle3.measure.bench import server_info_unchecked

    snap = {
        "raw_info": {
            "version": "0.5.16",
            "max_running_requests": 16,
            "internal_states": [{"avg_spec_accept_length": 1.7}],
        }
    }
    line = server_info_unchecked("http://127.0.0.1:1", snap, 4)
    assert line is not None and "internal_states[].env_vars" in line
    assert server_info_unchecked("http://127.0.0.1:1", snap, 4, env_checked=True) is None
