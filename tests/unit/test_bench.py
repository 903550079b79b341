"""run_bench against a small fake SGLang-compatible server (FastAPI in a thread on 127.0.0.1), and
the gate."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from eagle3.measure.bench import acceptance_verdict, run_bench
from eagle3.measure.offline import offline_acceptance
from eagle3.errors import ConfigError, TransientError


class FakeSGLang:
    """An SGLang-shaped server: /generate (streamed or not) with 0.5.23 meta_info, /get_server_info,
    /metrics.

    Each request's acceptance is a deterministic function of its prompt length; every request it
    served is recorded in ``self.served`` so the test can compute the expected figures
    independently.
    """

    def __init__(
        self, *, stream=True, speculative=True, fail_status=None, delay_s=0.0, with_metrics=True
    ):
        self.stream, self.speculative, self.fail_status, self.delay_s = (
            stream,
            speculative,
            fail_status,
            delay_s,
        )
        self.with_metrics = with_metrics
        self.served: list[dict] = []
        self.totals = {"gen": 0, "verify": 0}
        self.lock = threading.Lock()
        self.app = self._build()

    def _meta(self, ids: list[int], max_new: int) -> dict:
        completion = max_new - (len(ids) % 5)  # some requests stop early
        accepted_per_pass = 1 + (len(ids) % 3)  # 1..3 tokens per verify pass
        verify = -(-completion // accepted_per_pass)
        meta = {
            "prompt_tokens": len(ids),
            "completion_tokens": completion,
            "finish_reason": {"type": "length"},
        }
        if self.speculative:
            correct = completion - verify
            meta.update(
                spec_verify_ct=verify,
                spec_accept_length=completion / verify,
                spec_num_correct_drafts=correct,
                spec_num_proposed_drafts=3 * verify,
                spec_accept_rate=correct / (3 * verify),
            )
        return meta

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.post("/generate")
        async def generate(req: Request):
            if self.fail_status:
                return JSONResponse({"error": "boom"}, status_code=self.fail_status)
            body = await req.json()
            ids, max_new = body["input_ids"], body["sampling_params"]["max_new_tokens"]
            meta = self._meta(ids, max_new)
            with self.lock:
                self.served.append({"input_ids": ids, **meta})
                self.totals["gen"] += meta["completion_tokens"]
                self.totals["verify"] += meta.get("spec_verify_ct", 0)
            time.sleep(self.delay_s)
            text = f"answer to {len(ids)} tokens"
            if not (body.get("stream") and self.stream):
                return {"text": text, "meta_info": meta}

            def chunks():
                for n in (1, meta["completion_tokens"]):
                    part = dict(meta, completion_tokens=n)
                    if n <= 1:
                        part = {"completion_tokens": 1}
                    yield f"data: {json.dumps({'text': text[:n], 'meta_info': part})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")

        @app.get("/get_server_info")
        async def info():
            st = {}
            if self.speculative and self.totals["verify"]:
                st["avg_spec_accept_length"] = self.totals["gen"] / self.totals["verify"]
            return {"model_path": "/nonexistent/model", "internal_states": [st]}

        @app.get("/metrics")
        async def metrics():
            if not self.with_metrics:
                return PlainTextResponse("not found", status_code=404)
            return PlainTextResponse(
                "# TYPE sglang:generation_tokens_total counter\n"
                f'sglang:generation_tokens_total{{model_name="m"}} {float(self.totals["gen"])}\n'
                "# TYPE sglang:spec_verify_calls_total counter\n"
                f'sglang:spec_verify_calls_total{{model_name="m"}} {float(self.totals["verify"])}\n'
            )

        return app


@pytest.fixture
def serve():
    """Start FakeSGLang servers on 127.0.0.1 (free port) in threads; stop them all at teardown."""
    started = []

    def start(fake: FakeSGLang) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(fake.app, log_level="warning", lifespan="off"))
        th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        th.start()
        started.append((server, th, sock))
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start within 20 s")
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}"

    yield start
    for server, th, sock in started:
        server.should_exit = True
        th.join(timeout=10)
        sock.close()


def _expected_length(served: list[dict]) -> float:
    """1 + accepted drafts / verify passes over the fake's responses (this fake emits no prefill
    token)."""
    return 1 + sum(s["spec_num_correct_drafts"] for s in served) / sum(
        s["spec_verify_ct"] for s in served
    )


def test_run_bench_streaming_mtbench(serve, smollm2_dir, tmp_path):
    from transformers import AutoTokenizer

    from eagle3.measure.prompts import encode_prompts, load_prompts

    fake = FakeSGLang()
    url = serve(fake)
    rep = run_bench(
        url,
        prompts="mtbench",
        num_prompts=8,
        max_new_tokens=16,
        concurrency=2,
        tokenizer_dir=smollm2_dir,
        out_dir=tmp_path / "bench",
        request_timeout_s=30,
    )
    s = rep["summary"]
    assert len(fake.served) == 8
    assert s["acceptance_length"] == pytest.approx(_expected_length(fake.served))
    assert s["server_acceptance_length"] == pytest.approx(_expected_length(fake.served))
    assert s["server_acceptance_method"] == "prometheus_counter_difference"
    assert s["ttft_p50_s"] is not None and s["ttft_p50_s"] <= s["latency_p50_s"]
    assert s["latency_p50_s"] <= s["latency_p95_s"]
    assert s["output_tokens"] == sum(x["completion_tokens"] for x in fake.served)
    assert set(rep["per_category"]) == {
        "writing",
        "roleplay",
        "reasoning",
        "math",
        "coding",
        "extraction",
        "stem",
        "humanities",
    }
    # the chat template was applied the way the server would: exactly the target tokenizer's
    # template
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    sent = sorted(tuple(x["input_ids"]) for x in fake.served)
    assert sent == sorted(tuple(x) for x in encode_prompts(load_prompts("mtbench", 8), tok))
    for cat, row in rep["per_category"].items():
        mine = [r for r in rep["per_request"] if r["category"] == cat]
        assert row["acceptance_length"] == pytest.approx(
            sum(r["completion_tokens"] for r in mine) / sum(r["verify_ct"] for r in mine)
        )
    saved = json.loads((tmp_path / "bench" / "report.json").read_text())
    assert saved["summary"]["acceptance_length"] == pytest.approx(s["acceptance_length"])
    assert (tmp_path / "bench" / "acceptance_by_category.png").stat().st_size > 1000
    assert (
        json.loads((tmp_path / "bench" / "manifest.json").read_text())["kind"]
        == "acceptance_report"
    )


def test_non_streaming_server_and_server_info_fallback(serve, smollm2_dir, tmp_path):
    fake = FakeSGLang(stream=False, with_metrics=False)
    url = serve(fake)
    prompts = tmp_path / "p.txt"
    prompts.write_text("Say hello.\nCount to five.\nName a colour.\n")
    rep = run_bench(
        url, prompts=str(prompts), num_prompts=3, max_new_tokens=12, tokenizer_dir=smollm2_dir
    )
    s = rep["summary"]
    assert s["ttft_p50_s"] is None and "stream" in s["ttft_reason"]
    assert s["server_acceptance_method"] == "server_info_since_start"
    assert s["server_acceptance_length"] == pytest.approx(_expected_length(fake.served))


def test_baseline_gives_speedup_and_no_spec_is_explained(serve, smollm2_dir):
    spec = serve(FakeSGLang(delay_s=0.0))
    base = serve(FakeSGLang(speculative=False, delay_s=0.15))
    rep = run_bench(
        spec,
        prompts="gsm8k",
        num_prompts=2,
        max_new_tokens=8,
        tokenizer_dir=smollm2_dir,
        baseline_url=base,
    )
    assert rep["summary"]["speedup"] > 1.0
    assert rep["baseline"]["compared_outputs"] == 2
    only_base = run_bench(
        base, prompts="humaneval", num_prompts=1, max_new_tokens=8, tokenizer_dir=smollm2_dir
    )
    assert only_base["summary"]["acceptance_length"] is None
    assert "speculative" in only_base["summary"]["acceptance_reason"]


def test_errors_are_typed(serve, smollm2_dir):
    url = serve(FakeSGLang(fail_status=500))
    with pytest.raises(TransientError, match="500"):
        run_bench(
            url, num_prompts=1, max_new_tokens=4, tokenizer_dir=smollm2_dir, request_timeout_s=10
        )
    with pytest.raises(ConfigError, match="tokenizer"):
        run_bench(url, num_prompts=1, max_new_tokens=4, request_timeout_s=10)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(TransientError, match="ConnectError"):
        run_bench(dead, num_prompts=1, tokenizer_dir=smollm2_dir, request_timeout_s=5)
    for bad in ("notaurl", "localhost:30000"):  # not a transient failure: the argument is wrong
        with pytest.raises(
            ConfigError, match=rf"bench url: expected http://HOST:PORT .*got '{bad}'"
        ):
            run_bench(bad, num_prompts=1, tokenizer_dir=smollm2_dir, request_timeout_s=5)


def test_request_slower_than_the_setting_is_the_settings_fault(serve, smollm2_dir):
    """A request cut by the user's own bench.request_timeout_s is a ConfigError (never retried),
    naming the key, the value and what to do; not a TransientError (which the tasks retry and whose
    advice is a retry)."""
    url = serve(FakeSGLang(delay_s=1.0))
    with pytest.raises(
        ConfigError,
        match=r"ReadTimeout.*bench.request_timeout_s=0.2 s .*raise "
        r"bench.request_timeout_s",
    ) as info:
        run_bench(
            url, num_prompts=1, max_new_tokens=4, tokenizer_dir=smollm2_dir, request_timeout_s=0.2
        )
    assert not isinstance(info.value, TransientError)


def test_acceptance_gate_diagnosis():
    assert acceptance_verdict(1.5, 1.6, 1.3) is None  # passes
    assert "served ≪ offline: serving integration fault" in acceptance_verdict(1.02, 1.8, 1.3)
    assert "both low: draft quality or data" in acceptance_verdict(1.12, 1.15, 1.3)
    assert "no offline figure" in acceptance_verdict(1.1, None, 1.3)
    assert "serving integration" in acceptance_verdict(None, 1.5, 1.3)


def test_offline_acceptance_aggregates_decoder_counts(smollm2_dir):
    """Aggregation over a stand-in decoder with known counts (the real one is tested below)."""

    class Res:
        def __init__(self, n, v, per):
            self.output_ids, self.verify_ct, self.accepted_per_position = list(range(n)), v, per
            self.num_draft_tokens = 3 * v

    class Dec:
        num_steps = 3

        def generate(self, input_ids, max_new_tokens, temperature=0.0, seed=0):
            return Res(max_new_tokens, 4 + len(input_ids) % 3, [3, 2, 1])

    import torch

    seen = []
    Dec.generate_counted = Dec.generate
    Dec.generate = lambda self, *a, **k: (
        seen.append(torch.get_num_threads()) or self.generate_counted(*a, **k)
    )
    before = torch.get_num_threads()
    out = offline_acceptance(
        smollm2_dir, None, "mtbench", num_prompts=3, max_new_tokens=10, decoder=Dec(), cpu_threads=1
    )
    assert (
        seen == [1, 1, 1] and torch.get_num_threads() == before
    )  # serve.cpu_threads while decoding, restored
    vs = [r["verify_ct"] for r in out["per_request"]]
    assert out["acceptance_length"] == pytest.approx(
        1 + 18 / sum(vs)
    )  # 6 accepted drafts per prompt
    assert out["acceptance_length_sglang"] == pytest.approx(30 / sum(vs))
    assert out["per_position"] == pytest.approx([9 / sum(vs), 6 / sum(vs), 3 / sum(vs)])
    assert out["acceptance_rate"] == pytest.approx(18 / (3 * sum(vs)))
    assert set(out["per_category"]) == {"writing", "roleplay", "reasoning"}


@pytest.mark.slow
def test_offline_acceptance_with_real_specdec(tmp_path, tiny_target_dir):
    """refengine.specdec on the tiny target with a random SGLang-format draft: the figures equal the
    decoder's own."""
    from transformers import AutoTokenizer

    from eagle3.measure.prompts import encode_prompts, load_prompts
    from refengine.specdec import SpeculativeDecoder
    from testkit.sglang_drafts import make_random_draft

    draft = make_random_draft(tmp_path / "draft", tiny_target_dir)
    out = offline_acceptance(
        tiny_target_dir,
        draft,
        "mtbench",
        num_prompts=2,
        max_new_tokens=8,
        num_steps=2,
        capture_aux=False,
    )
    assert out["settings"]["capture_aux"] is False
    dec = SpeculativeDecoder(tiny_target_dir, draft, 2, "float32", capture_aux=False)
    ids = encode_prompts(
        load_prompts("mtbench", 2), AutoTokenizer.from_pretrained(str(tiny_target_dir))
    )
    res = [dec.generate(x, 8) for x in ids]
    assert out["acceptance_length"] == pytest.approx(
        1 + sum(sum(r.accepted_per_position) for r in res) / sum(r.verify_ct for r in res)
    )
    assert out["acceptance_length_sglang"] == pytest.approx(
        sum(len(r.output_ids) for r in res) / sum(r.verify_ct for r in res)
    )
    assert out["histogram"] == [sum(col) for col in zip(*(r.histogram for r in res))]
    assert 1.0 <= out["acceptance_length"] <= 3.0 and len(out["per_position"]) == 2


