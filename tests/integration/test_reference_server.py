"""The CPU reference engine as a real subprocess: SGLang's flags, endpoints and meta_info; greedy
output equal to the target's own greedy output; concurrent requests do not mix; refused flags are
named."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from refengine.launch_server import UsageError, parse_args
from testkit.sglang_drafts import make_random_draft

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [
    "Hello, how are you today?",
    "Write a haiku about the sea.",
    "1, 2, 3, 4,",
    "The capital of France",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(target, draft, port, *extra):
    return [
        sys.executable,
        "-m",
        "refengine.launch_server",
        "--model-path",
        str(target),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        *extra,
    ]


class Server:
    """A reference-engine subprocess in its own process group; stopped (TERM, then KILL) in
    ``stop``."""

    def __init__(self, cmd, log_path: Path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
        )
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"

    def wait_ready(self, timeout_s: float = 120.0) -> list[int]:
        """Poll /health until 200 within the deadline; returns the status codes seen (0 =
        refused)."""
        seen, deadline = [], time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"server exited {self.proc.returncode}: {self.log_path.read_text()[-3000:]}"
                )
            try:
                code = httpx.get(self.url + "/health", timeout=5).status_code
            except httpx.TransportError:
                code = 0
            seen.append(code)
            if code == 200:
                return seen
            time.sleep(0.25)
        raise AssertionError(
            f"not ready in {timeout_s}s; codes {seen[-5:]}; log {self.log_path.read_text()[-3000:]}"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="module")
def served(tiny_target_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    draft = make_random_draft(tmp / "draft", tiny_target_dir)
    srv = Server(_cmd(tiny_target_dir, draft, _free_port()), tmp / "server.log")
    try:
        codes = srv.wait_ready()
        yield srv, codes
    finally:
        srv.stop()
    assert srv.proc.returncode is not None


@pytest.fixture(scope="module")
def hf_target(tiny_target_dir):
    from eagle3.target_model import load_target

    return load_target(tiny_target_dir, dtype="float32", device="cpu")


def _greedy(model, ids, n, eos=2):
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[
        0, len(ids) :
    ].tolist()
    return out[: out.index(eos) + 1] if eos in out else out


def _gen(url, text, n=12, **sp):
    r = httpx.post(
        url + "/generate",
        json={"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0.0, **sp}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_warming_answers_503_then_ready_line_and_health(served):
    srv, codes = served
    assert codes[-1] == 200 and set(codes[:-1]) <= {0, 503}
    assert 503 in codes  # loading takes seconds; /health said "warming", never a failure
    log = srv.log_path.read_text()
    assert "The server is fired up and ready to roll!" in log and "Load weight begin" in log
    assert httpx.get(srv.url + "/health_generate", timeout=60).status_code == 200
    assert httpx.get(srv.url + "/ready", timeout=10).status_code == 200


def test_greedy_generate_equals_target_greedy_and_meta_info(served, hf_target):
    srv, _ = served
    model, tok = hf_target
    for text in PROMPTS:
        out = _gen(srv.url, text)
        ids = tok(text)["input_ids"]
        assert out["output_ids"] == _greedy(model, ids, 12)
        m = out["meta_info"]
        assert m["prompt_tokens"] == len(ids) and m["completion_tokens"] == len(out["output_ids"])
        assert m["spec_verify_ct"] >= 1
        assert m["spec_accept_length"] == pytest.approx(
            m["completion_tokens"] / m["spec_verify_ct"]
        )
        assert m["spec_num_proposed_drafts"] == 3 * m["spec_verify_ct"]
        assert m["spec_accept_rate"] == pytest.approx(
            m["spec_num_correct_drafts"] / m["spec_num_proposed_drafts"]
        )
        assert sum(m["spec_correct_drafts_histogram"]) == m["spec_verify_ct"]
        assert m["finish_reason"]["type"] in ("length", "stop") and m["e2e_latency"] > 0
        assert out["text"] == tok.decode(out["output_ids"], skip_special_tokens=True)


def test_concurrent_requests_do_not_mix(served):
    srv, _ = served
    solo = [_gen(srv.url, t)["output_ids"] for t in PROMPTS]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda t: _gen(srv.url, t)["output_ids"], PROMPTS))
    assert together == solo
    batch = httpx.post(
        srv.url + "/generate",
        json={"text": PROMPTS[:2], "sampling_params": {"max_new_tokens": 12, "temperature": 0.0}},
        timeout=120,
    ).json()
    assert [b["output_ids"] for b in batch] == solo[:2]


def test_sampling_is_seeded_and_input_ids_accepted(served, hf_target):
    srv, _ = served
    _, tok = hf_target
    ids = tok(PROMPTS[0])["input_ids"]
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "sampling_seed": 5},
    }
    a, b = (httpx.post(srv.url + "/generate", json=body, timeout=60).json() for _ in range(2))
    assert a["output_ids"] == b["output_ids"] and len(a["output_ids"]) >= 1


def test_chat_server_info_and_metrics(served):
    srv, _ = served
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Say hi"}],
            "max_tokens": 6,
            "temperature": 0,
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    c = r.json()
    assert (
        c["choices"][0]["message"]["role"] == "assistant" and c["usage"]["completion_tokens"] <= 6
    )
    info = httpx.get(srv.url + "/get_server_info", timeout=10).json()
    assert (
        info["decoder"].startswith("fast path (LlamaForCausalLM")
        and info["speculative_algorithm"] == "EAGLE3"
    )
    avg = info["internal_states"][0]["avg_spec_accept_length"]
    assert 1.0 <= avg <= 4.0
    assert httpx.get(srv.url + "/server_info", timeout=10).json()["speculative_num_steps"] == 3
    fams = {
        f.name: f
        for f in text_string_to_metric_families(httpx.get(srv.url + "/metrics", timeout=10).text)
    }
    assert fams["sglang:spec_accept_length"].samples[0].value == pytest.approx(avg)
    gen = fams["sglang:generation_tokens"].samples[0].value
    calls = fams["sglang:spec_verify_calls"].samples[0].value
    assert gen > calls > 0 and "sglang:spec_accept_rate" in fams


def test_generate_streams_cumulative_chunks_like_sglang(served, hf_target):
    srv, _ = served
    body = {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 10, "temperature": 0}}
    whole = httpx.post(srv.url + "/generate", json=body, timeout=60).json()
    events = []
    with httpx.stream(
        "POST", srv.url + "/generate", json={**body, "stream": True}, timeout=60
    ) as r:
        assert r.status_code == 200 and "text/event-stream" in r.headers["content-type"]
        events = [ln[5:].strip() for ln in r.iter_lines() if ln.startswith("data:")]
    assert events[-1] == "[DONE]" and len(events) >= 3
    chunks = [json.loads(e) for e in events[:-1]]
    sizes = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert sizes == sorted(sizes) and sizes[0] >= 1  # cumulative, first chunk = the prefill token
    assert chunks[-1]["output_ids"] == whole["output_ids"]
    assert chunks[-1]["meta_info"]["spec_verify_ct"] == whole["meta_info"]["spec_verify_ct"]


def test_unimplemented_request_fields_are_refused_by_name(served):
    srv, _ = served
    r = httpx.post(
        srv.url + "/generate",
        json={"text": "x", "sampling_params": {"frequency_penalty": 0.5}},
        timeout=30,
    )
    assert r.status_code == 400 and "frequency_penalty" in r.text
    r = httpx.post(srv.url + "/generate", json={"text": ["x", "y"], "stream": True}, timeout=30)
    assert r.status_code == 400 and "stream" in r.text
    r = httpx.post(srv.url + "/generate", json={"input_ids": [10**9]}, timeout=30)
    assert r.status_code == 400 and "outside the target vocabulary" in r.text


@pytest.mark.parametrize(
    "extra,name",
    [
        (["--mem-fraction-static", "0.8"], "--mem-fraction-static"),
        (["--speculative-eagle-topk", "4"], "--speculative-eagle-topk"),
        (["--speculative-num-draft-tokens", "5"], "--speculative-num-draft-tokens"),
        (["--tp-size", "2"], "--tp-size"),
        (["--port", "70000"], "--port: expected 0..65535, got 70000"),
        pytest.param(
            ["--device", "cuda:0"],
            "--device: 'cuda:0' but torch sees no CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device"),
        ),
    ],
)
def test_refused_flags_named(extra, name):
    argv = _cmd("T", "D", 1)[3:]
    for i in range(0, len(extra), 2):
        if extra[i] in argv:
            argv[argv.index(extra[i]) + 1] = extra[i + 1]
        else:
            argv += extra[i : i + 2]
    with pytest.raises(UsageError, match=name):
        parse_args(argv)


def test_refused_flag_exits_2_with_name(tiny_target_dir, tmp_path):
    r = subprocess.run(
        _cmd(tiny_target_dir, tmp_path, 1, "--cuda-graph-max-bs", "8"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--cuda-graph-max-bs" in r.stderr


def test_accepted_noop_flags_parse():
    args = parse_args(
        _cmd("T", "D", 1, "--enable-metrics", "--disable-cuda-graph", "--tp", "1")[3:]
    )
    assert (args.speculative_num_steps, args.speculative_num_draft_tokens, args.dtype) == (
        3,
        4,
        "float32",
    )
    assert not args.disable_spec_aux_capture and args.disable_cuda_graph
    assert not parse_args(_cmd("T", "D", 1)[3:]).disable_cuda_graph
    assert parse_args(_cmd("T", "D", 1, "--disable-spec-aux-capture")[3:]).disable_spec_aux_capture


def test_health_is_503_before_loading_in_process():
    from fastapi.testclient import TestClient

    from refengine.server import create_app

    app, engine = create_app(parse_args(_cmd("T", "D", 1)[3:]))
    client = TestClient(app)  # no lifespan: nothing loads
    assert engine.state == "starting"
    for path in ("/health", "/health_generate", "/ready"):
        assert client.get(path).status_code == 503
    assert client.post("/generate", json={"text": "x"}).status_code == 503


def test_load_failure_exits_nonzero_with_traceback(tiny_target_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"architectures": ["Eagle3DraftModel"]}))
    (bad / "model.safetensors").write_bytes(b"")
    srv = Server(_cmd(tiny_target_dir, bad, _free_port()), tmp_path / "log.txt")
    try:
        srv.proc.wait(timeout=120)
    finally:
        srv.stop()
    assert srv.proc.returncode == 1
    assert "LlamaForCausalLMEagle3" in srv.log_path.read_text()


def _plain_cmd(target, port, *extra):
    return [
        sys.executable,
        "-m",
        "refengine.launch_server",
        "--model-path",
        str(target),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        *extra,
    ]


def test_without_speculative_algorithm_it_parses_as_plain_decoding_and_refuses_a_lone_draft():
    args = parse_args(_plain_cmd("T", 1)[3:])
    assert args.speculative_algorithm is None and args.speculative_draft_model_path is None
    assert args.speculative_num_steps is None
    with pytest.raises(
        UsageError, match="--speculative-draft-model-path: given without --speculative-algorithm"
    ):
        parse_args(_plain_cmd("T", 1, "--speculative-draft-model-path", "D")[3:])
    with pytest.raises(UsageError, match="--speculative-num-steps"):
        parse_args(_plain_cmd("T", 1, "--speculative-num-steps", "3")[3:])
    with pytest.raises(UsageError, match="--context-length: expected >= 2"):
        parse_args(_plain_cmd("T", 1, "--context-length", "0")[3:])


def test_plain_server_decodes_greedily_through_the_fast_path(tiny_target_dir, hf_target):
    """No --speculative-algorithm: the same engine serves the target alone (the speedup
    baseline)."""
    from fastapi.testclient import TestClient

    from refengine.server import create_app

    model, tok = hf_target
    app, engine = create_app(
        parse_args(_plain_cmd(tiny_target_dir, 1, "--context-length", "256")[3:])
    )
    with TestClient(app) as client:
        deadline = time.monotonic() + 120
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, f"not ready: {engine.state}"
            time.sleep(0.2)
        info = client.get("/get_server_info").json()
        assert info["speculative_algorithm"] is None and info["decoder"].startswith("fast path")
        for text in PROMPTS[:2]:
            r = client.post(
                "/generate",
                json={"text": text, "sampling_params": {"max_new_tokens": 12, "temperature": 0}},
            )
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["output_ids"] == _greedy(model, tok(text)["input_ids"], 12)
            assert "spec_verify_ct" not in out["meta_info"]
        r = client.post(
            "/generate",
            json={"input_ids": list(range(5, 105)), "sampling_params": {"max_new_tokens": 200}},
        )
        assert r.status_code == 400 and "exceeds the static KV cache of 256 positions" in r.text
