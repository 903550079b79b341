"""HTTP side of the reference engine: SGLang's endpoints over
:func:`refengine.loader.load_decoder`'s decoder (the fast path for Llama targets, CUDA graphs on a
CUDA device unless ``--disable-cuda-graph``; the generic ``SpeculativeDecoder`` otherwise; plain
decoding on the fast path without ``--speculative-algorithm``). "Load weight end." and
``/get_server_info`` (``decoder``) say which.

Endpoints (``sglang/srt/entrypoints/http_server.py``): ``/health`` and ``/health_generate`` (a
1-token generation) answer 503 until loaded and warmed up (and while shutting down), then 200;
``/ready``; ``POST /generate`` (text or input_ids, single or batch; ``meta_info`` as
``tokenizer_manager._calculate_spec_decoding_metrics``); ``POST /v1/chat/completions`` (the target's
chat template); ``/get_server_info`` = ``/server_info``
(``internal_states[0].avg_spec_accept_length`` = accepted tokens / verify passes since start,
``internal_state.py``); ``/metrics`` (Prometheus). Requests share one model behind a lock (one after
another). Stdout: progress, then SGLang's "The server is fired up and ready to roll!"; a failure
while loading prints the traceback, exit code 1.
"""

from __future__ import annotations

import json
import os
import queue
import random
import threading
import time
import traceback
import uuid
from datetime import datetime
from typing import Callable

from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from eagle3.engines.sglang.profile import VERSION as SGLANG_VERSION
from eagle3.errors import ConfigError, DataError

READY_LINE = "The server is fired up and ready to roll!"
_NEUTRAL = {"min_new_tokens": 0, "n": 1, "frequency_penalty": 0.0, "presence_penalty": 0.0,
            "repetition_penalty": 1.0, "min_p": 0.0}