def test_cli_bench_url(serve, smollm2_dir, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    fake = FakeSGLang()
    url = serve(fake)
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "--url",
            url,
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "8",
            "--tokenizer",
            str(smollm2_dir),
            "--out",
            str(tmp_path / "b"),
        ],
    )
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)["acceptance_length"]
    assert got == pytest.approx(_expected_length(fake.served))
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "--url",
            url,
            "--prompts",
            str(tmp_path / "missing.jsonl"),
            "--tokenizer",
            str(smollm2_dir),
        ],
    )
    assert res.exit_code == 2


def test_gate_on_weak_draft_numbers_from_assets_md():
    """docs/ASSETS.md's SmolLM2 figures: 1.24 offline after 4 epochs. Served 1.00 is a fault; served
    1.23 is not."""
    assert "serving integration fault" in acceptance_verdict(1.00, 1.24, 1.3)
    assert "both low" in acceptance_verdict(1.23, 1.24, 1.3)


def test_save_report_with_offline(tmp_path):
    from eagle3.measure.bench import save_report

    report = {
        "summary": {"acceptance_length": 1.2, "num_prompts": 2, "output_tokens": 20, "wall_s": 1.0},
        "per_category": {"math": {"acceptance_length": 1.2}},
        "settings": {"url": "x"},
    }
    offline = {
        "acceptance_length": 1.25,
        "per_category": {"math": {"acceptance_length": 1.25}},
        "per_request": [{"id": 1}],
    }
    path = save_report(report, tmp_path / "b", offline=offline)
    saved = json.loads(path.read_text())
    assert (
        saved["summary"]["offline_acceptance_length"] == 1.25
        and "per_request" not in saved["offline"]
    )
    assert (tmp_path / "b" / "acceptance_by_category.png").exists()


def test_a_prompt_file_that_is_a_directory_is_called_one(tmp_path):
    from eagle3.errors import DataError
    from eagle3.measure.prompts import file_prompts

    with pytest.raises(DataError, match="got a directory"):
        file_prompts(tmp_path)
    with pytest.raises(DataError, match="not found"):
        file_prompts(tmp_path / "absent.jsonl")
