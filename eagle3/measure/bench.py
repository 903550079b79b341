"""Acceptance benchmark against any SGLang-compatible server, and the acceptance gate.

``run_bench`` templates each prompt as one user turn as SGLang's chat endpoint would
(``apply_chat_template(add_generation_prompt=True)``), sends ``input_ids`` to ``POST /generate``
(streamed if possible, for TTFT), reads ``meta_info`` (:mod:`eagle3.measure.acceptance`) and
snapshots ``/get_server_info`` and ``/metrics`` around the run. Acceptance lengths are
token-weighted (bonus counted; INTERNALS.md). The gate compares with
:mod:`eagle3.measure.offline`."""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from eagle3.artifacts import atomic_write_json, write_manifest
from eagle3.config import (BENCH_MAX_NEW_TOKENS, BENCH_NUM_PROMPTS, BENCH_PROMPTS,
                           BENCH_REQUEST_TIMEOUT_S)
from eagle3.engines.sglang.serving import running_problems
from eagle3.errors import ConfigError, DataError, TransientError
from eagle3.measure.acceptance import (ACCEPTANCE_CONVENTION, SERVING_EXCESS_RATIO,
                                       SERVING_FAULT_CHECKS, aggregate, parse_meta_info,
                                       parse_prometheus, parse_server_info, server_window,
                                       serving_gap)
from eagle3.measure.prompts import encode_prompts, load_prompts


def _percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]) of ``values``; None for an empty list."""
    return float(np.percentile(values, q)) if values else None


def _get(client: httpx.Client, url: str, path: str, **kwargs) -> httpx.Response:
    """``GET url+path``; TransientError naming it when unreachable."""
    try:
        return client.get(url + path, **kwargs)
    except httpx.TransportError as e:
        raise TransientError(f"GET {url}{path}: {type(e).__name__}: {e}") from e


def _server_info(client: httpx.Client, url: str, timeout_s: float | None = None
                 ) -> tuple[dict | None, str | None, list[int]]:
    """``(settings, None, statuses)``: the first non-empty JSON object of ``/get_server_info`` and
    ``/server_info`` (else an empty one); or ``(None, what each answered, statuses)``.
    ``timeout_s``: each GET's own timeout. TransientError if unreachable."""
    empty, answers, statuses = None, [], []
    extra = {} if timeout_s is None else {"timeout": httpx.Timeout(timeout_s, connect=10.0)}
    for path in ("/get_server_info", "/server_info"):
        r = _get(client, url, path, **extra)
        statuses.append(r.status_code)
        if r.status_code != 200:
            answers.append(f"{path} answered {r.status_code}")
            continue
        try:
            info = r.json()
        except json.JSONDecodeError:
            answers.append(f"{path} answered non-JSON {r.text[:60]!r}")
            continue
        if isinstance(info, dict) and info:
            return info, None, statuses
        if isinstance(info, dict):
            empty = info
        else:
            answers.append(f"{path} answered a JSON {type(info).__name__}, not an object")
    return (empty, None, statuses) if empty is not None else (None, ", ".join(answers), statuses)


def snapshot_server(client: httpx.Client, url: str) -> dict:
    """``{"server_info", "metrics", "raw_info", "info_absent"}`` from :func:`_server_info` and
    ``/metrics`` (``--enable-metrics``); None where absent. TransientError if unreachable."""
    info, absent, _ = _server_info(client, url)
    r = _get(client, url, "/metrics")
    text = r.text if r.status_code == 200 else None
    try:
        metrics = parse_prometheus(text) if text else None
    except DataError:
        metrics = None
    return {"server_info": parse_server_info(info) if info else None, "metrics": metrics,
            "raw_info": info, "info_absent": absent}


# Seconds the benchmark's first contact (the settings endpoints) may take: a server that accepted
# the connection and says nothing within it is hung or still loading, not slow at generating.
PROBE_TIMEOUT_S = 10.0