_IGNORED = {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"}


def log(msg: str) -> None:
    """One progress line on stdout, SGLang-style timestamp prefix, flushed (the gate watches the log
    grow)."""
    print(f"[{datetime.now():%Y-%m-%d %H:%M:%S}] {msg}", flush=True)


def accept_length(res) -> float:
    """SGLang's ``spec_accept_length`` of a GenerationResult: completion tokens / verify passes
    (1.0 without a pass)."""
    return res.completion_tokens / res.verify_ct if res.verify_ct else 1.0


def accept_rate(res) -> float:
    """SGLang's ``spec_accept_rate`` of a GenerationResult: accepted / proposed draft tokens (0.0
    when none was proposed)."""
    return res.num_correct_drafts / res.num_draft_tokens if res.num_draft_tokens else 0.0


class BadRequest(Exception):
    """A request field the engine cannot honour; answered with HTTP 400 and this message."""


def parse_sampling_params(sp: dict | None, default_max_new_tokens: int = 128) -> dict:
    """SGLang ``sampling_params`` → keyword arguments of the decoder's ``generate``.

    Defaults are SGLang's (temperature 1.0, top_p 1.0, max_new_tokens 128); ``top_k`` 1 means
    greedy, -1 (or 0) off. Raises BadRequest naming any parameter set to a value the engine does not
    implement.
    """
    sp = dict(sp or {})
    out = {"max_new_tokens": int(sp.pop("max_new_tokens", None) or default_max_new_tokens),
           "temperature": float(sp.pop("temperature", 1.0)), "top_p": float(sp.pop("top_p", 1.0)),
           "stop_token_ids": [int(t) for t in (sp.pop("stop_token_ids", None) or [])],
           "ignore_eos": bool(sp.pop("ignore_eos", False))}
    seed = sp.pop("sampling_seed", None)
    out["seed"] = int(seed) if seed is not None else None
    top_k = int(sp.pop("top_k", -1))
    if top_k == 1:
        out["temperature"] = 0.0
    elif top_k not in (-1, 0):
        raise BadRequest("sampling_params.top_k: the reference engine implements -1 (off) or 1 "
                         f"(greedy), got {top_k}")
    stop = sp.pop("stop", None)
    if stop:
        raise BadRequest("sampling_params.stop: stop strings are not implemented (use "
                         f"stop_token_ids), got {stop!r}")
    if out["temperature"] < 0 or not 0 < out["top_p"] <= 1:
        raise BadRequest(f"sampling_params: expected temperature >= 0 and 0 < top_p <= 1, got "
                         f"{out['temperature']}, {out['top_p']}")
    bad = {k: v for k, v in sp.items()
           if k not in _IGNORED and (k not in _NEUTRAL or v != _NEUTRAL[k])}
    if bad:
        raise BadRequest(f"sampling_params: not implemented by the reference engine: {bad}")
    return out


class Engine:
    """Loads the models in the background and serves generations one at a time (a lock around the
    model)."""

    def __init__(self, args):
        self.args = args
        self.state = "starting"           # starting → loading → warming → ready → stopping
        self.decoder = None
        self.decoder_line = ""
        self.lock = threading.Lock()
        self.rng = random.Random(args.random_seed)
        self.totals = dict(requests=0, prompt_tokens=0, generation_tokens=0, verify_ct=0,
                           correct_drafts=0,
                           proposed_drafts=0)

    def load(self) -> None:
        """Load target + draft, warm up, mark ready; on any error print it and exit the process
        (code 1)."""
        try:
            from refengine.loader import load_decoder

            a = self.args
            self.state = "loading"
            log(f"Load weight begin. target={a.model_path} draft={a.speculative_draft_model_path} "
                f"dtype={a.dtype} "
                f"device={a.device}" + ("" if a.disable_cuda_graph else "; the fast path captures "
                                                                        "CUDA graphs on CUDA"))
            self.decoder, self.decoder_line = load_decoder(
                a.model_path, a.speculative_draft_model_path, num_steps=a.speculative_num_steps
                or 0,
                dtype=a.dtype, device=a.device, capture_aux=not a.disable_spec_aux_capture,
                context_length=a.context_length, cuda_graphs=not a.disable_cuda_graph)
            if a.tokenizer_path:
                from transformers import AutoTokenizer
                self.decoder.tokenizer = AutoTokenizer.from_pretrained(a.tokenizer_path)
            d = self.decoder
            aux = d.capture_indices if d.capture_aux else "off"
            report = d.draft.load_report if d.draft is not None else "no draft (plain decoding)"
            log(f"Load weight end. decoder: {self.decoder_line}; aux capture (HF hidden_states "
                f"indices)={aux}; "
                f"draft load report={report}")
            self.state = "warming"
            if not a.skip_server_warmup:
                log("Warming up: one generation of 8 tokens")
                self.generate([0, 1, 2, 3], {"max_new_tokens": 8, "temperature": 0.0,
                                             "ignore_eos": True})
                log("End of warmup.")
            self.state = "ready"
            log(READY_LINE)
        except BaseException as e:  # noqa: BLE001 - any failure here must end the process visibly
            if isinstance(e, ConfigError):  # a folder that is not a model: one line says which
                log(f"error: {e}")
            else:
                traceback.print_exc()
            log("Load failed; exiting with code 1")
            os._exit(1)

    def generate(self, input_ids: list[int], sp: dict | None, rid: str | None = None,
                 on_chunk: Callable[[dict], None] | None = None) -> dict:
        """One request → ``{"text", "output_ids", "meta_info"}``; raises BadRequest / DataError for
        bad input.

        ``on_chunk(body)`` receives the cumulative response after every verify pass (SGLang's
        streaming chunks carry the cumulative text and meta_info too).
        """
        kw = parse_sampling_params(sp)
        if kw["seed"] is None:
            kw["seed"] = self.rng.randrange(1 << 31)
        rid = rid or uuid.uuid4().hex
        start = time.perf_counter()
        hook = None
        if on_chunk is not None:
            def hook(partial):
                on_chunk(self._body(partial, rid, time.perf_counter() - start))
        with self.lock:
            res = self.decoder.generate(input_ids, on_tokens=hook, **kw)
        elapsed = time.perf_counter() - start
        body = self._body(res, rid, elapsed)
        meta = body["meta_info"]
        t = self.totals
        t["requests"] += 1
        t["prompt_tokens"] += res.prompt_tokens
        t["generation_tokens"] += res.completion_tokens
        t["verify_ct"] += res.verify_ct
        t["correct_drafts"] += res.num_correct_drafts
        t["proposed_drafts"] += res.num_draft_tokens
        log(f"Request {meta['id'][:8]} done: #prompt: {res.prompt_tokens}, #gen: "
            f"{res.completion_tokens}, "
            f"accept len: {accept_length(res):.2f}, accept rate: {accept_rate(res):.2f}, "
            f"gen throughput (token/s): {res.completion_tokens / max(elapsed, 1e-9):.2f}")
        return body

    def _body(self, res, rid: str, elapsed: float) -> dict:
        """SGLang's ``/generate`` response body for a (possibly partial) GenerationResult."""
        tok = self.decoder.tokenizer
        text = tok.decode(res.output_ids, skip_special_tokens=True) if tok else ""
        meta = {"id": rid, "finish_reason": res.finish_reason or None,
                "prompt_tokens": res.prompt_tokens,
                "completion_tokens": res.completion_tokens, "cached_tokens": 0,
                "e2e_latency": elapsed}
        if res.verify_ct > 0:  # SGLang adds the speculative fields after a verify pass
            hist = list(res.histogram)
            while len(hist) > 1 and hist[-1] == 0:
                hist.pop()
            meta.update(spec_accept_rate=accept_rate(res), spec_accept_length=accept_length(res),
                        spec_num_correct_drafts=res.num_correct_drafts,
                        spec_num_proposed_drafts=res.num_draft_tokens,
                        spec_verify_ct=res.verify_ct, spec_correct_drafts_histogram=hist,
                        spec_accepted_per_position=list(res.accepted_per_position))
        return {"text": text, "output_ids": list(res.output_ids), "meta_info": meta}

    def avg_accept_length(self) -> float | None:
        """(accepted drafts + bonus) per verify pass since start; None before the first verify
        pass."""
        t = self.totals
        return (t["correct_drafts"] + t["verify_ct"]) / t["verify_ct"] if t["verify_ct"] else None

    def tokenize(self, text: str) -> list[int]:
        if self.decoder.tokenizer is None:
            raise BadRequest("text input needs a tokenizer; send input_ids")
        return list(self.decoder.tokenizer(text)["input_ids"])


def _err(status: int, msg: str) -> JSONResponse:
    return JSONResponse({"error": {"message": msg, "code": status}}, status_code=status)


def create_app(args) -> tuple[FastAPI, Engine]:
    """The FastAPI app and its engine; the engine starts loading in a daemon thread when the app
    starts."""
    from contextlib import asynccontextmanager

    engine = Engine(args)

    @asynccontextmanager
    async def lifespan(_app):
        threading.Thread(target=engine.load, name="engine-load", daemon=True).start()
        yield
        engine.state = "stopping"
        log("Shutting down.")

    app = FastAPI(lifespan=lifespan)

    def ready() -> bool:
        return engine.state == "ready"

    @app.get("/health")
    def health():
        return Response(status_code=200 if ready() else 503)

    @app.get("/health_generate")
    def health_generate():
        if not ready():
            return Response(status_code=503)
        engine.generate([0], {"max_new_tokens": 1, "temperature": 0.0}, rid="health_generate")
        return Response(status_code=200)

    @app.get("/ready")
    def ready_ep():
        return JSONResponse({"status": engine.state}, status_code=200 if ready() else 503)

    @app.post("/generate")
    def generate(body: dict = Body(...)):
        if not ready():
            return _err(503, f"server not ready (state: {engine.state})")
        try:
            return _generate(engine, body)
        except (BadRequest, DataError) as e:
            return _err(400, str(e))

    @app.post("/v1/chat/completions")
    def chat(body: dict = Body(...)):
        if not ready():
            return _err(503, f"server not ready (state: {engine.state})")
        try:
            return _chat(engine, args, body)
        except (BadRequest, DataError) as e:
            return _err(400, str(e))

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": args.served_model_name, "object": "model",
                                            "owned_by": "eagle3"}]}

    @app.get("/get_model_info")
    def model_info():
        return {"model_path": args.model_path, "tokenizer_path": args.tokenizer_path
                or args.model_path,
                "is_generation": True}

    @app.get("/get_server_info")
    @app.get("/server_info")
    def server_info():
        state = {"state": engine.state}
        if (avg := engine.avg_accept_length()) is not None:
            state["avg_spec_accept_length"] = avg
        return {"model_path": args.model_path, "speculative_algorithm": args.speculative_algorithm,
                "speculative_draft_model_path": args.speculative_draft_model_path,
                "speculative_num_steps": args.speculative_num_steps,
                "speculative_eagle_topk": args.speculative_eagle_topk,
                "speculative_num_draft_tokens": args.speculative_num_draft_tokens,
                "dtype": args.dtype,
                "engine": "eagle3-reference", "version": f"{SGLANG_VERSION}-compatible",
                "internal_states": [state],
                "decoder": engine.decoder_line, "device": args.device}

    @app.get("/metrics")
    def metrics():
        return PlainTextResponse(_prometheus(engine, args.served_model_name))

    return app, engine


