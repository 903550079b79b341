"""Rules across config sections, checked when a config loads, before extraction or training
spends hours on a run whose settings cannot work. Each message names the keys, both values and what
to change (``RunConfig`` joins them into one ConfigError):

- ``serve.speculative_num_steps`` <= ``train.ttt_steps``; the SGLang rules that need only the
  config (:mod:`eagle3.engines.sglang.serving`: chain drafting verifies ``steps + 1`` tokens,
  ``bench.concurrency`` within the requests SGLang runs at once, no simulated-acceptance variable
  in ``serve.env``); the reference engine's refusals (:func:`reference_problem`).
- ``train.forward_impl: project`` not under fsdp on several GPUs; ``train.attn_implementation:
  flex`` only for this project's forward and not on the CPU; fused losses need CUDA.
- ``extract.cache_max_gb`` within :data:`WINDOW_GB` (``CACHE_SIZE_INVALID``) and given with
  ``extract.mode: cached`` (``CACHE_SIZE_MISSING``); ``extract.backend`` ``hf`` unless
  ``extract.mode`` is offline (``MODE_BACKEND``: the target runs in the training process).
- ``bench.prompts`` that reads as a name is a built-in set (``BENCH_PROMPTS``).
- ``train.select_best_by: measured`` has dev prompts (``NO_DEV_PROMPTS``).

Likely mistakes that load are warnings (:func:`config_warnings`). :func:`before_run_problems` runs,
for the pre-flight, the checks a stage repeats at its start that need files but no model. Reads a
``RunConfig`` by attribute; never imports :mod:`eagle3.config` (which calls it)."""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from pathlib import Path
from typing import Any

from eagle3.engines.sglang.serving import (concurrency_problem, draft_tokens_problem,
                                           reference_refusals, simulation_problem)
from eagle3.target_config import target_text_config


def _serving(cfg: Any) -> list[str]:
    s, t = cfg.serve, cfg.train
    out = []
    if s.speculative_num_steps > t.ttt_steps:
        out.append(f"serve.speculative_num_steps {s.speculative_num_steps} > train.ttt_steps "
                   f"{t.ttt_steps}: served draft steps {t.ttt_steps + 1}..{s.speculative_num_steps}"
                   " run the draft on its own hidden states further than training ever did, so "
                   "those positions are untrained and accept little; expected "
                   "serve.speculative_num_steps <= train.ttt_steps (raise train.ttt_steps to "
                   f"{s.speculative_num_steps} or lower serve.speculative_num_steps)")
    out.append(draft_tokens_problem(s))
    if s.engine == "reference":
        out.append(reference_problem(s))
    if s.engine in ("sglang", "auto"):
        out.append(concurrency_problem(s, cfg.bench.concurrency))
    out.append(simulation_problem(s.env, "serve.env"))
    return [m for m in out if m]


def reference_problem(serve: Any) -> str | None:
    """``REFERENCE_UNSUPPORTED`` message when ServeConfig ``serve`` asks the reference engine for
    settings it cannot honour (:func:`eagle3.engines.sglang.serving.reference_refusals`), else
    None. The rule's one home: config load (``serve.engine: reference``), the pre-flight, ``eagle3
    run`` and the launcher (where ``auto`` resolves to the reference engine)."""
    if not (bad := reference_refusals(serve)):
        return None
    how = ("" if serve.engine == "reference" else
           " (it resolves to the reference engine on this machine)")
    return (f"REFERENCE_UNSUPPORTED: serve.engine {serve.engine}{how}: the CPU reference engine "
            f"does chain drafting on one device and cannot honour {bad}; expected "
            "serve.speculative_eagle_topk 1, serve.tp 1 and mem_fraction_static, "
            "cuda_graph_max_bs, max_running_requests unset (SGLang settings), or serve.engine "
            "sglang")