def probe_server(client: httpx.Client, url: str) -> dict | None:
    """:func:`_server_info`'s settings within :data:`PROBE_TIMEOUT_S` per GET. TransientError
    ``SERVER_SILENT`` (connection accepted, no HTTP answer in time), ``SERVER_NOT_READY`` (every
    settings endpoint answered 5xx), or :func:`_server_info`'s when nothing listens."""
    try:
        info, _, statuses = _server_info(client, url, PROBE_TIMEOUT_S)
    except TransientError as e:
        if isinstance(e.__cause__, httpx.ReadTimeout):
            raise TransientError(
                f"SERVER_SILENT: bench {url}: accepted connections but gave no HTTP answer to GET "
                f"/get_server_info within {PROBE_TIMEOUT_S:g} s (expected an answer from a ready "
                f"server): a server still loading or hung; check it with eagle3 wait-ready --url "
                f"{url}") from e.__cause__
        raise
    if statuses and all(code >= 500 for code in statuses):
        raise TransientError(
            f"SERVER_NOT_READY: bench {url}: GET /get_server_info and /server_info answered HTTP "
            f"{', '.join(str(c) for c in statuses)} (expected 200): the server is up but not "
            f"ready; wait for it with eagle3 wait-ready --url {url}")
    return info


def no_speculative_fields(report: dict) -> str | None:
    """``NO_SPECULATIVE_FIELDS: ...`` naming the server and what to check when no request of
    ``report`` (:func:`run_bench`) carried speculative fields; None otherwise."""
    s, settings = report.get("summary") or {}, report.get("settings") or {}
    if s.get("acceptance_length") is not None:
        return None
    url = settings.get("url")
    return (f"NO_SPECULATIVE_FIELDS: bench {url}: expected speculative fields (spec_verify_ct, "
            f"spec_accept_length, ...) in the meta_info of /generate answers, got none in "
            f"{s.get('num_prompts')} request(s): acceptance not measured. Check that the server "
            "runs speculative decoding with the draft (SGLang: --speculative-algorithm EAGLE3 "
            f"--speculative-draft-model-path DRAFT); eagle3 wait-ready --url {url} reports the "
            "same as PROBE_FAILED")


# The CPU reference engine's /server_info "engine" (refengine/server.py); it has no
# simulated-acceptance mode, so its environment needs no check.
REFERENCE_ENGINE = "eagle3-reference"


def server_info_unchecked(url: str, snapshot: dict, concurrency: int,
                          window: dict | None = None, env_checked: bool = False) -> str | None:
    """``SERVER_INFO_UNCHECKED: ...`` naming every ``/server_info`` field the benchmark reads that
    the server did not report and what went unchecked; None when none is missing. ``snapshot``:
    :func:`snapshot_server` before the run; ``window``: :func:`server_window`; ``env_checked``:
    the launcher checked the environment for simulated acceptance (``env_vars`` not needed)."""
    info = snapshot.get("raw_info") or {}
    states = info.get("internal_states")
    states = [st for st in states if isinstance(st, dict)] if isinstance(states, list) else []
    missing = []
    if info.get("version") in (None, ""):
        missing.append(("version", "which engine release the figures come from (settings "
                        "engine_version: null)"))
    mrr = info.get("max_running_requests")
    if concurrency > 1 and (not isinstance(mrr, int) or isinstance(mrr, bool)):
        missing.append(("max_running_requests", f"that the server runs concurrency {concurrency} "
                        "requests at once (fewer would measure queueing)"))
    if not env_checked and info.get("engine") != REFERENCE_ENGINE and not any(
            isinstance(st.get("env_vars"), dict) for st in states):
        missing.append(("internal_states[].env_vars",
                        "that no simulated-acceptance variable (SGLANG_SIMULATE_ACC_LEN) made the "
                        "acceptance up (SGLang lists its variables with "
                        "SGLANG_EXPOSE_OWN_ENV_VARS=1)"))
    if (window or {}).get("method") == "unavailable":
        missing.append(("internal_states[].avg_spec_accept_length",
                        "the per-request acceptance against the server's own figure (/metrics "
                        "has no speculative counters either)"))
    if not missing:
        return None
    why = f" ({snapshot['info_absent']})" if snapshot.get("info_absent") else ""
    return (f"SERVER_INFO_UNCHECKED: {url}/server_info lacks "
            f"{', '.join(f for f, _ in missing)}{why}: could not check "
            f"{'; '.join(w for _, w in missing)}")