def _generate(engine: Engine, body: dict):
    known = {"text", "input_ids", "sampling_params", "rid", "stream", "return_logprob"}
    extra = sorted(k for k, v in body.items() if k not in known and v not in (None, False))
    if extra or body.get("return_logprob"):
        raise BadRequest(f"/generate fields not implemented by the reference engine: "
                         f"{extra + (['return_logprob'] if body.get('return_logprob') else [])}")
    if (body.get("text") is None) == (body.get("input_ids") is None):
        raise BadRequest("/generate: expected exactly one of 'text' or 'input_ids'")
    if body.get("text") is not None:
        batch = isinstance(body["text"], list)
        prompts = [engine.tokenize(t) for t in (body["text"] if batch else [body["text"]])]
    else:
        ids = body["input_ids"]
        batch = bool(ids) and isinstance(ids[0], list)
        prompts = ids if batch else [ids]
    sps = body.get("sampling_params")
    sps = sps if isinstance(sps, list) else [sps] * len(prompts)
    rids = body.get("rid")
    rids = rids if isinstance(rids, list) else [rids] * len(prompts)
    if not (len(sps) == len(rids) == len(prompts)):
        raise BadRequest(f"/generate: {len(prompts)} prompts but {len(sps)} sampling_params and "
                         f"{len(rids)} rids")
    if body.get("stream"):
        if batch:
            raise BadRequest("/generate: stream is implemented for a single prompt only, got a "
                             "batch")
        return _stream(engine, prompts[0], sps[0], rids[0])
    out = [engine.generate(p, sp, rid) for p, sp, rid in zip(prompts, sps, rids)]
    return out if batch else out[0]


