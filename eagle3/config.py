"""Run configuration: one pydantic schema (``extra="forbid"``), YAML files in ``configs/``, ``-o
a.b=c`` overrides. Every section belongs to one stage, so a stage's cache key can be built from its
own section only. Units are in the field names or descriptions: tokens, seconds, bytes.

Raises :class:`eagle3.errors.ConfigError` for unreadable files, unknown keys, wrong types and bad
overrides; the message names the file and the dotted key with the expected and actual value."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo,
                      field_validator, model_serializer, model_validator)
from pydantic_core import PydanticCustomError

from eagle3.engines.sglang.profile import RELEASES, VERSION as SGLANG_VERSION
from eagle3.errors import ConfigError
from eagle3.overrides import apply_overrides, format_validation_error, load_yaml

log = logging.getLogger(__name__)

# Defaults shared by a config section, the library function it feeds and the CLI option.
BENCH_PROMPTS = "mtbench"
BENCH_NUM_PROMPTS = 8  # prompts (MT-Bench, round-robin over categories: one per category)
BENCH_MAX_NEW_TOKENS = 64  # tokens generated per prompt
BENCH_REQUEST_TIMEOUT_S = 600.0  # seconds per benchmark request
GATE_TIMEOUT_S = 600.0  # seconds: the readiness gate's overall deadline (start-up included)
GATE_STALL_TIMEOUT_S = 120.0  # seconds without any progress signal (log, CPU, GPU) → stalled
GATE_POLL_INTERVAL_S = 1.0  # seconds between probes
GATE_PROBE_TIMEOUT_S = 120.0  # seconds for the generation probe once /health answers


@lru_cache(maxsize=None)
def _number_kind(annotation: Any) -> tuple[type | None, bool]:
    """``(int or float, whether a list of them)`` for an annotation (``X | None`` read as ``X``),
    else ``(None, False)``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            return None, False
        annotation = args[0]
    if typing.get_origin(annotation) is list:
        inner = typing.get_args(annotation)
        return (inner[0] if inner and inner[0] in (int, float) else None), True
    return (annotation if annotation in (int, float) else None), False


def _loose_number(v: Any, kind: type) -> str | None:
    """Why ``v`` is refused for an ``int`` / ``float`` field although pydantic's lax mode would
    convert it, else None: a boolean is no number; an integer field takes no string (a quoted
    ``"256"``). Float fields keep strings: YAML reads ``1e-3`` (no dot) as a string."""
    want = "an integer" if kind is int else "a number"
    if isinstance(v, bool):
        return (f"expected {want}, got the boolean {v} (YAML reads true/false/yes/no/on/off as "
                "booleans)")
    if kind is int and isinstance(v, str):
        return f"expected {want}, got the string {v!r} (write the number without quotes)"
    return None


