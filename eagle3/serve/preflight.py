"""Pre-flight of a deployment: what can be known before any engine starts (failure classes 11, 14,
19, 23, 24); config-only rules are in :mod:`eagle3.config_checks`. Checks (passed / failed /
skipped / note, with figures): ``engine`` (SGLang's interpreter imports the pinned release),
``aux_capture`` (the target's class captures EAGLE-3 aux states there, else fc is bypassed and
acceptance is about 1.0), ``memory`` (weights + both KV caches of one full-context request per GPU
against ``GPU memory × serve.mem_fraction_static`` and other processes), ``settings`` (what SGLang
really runs; for the reference engine what it cannot honour, REFERENCE_UNSUPPORTED),
``environment`` (no simulated acceptance), ``template`` (trained chat-template switches against
the benchmark's and the server's), ``steps`` (served against trained steps, noted), ``port``
(SERVE_HOST, PORT_IN_USE), ``inputs`` (what a stage refuses at its start, from files only:
:func:`eagle3.config_checks.before_run_problems`), ``extraction`` (``extract.backend sglang``
needs SGLang whatever serves, with a release that returns aux states: EXTRACT_NO_AUX_RETURN).
:meth:`PreflightReport.raise_if_failed` raises EngineUnsupported (engine side) or ConfigError.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3.artifacts import read_json_object
from eagle3.config import RunConfig
from eagle3.convert.checkpoint import Problem
from eagle3.engines.bounds import bounded_int
from eagle3.engines.sglang.environment import install_advice
from eagle3.engines.sglang.serving import (extra_args_problems, flag_value, resolve,
                                           simulation_problem)
from eagle3.errors import ConfigError, DataError, EngineUnsupported
from eagle3.target_config import target_architecture, target_config_json, text_config

GIB = 1 << 30
ENGINE_CODES = {"TARGET_NO_AUX_CAPTURE", "ENGINE_MISSING", "ENGINE_VERSION", "GPU_COUNT",
                "EXTRACT_NO_AUX_RETURN"}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_KV_BYTES = {**_DTYPE_BYTES, "fp8": 1, "auto": 2}


@dataclass
class Check:
    """One check: ``status`` passed | failed | skipped | note, a one-line ``detail``, figures."""

    name: str
    status: str
    detail: str
    figures: dict = field(default_factory=dict)


@dataclass
class PreflightReport:
    """Every check of one launch and the problems found (``CODE: message``)."""

    engine: str
    checks: list[Check]
    problems: list[Problem]

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"engine": self.engine, "passed": self.passed,
                "checks": [asdict(c) for c in self.checks],
                "problems": [str(p) for p in self.problems]}

    def figures(self) -> dict[str, float]:
        """Numeric figures as ``<check>.<name>`` (for a tracker's metrics)."""
        return {f"{c.name}.{k}": float(v) for c in self.checks for k, v in c.figures.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}

    def lines(self) -> list[str]:
        """A row per check, then each problem as ``CODE: message``; a failed check whose detail is
        its problems' messages shows them in its row with their codes, not a second time below."""
        rows, shown = [], set()
        for c in self.checks:
            detail = c.detail
            if c.status == "failed":
                mine = [p for p in self.problems if id(p) not in shown and p.message in c.detail]
                if mine and "; ".join(p.message for p in mine) == c.detail:
                    detail = "; ".join(map(str, mine))
                    shown.update(id(p) for p in mine)
            rows.append(f"{c.name:<12} {c.status:<8} {detail}")
        return rows + [str(p) for p in self.problems if id(p) not in shown]

    def raise_if_failed(self) -> None:
        if self.passed:
            return
        engine_side = any(p.code in ENGINE_CODES for p in self.problems)
        cls = EngineUnsupported if engine_side else ConfigError
        err = cls(f"pre-flight of serve.engine {self.engine} failed before any engine started: "
                  + "; ".join(map(str, self.problems)))
        err.problems = list(self.problems)
        raise err


def _problem(text: str) -> Problem:
    """A ``CODE: message`` string as a Problem."""
    return Problem(*(part.strip() for part in text.split(":", 1)))


def _failed(name: str, problems: list[Problem], figs: dict | None = None):
    return Check(name, "failed", "; ".join(p.message for p in problems), figs or {}), problems


def _weights_bytes(model_dir: Path) -> int:
    files = list(model_dir.glob("*.safetensors")) + list(model_dir.glob("*.bin"))
    if not files:
        raise DataError(f"{model_dir}: no *.safetensors or *.bin weight files to size")
    return sum(f.stat().st_size for f in files)


def _kv_bytes_per_token(cfg: dict, dtype_bytes: int, where: str, tp: int = 1) -> int:
    """KV bytes per token on one GPU: 2 × layers × max(1, KV heads // tp) × head_dim × bytes;
    MLA (``kv_lora_rank``: DeepSeek-V2/V3, Kimi): layers × (kv_lora_rank + qk_rope_head_dim) ×
    bytes, on every GPU."""
    cfg = text_config(cfg)
    try:
        layers = bounded_int(cfg, "num_hidden_layers", where=where)
        if cfg.get("kv_lora_rank"):
            latent = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
            return layers * latent * dtype_bytes
        heads = bounded_int(cfg, "num_attention_heads", where=where)
        kv = bounded_int(cfg, "num_key_value_heads", heads, where=where)
        head_dim = bounded_int(cfg, "head_dim",
                               bounded_int(cfg, "hidden_size", where=where) // heads, where=where)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{where}: cannot size the KV cache, missing/bad field {e}") from e
    return 2 * layers * max(1, kv // tp) * head_dim * dtype_bytes  # K and V


def estimate_memory(target_dir: str | Path, draft_dir: str | Path | dict, *, context_length: int,
                    batch_size: int, gpu_memory_bytes: int, mem_fraction_static: float,
                    kv_dtype: str = "bfloat16", tp: int = 1,
                    draft_weights_bytes: int | None = None) -> dict:
    """Bytes one GPU needs vs ``gpu_memory_bytes × mem_fraction_static``: (target + draft weight
    file sizes) / ``tp`` + both KV caches at ``context_length × batch_size`` tokens. An unwritten
    draft is its ``config.json`` dict plus ``draft_weights_bytes``. Returns every number and
    ``fits``; ConfigError with the breakdown when it does not fit (failure class 19)."""
    target_dir = Path(target_dir)
    tcfg = target_config_json(target_dir)
    if isinstance(draft_dir, dict):
        dcfg, draft_dir = draft_dir, Path("<draft sized from the run config>")
    else:
        draft_dir = Path(draft_dir)
        dcfg = read_json_object(draft_dir / "config.json", "draft config.json")
    nbytes = _KV_BYTES.get(kv_dtype)
    if nbytes is None:
        raise ConfigError(f"kv_dtype: expected one of {sorted(_KV_BYTES)}, got {kv_dtype!r}")
    tokens = int(context_length) * int(batch_size)
    draft_w = _weights_bytes(draft_dir) if draft_weights_bytes is None else int(draft_weights_bytes)
    parts = {
        "target_weights": _weights_bytes(target_dir) // tp, "draft_weights": draft_w // tp,
        "target_kv": tokens * _kv_bytes_per_token(tcfg, nbytes, f"{target_dir}/config.json", tp),
        "draft_kv": tokens * _kv_bytes_per_token(dcfg, nbytes, f"{draft_dir}/config.json", tp),
    }
    need, budget = sum(parts.values()), int(gpu_memory_bytes * mem_fraction_static)
    if need > budget:
        detail = ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in parts.items())
        raise ConfigError(
            f"serve.mem_fraction_static: needs {need / GIB:.2f} GiB per GPU ({detail}; context "
            f"{context_length} x batch {batch_size}, tp {tp}) but GPU {gpu_memory_bytes / GIB:.2f} "
            f"GiB × mem_fraction_static {mem_fraction_static} = {budget / GIB:.2f} GiB")
    return {**parts, "need_bytes": need, "budget_bytes": budget,
            "gpu_memory_bytes": int(gpu_memory_bytes), "mem_fraction_static": mem_fraction_static,
            "context_length": int(context_length), "batch_size": int(batch_size),
            "kv_dtype": kv_dtype, "tp": int(tp), "fits": True}


def _sglang_env_problem(cfg: RunConfig, who: str, fallback: str) -> Problem | None:
    """ENGINE_MISSING / ENGINE_VERSION when ``serve.sglang_python`` lacks the release of
    ``convert.engine_version``; ``who`` names the setting that needs SGLang."""
    from eagle3.engines.sglang.environment import (sglang_installed, sglang_python,
                                                   sglang_unusable_reason, sglang_version)

    py, want = sglang_python(cfg), cfg.convert.engine_version
    if not sglang_installed(py):
        return Problem("ENGINE_MISSING", f"{who}: serve.sglang_python: expected the Python of an "
                       f"environment with sglang=={want}, got {sglang_unusable_reason(py)}; fix: "
                       f"{install_advice(want)} and set serve.sglang_python to its bin/python, or "
                       f"{fallback}")
    version = sglang_version(py)
    if version != want:
        return Problem("ENGINE_VERSION", f"{who}: SGLang in {py}: expected {want} "
                       "(convert.engine_version: every loader, capture and serving fact checked "
                       f"is that release's), got {version}; fix: {install_advice(want)}, or set "
                       f"convert.engine_version to {version!r} if it is a pinned release")
    return None


def _check_engine(cfg: RunConfig, engine: str) -> tuple[Check, list[Problem]]:
    if engine == "reference":
        return Check("engine", "passed", f"reference engine (refengine) in {sys.executable}"), []
    from eagle3.engines.sglang.environment import sglang_python

    p = _sglang_env_problem(cfg, "serve.engine sglang", "serve.engine reference")
    if p is not None:
        return _failed("engine", [p])
    return Check("engine", "passed",
                 f"SGLang {cfg.convert.engine_version} in {sglang_python(cfg)}"), []


def _check_extraction(cfg: RunConfig, engine: str) -> tuple[Check, list[Problem]]:
    """``extract.backend sglang`` needs SGLang whatever serves: ``serve.sglang_python`` with the
    release of ``convert.engine_version``, and a release with a flag that returns the target's
    aux states without a draft (``RELEASES[v]["return_aux_flag"]``)."""
    if cfg.extract.backend != "sglang":
        return Check("extraction", "passed", f"extract.backend {cfg.extract.backend}: the HF "
                     "target in this environment"), []
    from eagle3.engines.sglang.profile import RELEASES

    v = cfg.convert.engine_version
    flag = RELEASES[v]["return_aux_flag"]
    if flag is None:
        able = sorted(r for r, facts in RELEASES.items() if facts["return_aux_flag"])
        p = Problem("EXTRACT_NO_AUX_RETURN", f"extract.backend sglang with "
                    f"convert.engine_version {v}: SGLang {v} has no flag that returns the target's "
                    f"aux hidden states without a draft; expected a release that has one ({able}), "
                    "got one without; fix: extract.backend hf, or convert.engine_version "
                    f"{able[-1] if able else '(none pinned)'}")
        return _failed("extraction", [p])
    # with serve.engine sglang the engine check has judged the same interpreter already
    p = None if engine == "sglang" else _sglang_env_problem(cfg, "extract.backend sglang",
                                                             "extract.backend hf")
    if p is not None:
        return _failed("extraction", [p])
    return Check("extraction", "passed", f"extract.backend sglang: SGLang {v} returns aux states "
                 f"({flag})"), []


def _check_aux(cfg: RunConfig, engine: str, target_dir: Path) -> tuple[Check, list[Problem]]:
    from eagle3.engines.sglang.source import check_aux_capture, find_engine_source

    arch, v = target_architecture(target_dir), cfg.convert.engine_version
    if engine == "reference":
        return Check("aux_capture", "passed", f"{arch}: the reference engine hooks the HF target's "
                     "decoder layers (eagle3.target_model.capture_hidden_states)"), []
    try:
        source = find_engine_source("sglang", v, cache_dir=Path(cfg.paths.resolved_cache_dir()))
    except EngineUnsupported:
        source = None  # the profile's list
    try:
        got = check_aux_capture(arch, engine="sglang", version=v, source=source)
    except EngineUnsupported as e:
        p = Problem("TARGET_NO_AUX_CAPTURE", f"target architectures[0] {arch}: {e}; expected a "
                    f"class that implements set_eagle3_layers_to_capture in SGLang {v} (the "
                    "draft's fc would be bypassed and acceptance fall to about 1.0); fix: "
                    "serve.engine reference, or a target class SGLang captures")
        return _failed("aux_capture", [p], {"captures": 0})
    return Check("aux_capture", "passed", f"{arch} captures aux states in SGLang {v} "
                                          f"({got['how']})", {"captures": 1}), []


def _visible_gpus(cfg: RunConfig, sample: list[dict]) -> list[dict]:
    """``serve.tp`` GPUs from ``--base-gpu-id``, in ``CUDA_VISIBLE_DEVICES`` order."""
    raw = cfg.serve.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    gpus = sample
    if raw is not None:
        by = {str(g["index"]): g for g in sample} | {g["uuid"]: g for g in sample}
        gpus = [by[x.strip()] for x in raw.split(",") if x.strip() in by]
    base = int(flag_value(cfg.serve.extra_args, "--base-gpu-id") or 0)
    return gpus[base:base + cfg.serve.tp]


def draft_size_from_config(cfg: RunConfig, tcfg: dict) -> tuple[dict, int]:
    """(config dict, weight bytes in the serving dtype) of the draft before it exists: target layer
    shape, embedding ``[vocab, H]``, head ``[draft_vocab, H]``, ``fc`` ``[H, n_aux · H]``."""
    t = text_config(tcfg)
    h, inter = int(t["hidden_size"]), int(t["intermediate_size"])
    heads = int(t["num_attention_heads"])
    kv, hd = int(t.get("num_key_value_heads") or heads), int(t.get("head_dim") or h // heads)
    n_aux = len(cfg.extract.aux_layer_ids or [0, 0, 0])
    per_layer = (heads * hd + 2 * kv * hd) * 2 * h + h * heads * hd + 3 * h * inter + 3 * h
    params = (int(t["vocab_size"]) * h + cfg.train.draft_vocab_size * h + h * n_aux * h + h
              + cfg.train.num_layers * per_layer)
    dcfg = {"num_hidden_layers": cfg.train.num_layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": hd, "hidden_size": h}
    return dcfg, params * _DTYPE_BYTES.get(cfg.serve.dtype, 2)


def _check_memory(cfg: RunConfig, engine: str, target_dir: Path, serving_dir: Path | None,
                  gpus: list[dict] | None) -> tuple[Check, list[Problem]]:
    s, tcfg = cfg.serve, target_config_json(target_dir)
    draft, draft_bytes = serving_dir, None
    if serving_dir is None or not (serving_dir / "config.json").is_file():
        draft, draft_bytes = draft_size_from_config(cfg, tcfg)
    ctx = s.context_length or int(text_config(tcfg).get("max_position_embeddings") or 4096)
    if engine == "reference":
        return _reference_memory(cfg, target_dir, tcfg, draft, draft_bytes, ctx)
    if gpus is None:
        from eagle3.serve.diagnostics import gpu_sample

        gpus = gpu_sample() or []
    if (flag_value(s.extra_args, "--device") or "cuda") == "cpu":
        return Check("memory", "skipped", "SGLang on --device cpu: no GPU memory to size"), []
    used, cvd = _visible_gpus(cfg, gpus), "CUDA_VISIBLE_DEVICES"
    if len(used) < s.tp:
        p = Problem("GPU_COUNT", f"serve.tp {s.tp}: expected {s.tp} visible GPU(s) for SGLang, "
                    f"found {len(used)} (nvidia-smi lists {len(gpus)}; CUDA_VISIBLE_DEVICES "
                    f"{s.env.get(cvd, os.environ.get(cvd))!r})")
        return _failed("memory", [p], {"gpus_visible": len(gpus)})
    problems, worst = [], None
    for g in used:
        total, taken = g["mem_total_mib"] << 20, g["mem_used_mib"] << 20
        frac = s.mem_fraction_static
        frac = max(total - taken, 0) / total if frac is None else frac
        try:
            r = estimate_memory(target_dir, draft, context_length=ctx, batch_size=1,
                                gpu_memory_bytes=total, mem_fraction_static=frac,
                                kv_dtype="float32" if s.dtype == "float32" else "bfloat16",
                                tp=s.tp, draft_weights_bytes=draft_bytes)
        except ConfigError as e:
            problems.append(Problem("MEM_FRACTION_TOO_SMALL", f"GPU {g['index']}: {e}; fix: raise "
                                    "serve.mem_fraction_static, serve.tp, or lower "
                                    "serve.context_length"))
            continue
        if s.mem_fraction_static is not None and total - taken < r["budget_bytes"]:
            problems.append(Problem("GPU_BUSY", f"GPU {g['index']}: {taken / GIB:.2f} GiB already "
                                    "used by other processes; expected "
                                    f"{r['budget_bytes'] / GIB:.2f} GiB free for "
                                    f"mem_fraction_static {frac}, got {(total - taken) / GIB:.2f} "
                                    "GiB (an engine left running?)"))
        worst = r if worst is None or r["need_bytes"] > worst["need_bytes"] else worst
    figs = {f"{k.removesuffix('_bytes')}_gib": v / GIB for k, v in (worst or {}).items()
            if k.endswith(("_bytes", "_weights", "_kv"))}
    detail = (f"per GPU need {worst['need_bytes'] / GIB:.2f} GiB of "
              f"{worst['budget_bytes'] / GIB:.2f} GiB (context {ctx}, tp {s.tp}, GPUs "
              f"{[g['index'] for g in used]})" if worst else "; ".join(p.message for p in problems))
    return Check("memory", "failed" if problems else "passed", detail,
                 {**figs, "gpus": len(used)}), problems


def _reference_memory(cfg: RunConfig, target_dir: Path, tcfg: dict, draft: Any,
                      draft_bytes: int | None, ctx: int) -> tuple[Check, list[Problem]]:
    import psutil

    from eagle3.serve.launcher import reference_device

    device = reference_device(cfg.serve.device)
    stored = _DTYPE_BYTES.get(str(tcfg.get("torch_dtype") or tcfg.get("dtype") or "float32"), 4)
    served = _DTYPE_BYTES.get("float32" if cfg.serve.dtype == "auto" else cfg.serve.dtype, 4)
    d_bytes = draft_bytes if draft_bytes is not None else _weights_bytes(Path(draft))
    need = (_weights_bytes(target_dir) * served) // stored + d_bytes
    if device.startswith("cuda"):
        import torch

        seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = torch.device(device).index or 0
        if index >= seen:  # no free memory to read: the device is not there
            p = Problem("DEVICE_MISSING", f"serve.device: expected a CUDA device this machine has, "
                                          f"got {device!r} and torch sees {seen}; fix: -o "
                                          "serve.device=cpu (or auto), or a machine with the GPU")
            return _failed("memory", [p])
        free = torch.cuda.mem_get_info(torch.device(device))[0]
    else:
        free = psutil.virtual_memory().available
    figs = {"need_gib": need / GIB, "free_gib": free / GIB}
    if need > free:
        p = Problem("MEMORY_TOO_SMALL", f"reference engine on {device}: needs about "
                    f"{need / GIB:.2f} GiB (target and draft weights in the serving dtype), "
                    f"{free / GIB:.2f} GiB free; fix: free memory or serve.dtype bfloat16")
        return _failed("memory", [p], figs)
    return Check("memory", "passed", f"reference engine on {device}: about {need / GIB:.2f} GiB of "
                                     f"{free / GIB:.2f} GiB free (context up to {ctx})", figs), []


def _check_settings(cfg: RunConfig, engine: str) -> tuple[Check, list[Problem]]:
    s, b = cfg.serve, cfg.bench
    if engine == "reference":  # the launcher's rules for its command line
        from eagle3.serve.launcher import reference_rules

        from eagle3.config_checks import reference_problem

        extra = [Problem(code, msg) for code, msg in extra_args_problems(
            s.extra_args, rules=reference_rules())]
        refused = reference_problem(s)  # what config load refuses for serve.engine reference
        extra = ([_problem(refused)] if refused else []) + extra
        if extra:
            return _failed("settings", extra)
        queue = f"; bench.concurrency {b.concurrency} queues behind it" if b.concurrency > 1 else ""
        return Check("settings", "passed", f"chain drafting, {s.speculative_num_steps} steps; one "
                     f"request at a time{queue}", {"max_running_requests": 1}), []
    r = resolve(s)
    figs = {"max_running_requests": r["max_running_requests"],
            "num_draft_tokens": r["num_draft_tokens"],
            "overlap_scheduler": int(r["scheduler"] == "overlap")}
    extra = [Problem(code, msg) for code, msg in extra_args_problems(
        s.extra_args, version=cfg.convert.engine_version)]
    if extra:
        return _failed("settings", extra, figs)
    return Check("settings", "passed", f"{r['worker']} with the {r['scheduler']} scheduler "
                 f"({r['scheduler_reason']}), {r['drafting']} drafting {s.speculative_num_steps} "
                 f"steps × top-k {s.speculative_eagle_topk}, "
                 f"{r['num_draft_tokens']} draft tokens, "
                 f"max_running_requests {r['max_running_requests']} "
                 f"({r['max_running_requests_source']})", figs), []


def _check_environment(cfg: RunConfig, engine: str) -> tuple[Check, list[Problem]]:
    env = {**os.environ, **cfg.serve.env}
    problem = simulation_problem(env, "the server's environment")
    if problem is None:
        return Check("environment", "passed", "no SGLANG_SIMULATE_ACC_LEN / SGL_SIMULATE_ACC_LEN "
                     "above 0"), []
    if engine == "reference":
        return Check("environment", "note", problem.split(":")[0] + "; the reference engine does "
                                                                    "not read it"), []
    return _failed("environment", [Problem("SIMULATED_ACCEPTANCE", problem + "; fix: unset it")])


def _check_template(cfg: RunConfig, engine: str, target_dir: Path,
                    data: dict | None) -> tuple[Check, list[Problem]]:
    if data is None:
        return Check("template", "skipped", "no extraction manifest to compare with"), []
    from transformers import AutoTokenizer

    from eagle3.extract.conversations import template_switches

    trained = dict(data.get("template_switches") or {})
    bench = template_switches(AutoTokenizer.from_pretrained(str(target_dir)),
                              cfg.data.chat_template_kwargs)
    problems = []
    if ({k: v for k, v in bench.items() if v is not None}
            != {k: v for k, v in trained.items() if v is not None}):
        problems.append(Problem("TEMPLATE_SWITCHES", "chat-template switches: the extraction "
                                f"rendered {trained}, the benchmark renders {bench} "
                                "(data.chat_template_kwargs); expected the same"))
    note = ""
    if engine == "sglang":
        problems += _server_template(cfg, trained, data)
    elif any(v is not None for v in trained.values()):
        note = ("; the reference engine's /v1/chat/completions renders the template's defaults "
                "(the benchmark sends ids)")
    status = "failed" if problems else ("note" if note else "passed")
    return Check("template", status, f"switches {trained} at extraction, {bench} in the "
                                     f"benchmark{note}"), problems


def _server_template(cfg: RunConfig, trained: dict, data: dict) -> list[Problem]:
    extra, out = cfg.serve.extra_args, []
    raw = flag_value(extra, "--default-chat-template-kwargs")
    server = cfg.data.chat_template_kwargs if raw is None else json.loads(raw)
    wrong = {k: (trained.get(k), server.get(k)) for k in set(trained) | set(server)
             # a switch set on one side only renders other text too
             if server.get(k) != trained.get(k)}
    if wrong:
        out.append(Problem("TEMPLATE_SWITCHES", "server chat requests: expected the extraction's "
                           f"switches, got { {k: v[1] for k, v in wrong.items()} } instead of "
                           f"{ {k: v[0] for k, v in wrong.items()} } "
                           "(--default-chat-template-kwargs)"))
    tpl = flag_value(extra, "--chat-template")
    if tpl is not None:
        p = Path(tpl).expanduser()
        got = hashlib.sha256(p.read_text().encode()).hexdigest() if p.is_file() else None
        if got != data.get("chat_template_hash"):
            why = (f"a file whose text hashes to {got[:12]}…" if got
                   else "a built-in template name (not comparable)")
            out.append(Problem("TEMPLATE_OVERRIDE", f"serve.extra_args --chat-template {tpl!r}: "
                               "expected no override or the extraction's template (sha256 "
                               f"{str(data.get('chat_template_hash'))[:12]}…), got {why}"))
    name = flag_value(extra, "--hf-chat-template-name")
    if name is not None:
        out.append(Problem("TEMPLATE_OVERRIDE", f"serve.extra_args --hf-chat-template-name "
                           f"{name!r}: expected the tokenizer's default template (the one "
                           "extraction used), got a named alternative"))
    return out


def _check_steps(cfg: RunConfig) -> tuple[Check, list[Problem]]:
    s, t = cfg.serve.speculative_num_steps, cfg.train.ttt_steps
    how = "equal" if s == t else f"trained steps {s + 1}..{t} go unused"
    return Check("steps", "passed", f"{s} served draft steps, {t} trained TTT steps ({how})",
                 {"served_steps": s, "ttt_steps": t}), []


def _check_port(cfg: RunConfig) -> tuple[Check, list[Problem]]:
    """SERVE_HOST (:func:`eagle3.config_checks.serve_host_problem`), and PORT_IN_USE for a set
    ``serve.port`` that does not bind."""
    import socket

    from eagle3.config_checks import serve_host_problem

    s = cfg.serve
    refused = serve_host_problem(s)
    if refused:
        return _failed("port", [_problem(refused)])
    if s.port is None:
        return Check("port", "passed", f"{s.host} binds; a free port there is chosen at "
                                       "launch"), []
    with socket.socket(socket.AF_INET6 if ":" in s.host else socket.AF_INET) as sock:
        try:
            sock.bind((s.host, s.port))
        except OSError as e:
            p = Problem("PORT_IN_USE", f"serve.port {s.port} on {s.host}: expected a free port, "
                        f"binding it gives {e.strerror or e}; fix: end what listens there, choose "
                        "another serve.port, or leave serve.port unset (a free port is chosen)")
            return _failed("port", [p])
    return Check("port", "passed", f"serve.port {s.port} on {s.host} is free"), []


def run_preflight(cfg: RunConfig, target_dir: str | Path, serving_dir: str | Path | None = None, *,
                  data_manifest: dict | None = None, engine: str | None = None,
                  gpus: list[dict] | None = None) -> PreflightReport:
    """Every check above for RunConfig ``cfg``; starts nothing. ``serving_dir`` None: draft sized
    from the config; ``engine`` None: resolved from ``serve.engine``; ``gpus`` None: read now
    (:func:`eagle3.serve.diagnostics.gpu_sample`)."""
    if engine is None:
        from eagle3.serve.launcher import resolve_engine

        engine = cfg.serve.engine if cfg.serve.engine != "auto" else resolve_engine(cfg)
    target, serving = Path(target_dir), Path(serving_dir) if serving_dir is not None else None
    results = [_check_engine(cfg, engine), _check_aux(cfg, engine, target),
               _check_memory(cfg, engine, target, serving, gpus), _check_settings(cfg, engine),
               _check_environment(cfg, engine), _check_template(cfg, engine, target, data_manifest),
               _check_steps(cfg), _check_port(cfg), _check_extraction(cfg, engine)]
    return PreflightReport(engine, [c for c, _ in results], [p for _, ps in results for p in ps])


def preflight_of_run(cfg: RunConfig, serving_dir: str | Path | None,
                     data_dir: str | Path | None) -> PreflightReport:
    """:func:`run_preflight` on a run's folders (each used when present); DataError/ConfigError
    only for unreadable inputs."""
    from eagle3.artifacts import read_manifest
    from eagle3.assets import resolve_target

    def has(folder, name):
        return folder is not None and (Path(folder) / name).is_file()

    serving = Path(serving_dir) if has(serving_dir, "config.json") else None
    data = read_manifest(data_dir) if has(data_dir, "manifest.json") else None
    target = resolve_target(cfg)
    report = run_preflight(cfg, target, serving, data_manifest=data)
    report.checks.insert(0, _check_inputs(cfg, target, report.problems))
    return report


def _check_inputs(cfg: RunConfig, target: Path, problems: list[Problem]) -> Check:
    """``inputs``: the file checks a stage repeats at its start (data, dev and bench prompts, aux
    layer ids and draft vocabulary against the target); its problems go first in ``problems``."""
    from eagle3.config_checks import before_run_problems

    found = [p for p in map(_problem, before_run_problems(cfg, target))
             if p.code != "SERVE_HOST"]  # the port check reports it
    problems[:0] = found
    if found:
        return Check("inputs", "failed", f"{len(found)} problem(s) a stage would refuse at its "
                     "start (below)")
    from eagle3.extract.precheck import READ_AHEAD_MAX_BYTES

    path = Path(cfg.data.path or "").expanduser()
    unread = cfg.data.source == "file" and path.is_file() \
        and path.stat().st_size > READ_AHEAD_MAX_BYTES
    return Check("inputs", "passed", "data, dev prompts and bench prompts files, aux layer ids "
                 "and the draft vocabulary fit the target where known" + (
                     f"; data.path {path} is over {READ_AHEAD_MAX_BYTES // 2**20} MiB: its "
                     "conversations are read by the extraction only" if unread else ""))