def _too_slow(url: str, timeout_s: float, what: str) -> ConfigError:
    """ConfigError ``REQUEST_TIMEOUT`` (never retried) for a request past the setting."""
    return ConfigError(f"REQUEST_TIMEOUT: POST {url}/generate: {what}: one request took longer "
                       f"than bench.request_timeout_s={timeout_s:g} s (expected every request to "
                       "finish within it): a server that answers its health and settings but "
                       "not /generate is hung; a slow one needs more time: raise "
                       "bench.request_timeout_s (-o bench.request_timeout_s=S, or eagle3 bench "
                       "--request-timeout S)")


def _post_generate(client: httpx.Client, url: str, payload: dict, timeout_s: float) -> dict:
    """One ``POST /generate``: body + timings (s). Transient/Config (timeout)/DataError."""
    t0, ttft, final, chunks = time.perf_counter(), None, None, 0
    try:
        with client.stream("POST", url + "/generate", json=payload) as r:
            if r.status_code >= 400:
                body = r.read().decode(errors="replace")[:300]
                cls = TransientError if r.status_code >= 500 else DataError
                hint = (f" (check the server with eagle3 wait-ready --url {url})"
                        if r.status_code == 503 else "")
                raise cls(f"POST {url}/generate: expected 200, got {r.status_code}: {body}{hint}")
            if "text/event-stream" not in r.headers.get("content-type", ""):
                final = json.loads(r.read())
            else:
                for line in r.iter_lines():
                    if time.perf_counter() > t0 + timeout_s:
                        raise _too_slow(url, timeout_s, f"no end of stream after {timeout_s} s")
                    line = line.strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    final, chunks = json.loads(data), chunks + 1
                    if ttft is None and (final.get("meta_info") or {}).get("completion_tokens", 0):
                        ttft = time.perf_counter() - t0
    except (httpx.ReadTimeout, httpx.WriteTimeout) as e:  # answering, not within the setting
        raise _too_slow(url, timeout_s, f"{type(e).__name__}") from e
    except httpx.TransportError as e:
        raise TransientError(f"POST {url}/generate: {type(e).__name__}: {e}") from e
    except json.JSONDecodeError as e:
        raise DataError(f"POST {url}/generate: response is not JSON ({e})") from e
    if isinstance(final, list):  # SGLang answers a batch with a list; we send one prompt
        final = final[0] if final else None
    if not isinstance(final, dict) or "meta_info" not in final:
        raise DataError(f"POST {url}/generate: expected an object with 'meta_info', got "
                        f"{str(final)[:200]!r}")
    return {"body": final, "latency_s": time.perf_counter() - t0, "ttft_s": ttft,
            "streamed": chunks > 0}


# Files one of which a Hugging Face tokenizer folder holds (fast, sentencepiece or BPE vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(tokenizer_dir: str | Path):
    """The tokenizer in ``tokenizer_dir``. ConfigError ``TOKENIZER_MISSING`` naming the folder when
    it is not a folder, holds none of :data:`TOKENIZER_FILES`, or transformers cannot load it."""
    from transformers import AutoTokenizer

    path = Path(tokenizer_dir)
    head = f"TOKENIZER_MISSING: bench: tokenizer_dir (--tokenizer) {str(path)!r}"
    if not path.is_dir():
        raise ConfigError("TOKENIZER_MISSING: bench: tokenizer_dir (--tokenizer) expected an "
                          f"existing folder, got {str(tokenizer_dir)!r}")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"{head}: expected the target's tokenizer files (one of "
                          f"{list(TOKENIZER_FILES)}), got none (give the target model's folder, "
                          "not a draft's)")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # transformers raises OSError, ValueError, ImportError, ... here
        raise ConfigError(f"{head}: expected a loadable tokenizer, got {type(e).__name__}: "
                          f"{' '.join(str(e).split())[:300]}") from e