class _Section(BaseModel):
    """Refuses unknown keys, validates assignments, takes numbers only as numbers
    (:func:`_loose_number`; pydantic itself refuses fractional floats for integers)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_as_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        kind, many = _number_kind(cls.model_fields[info.field_name].annotation)
        if kind is None or v is None:
            return v
        for i, item in enumerate(v if many and isinstance(v, list) else [v]):
            if why := _loose_number(item, kind):
                at = f" (item {i} of the list)" if many else ""
                raise PydanticCustomError("loose_number", why + at,
                                          {"shows_input": True, "code": "NUMBER_TYPE"})
        return v


class PathsConfig(_Section):
    """Where prepared assets and run outputs live (both outside git)."""

    cache_dir: str | None = Field(None, description="Prepared assets (converted target, datasets). "
                                  "Default: $EAGLE3_CACHE or ~/.cache/eagle3-pipeline.")
    runs_dir: str = Field("runs", description="Run outputs; relative to the working directory.")

    def resolved_cache_dir(self) -> Path:
        """``cache_dir``, else ``$EAGLE3_CACHE``, else ``~/.cache/eagle3-pipeline``."""
        raw = self.cache_dir or os.environ.get("EAGLE3_CACHE") or "~/.cache/eagle3-pipeline"
        return Path(raw).expanduser().resolve()

    def resolved_runs_dir(self) -> Path:
        return Path(self.runs_dir).expanduser().resolve()


class TinyRandomTarget(_Section):
    """Shape of a randomly initialised Llama target (for fast tests). Weights come from ``seed``."""

    num_hidden_layers: int = Field(6, ge=1, le=1024)
    hidden_size: int = Field(64, ge=8, le=1 << 17)
    intermediate_size: int = Field(128, ge=8, le=1 << 20)
    num_attention_heads: int = Field(4, ge=1, le=4096)
    num_key_value_heads: int = Field(2, ge=1, le=4096)
    vocab_size: int = Field(512, ge=16, le=1 << 24,
                            description="The tokenizer is SmolLM2's, cut to this many ids.")
    max_position_embeddings: int = Field(2048, ge=16, le=1 << 31)
    rope_theta: float = 10000.0
    seed: int = 0



class TargetConfig(_Section):
    """The target (verifier) model."""

    kind: Literal["smollm2", "tiny-random", "hf"] = "smollm2"
    path: str | None = Field(None, description="An HF model folder; required when kind == 'hf' "
                             "and refused otherwise (the other kinds build their own folder).")
    tiny: TinyRandomTarget = Field(default_factory=TinyRandomTarget)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto = bfloat16 where bf16 is really fast on the extraction device "
        "(CUDA; a CPU with AMX/AVX512-BF16, measured), else float32 (eagle3.precision).")
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _path_for_hf(self) -> TargetConfig:
        if self.kind == "hf" and not self.path:
            raise ValueError("target.path is required when target.kind is 'hf' (got none)")
        return self

    @field_validator("path")
    @classmethod
    def _path_only_for_hf(cls, v: str | None, info: ValidationInfo) -> str | None:
        # the other kinds are prepared into the cache: a path would be ignored yet enter cache keys
        kind = info.data.get("kind")
        if v and kind is not None and kind != "hf":
            raise ValueError(f"target.kind {kind!r} prepares its own model folder and never "
                             "reads target.path; expected no target.path, or target.kind 'hf' to "
                             "use that folder (-o target.kind=hf)")
        return v


class DataConfig(_Section):
    """Training conversations."""

    source: Literal["sharegpt", "file", "instructions"] = Field(
        "sharegpt", description="sharegpt = the English ShareGPT conversations; file = "
        "data.path; instructions = the English prompts of five instruction benchmarks "
        "(eagle3.assets.prepare_instructions), without answers: data.regenerate must give them.")
    path: str | None = Field(None, description="Conversations (JSON/JSONL/txt), source 'file'.")
    num_conversations: int = Field(128, ge=1)
    on_short: Literal["warn", "fail"] = Field("warn", description="When the data gives fewer "
        "usable conversations than num_conversations (DATA_SHORT): warn and extract what there "
        "is, or fail before any hidden state is extracted (a sweep's data-size point).")
    max_seq_len: int = Field(512, ge=16, le=1 << 22, description="Tokens per sample after "
                             "templating; longer ones are cut and counted as truncated.")
    val_fraction: float = Field(0.05, ge=0.0, lt=1.0)
    seed: int = 0
    chat_template_kwargs: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="Template switches passed to apply_chat_template, e.g. "
        "{enable_thinking: false}; recorded in the hidden-states manifest.")
    max_unstable_template_share: float = Field(0.05, ge=0.0, le=1.0, description="Largest share "
        "of the conversations tried, or of their tokens, that may be dropped because the chat "
        "template renders an earlier turn differently once later turns follow (no loss mask); "
        "above it extraction is refused (TEMPLATE_UNSTABLE), else warned about and recorded.")
    regenerate: Literal["none", "hf", "sglang", "openai"] = Field("none", description="Replace "
        "assistant turns by the target's own greedy answers before extraction: 'hf' (batched "
        "generate in this process), 'sglang' (SGLang's native /generate: the server at "
        "regenerate_url, else the target launched with serve.* and no draft), 'openai' "
        "(chat/completions at regenerate_url).")
    regenerate_url: str | None = Field(None, description="'sglang': the server's base URL "
        "(none: launch one); 'openai': the base URL ending in /v1.")
    regenerate_max_new_tokens: int = Field(256, ge=1, le=32768,
                                           description="Tokens per regenerated assistant turn.")
    regenerate_max_rounds: int | None = Field(None, ge=1, description="Regenerate only the first "
        "N assistant turns and drop the turns after them (None = every turn, in order).")
    regenerate_timeout_s: float = Field(600.0, gt=0, description="Seconds one request to a "
        "regeneration server may take (per attempt; 3 attempts for transient failures).")
    regenerate_max_failed_share: float = Field(0.05, ge=0.0, le=1.0, description="Largest share "
        "of a chunk's turns that may fail (refused, aborted) or come back blank before "
        "regeneration stops (REGEN_FAILED; the chunk is not saved, so a re-run asks again).")
    regenerate_batch_size: int | None = Field(None, ge=1, le=4096, description="Conversations per "
        "batched generate call, or requests open at once to a server, where conversations go "
        "side by side, each turn asked once its earlier turns are answered (None = "
        "extract.batch_size).")

    @field_validator("regenerate_url")
    @classmethod
    def _url_with_scheme(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"https?://[^/]", v, re.IGNORECASE):
            raise ValueError("expected a URL starting with http:// or https:// (e.g. "
                             "http://127.0.0.1:30000)")
        if v is not None:
            from urllib.parse import urlsplit

            try:
                urlsplit(v).port
            except ValueError as e:
                raise ValueError(f"expected a URL with a port in 0-65535 ({e})") from None
        return v

    @model_validator(mode="after")
    def _path_for_file(self) -> DataConfig:
        if self.source == "file" and not self.path:
            raise PydanticCustomError("data_path_required", "data.path is required when "
                                      "data.source is 'file' (got none)",
                                      {"shows_input": True, "code": "DATA_PATH"})
        if self.source == "instructions" and self.regenerate == "none":
            raise PydanticCustomError("data_answers_required", "data.source 'instructions' holds "
                                      "prompts without answers: expected data.regenerate hf, "
                                      "sglang or openai, got 'none'",
                                      {"shows_input": True, "code": "DATA_NO_ANSWERS"})
        return self


class ExtractConfig(_Section):
    """Hidden-state extraction."""

    mode: Literal["offline", "online", "cached"] = Field(
        "offline", description="offline = every sample's hidden states are written to disk and "
        "read by training; online = only the tokenized samples are written and training runs the "
        "target on its own device for each micro-batch (0 bytes of states on disk, the target's "
        "forward repeated every epoch); cached = online, keeping computed states in a window of "
        "cache_max_gb on disk that later epochs read. Online and cached need backend 'hf'.")
    cache_max_gb: float | None = Field(None, description="mode 'cached': the window's size in "
        "GB (1e9 bytes) under the train folder's state/, from 1e-6 (1 kB) to 1e6 (1 PB); "
        "required there, unused otherwise (and then kept out of the cache keys).")
    backend: Literal["hf", "sglang"] = "hf"
    aux_layer_ids: list[int] | None = Field(None, description="HF hidden_states indices (= input "
        "of layer i). Default: EAGLE-3's [2, L//2, L-3].")
    dtype: Literal["auto", "bfloat16", "float32", "fp8"] = Field(
        "auto", description="Storage dtype of the hidden states; auto = bfloat16 where bf16 is "
        "fast on the extraction device, else float32 (eagle3.precision).")
    batch_size: int = Field(4, ge=1, le=1 << 16)
    shard_size: int = Field(64, ge=1, le=1 << 20,
                            description="Samples per committed shard (resume granularity).")
    device: str = Field("auto", description="'auto', 'cpu', 'cuda' or 'cuda:N'.")
    num_gpus: int = Field(1, ge=1, description="backend 'hf': worker processes, one per GPU (CPU "
                          "workers on a CPU).")
    startup_timeout_s: float = Field(1800.0, gt=0, description="backend 'hf' with num_gpus > 1: "
        "every worker must have loaded the target within this many seconds of the start (else "
        "RankFailed naming the workers).")
    stall_timeout_s: float = Field(1800.0, gt=0, description="backend 'hf' with num_gpus > 1: a "
        "worker that writes no batch for this many seconds (its first batch included) ends the "
        "extraction with RankFailed; committed shards are kept.")
    sglang_engine_args: dict[str, Any] = Field(default_factory=dict, description="backend "
        "'sglang': extra keyword arguments of sglang.Engine (e.g. tp_size, dp_size, "
        "mem_fraction_static; on a CPU: device, attention_backend, ...). The interpreter is "
        "serve.sglang_python.")
    sglang_env: dict[str, str] = Field(default_factory=dict, description="backend 'sglang': "
        "environment variables added for the SGLang worker (a PYTHONPATH here is appended after "
        "the project's capture plugin).")
    sglang_startup_timeout_s: float = Field(1800.0, gt=0, description="backend 'sglang': seconds "
                                            "for the engine to start.")
    sglang_request_timeout_s: float = Field(3600.0, gt=0,
                                            description="backend 'sglang': seconds for one batch.")

    @property
    def cache_max_bytes(self) -> int | None:
        """``cache_max_gb`` in bytes (GB = 1e9 bytes), rounded (``int(0.57 * 1e9)`` would be
        569,999,999); None when it is not set."""
        return None if self.cache_max_gb is None else round(self.cache_max_gb * 1e9)

    @model_serializer(mode="wrap")
    def _omit_unset_mode(self, handler):
        """The dump (cache keys, settings digests, manifests) leaves out ``mode`` while it is
        ``offline`` and ``cache_max_gb`` while None: a config setting neither keeps its keys."""
        out = handler(self)
        if isinstance(out, dict) and out.get("mode") == "offline":
            out.pop("mode")
        if isinstance(out, dict) and out.get("cache_max_gb") is None:
            out.pop("cache_max_gb", None)
        return out


class TrainConfig(_Section):
    """Draft training."""

    ttt_steps: int = Field(3, ge=1, le=64)
    draft_vocab_size: int = Field(8192, ge=2, le=1 << 24)
    pad_draft_vocab: bool = False
    num_layers: int = Field(1, ge=1, le=64)
    schedule: Literal["epochs", "constant"] = "epochs"
    epochs: float = Field(4.0, gt=0, description="Passes over the training split, fractional "
                          "too (ceil(epochs x steps per epoch) optimizer steps).")
    max_steps: int | None = Field(None, ge=0, description="Optimizer steps to run (0 = "
        "untrained): schedule 'constant' runs exactly this many, as many epochs as that takes "
        "whatever train.epochs says; schedule 'epochs' stops here or at its epochs' end, "
        "whichever comes first (its cosine spans the epochs).")
    lr: float = Field(3e-4, gt=0)
    warmup_steps: int = Field(10, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    grad_accum: int = Field(1, ge=1, le=1 << 16)
    max_tokens_per_batch: int = Field(512, ge=16, le=1 << 24,
                                      description="Tokens per packed micro-batch.")
    log_every: int = Field(10, ge=1)
    eval_every: int = Field(0, ge=0, description="Optimizer steps between evals (0 = epoch ends).")
    keep_last: int = Field(2, ge=1)
    seed: int = 0
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$",
                        description="auto, cpu, cuda or cuda:N.")
    num_gpus: int = Field(1, ge=1, description="Processes (one per GPU); > 1 launches torchrun.")
    distributed: Literal["ddp", "fsdp"] = Field("ddp", description="With num_gpus > 1: ddp (whole "
        "draft per rank) or fsdp (trainable modules, gradients and AdamW moments sharded over "
        "the ranks: for drafts whose trainable state is large).")
    startup_timeout_s: float = Field(600.0, gt=0, description="With num_gpus > 1: every rank must "
        "have joined the process group within this many seconds of the launch (else RankFailed "
        "naming the ranks that did not arrive).")
    first_step_timeout_s: float = Field(1800.0, gt=0, description="With num_gpus > 1: every rank "
        "must finish its first optimizer step within this many seconds of the last rank joining "
        "(loading data, building and compiling the draft included).")
    stall_timeout_s: float = Field(1800.0, gt=0, description="With num_gpus > 1: a rank whose "
        "optimizer step does not advance for this many seconds (an evaluation and a checkpoint "
        "write included) ends the run with RankFailed.")
    precision: Literal["auto", "float32", "bf16-autocast"] = Field(
        "auto", description="auto = bf16-autocast where bf16 is fast on the training device (CUDA; "
        "a CPU with AMX/AVX512-BF16, measured), else float32 (eagle3.precision).")
    norm_before_residual: bool | None = Field(
        None, description="None = what the serving engine's profile computes (SGLang: False).")
    allow_vocab_map_change: bool = False
    norm_before_fc: bool = Field(False, description="RMSNorm of the joined aux states before fc.")
    fc_norm: bool = Field(False, description="One RMSNorm per aux state before fc.")
    norm_output: bool = Field(False, description="Post-norm state to the next draft step.")
    lr_min_ratio: float = Field(0.0, ge=0, le=1, description="Cosine floor of schedule 'epochs', "
                                "as a fraction of lr.")
    checkpoint_every: int = Field(0, ge=0, description="Steps between checkpoints (0 = at evals).")
    export: Literal["best", "last"] = Field("best", description="Weights written as the draft: "
        "best simulated acceptance length at an evaluation, or last.")
    resume: bool = Field(True, description="Continue from the newest <out_dir>/state checkpoint.")
    on_other_checkpoint: Literal["restart", "refuse"] = Field(
        "restart", description="A checkpoint in <out_dir>/state made from other inputs (data, "
        "draft vocabulary, frozen train fields, layer flags, processes): restart = start from "
        "step 0 with a warning naming the difference; refuse = stop with it as the error.")
    init_from: str | None = Field(None, description="A speculators draft folder (weights only).")
    forward_impl: Literal["auto", "speculators", "project"] = Field(
        "auto", description="project = eagle3/train/ttt_forward.py (speculators' loss and "
        "gradients, one static graph); auto = project, speculators under fsdp.")
    attn_implementation: Literal["auto", "sdpa", "eager", "flex"] = Field(
        "auto", description="auto: project forward flex (CUDA, compiled) / sdpa (CUDA) / eager "
        "(CPU); speculators' forward sdpa (flex refused).")
    compile: bool = Field(False, description="torch.compile the forward (CUDA, static shapes).")
    compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = Field(
        "default", description="torch.compile mode; reduce-overhead = CUDA graphs.")
    pad_to_max_tokens: bool | None = Field(None, description="Pad every micro-batch to "
        "max_tokens_per_batch (one shape: compiles once; no loss on padding); None = compile.")
    max_eval_samples: int | None = Field(None, ge=1,
                                         description="Cap on validation samples per evaluation.")
    loss: str = Field("kl_div", description="speculators loss: a name (kl_div, ce, tv) or JSON.")
    loss_implementation: Literal["eager", "fused"] = Field("eager", description="fused: Triton.")
    loader_workers: int | None = Field(None, ge=0, description="Processes that read hidden-state "
        "files ahead of the device; None = 4 on CUDA, 0 on CPU.")
    optimizer_impl: Literal["auto", "default", "foreach", "fused"] = Field(
        "auto", description="AdamW; auto = fused on CUDA")
    select_best_by: Literal["simulated", "measured"] = Field("simulated", description="Picks the "
        "best checkpoint: simulated = val/simulated_acceptance_length (teacher-forced; "
        "overestimates serving); measured = dev/acceptance_length, the converted draft's greedy "
        "chain replay on the dev prompts (eagle3.measure.dev_acceptance), logged at every "
        "evaluation; rank 0 then holds the target beside the draft on the training device.")
    dev_prompts: int = Field(32, ge=1, le=4096, description="With select_best_by=measured: dev "
        "prompts (the first of the validation split's samples, their prompt part); the dev_* "
        "keys are unused, and kept out of the cache keys, with select_best_by=simulated.")
    dev_max_new_tokens: int = Field(64, ge=1, le=32768, description="With select_best_by="
        "measured: greedy tokens generated per dev prompt.")
    dev_prompts_file: str | None = Field(None, description="With select_best_by=measured: a "
        "prompts file (eagle3 bench --prompts FILE formats) used instead of the validation "
        "split; select_best_by=measured without it needs one (data.val_fraction > 0).")


class ConvertConfig(_Section):
    """Conversion to the serving engine's format."""

    engine: Literal["sglang"] = "sglang"
    engine_version: str = Field(SGLANG_VERSION, description="A pinned release: a key of "
                                "eagle3.engines.sglang.profile.RELEASES.")
    equivalence_atol: float = Field(2e-2, gt=0,
                                    description="Logit tolerance of the equivalence check.")

    @field_validator("engine_version", mode="before")
    @classmethod
    def _a_string(cls, v: Any) -> Any:
        # YAML reads 0.5 as a float: say what is expected instead of pydantic's "valid string"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            raise ValueError(f"expected a string naming a pinned SGLang release, one of "
                             f"{sorted(RELEASES)} (eagle3.engines.sglang.profile.RELEASES), got "
                             f"the number {v!r} (YAML reads {v!r} as a number: write the full "
                             f"release, e.g. {SGLANG_VERSION}, or quote it)")
        return v

    @field_validator("engine_version")
    @classmethod
    def _known_release(cls, v: str) -> str:
        if v not in RELEASES:
            raise ValueError(f"expected a pinned SGLang release, one of {sorted(RELEASES)} "
                             f"(eagle3.engines.sglang.profile.RELEASES)")
        return v