def _stream(engine: Engine, prompt: list[int], sp: dict | None,
            rid: str | None) -> StreamingResponse:
    """SGLang-style server-sent events: one ``data: {cumulative body}`` per verify pass, then
    ``data: [DONE]``."""
    parse_sampling_params(sp)  # a bad request fails with 400 before the stream starts
    chunks: queue.Queue = queue.Queue()
    done = object()

    def work():
        try:
            chunks.put(engine.generate(prompt, sp, rid, on_chunk=chunks.put))
        except Exception as e:  # reported to the client as the stream's last event
            chunks.put({"error": {"message": f"{type(e).__name__}: {e}", "code": 500}})
        finally:
            chunks.put(done)

    threading.Thread(target=work, name="reference-stream", daemon=True).start()

    def events():
        while (item := chunks.get()) is not done:
            yield f"data: {json.dumps(item)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def _chat(engine: Engine, args, body: dict):
    tok = engine.decoder.tokenizer
    if body.get("stream") or int(body.get("n") or 1) != 1:
        raise BadRequest("/v1/chat/completions: stream and n > 1 are not implemented by the "
                         "reference engine "
                         "(POST /generate streams)")
    messages = body.get("messages")
    if not messages:
        raise BadRequest("/v1/chat/completions: 'messages' is required and must be non-empty")
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                  return_dict=False)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is None:  # SGLang: up to the context length
        max_tokens = engine.decoder.max_positions - len(ids) - engine.decoder.num_steps
    sp = {"max_new_tokens": max_tokens, "temperature": body.get("temperature", 1.0),
          "top_p": body.get("top_p", 1.0)}
    if body.get("seed") is not None:
        sp["sampling_seed"] = body["seed"]
    if body.get("stop"):
        sp["stop"] = body["stop"]
    r = engine.generate(list(ids), sp)
    m = r["meta_info"]
    fr = m["finish_reason"]
    choice = {"index": 0, "message": {"role": "assistant", "content": r["text"]},
              "finish_reason": fr.get("type"), "matched_stop": fr.get("matched")}
    return {"id": m["id"], "object": "chat.completion", "created": int(time.time()),
            "model": args.served_model_name,
            "choices": [choice],
            "usage": {"prompt_tokens": m["prompt_tokens"],
                      "completion_tokens": m["completion_tokens"],
                      "total_tokens": m["prompt_tokens"] + m["completion_tokens"]},
            "meta_info": m}


def _prometheus(engine: Engine, model_name: str) -> str:
    """Prometheus text: SGLang's gauge and counter names; gauges are cumulative since start here."""
    t = engine.totals
    escaped = model_name.replace("\\", "\\\\").replace('"', '\\"')
    lab = f'{{model_name="{escaped}"}}'
    rate = t["correct_drafts"] / t["proposed_drafts"] if t["proposed_drafts"] else 0.0
    rows = [("sglang:spec_accept_length", "gauge", engine.avg_accept_length() or 0.0,
             "Mean acceptance length of speculative decoding (accepted drafts + bonus token per "
             "forward)."),
            ("sglang:spec_accept_rate", "gauge", rate, "Speculative acceptance rate (accepted / "
                                                       "proposed drafts)."),
            ("sglang:prompt_tokens_total", "counter", t["prompt_tokens"], "Number of prefill "
                                                                          "tokens processed."),
            ("sglang:generation_tokens_total", "counter", t["generation_tokens"], "Number of "
                                                                                  "generation "
                                                                                  "tokens."),
            ("sglang:spec_verify_calls_total", "counter", t["verify_ct"], "Number of speculative "
                                                                          "verify calls."),
            ("sglang:num_requests_total", "counter", t["requests"],
             "Number of requests processed.")]
    lines = []
    for name, kind, value, doc in rows:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name}{lab} {float(value)}"]
    return "\n".join(lines) + "\n"


def serve(args) -> int:
    """Run the server in this process until SIGINT/SIGTERM; returns the exit code."""
    import uvicorn

    log(f"server_args=ServerArgs({', '.join(f'{k}={v!r}' for k, v in vars(args).items())})")
    app, _engine = create_app(args)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0