def _resolve_tokenizer(tokenizer_dir, info: dict | None):
    """``tokenizer_dir``, else the server's ``tokenizer_path``/``model_path`` when local."""
    if tokenizer_dir is None and info:
        tokenizer_dir = next((info[k] for k in ("tokenizer_path", "model_path")
                              if info.get(k) and Path(info[k]).is_dir()), None)
    if tokenizer_dir is None:
        where = (info or {}).get("tokenizer_path") or (info or {}).get("model_path")
        raise ConfigError("bench: tokenizer_dir (--tokenizer) is needed to apply the target's chat "
                          "template; got none, and the server's tokenizer_path/model_path "
                          f"{where!r} is not a local folder")
    return load_tokenizer(tokenizer_dir), str(tokenizer_dir)


def _measure(client, url, prompts, ids, sampling, concurrency, timeout_s,
             on_request_done=None) -> dict:
    """All prompts, ``concurrency`` at once, between two server snapshots: ``{"rows", "wall_s",
    "window", "info", "before"}``; ``on_request_done(row)`` after each request."""
    def one(i: int) -> dict:
        payload = {"input_ids": ids[i], "sampling_params": sampling, "stream": True}
        out = _post_generate(client, url, payload, timeout_s)
        meta = out["body"]["meta_info"]
        acc = parse_meta_info(meta)
        row = {"id": prompts[i]["id"], "category": prompts[i]["category"],
               "prompt_tokens": len(ids[i]), "latency_s": out["latency_s"],
               "ttft_s": out["ttft_s"], "streamed": out["streamed"],
               "text": out["body"].get("text"), "finish_reason": meta.get("finish_reason"),
               **acc.to_dict(), "_acc": acc}
        if on_request_done is not None:
            on_request_done(row)
        return row

    before, t0 = snapshot_server(client, url), time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        rows = list(pool.map(one, range(len(prompts))))
    wall, after = time.perf_counter() - t0, snapshot_server(client, url)
    return {"rows": rows, "wall_s": wall, "window": server_window(before, after),
            "info": after["raw_info"], "before": before}


def _timing_summary(rows: list[dict], wall_s: float) -> dict:
    lat = [r["latency_s"] for r in rows]
    ttfts = [r["ttft_s"] for r in rows if r["ttft_s"] is not None]
    tokens = sum(r["completion_tokens"] for r in rows)
    out = {"output_tokens": tokens, "wall_s": wall_s,
           "output_tokens_per_s": tokens / wall_s if wall_s > 0 else None,
           "latency_p50_s": _percentile(lat, 50), "latency_p95_s": _percentile(lat, 95),
           "ttft_p50_s": _percentile(ttfts, 50) if len(ttfts) == len(rows) else None}
    if out["ttft_p50_s"] is None:
        out["ttft_reason"] = "server did not stream /generate; time to first token not measurable"
    return out