class ServeConfig(_Section):
    """Deployment: which engine, its flags, and the readiness gate."""

    engine: Literal["auto", "reference", "sglang"] = "auto"
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535, description="None = a free port is chosen.")
    speculative_num_steps: int = Field(3, ge=1, le=64)
    speculative_eagle_topk: int = Field(1, ge=1, le=64)
    speculative_num_draft_tokens: int = Field(4, ge=2, le=4096)
    tp: int = Field(1, ge=1, le=1024)
    max_running_requests: int | None = Field(None, ge=1, le=1 << 20, description="Requests the "
        "engine runs at once (SGLang --max-running-requests); None = SGLang's default, which is "
        "48 when speculative decoding is on.")
    mem_fraction_static: float | None = Field(None, gt=0, le=1)
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = Field(None, ge=1, le=1 << 16)
    context_length: int | None = Field(None, ge=1, le=1 << 31)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="SGLang: "
        "its own auto (the checkpoint's dtype). Reference engine and offline decoding: bfloat16 "
        "where bf16 is fast on serve.device, else float32 (eagle3.precision).")
    device: str = Field("auto", description="Reference engine and offline decoding: 'auto' (cuda "
                        "when available, else cpu), 'cpu', 'cuda' or 'cuda:N'.")
    cpu_threads: int | None = Field(1, ge=1, description="torch threads of the reference engine "
        "and of offline decoding on a CPU (None = torch's default, one per core). 1: a batch-1 "
        "verify pass ran 7-13x slower with 2 threads on 2 shared cores (lab/NOTEBOOK.md).")
    extra_args: list[str] = Field(default_factory=list,
                                  description="Passed through to the engine verbatim.")
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(GATE_TIMEOUT_S, gt=0)
    stall_timeout_s: float = Field(GATE_STALL_TIMEOUT_S, gt=0)
    poll_interval_s: float = Field(GATE_POLL_INTERVAL_S, gt=0)
    probe_timeout_s: float = Field(GATE_PROBE_TIMEOUT_S, gt=0)
    retry_without_cuda_graph: bool = False
    sglang_python: str | None = Field(None, description="Python of the environment that has "
        "SGLang (e.g. ~/.cache/eagle3-pipeline/venv-sglang/bin/python); None = this one.")
    stop_grace_s: float = Field(15.0, gt=0, description="Seconds between SIGTERM and SIGKILL of "
                                "the engine's group.")