def _bench_prompts(cfg: Any) -> list[str]:
    """``BENCH_PROMPTS`` for a misspelt set name: no path separator, no suffix, no file here. A
    missing path is for the pre-flight (:func:`bench_prompts_file_problem`)."""
    from eagle3.measure.prompts import PROMPT_SETS

    spec = cfg.bench.prompts
    if spec in PROMPT_SETS or "/" in spec or "\\" in spec or Path(spec).suffix or \
            Path(spec).expanduser().exists():
        return []
    near = difflib.get_close_matches(spec.lower(), PROMPT_SETS, n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return [f"BENCH_PROMPTS: bench.prompts: expected one of {PROMPT_SETS} or a prompts file, got "
            f"{spec!r}, which is neither{hint}"]


def _not_a_file(path: Path) -> str | None:
    """Why ``path`` is no regular file, or None."""
    return ("a directory" if path.is_dir() else None if path.is_file() else
            "not found" if not path.exists() else "not a regular file")


def bench_prompts_file_problem(b: Any) -> str | None:
    """``BENCH_PROMPTS`` message when ``bench.prompts`` (``b`` is the bench section) names no
    built-in set and is no existing file; ``BENCH_PROMPTS_FILE`` with the message of the
    benchmark's loader (:func:`eagle3.measure.prompts.load_prompts`, with ``bench.num_prompts``)
    when it refuses the file: empty, a record without prompt text, too few prompts."""
    from eagle3.errors import DataError
    from eagle3.measure.prompts import PROMPT_SETS, load_prompts

    spec = b.prompts
    if spec in PROMPT_SETS:
        return None
    if what := _not_a_file(Path(spec)):
        return (f"BENCH_PROMPTS: bench.prompts: expected one of {PROMPT_SETS} or an existing "
                f"prompts file (JSONL, JSON or text), got {spec!r} ({what})")
    try:
        load_prompts(spec, b.num_prompts)
    except (DataError, OSError, UnicodeDecodeError) as e:
        return (f"BENCH_PROMPTS_FILE: bench.prompts: expected a prompts file the benchmark reads "
                f"(bench.num_prompts {b.num_prompts}), got {spec!r}: {e}")
    return None


def _train_forward(cfg: Any) -> list[str]:
    t, out = cfg.train, []
    several = t.distributed == "fsdp" and t.num_gpus > 1
    if t.forward_impl == "project" and several:
        out.append("train.forward_impl project with train.distributed fsdp: FSDP gathers a layer's "
                   "weights around that layer's own forward, which this project's forward does not "
                   "call; expected train.distributed ddp, or train.forward_impl speculators / auto "
                   "(auto takes speculators' forward under fsdp)")
    auto_speculators = t.forward_impl == "auto" and several
    if t.attn_implementation == "flex" and (t.forward_impl == "speculators" or auto_speculators):
        why = (" (train.forward_impl auto takes speculators' forward under train.distributed fsdp "
               "with num_gpus > 1)" if auto_speculators else "")
        out.append("train.attn_implementation flex: expected auto, sdpa or eager with speculators' "
                   f"forward{why} (its flex path fails under torch.compile), got flex")
    elif t.attn_implementation == "flex" and t.device.startswith("cpu"):
        out.append("train.attn_implementation flex: expected auto, sdpa or eager with train.device "
                   "cpu (flex attention has no backward on the CPU; it is for compiled CUDA "
                   "training), got flex")
    if t.loss_implementation == "fused" and t.device.startswith("cpu"):
        out.append("train.loss_implementation fused: expected eager with train.device cpu "
                   "(speculators' fused losses are Triton kernels for CUDA), got fused")
    return out


WINDOW_GB = (1e-6, 1e6)  # extract.cache_max_gb's range: 1 kB to 1 PB


def _extract_cache(cfg: Any) -> list[str]:
    e, size = cfg.extract, cfg.extract.cache_max_gb
    if e.mode != "offline" and e.backend != "hf":
        return [f"MODE_BACKEND: extract.backend: expected 'hf' with extract.mode={e.mode} (the "
                "target runs inside the training process, through transformers), got "
                f"{e.backend!r}"]
    if size is not None and not (math.isfinite(size) and WINDOW_GB[0] <= size <= WINDOW_GB[1]):
        return [f"CACHE_SIZE_INVALID: extract.cache_max_gb: expected a size in GB from "
                f"{WINDOW_GB[0]:g} (1 kB) to {WINDOW_GB[1]:g} (1 PB) (the window of computed "
                f"states kept on disk), got {size!r}"]
    if e.mode == "cached" and size is None:
        return ["CACHE_SIZE_MISSING: extract.cache_max_gb: expected the window's size in GB "
                f"({WINDOW_GB[0]:g} to {WINDOW_GB[1]:g}) with extract.mode cached, got none"]
    return []


def _dev_prompts(cfg: Any) -> list[str]:
    t, d = cfg.train, cfg.data
    if (t.select_best_by != "measured" or t.dev_prompts_file
            or (d.val_fraction > 0 and d.num_conversations >= 2)):
        return []
    why = (f"data.val_fraction {d.val_fraction}" if d.val_fraction <= 0 else
           f"data.num_conversations {d.num_conversations} (a split needs 2)")
    return ["NO_DEV_PROMPTS: train.select_best_by measured: expected dev prompts from the "
            "validation split (data.val_fraction > 0, data.num_conversations >= 2) or from "
            f"train.dev_prompts_file, got {why} and no train.dev_prompts_file (set one, or "
            "train.select_best_by simulated)"]


# section -> [(keys, the key of that section deciding whether they are read, its default, the
# values that read them)]. Unused keys stay out of cache keys and settings digests
# (tasks/stage_config.py) and are warned about when set (:func:`config_warnings`).
UNUSED_UNLESS: dict[str, list[tuple[tuple[str, ...], str, Any, tuple[Any, ...]]]] = {
    "data": [(("path",), "source", "sharegpt", ("file",)),
             (("regenerate_url", "regenerate_timeout_s"), "regenerate", "none",
              ("sglang", "openai")),
             # blank answers count toward it in every mode
             (("regenerate_max_failed_share",), "regenerate", "none", ("hf", "sglang", "openai"))],
    "extract": [(("cache_max_gb",), "mode", "offline", ("cached",)),
                (("shard_size", "num_gpus", "startup_timeout_s", "stall_timeout_s"), "mode",
                 "offline", ("offline",)),
                (("sglang_engine_args", "sglang_env", "sglang_startup_timeout_s",
                  "sglang_request_timeout_s"), "backend", "hf", ("sglang",))],
    "train": [(("dev_prompts", "dev_max_new_tokens", "dev_prompts_file"), "select_best_by",
               "simulated", ("measured",)),
              (("compile_mode",), "compile", False, (True,))],
}
# {section: {key: its default}}: unused keys of UNUSED_UNLESS that the cache keys hold at their
# default instead of dropping them, keeping older configs' keys (tasks/stage_config.used_values)
KEYED_AS_DEFAULT: dict[str, dict[str, Any]] = {
    "data": {"path": None},
    "extract": {"sglang_engine_args": {}, "shard_size": 64, "num_gpus": 1,
                "startup_timeout_s": 1800.0, "stall_timeout_s": 1800.0, "sglang_env": {},
                "sglang_startup_timeout_s": 1800.0, "sglang_request_timeout_s": 3600.0},
    "train": {"compile_mode": "default"}}
LOOPBACK_NAMES = ("localhost",)


def _unused_keys(cfg: Any) -> list[str]:
    return [f"UNUSED_KEY: {section}.{k} is set ({getattr(sec, k)!r}) but {section}.{decider} "
            f"{getattr(sec, decider)} never reads it (read only with {section}.{decider} "
            f"{' or '.join(map(str, readers))}); expected it unset here, got it set: it has no "
            "effect (and stays out of the cache keys)"
            for section, rules in UNUSED_UNLESS.items() for sec in [getattr(cfg, section)]
            for keys, decider, _default, readers in rules if getattr(sec, decider) not in readers
            for k in keys if k in sec.model_fields_set]


def _serve_host(cfg: Any) -> list[str]:
    host = cfg.serve.host
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name
        loopback = host.lower().removesuffix(".") in LOOPBACK_NAMES  # "localhost." is the FQDN
    if loopback:
        return []
    every = host.strip("[]") in ("0.0.0.0", "::")
    where = "binds every interface" if every else "binds a non-loopback interface"
    return [f"SERVE_HOST_EXPOSED: serve.host {host!r} {where}: the engine's HTTP API, which has "
            "no authentication, is reachable from other machines on the network; expected a "
            "loopback address (127.0.0.1, ::1 or localhost) unless that is intended"]


def config_warnings(cfg: Any) -> list[str]:
    """Likely mistakes that load, one ``CODE: message`` each (the caller logs them): a set key the
    settings leave unused (``UNUSED_KEY``, :data:`UNUSED_UNLESS`), a non-loopback ``serve.host``
    (``SERVE_HOST_EXPOSED``)."""
    return _unused_keys(cfg) + _serve_host(cfg)


def dev_prompts_file_problem(t: Any) -> str | None:
    """``DEV_PROMPTS_FILE`` message unless ``train.dev_prompts_file`` (read with
    ``train.select_best_by=measured``; ``t`` is the train section) is an existing file that the
    dev acceptance's loader (:func:`eagle3.measure.prompts.file_prompts`) reads prompts from."""
    if t.select_best_by != "measured" or not t.dev_prompts_file:
        return None
    path = Path(t.dev_prompts_file).expanduser()
    if what := _not_a_file(path):
        return (f"DEV_PROMPTS_FILE: train.dev_prompts_file: expected a prompts file (JSONL, JSON "
                f"or text: the eagle3 bench --prompts FILE formats), got {str(path)!r} ({what})")
    from eagle3.errors import DataError
    from eagle3.measure.prompts import file_prompts

    try:
        file_prompts(path)
    except (DataError, OSError, UnicodeDecodeError) as e:
        return (f"DEV_PROMPTS_FILE: train.dev_prompts_file: expected a prompts file the dev "
                f"acceptance reads, got {str(path)!r}: {e}")
    return None


def serve_host_problem(serve: Any) -> str | None:
    """``SERVE_HOST`` message when ``serve.host`` (``serve``: the serve section) cannot be bound
    here at port 0: an address this machine lacks, a name that does not resolve (no retry helps)."""
    import errno
    import socket

    host = serve.host
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                       socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError as e:
            why = e.strerror or str(e)
            if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
                return (f"SERVE_HOST: serve.host: expected an address of this machine (or a name "
                        f"that resolves to one) to bind, got {host!r}: binding it gives {why}; "
                        "fix: serve.host 127.0.0.1, or an address this machine has")
            return (f"SERVE_HOST: serve.host: expected a free port to bind on {host!r}, binding "
                    f"port 0 gives {why}")
    return None


def before_run_problems(cfg: Any, target_dir: str | Path | None = None) -> list[str]:
    """The checks the stages repeat at their start that need files but no model, for ``eagle3
    preflight``, one ``CODE: message`` per problem, each from its one home: ``DATA_PATH`` /
    ``AUX_LAYER_IDS`` / ``DATA_SHORT`` (:func:`eagle3.extract.precheck.check_before_run`; the
    last with ``data.on_short=fail``), ``DEV_PROMPTS_FILE``, ``BENCH_PROMPTS`` /
    ``BENCH_PROMPTS_FILE``, ``SERVE_HOST`` (the ``*_problem`` functions here),
    ``DRAFT_VOCAB_SIZE`` against the vocabulary in ``target_dir``'s config.json when readable
    (:func:`eagle3.train.vocab.check_draft_vocab_size`)."""
    from eagle3.errors import ConfigError
    from eagle3.extract.precheck import check_before_run

    out = []
    try:
        usable = check_before_run(cfg)
    except ConfigError as e:
        msg = str(e)
        coded = re.match(r"[A-Z][A-Z0-9_]+: ", msg) is not None  # already CODE: message
        out.append(msg if coded else
                   f"{'DATA_PATH' if msg.startswith('data.path') else 'AUX_LAYER_IDS'}: {msg}")
    else:  # the extraction's selection may leave out more: this is the least it would refuse
        if usable is not None and cfg.data.on_short == "fail" \
                and usable < cfg.data.num_conversations:
            out.append(f"DATA_SHORT: data.path {cfg.data.path} holds {usable} usable "
                       f"conversations, data.num_conversations={cfg.data.num_conversations} "
                       "asked; data.on_short=fail stops the extraction")
    out += [p for p in (dev_prompts_file_problem(cfg.train), bench_prompts_file_problem(cfg.bench),
                        serve_host_problem(cfg.serve)) if p]
    vocab = (target_text_config(target_dir) or {}).get("vocab_size")
    if isinstance(vocab, int) and not isinstance(vocab, bool):
        from eagle3.train.vocab import check_draft_vocab_size

        try:
            check_draft_vocab_size(cfg.train.draft_vocab_size, vocab)
        except ConfigError as e:
            out.append(f"DRAFT_VOCAB_SIZE: {e}")
    return out


def cross_section_problems(cfg: Any) -> list[str]:
    """Every rule of the module docstring that ``cfg`` (a RunConfig) breaks; empty when none."""
    return (_serving(cfg) + _train_forward(cfg) + _extract_cache(cfg) + _dev_prompts(cfg)
            + _bench_prompts(cfg))