def run_bench(url: str, *, prompts: Any = BENCH_PROMPTS, num_prompts: int = BENCH_NUM_PROMPTS,
              max_new_tokens: int = BENCH_MAX_NEW_TOKENS, temperature: float = 0.0,
              concurrency: int = 1, tokenizer_dir: str | Path | None = None,
              out_dir: str | Path | None = None, baseline_url: str | None = None,
              request_timeout_s: float = BENCH_REQUEST_TIMEOUT_S, on_request_done=None,
              chat_template_kwargs: dict | None = None, env_checked: bool = False) -> dict:
    """Acceptance length, throughput and latency of a served draft (module docstring).

    ``prompts``: "mtbench" | "gsm8k" | "humaneval" | a file | ``[{"id", "category", "text"}]``;
    ``tokenizer_dir``: the target's (else the server's local ``tokenizer_path``); ``out_dir``:
    report, manifest, PNGs; ``baseline_url``: a non-speculative server for ``speedup`` (tokens/s
    ratio); ``chat_template_kwargs``: extraction's template switches. ``summary["warnings"]``:
    the :func:`server_info_unchecked` line, if any. Returns ``{"summary", "per_category",
    "per_position", "per_request", "settings", "server"}``. Raises ConfigError / DataError
    (``TOKENIZER_MISSING``, a bad argument), TransientError (server unreachable,
    ``SERVER_SILENT`` / ``SERVER_NOT_READY``). A null acceptance measured nothing."""
    url = url.rstrip("/")
    if httpx.URL(url).scheme not in ("http", "https") or not httpx.URL(url).host:
        raise ConfigError("bench url: expected http://HOST:PORT (e.g. http://127.0.0.1:30000), "
                          f"got {url!r}")
    if concurrency < 1 or max_new_tokens < 1 or request_timeout_s <= 0:
        raise ConfigError("bench: expected concurrency >= 1, max_new_tokens >= 1, "
                          f"request_timeout_s > 0; got {concurrency}, {max_new_tokens}, "
                          f"{request_timeout_s}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError("bench: temperature (--temperature, bench.temperature): expected a "
                          f"finite number >= 0, got {temperature!r}")
    plist = list(prompts) if isinstance(prompts, list) else load_prompts(prompts, num_prompts)
    timeout = httpx.Timeout(request_timeout_s, connect=10.0)
    sampling = {"max_new_tokens": int(max_new_tokens), "temperature": float(temperature)}
    with httpx.Client(timeout=timeout) as client:
        # a silent or unready server fails here, before the tokenizer (which may come from it)
        info = probe_server(client, url)
        refused = running_problems(info, concurrency)
        if refused:
            raise ConfigError(f"bench {url}: " + "; ".join(refused))
        tok, tok_dir = _resolve_tokenizer(tokenizer_dir, info)
        ids = encode_prompts(plist, tok, chat_template_kwargs)
        main = _measure(client, url, plist, ids, sampling, concurrency, request_timeout_s,
                        on_request_done)
        base = None
        if baseline_url:
            base = _measure(client, baseline_url.rstrip("/"), plist, ids, sampling, concurrency,
                            request_timeout_s)
    report = _build_report(main, base, plist, settings={
        "url": url, "prompts": prompts if isinstance(prompts, str) else "list",
        "num_prompts": len(plist), "max_new_tokens": max_new_tokens, "temperature": temperature,
        "concurrency": concurrency, "tokenizer_dir": tok_dir,
        "input": "input_ids (target chat template, add_generation_prompt=True)",
        "chat_template_kwargs": dict(chat_template_kwargs or {}),
        "baseline_url": baseline_url, "request_timeout_s": request_timeout_s,
        "engine_version": (main["before"]["raw_info"] or {}).get("version"),
        "convention": ACCEPTANCE_CONVENTION})
    unchecked = server_info_unchecked(url, main["before"], concurrency, main["window"], env_checked)
    report["summary"]["warnings"] = [unchecked] if unchecked else []
    if out_dir is not None:
        save_report(report, out_dir)
    return report