class BenchConfig(_Section):
    """Acceptance benchmark."""

    prompts: str = Field(BENCH_PROMPTS, description="mtbench | gsm8k | humaneval | a file path.")
    num_prompts: int = Field(BENCH_NUM_PROMPTS, ge=1, le=10 ** 6)
    max_new_tokens: int = Field(BENCH_MAX_NEW_TOKENS, ge=1, le=1 << 20)
    temperature: float = Field(0.0, ge=0)
    concurrency: int = Field(1, ge=1, le=1 << 16)
    min_acceptance_length: float = Field(1.3, ge=0,
                                         description="The run fails below this (acceptance gate).")
    baseline_untrained: bool = True
    request_timeout_s: float = Field(BENCH_REQUEST_TIMEOUT_S, gt=0)


class TrackingConfig(_Section):
    """MLflow tracking (used by tasks/ and flows/, never by the library)."""

    mlflow_uri: str | None = Field(None, description="Default: sqlite:///<runs_dir>/mlflow.db")
    experiment: str = "eagle3-pipeline"


class RunConfig(_Section):
    """The whole run. One section per stage; ``name`` names the run directory."""

    name: str = "run"
    paths: PathsConfig = Field(default_factory=PathsConfig)
    target: TargetConfig = Field(default_factory=TargetConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    extract: ExtractConfig = Field(default_factory=ExtractConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    convert: ConvertConfig = Field(default_factory=ConvertConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    bench: BenchConfig = Field(default_factory=BenchConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    # how each ``auto`` was resolved (eagle3.precision.resolve_config); in no hash
    _auto_resolved: dict = PrivateAttr(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _one_folder(cls, v: str) -> str:
        """``name`` is one folder under ``paths.runs_dir``: no separator, not ``.``/``..``."""
        if not v.strip() or "/" in v or "\\" in v or v.strip(".") == "":
            raise ValueError("expected one folder name (no '/', '\\', '.' or '..')")
        return v

    @property
    def auto_resolved(self) -> dict[str, dict]:
        """``{"target.dtype": {"setting": "auto", "value": "float32", "device": "cpu", "why":
        ...}}`` for every setting that was ``auto``."""
        return self._auto_resolved

    @model_validator(mode="after")
    def _across_sections(self) -> RunConfig:
        from eagle3.config_checks import cross_section_problems  # reads this config by attribute

        if problems := cross_section_problems(self):
            raise ValueError("\n".join(problems))
        return self

    def run_dir(self) -> Path:
        """``<runs_dir>/<name>``: where every stage of this run writes its output directory."""
        return self.paths.resolved_runs_dir() / self.name

    def mlflow_uri(self) -> str:
        db = self.paths.resolved_runs_dir() / "mlflow.db"
        return self.tracking.mlflow_uri or f"sqlite:///{db}"

    def section_hash(self, *sections: str) -> str:
        """sha256 (hex, 16 chars) of the named sections' JSON, for cache keys and manifests."""
        payload = {s: getattr(self, s).model_dump(mode="json") for s in sections}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def save(self, path: str | Path) -> Path:
        """Write the config as YAML to ``path`` (a directory: ``<dir>/config.yaml``)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.yaml"
        path.write_text(self.to_yaml())
        return path


_PARSED: dict[tuple, RunConfig] = {}  # (file, its bytes' sha256, overrides) → validated config
_PARSED_MAX = 32


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML run config (``path`` None: all defaults), apply ``-o`` overrides
    (``["train.lr=1e-3"]``), validate, and resolve every ``auto`` dtype/precision
    (:func:`eagle3.precision.resolve_config`, :attr:`RunConfig.auto_resolved`). Parsed once per
    (file path, file bytes, overrides) per process, logging the warnings of
    :func:`eagle3.config_checks.config_warnings` then; each call gets a deep copy. ConfigError:
    file missing or a directory, empty or not YAML, a key written twice (``DUPLICATE_KEY``), top
    level not a mapping, unknown key (with the nearest known keys), wrong type or value."""
    text = None
    if path is not None:
        p = Path(path)
        if p.is_dir():
            inside = sorted(f.name for f in p.glob("*.y*ml"))
            hint = f" (YAML files in it: {', '.join(inside[:8])})" if inside else ""
            raise ConfigError(f"config file {p}: expected a YAML file, got a directory{hint}")
        if not p.is_file():
            raise ConfigError(f"config file {p}: not found")
        text = p.read_text()
    key = (str(Path(path).resolve()) if path is not None else None,
           hashlib.sha256(text.encode()).hexdigest() if text is not None else None,
           tuple(overrides or []))
    if key not in _PARSED:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.pop(next(iter(_PARSED)))
        parsed = _parse(path, text, list(overrides or []))
        from eagle3.config_checks import config_warnings
        from eagle3.precision import resolve_config

        parsed._auto_resolved = resolve_config(parsed)
        for message in config_warnings(parsed):
            log.warning("%s [config %s]", message, "<defaults>" if path is None else path)
        _PARSED[key] = parsed
    return _PARSED[key].model_copy(deep=True)


def _parse(path: str | Path | None, text: str | None, overrides: list[str]) -> RunConfig:
    data: dict = {}
    if text is not None:
        try:
            data = load_yaml(text, str(path))
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path}: not valid YAML ({e})") from e
        if data is None:  # an empty file (or comments only) is a mistake, not "all defaults"
            raise ConfigError(f"config file {path}: expected a mapping of sections (name, target, "
                              "data, ...), got an empty document")
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path}: expected a mapping at the top level, got "
                              f"{type(data).__name__}")
    apply_overrides(data, overrides)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        source = "<defaults>" if path is None else str(path)
        raise ConfigError(format_validation_error(e, source, overrides, RunConfig)) from e
