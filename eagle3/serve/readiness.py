"""The readiness gate: tells a server warming up from one that hung, crashed or never came up.

Phases (seconds in each): ``launching`` (port refused, log empty), ``loading`` (port refused, log
started: SGLang binds after loading weights), ``warming`` (port answers, health not 200: SGLang's
503 during CUDA-graph capture is no failure), ``probing`` (``/health_generate`` 200, probe in
flight). Verdicts: ``ready``, ``crashed`` (exit code, log tail), ``stalled`` (no progress signal,
:mod:`eagle3.serve.liveness`, for ``stall_timeout_s``; without a pid or log: every health check
refused, or accepted and never answered, "Not answering", that long), ``timed_out``,
``probe_failed`` (no tokens, error status, or no speculative fields). Ready: ``GET
/health_generate`` 200 *and* ``probe_concurrency`` (≥ 2) concurrent greedy ``POST /generate`` of 4
tokens each returned a token within ``probe_timeout_s`` with ``spec_*`` fields in ``meta_info``
(docs/ENGINE_FACTS.md §4).

HTTP runs in daemon threads, so a silent server cannot block the loop. Each health check waits at
most until the nearest deadline, and the check due at a deadline is read before the verdict, which
says what the checks met (refused, no HTTP answer, or the status). The gate never ends the server;
on a non-ready verdict it saves :func:`eagle3.serve.diagnostics.collect_diagnostics`.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from eagle3.artifacts import atomic_write_json
from eagle3.errors import ConfigError
from eagle3.config import (GATE_POLL_INTERVAL_S, GATE_PROBE_TIMEOUT_S, GATE_STALL_TIMEOUT_S,
                           GATE_TIMEOUT_S)
from eagle3.serve.diagnostics import collect_diagnostics, log_tail
from eagle3.serve.liveness import ProgressMonitor
from eagle3.procs import exit_status

__all__ = ["GateResult", "http_status", "probe_generate", "spec_fields", "wait_ready"]
MIN_HEALTH_TIMEOUT_S = 0.05  # s: the shortest wait of one health check (enough on the same host)
HEALTH_GRACE_S = 0.5  # s waited once for a check past its timeout, so a verdict knows what it met
PROBE_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,")
SPEC_KEYS = ("spec_verify_ct", "spec_accept_length", "spec_accept_rate", "spec_num_correct_drafts",
             "spec_accept_token_num", "spec_draft_token_num", "spec_accept_histogram")


class Call:
    """Runs ``fn(*args)`` in a daemon thread; ``.done()``, ``.result`` / ``.error`` afterwards."""

    def __init__(self, fn: Callable, *args: Any):
        self.result: Any = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(fn, args), daemon=True).start()

    def _run(self, fn: Callable, args: tuple) -> None:
        try:
            self.result = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller through .error
            self.error = e
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)


def http_status(url: str, timeout_s: float) -> int | str:
    """GET ``url``: the status code, ``"refused"``, ``"connect timeout"`` (no connection within
    ``timeout_s`` seconds: a host that drops connection attempts), ``"timeout"`` (connected, no
    answer within ``timeout_s``) or ``"error: ..."``; environment proxies are ignored."""
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False) as c:
            return c.get(url).status_code
    except httpx.ConnectError:
        return "refused"
    except httpx.ConnectTimeout:
        return "connect timeout"
    except httpx.TimeoutException:
        return "timeout"
    except httpx.HTTPError as e:
        return f"error: {type(e).__name__}: {e}"


def spec_fields(meta_info: dict) -> dict:
    """Every ``spec_*`` key of one ``meta_info``."""
    return {k: v for k, v in meta_info.items() if k.startswith("spec_")}


def probe_generate(url: str, prompt: str, timeout_s: float) -> dict:
    """One greedy ``POST /generate`` of 4 tokens: ``{"status", "tokens", "spec", "seconds",
    "error"}``; ``tokens`` = ``meta_info.completion_tokens`` (else ``len(output_ids)``)."""
    t0 = time.monotonic()
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    out: dict = {"status": None, "tokens": 0, "spec": {}, "error": None}
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False) as c:
            r = c.post(url.rstrip("/") + "/generate", json=body)
        out["status"] = r.status_code
        if r.status_code == 200:
            data = r.json()
            data = data[0] if isinstance(data, list) and data else data
            meta = data.get("meta_info") or {} if isinstance(data, dict) else {}
            out["tokens"] = int(meta.get("completion_tokens") or len(data.get("output_ids") or []))
            out["spec"] = spec_fields(meta)
            out["meta_keys"] = sorted(meta)
        else:
            out["error"] = r.text[:300]
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


@dataclass
class GateResult:
    """Outcome of :func:`wait_ready`. Times are seconds since the gate started."""

    verdict: str  # ready, crashed, stalled, timed_out or probe_failed
    url: str
    detail: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    timeline: list[dict] = field(default_factory=list)
    elapsed_s: float = 0.0
    last_progress_s: float = 0.0
    exit_code: int | None = None
    log_tail: str = ""
    probe: list[dict] = field(default_factory=list)
    signals: dict[str, int] = field(default_factory=dict)
    signal_sources: list[str] = field(default_factory=list)
    diagnostics_dir: str | None = None
    diagnostics: dict | None = None
    # the last answer to a health check: a status code, "refused", "timeout" or "error: ..."
    last_health: int | str | None = None

    @property
    def ready(self) -> bool:
        return self.verdict == "ready"

    def summary(self) -> str:
        """One paragraph: verdict, phase times, why, where the diagnostics are."""
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items()) or "no phase"
        text = f"Server {self.url}: {self.verdict.upper()} after {self.elapsed_s:.1f} s ({phases})."
        if self.detail:
            text += f" {self.detail}"
        if self.ready and self.probe:
            spec = self.probe[0].get("spec", {})
            text += (f" Probe: {len(self.probe)} concurrent requests returned "
                     f"{'/'.join(str(p['tokens']) for p in self.probe)} tokens in "
                     f"{max(p['seconds'] for p in self.probe):.2f} s; speculative fields {spec}.")
        if self.signal_sources:
            sig = ", ".join(f"{k} {self.signals.get(k, 0)}" for k in self.signal_sources)
            text += (f" Progress signals observed: {sig}; last progress at "
                     f"{self.last_progress_s:.1f} s.")
        else:  # nothing of the server watched: only the gate's own phase changes count
            text += (" No progress signal (no server pid or log given, no GPU seen); last "
                     f"phase change at {self.last_progress_s:.1f} s.")
        if self.exit_code is not None:
            text += f" Exit code {self.exit_code}."
        if self.diagnostics_dir and not self.ready:
            text += f" Diagnostics saved to {self.diagnostics_dir}."
        if self.log_tail and not self.ready:
            last = [ln for ln in self.log_tail.splitlines() if ln.strip()][-3:]
            text += " Log tail: " + " | ".join(ln.strip()[:200] for ln in last)
        return text

    def metrics(self) -> dict[str, float]:
        """``gate_<phase>_s``, ``gate_total_s``, ``gate_ready`` for a tracker."""
        out = {**{f"gate_{k}_s": round(v, 3) for k, v in self.phases.items()},
               "gate_total_s": round(self.elapsed_s, 3), "gate_ready": float(self.ready)}
        if self.probe:
            out["gate_probe_latency_s"] = max(p["seconds"] for p in self.probe)
        return out

    def to_dict(self) -> dict:
        return asdict(self)


class _Timeline:
    def __init__(self, t0: float):
        self.t0, self.entries = t0, [{"phase": "launching", "start_s": 0.0}]

    @property
    def phase(self) -> str:
        return self.entries[-1]["phase"]

    def enter(self, phase: str, now: float) -> bool:
        if phase == self.phase:
            return False
        self.entries[-1]["end_s"] = round(now - self.t0, 3)
        self.entries.append({"phase": phase, "start_s": round(now - self.t0, 3)})
        return True

    def close(self, now: float) -> tuple[dict[str, float], list[dict]]:
        self.entries[-1]["end_s"] = round(now - self.t0, 3)
        totals: dict[str, float] = {}
        for e in self.entries:
            totals[e["phase"]] = round(totals.get(e["phase"], 0.0) + e["end_s"] - e["start_s"], 3)
        return totals, self.entries


def _check_arguments(url: str, seconds: dict[str, float]) -> None:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as e:
        raise ConfigError(f"url: expected http(s)://host[:port], got {url!r} ({e})") from e
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"url: expected http(s)://host[:port], got {url!r}")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise ConfigError(f"url: expected a port in 1..65535, got {parsed.port} ({url!r})")
    for name, value in seconds.items():
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{name}: expected a positive, finite number of seconds, got {value}")
    try:
        socket.getaddrinfo(parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80))
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"url: host {parsed.host!r} does not resolve ({e}); expected a reachable "
                          f"server address, got {url!r}") from e


def wait_ready(url: str, *, pid: int | None = None, log_path: str | Path | None = None,
               timeout_s: float = GATE_TIMEOUT_S, stall_timeout_s: float = GATE_STALL_TIMEOUT_S,
               poll_interval_s: float = GATE_POLL_INTERVAL_S,
               probe_timeout_s: float = GATE_PROBE_TIMEOUT_S,
               diagnostics_dir: str | Path | None = None, require_spec_fields: bool = True,
               probe_concurrency: int = 2, use_gpu: bool = True) -> GateResult:
    """Wait until ``url`` (``http://host:port``) is ready or a verdict says why not.

    ``pid``: server process-tree root (exit → crashed; CPU time is progress). ``log_path``: growth
    is progress, its tail goes in the result. All ``*_s`` are seconds. ``diagnostics_dir`` gets
    ``gate.json`` (and diagnostics unless ready). Returns a :class:`GateResult` for any verdict
    (the caller raises ``GateFailed``); ConfigError up front for a url not ``http(s)://host[:port]``
    or a non-positive timeout.
    """
    _check_arguments(url, {"timeout_s": timeout_s, "stall_timeout_s": stall_timeout_s,
                           "poll_interval_s": poll_interval_s, "probe_timeout_s": probe_timeout_s})
    url, t0 = url.rstrip("/"), time.monotonic()
    mon, tl = ProgressMonitor(pid, log_path, use_gpu=use_gpu), _Timeline(t0)
    watched = pid is not None or log_path is not None
    state: dict = {"last_progress": t0, "health_path": "/health_generate", "health": None,
                   "probe": None, "probe_t0": 0.0, "probe_results": []}
    health_timeout = min(probe_timeout_s, max(2.0, 5 * poll_interval_s))
    while True:
        h = state["health"]
        if h is not None and not state.get("health_waited") and (
                time.monotonic() >= state["health_end"]):  # its answer (or timeout) is due now
            state["health_waited"] = True
            h.wait(HEALTH_GRACE_S)
        now = time.monotonic()
        verdict, detail, code = _check_exit(pid)
        if verdict is None:
            if mon.sample():
                state["last_progress"] = now
            deadline = _nearest_deadline(state, mon, now, t0 + timeout_s, stall_timeout_s, watched)
            check_timeout = max(MIN_HEALTH_TIMEOUT_S, min(health_timeout, deadline - now))
            verdict, detail = _advance(url, state, tl, mon, now, check_timeout, probe_timeout_s,
                                       require_spec_fields, max(2, probe_concurrency))
        if verdict is None and mon.sources and now - state["last_progress"] >= stall_timeout_s:
            verdict = "stalled"
            quiet = now - state["last_progress"]
            detail = (f"No progress signal ({', '.join(mon.sources)}) for {quiet:.1f} s "
                      f"(stall_timeout_s={stall_timeout_s}) in phase {tl.phase}.")
        refused_for = now - state.get("refused_since", now)
        silent_for = now - state.get("silent_since", now)
        # without pid or log nothing (a GPU's activity may be another process's) tells a server
        # still loading from none at all, or from a port that accepts but never answers
        if verdict is None and not watched and refused_for >= stall_timeout_s:
            verdict = "stalled"
            detail = (f"Connection refused for {refused_for:.1f} s (stall_timeout_s="
                      f"{stall_timeout_s}) in phase {tl.phase}, with no progress signal (no "
                      "server pid or log) to show a server still starting.")
        if verdict is None and not watched and silent_for >= stall_timeout_s:
            verdict = "stalled"
            detail = (f"Not answering: {_silent_what(url, state)} to {state.get('silent', 0)} "
                      f"health checks over {silent_for:.1f} s (stall_timeout_s={stall_timeout_s}; "
                      "each check waited up to "
                      f"{state.get('silent_wait', health_timeout):.1f} s; last: "
                      f"{state.get('last_health')}) in phase {tl.phase}, with no progress signal "
                      "(no server pid or log) to show a server still starting.")
        if verdict is None and now - t0 >= timeout_s:
            verdict = "timed_out"
            detail = f"Overall deadline timeout_s={timeout_s} reached in phase {tl.phase}."
        if verdict in ("timed_out", "stalled"):
            detail += _refused_note(url, state) + _health_note(url, state, now, detail)
        if verdict is not None:
            return _finish(verdict, detail, code, url, pid, log_path, tl, mon, state, t0, now,
                           diagnostics_dir)
        # wake at the next poll, or earlier at the nearest deadline
        wake = min(now + poll_interval_s,
                   _nearest_deadline(state, mon, now, t0 + timeout_s, stall_timeout_s, watched))
        time.sleep(max(0.0, wake - time.monotonic()))


def _nearest_deadline(st: dict, mon: ProgressMonitor, now: float, overall: float,
                      stall_timeout_s: float, watched: bool) -> float:
    """The nearest ``time.monotonic()`` a verdict can fall due: the overall deadline, or
    ``stall_timeout_s`` after the last progress or (no pid or log) after refused or unanswered
    health checks began (a check started ``now`` begins such a run)."""
    out = [overall]
    if mon.sources:
        out.append(st["last_progress"] + stall_timeout_s)
    if not watched:
        out.append(st.get("silent_since", now) + stall_timeout_s)
        if "refused_since" in st:
            out.append(st["refused_since"] + stall_timeout_s)
    return min(out)


def _check_exit(pid: int | None) -> tuple[str | None, str, int | None]:
    if pid is None:
        return None, "", None
    exited, code = exit_status(pid)
    if not exited:
        return None, "", None
    how = (f"exit code {code}" if code is not None
           else "exit code unknown (not a child of this process)")
    return "crashed", f"The server process {pid} exited ({how}).", code


def _advance(url: str, st: dict, tl: _Timeline, mon: ProgressMonitor, now: float,
             health_timeout: float, probe_timeout: float, require_spec: bool,
             concurrency: int) -> tuple[str | None, str]:
    """One step of the HTTP state machine (health polling, then the concurrent probe)."""
    if st["probe"] is not None:
        return _advance_probe(url, st, tl, now, probe_timeout, require_spec)
    h = st["health"]
    if h is None:
        st["health"] = Call(http_status, url + st["health_path"], health_timeout)
        st["health_t0"], st["health_end"], st["health_waited"] = now, now + health_timeout, False
        st["silent_wait"] = max(st.get("silent_wait", 0.0), health_timeout)
        return None, ""
    if not h.done():
        return None, ""
    st["health"], status = None, h.result
    st["health_seen"] = st.get("health_seen", 0) + 1
    if status == "refused":
        st["refused"] = st.get("refused", 0) + 1
        st.setdefault("refused_since", st.get("health_t0", now))
    else:
        st.pop("refused_since", None)
    if isinstance(status, str) and status != "refused":  # accepted, no HTTP answer
        st["silent"] = st.get("silent", 0) + 1
        st.setdefault("silent_since", st.get("health_t0", now))
    else:
        st.pop("silent_since", None)
        st.pop("silent", None)
        st.pop("silent_wait", None)
    st["last_health"] = status
    if status == 404 and st["health_path"] == "/health_generate":
        st["health_path"] = "/health"  # a server without /health_generate: fall back to /health
        return None, ""
    if status == "refused":
        phase = "loading" if mon.log_pos > 0 else "launching"
    elif status == 200:
        phase = "probing"
        st["probe_t0"] = now
        st["probe"] = [Call(probe_generate, url, PROBE_PROMPTS[i % len(PROBE_PROMPTS)],
                            probe_timeout) for i in range(concurrency)]
    else:  # 503 while warming, any other status, or a connection that does not answer (without
        phase = "warming"  # a pid or log, wait_ready ends that after stall_timeout_s)
    if tl.enter(phase, now):
        st["last_progress"] = now  # a phase change is progress
    return None, ""


def _refused_note(url: str, st: dict) -> str:
    """`` Connection refused ...`` (how many checks were) when the last health check was."""
    if st.get("last_health") != "refused":
        return ""
    refused, seen = st.get("refused", 0), st.get("health_seen", 0)
    every = "every one" if refused == seen else f"{refused}"
    return (f" Connection refused at {url}: {every} of {seen} health checks was refused "
            "(nothing listens on that host and port).")


def _silent_what(url: str, st: dict) -> str:
    """What a check without an HTTP answer met: no connection (connect timeout), or no answer."""
    if st.get("last_health") == "connect timeout":
        return (f"{url} did not accept a connection (connect timeout: a host that drops "
                "connection attempts, a firewall or a wrong address)")
    return f"{url} accepted connections but gave no HTTP answer"


def _health_note(url: str, st: dict, now: float, detail: str) -> str:
    """What the last health check met when not refused and ``detail`` does not say it yet:
    `` Not answering: ...`` or `` The last health check ... answered HTTP <status>``."""
    last = st.get("last_health")
    if last is None or last == "refused" or detail.startswith("Not answering: "):
        return ""
    path = st["health_path"]
    if isinstance(last, str):
        silent_for = now - st.get("silent_since", now)
        return (f" Not answering: {_silent_what(url, st)} "
                f"within {silent_for:.1f} s to {st.get('silent', 0)} health checks of {path} "
                f"(each waited up to {st.get('silent_wait', 0.0):.1f} s; last: {last}).")
    return (f" The last health check of {url}{path} answered HTTP {last}"
            + (" (the server is up, not ready yet)." if last == 503 else "."))


def _advance_probe(url: str, st: dict, tl: _Timeline, now: float, probe_timeout: float,
                   require_spec: bool) -> tuple[str | None, str]:
    calls = st["probe"]
    if not all(c.done() for c in calls):
        if now - st["probe_t0"] >= probe_timeout:
            return "timed_out", ("/health_generate answered 200 but the generation probe returned "
                                 f"no tokens within probe_timeout_s={probe_timeout} while the "
                                 "server kept showing progress.")
        return None, ""
    st["probe"] = None
    failed = {"status": None, "tokens": 0, "spec": {}, "seconds": 0.0}
    results = [c.result if c.error is None else {**failed, "error": repr(c.error)} for c in calls]
    st["probe_results"] = results
    if any(r["status"] in (None, 503) for r in results):
        tl.enter("warming", now)  # not answered yet (503, reset): back to health polling
        return None, ""
    bad = [r for r in results if r["status"] != 200 or r["tokens"] < 1]
    if bad:
        return "probe_failed", ("The generation probe was answered without tokens: status "
                                f"{bad[0]['status']}, tokens {bad[0]['tokens']}, error "
                                f"{bad[0].get('error')!r}.")
    if require_spec and not all(r["spec"] for r in results):
        keys = next(r.get("meta_keys") for r in results if not r["spec"])
        return "probe_failed", ("The server generates, but meta_info has no speculative-decoding "
                                f"fields (expected one of {list(SPEC_KEYS)}, got keys {keys}): it "
                                "is not speculating.")
    tl.enter("ready", now)
    return "ready", ""


def _finish(verdict: str, detail: str, code: int | None, url: str, pid: int | None, log_path,
            tl: _Timeline, mon: ProgressMonitor, st: dict, t0: float, now: float,
            diagnostics_dir) -> GateResult:
    if tl.phase == "ready":
        tl.entries.pop()  # "ready" is the verdict, not a phase with a duration
    phases, timeline = tl.close(now)
    res = GateResult(verdict=verdict, url=url, detail=detail, phases=phases, timeline=timeline,
                     elapsed_s=round(now - t0, 3), exit_code=code, probe=st["probe_results"],
                     last_progress_s=round(st["last_progress"] - t0, 3), signals=dict(mon.counts),
                     last_health=st.get("last_health"), signal_sources=mon.sources)
    if log_path is not None and verdict != "ready":
        res.log_tail = log_tail(log_path, max_lines=40)
    if diagnostics_dir is not None:
        ddir = Path(diagnostics_dir)
        if verdict != "ready":
            res.diagnostics = collect_diagnostics(ddir, pid=pid,
                                                  log_paths=[log_path] if log_path else [],
                                                  reason=f"{verdict}: {detail}")
            res.diagnostics_dir = str(ddir)
        atomic_write_json(ddir / "gate.json", res.to_dict())
    return res