def _build_report(main: dict, base: dict | None, plist: list[dict], settings: dict) -> dict:
    rows = main["rows"]
    overall = aggregate([r["_acc"] for r in rows])
    per_category = {cat: {k: agg[k] for k in ("acceptance_length", "acceptance_rate",
                                              "num_requests", "completion_tokens", "verify_ct")}
                    for cat in dict.fromkeys(p["category"] for p in plist)
                    for agg in [aggregate([r["_acc"] for r in rows if r["category"] == cat])]}
    timing = _timing_summary(rows, main["wall_s"])
    summary = {**{k: overall[k] for k in ("acceptance_length", "acceptance_length_sglang",
                                          "acceptance_rate", "mean_request_acceptance_length",
                                          "num_speculative_requests")},
               "num_prompts": len(rows), **timing,
               "server_acceptance_length": main["window"].get("server_acceptance_length"),
               "server_acceptance_method": main["window"].get("method"),
               "field_generations": overall["generations"], "speedup": None}
    if overall["acceptance_length"] is None:
        summary["acceptance_reason"] = ("no request carried speculative fields (spec_verify_ct "
                                        "etc.): is speculative decoding enabled on this server?")
    baseline = None
    if base is not None:
        bt = _timing_summary(base["rows"], base["wall_s"])
        summary["speedup"] = (timing["output_tokens_per_s"] / bt["output_tokens_per_s"]
                              if bt["output_tokens_per_s"] else None)
        same = [a["text"] == b["text"] for a, b in zip(rows, base["rows"]) if a["text"] is not None]
        baseline = {**bt, "identical_outputs": sum(same), "compared_outputs": len(same)}
    per_request = [{k: v for k, v in r.items() if k != "_acc"} for r in rows]
    return {"summary": summary, "per_category": per_category,
            "per_position": overall["per_position"], "histogram": overall["histogram"],
            "per_request": per_request, "baseline": baseline,
            "server": main["window"], "settings": settings}


def save_report(report: dict, out_dir: str | Path, offline: dict | None = None) -> Path:
    """Write ``report.json``, ``acceptance_by_category.png`` and ``manifest.json``
    (``acceptance_report``), with ``offline`` (same prompts) in the report and the plot."""
    from eagle3.measure.plots import plot_acceptance_by_category

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if offline is not None:
        report["offline"] = {k: v for k, v in offline.items() if k != "per_request"}
        report["summary"]["offline_acceptance_length"] = offline["acceptance_length"]
    atomic_write_json(out / "report.json", report)
    if any(v.get("acceptance_length") for v in report["per_category"].values()):
        plot_acceptance_by_category(report, out / "acceptance_by_category.png", offline=offline)
    s = report["summary"]
    write_manifest(out, "acceptance_report", config=report["settings"],
                   counts={"num_prompts": s["num_prompts"], "output_tokens": s["output_tokens"]},
                   timings={"wall_s": s["wall_s"]}, acceptance_length=s["acceptance_length"])
    return out / "report.json"


def acceptance_verdict(served: float | None, offline: float | None, minimum: float,
                       unlike_served: str | None = None) -> str | None:
    """None when ``served >= minimum``; else "served ≪ offline: serving integration fault"
    (``serving_gap``) or "both low: draft quality or data"; undetermined without offline or
    with ``unlike_served`` (the settings differ)."""
    if served is not None and served >= minimum:
        return None
    got = f"{served:.3f}" if served is not None else "none (no speculative fields)"
    head = f"served acceptance length {got} < minimum {minimum:.3f}"
    if served is None:  # nothing measured: the server did not speculate, whatever the draft
        head = ("NO_SPECULATIVE_FIELDS: " + head + " (no /generate answer carried spec_verify_ct "
                "etc.: check that the engine ran speculative decoding with the draft)")
    if offline is not None and unlike_served:
        return f"{head}; offline (in-process) {offline:.3f} not compared: {unlike_served}"
    if offline is None:
        return (f"{head}; no offline figure to separate a serving fault from a weak draft — run "
                "offline_acceptance on the same prompts")
    if serving_gap(served, offline):
        return (f"{head}; offline (in-process) {offline:.3f} (served − 1 < {SERVING_EXCESS_RATIO} "
                "× (offline − 1)): served ≪ offline: serving integration fault — check "
                f"{SERVING_FAULT_CHECKS}")
    return (f"{head}; offline (in-process) {offline:.3f} is low too: both low: draft quality or "
            "data — train longer or on more data (see eagle3.decide)")
