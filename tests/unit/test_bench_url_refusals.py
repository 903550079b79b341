"""``eagle3 bench --url`` fails loudly, with a coded one-line message, when it cannot measure: a
server that answers without speculative fields, a port that accepts and never answers, a server
answering 503, and bad arguments (temperature, tokenizer folder, -o overrides) refused with the
flag named. Servers listen on 127.0.0.1 only."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from cli.main import app
from eagle3.measure import bench
from eagle3.measure.bench import acceptance_verdict

pytestmark = pytest.mark.timeout(120)

META_NO_SPEC = {"prompt_tokens": 5, "completion_tokens": 4, "finish_reason": {"type": "length"}}
INFO = {"version": "0.5.23", "max_running_requests": 48, "internal_states": [{"env_vars": {}}]}


def _serve(mode: str):
    """A loopback HTTP server: ``nospec`` generates without speculative fields; ``503`` answers
    503 to everything; ``hung`` answers its settings but holds every /generate unanswered."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code, body):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 - http.server's name
            if mode == "503":
                return self._send(503, '{"error": "loading"}')
            if self.path in ("/server_info", "/get_server_info"):
                return self._send(200, json.dumps(INFO))
            return self._send(404, "{}")

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if mode == "503":
                return self._send(503, '{"error": "loading"}')
            if mode == "hung":
                return stop.wait(30)  # health green, generation hung
            self._send(200, json.dumps({"text": "abcd", "meta_info": META_NO_SPEC}))

        def log_message(self, *a):
            pass

    stop = threading.Event()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.stop_hung = stop
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture
def server(request):
    httpd, url = _serve(request.param)
    yield url
    httpd.stop_hung.set()
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def blackhole():
    """A port that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    t.join(2)
    for c in held:
        c.close()
    sock.close()


def _bench(*args):
    return CliRunner().invoke(app, ["bench", *args])


@pytest.mark.parametrize("server", ["nospec"], indirect=True)
def test_no_speculative_fields_exits_1_with_code(server, smollm2_dir, tmp_path):
    r = _bench(
        "--url",
        server,
        "--num-prompts",
        "2",
        "--max-new-tokens",
        "4",
        "--tokenizer",
        str(smollm2_dir),
        "--out",
        str(tmp_path / "b"),
    )
    assert r.exit_code == 1, r.output
    assert f"error: NO_SPECULATIVE_FIELDS: bench {server}: " in r.output
    assert f"eagle3 wait-ready --url {server}" in r.output and "speculative" in r.output
    # the report is still written, with the null figure
    assert (
        json.loads((tmp_path / "b" / "report.json").read_text())["summary"]["acceptance_length"]
        is None
    )


def test_stage_verdict_for_no_speculative_fields_is_coded():
    verdict = acceptance_verdict(None, 2.0, 1.3)
    assert verdict.startswith("NO_SPECULATIVE_FIELDS: served acceptance length none")
    assert acceptance_verdict(None, None, 1.3).startswith("NO_SPECULATIVE_FIELDS: ")


def test_silent_port_fails_fast(blackhole, monkeypatch, smollm2_dir, tmp_path):
    monkeypatch.setattr(bench, "PROBE_TIMEOUT_S", 0.5)
    for extra in ([], ["--tokenizer", str(smollm2_dir)]):
        r = _bench("--url", blackhole, "--num-prompts", "1", "--max-new-tokens", "4", *extra)
        assert r.exit_code == 1, r.output
        assert (
            f"error: SERVER_SILENT: bench {blackhole}: accepted connections but gave no HTTP "
            "answer to GET /get_server_info within 0.5 s"
        ) in r.output
        assert "wait-ready --url" in r.output


@pytest.mark.parametrize("server", ["503"], indirect=True)
def test_503_server_is_not_ready_not_a_tokenizer_problem(server):
    r = _bench("--url", server, "--num-prompts", "1", "--max-new-tokens", "4")
    assert r.exit_code == 1, r.output
    assert f"error: SERVER_NOT_READY: bench {server}: " in r.output and "503" in r.output
    assert f"eagle3 wait-ready --url {server}" in r.output
    assert "tokenizer" not in r.output


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_bad_temperature_refused_before_any_request(value):
    r = _bench("--url", "http://127.0.0.1:9", "--temperature", value)
    assert r.exit_code == 2, r.output
    assert "--temperature" in r.output and "expected a finite number >= 0" in r.output
    assert (
        "Traceback" not in r.output and r.exception is None or isinstance(r.exception, SystemExit)
    )


@pytest.mark.parametrize("server", ["nospec"], indirect=True)
def test_tokenizer_folder_without_tokenizer_files(server, tmp_path):
    folder = tmp_path / "draft"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    r = _bench("--url", server, "--tokenizer", str(folder))
    assert r.exit_code == 2, r.output
    assert f"error: TOKENIZER_MISSING: bench: tokenizer_dir (--tokenizer) '{folder}'" in r.output
    assert "tokenizer.json" in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("server", ["nospec"], indirect=True)
def test_unloadable_tokenizer_is_one_line(server, tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "NoSuchTokenizer"}')
    r = _bench("--url", server, "--tokenizer", str(folder))
    assert r.exit_code == 2, r.output
    assert f"error: TOKENIZER_MISSING: bench: tokenizer_dir (--tokenizer) '{folder}'" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_override_with_url_is_refused():
    r = _bench("--url", "http://127.0.0.1:9", "-o", "bench.foo=1")
    assert r.exit_code == 2, r.output
    assert "-o/--override ['bench.foo=1'] is not used with --url" in r.output


@pytest.mark.parametrize("server", ["hung"], indirect=True)
def test_a_generate_that_never_answers_ends_at_the_request_timeout(server, tiny_target_dir):
    import time

    t0 = time.monotonic()
    r = CliRunner().invoke(
        app,
        [
            "bench",
            "--url",
            server,
            "--num-prompts",
            "1",
            "--max-new-tokens",
            "4",
            "--tokenizer",
            str(tiny_target_dir),
            "--request-timeout",
            "1",
        ],
    )
    assert time.monotonic() - t0 < 20
    assert r.exit_code == 2, r.output
    assert "REQUEST_TIMEOUT: POST " in r.output and "--request-timeout S" in r.output, r.output


def test_a_request_timeout_that_is_no_positive_number_is_refused():
    r = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--request-timeout", "0"])
    assert r.exit_code == 2 and "--request-timeout: expected a finite number" in r.output
