"""What SGLang 0.5.23 changes, or fakes, in the speculative serving settings it was given: as data and rules.

Read from the released source (pinned by ``tests/unit/test_sglang_serving.py``, which re-reads these lines in
the wheel; docs/ENGINE_FACTS.md §4 S11-S15):

- **max_running_requests** (S11): ``arg_groups/speculative_hook.py`` ``_handle_eagle_family`` sets it to 48 when
  it is unset ("Max running requests is reset to 48 for speculative decoding"). A benchmark at a higher
  concurrency then measures queueing, not what it says.
- **draft tokens** (S12): with ``speculative_eagle_topk == 1`` it sets ``speculative_num_draft_tokens =
  speculative_num_steps + 1`` whatever was asked (a warning in the log only).
- **scheduler** (S13): EAGLE/EAGLE3 always run ``EAGLEWorkerV2`` (``speculative/spec_info.py``); the overlap
  scheduler is on unless ``--disable-overlap-schedule``, device ``cpu`` (``_disable_overlap_schedule_for_cpu``)
  or pipeline parallelism > 1 (``arg_groups/overrides.py``). In 0.5.23 top-k > 1 (tree drafting) runs under the
  overlap scheduler too: no refusal and no silent switch was found in the source (public 2026 reports of
  "overlap needs top-k 1" concern other builds), so the launch records which scheduler it gets instead.
- **simulated acceptance** (S14): ``SGLANG_SIMULATE_ACC_LEN`` (``environ.py``, ``EnvFloat(-1)``; the legacy
  ``SGL_`` prefix is rewritten to ``SGLANG_``) > 0 makes the engine accept a simulated number of draft tokens
  (``speculative/spec_utils.py``): every acceptance figure of such a server is made up.
- **/server_info** (S15) returns the *resolved* settings (``server_args.resolved_dict()``), so what the engine
  really runs can be read back after launch (:func:`compare_server_info`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

SPEC_DEFAULT_MAX_RUNNING_REQUESTS = 48
SIMULATE_ENV = ("SGLANG_SIMULATE_ACC_LEN", "SGL_SIMULATE_ACC_LEN")
RESOLVED_KEYS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                 "max_running_requests", "disable_overlap_schedule")


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in an argv list (``--flag V`` or ``--flag=V``; the last one wins), None if absent;
    ``"true"`` for a flag given without a value."""
    value = None
    for i, a in enumerate(argv):
        if a == flag:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            value = nxt if nxt is not None and not nxt.startswith("--") else "true"
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def simulated_acceptance(env: Mapping[str, str]) -> tuple[str, str] | None:
    """``(name, value)`` of the variable that makes SGLang simulate acceptance, None when none is set above 0.

    A value SGLang cannot parse as a float also counts: the engine would refuse to start or (for a build that
    reads it otherwise) simulate; either way no measured figure can come from it.
    """
    for name in SIMULATE_ENV:
        raw = env.get(name)
        if raw is None or str(raw).strip() == "":
            continue
        try:
            if float(raw) <= 0 and math.isfinite(float(raw)):
                continue
        except ValueError:
            pass
        return name, str(raw)
    return None


def resolve(*, num_steps: int, topk: int, num_draft_tokens: int, max_running_requests: int | None,
            extra_args: Sequence[str] = (), device: str = "cuda") -> dict:
    """The settings SGLang 0.5.23 will run with for these launch settings (see the module docstring).

    ``extra_args``: flags passed through verbatim (``--max-running-requests``, ``--disable-overlap-schedule``,
    ``--device``, ``--pp-size`` are read from them). Returns ``{"max_running_requests", "max_running_requests_source",
    "num_draft_tokens", "num_draft_tokens_adjusted", "scheduler" ("overlap" | "synchronous"),
    "scheduler_reason", "drafting" ("chain" | "tree"), "worker"}``.
    """
    mrr_arg = flag_value(extra_args, "--max-running-requests")
    mrr = int(mrr_arg) if mrr_arg not in (None, "true") else max_running_requests
    device = flag_value(extra_args, "--device") or device
    pp = flag_value(extra_args, "--pp-size") or flag_value(extra_args, "--pipeline-parallel-size") or "1"
    if flag_value(extra_args, "--disable-overlap-schedule") is not None:
        scheduler, why = "synchronous", "--disable-overlap-schedule"
    elif device == "cpu":
        scheduler, why = "synchronous", "device cpu (speculative_hook.py _disable_overlap_schedule_for_cpu)"
    elif pp not in ("1", "true"):
        scheduler, why = "synchronous", f"pipeline parallel size {pp} (overrides.py _pipeline_parallel_overlap_disable)"
    else:
        scheduler, why = "overlap", "the default (no --disable-overlap-schedule, device not cpu, pp 1)"
    tokens = num_steps + 1 if topk == 1 else num_draft_tokens
    return {"max_running_requests": SPEC_DEFAULT_MAX_RUNNING_REQUESTS if mrr is None else mrr,
            "max_running_requests_source": "SGLang's speculative default (48)" if mrr is None else "set",
            "num_draft_tokens": tokens, "num_draft_tokens_adjusted": tokens != num_draft_tokens,
            "scheduler": scheduler, "scheduler_reason": why, "drafting": "chain" if topk == 1 else "tree",
            "worker": "EAGLEWorkerV2"}


def compare_server_info(info: Mapping[str, Any], asked: Mapping[str, Any]) -> dict:
    """The running engine's resolved settings (``GET /server_info``) against what the launch asked for.

    ``asked``: ``{key: value}`` for keys of :data:`RESOLVED_KEYS` (``disable_overlap_schedule`` as a bool).
    Returns ``{"reported": {key: value or None}, "changed": {key: {"asked", "running"}}, "scheduler":
    "overlap" | "synchronous" | None}``; a key the server does not report (another engine) is None, not a change.
    """
    reported = {k: info.get(k) for k in RESOLVED_KEYS}
    changed = {k: {"asked": v, "running": reported[k]} for k, v in asked.items()
               if reported.get(k) is not None and v is not None and reported[k] != v}
    dos = reported.get("disable_overlap_schedule")
    return {"reported": reported, "changed": changed,
            "scheduler": None if dos is None else ("synchronous" if dos else "overlap")}


def running_problems(info: Mapping[str, Any] | None, concurrency: int) -> list[str]:
    """Why a measurement against a running server (its ``/server_info``) would not measure what it says: the
    server reports fewer requests at once than ``concurrency``, or exposes (``SGLANG_EXPOSE_OWN_ENV_VARS``) a
    simulated-acceptance variable. Fields the server does not report are not held against it."""
    if not info:
        return []
    out = []
    mrr = info.get("max_running_requests")
    if isinstance(mrr, int) and not isinstance(mrr, bool) and mrr < concurrency:
        out.append(f"server max_running_requests {mrr} < concurrency {concurrency}: the server runs at most {mrr} "
                   f"requests at once (SGLang resets it to {SPEC_DEFAULT_MAX_RUNNING_REQUESTS} with speculation unless "
                   f"--max-running-requests is given), so the benchmark would measure queueing")
    for state in info.get("internal_states") or []:
        sim = simulated_acceptance((state or {}).get("env_vars") or {}) if isinstance(state, Mapping) else None
        if sim is not None:
            out.append(f"server environment {sim[0]}={sim[1]!r}: the server reports a simulated acceptance length; no "
                       f"measured figure may come from it")
            break
    return out
