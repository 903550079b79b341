"""Checks across config sections, made when a config is loaded: before extraction or training spends hours on a
run whose serving settings cannot work as written.

Each rule returns a message naming the keys, both values and what to change (``RunConfig`` turns them into one
ConfigError). The rules:

- ``serve.speculative_num_steps`` ≤ ``train.ttt_steps``. The draft is trained to predict ``ttt_steps`` steps ahead,
  feeding itself its own hidden state (training-time test); a served step beyond that runs the draft further
  from the target's states than it ever was in training, so those positions accept little. Fewer served steps
  than trained ones are fine (the later trained steps simply go unused).
- Chain drafting (``speculative_eagle_topk`` 1) verifies ``steps + 1`` tokens: SGLang 0.5.23 silently rewrites
  any other ``speculative_num_draft_tokens`` to that (:mod:`eagle3.engines.sglang.serving`), the reference engine
  refuses it; so does this check, for every engine.
- The reference engine (``serve.engine: reference``) does chain drafting on one device: top-k 1, no tensor
  parallelism, none of SGLang's GPU memory settings, no ``max_running_requests``.
- SGLang resets ``max_running_requests`` to 48 when speculation is on and it is unset: ``bench.concurrency``
  above the number of requests the engine runs at once would measure queueing.
- ``SGLANG_SIMULATE_ACC_LEN`` in ``serve.env`` makes SGLang report made-up acceptance: refused.
- ``train.forward_impl: project`` cannot run under ``train.distributed: fsdp`` on several GPUs, and
  ``train.attn_implementation: flex`` is only for this project's forward (:mod:`eagle3.train.ttt_forward`;
  ``forward_impl: auto`` takes speculators' under fsdp on several GPUs) and not for ``train.device: cpu`` (no
  backward there; ``device: auto`` is checked when training starts, on the machine that trains).

This module reads a ``RunConfig`` by attribute and never imports :mod:`eagle3.config` (which calls it).
"""

from __future__ import annotations

from typing import Any

from eagle3.engines.sglang.serving import SPEC_DEFAULT_MAX_RUNNING_REQUESTS, flag_value, simulated_acceptance


def _steps(cfg: Any) -> list[str]:
    s, t = cfg.serve, cfg.train
    out = []
    if s.speculative_num_steps > t.ttt_steps:
        out.append(f"serve.speculative_num_steps {s.speculative_num_steps} > train.ttt_steps {t.ttt_steps}: served "
                   f"draft steps {t.ttt_steps + 1}..{s.speculative_num_steps} run the draft on its own hidden states "
                   f"further than training ever did, so those positions are untrained and accept little; expected "
                   f"serve.speculative_num_steps <= train.ttt_steps (raise train.ttt_steps to "
                   f"{s.speculative_num_steps} or lower serve.speculative_num_steps)")
    if s.speculative_eagle_topk == 1 and s.speculative_num_draft_tokens != s.speculative_num_steps + 1:
        out.append(f"serve.speculative_num_draft_tokens: chain drafting (speculative_eagle_topk 1) verifies "
                   f"speculative_num_steps + 1 = {s.speculative_num_steps + 1} tokens, got "
                   f"{s.speculative_num_draft_tokens} (SGLang 0.5.23 would silently use "
                   f"{s.speculative_num_steps + 1}; the reference engine refuses it)")
    return out


def _reference(cfg: Any) -> list[str]:
    s = cfg.serve
    if s.engine != "reference":
        return []
    bad = {k: v for k, v in (("serve.speculative_eagle_topk", s.speculative_eagle_topk if s.speculative_eagle_topk != 1
                                                            else None),
                             ("serve.tp", s.tp if s.tp != 1 else None),
                             ("serve.mem_fraction_static", s.mem_fraction_static),
                             ("serve.cuda_graph_max_bs", s.cuda_graph_max_bs),
                             ("serve.max_running_requests", s.max_running_requests)) if v is not None}
    if not bad:
        return []
    return [f"serve.engine reference: it does chain drafting on one device and cannot honour {bad}; expected "
            f"serve.speculative_eagle_topk 1, serve.tp 1 and mem_fraction_static, cuda_graph_max_bs, "
            f"max_running_requests unset (SGLang settings), or serve.engine sglang"]


def _sglang(cfg: Any) -> list[str]:
    s, b = cfg.serve, cfg.bench
    out = []
    if s.engine in ("sglang", "auto"):
        arg = flag_value(s.extra_args, "--max-running-requests")
        mrr = int(arg) if arg not in (None, "true") and arg.isdigit() else s.max_running_requests
        running = SPEC_DEFAULT_MAX_RUNNING_REQUESTS if mrr is None else mrr
        if b.concurrency > running:
            why = (f"SGLang 0.5.23 resets max_running_requests to {SPEC_DEFAULT_MAX_RUNNING_REQUESTS} when speculative "
                   "decoding is on and it is unset" if mrr is None else f"serve.max_running_requests is {mrr}")
            out.append(f"bench.concurrency {b.concurrency}: expected at most the {running} requests the engine runs "
                       f"at once ({why}); the benchmark would measure queueing, not concurrency {b.concurrency}: set "
                       f"serve.max_running_requests >= {b.concurrency} or lower bench.concurrency")
    sim = simulated_acceptance(s.env)
    if sim is not None:
        out.append(f"serve.env.{sim[0]}: expected unset (or <= 0), got {sim[1]!r}: SGLang then simulates the "
                   f"acceptance length, and no measured figure may come from such a server")
    return out


def _train_forward(cfg: Any) -> list[str]:
    t = cfg.train
    out = []
    if t.forward_impl == "project" and t.distributed == "fsdp" and t.num_gpus > 1:
        out.append("train.forward_impl project with train.distributed fsdp: FSDP gathers a layer's weights around that "
                   "layer's own forward, which this project's forward does not call; expected train.distributed ddp, "
                   "or train.forward_impl speculators / auto (auto takes speculators' forward under fsdp)")
    auto_speculators = t.forward_impl == "auto" and t.distributed == "fsdp" and t.num_gpus > 1
    if t.attn_implementation == "flex" and (t.forward_impl == "speculators" or auto_speculators):
        why = (" (train.forward_impl auto takes speculators' forward under train.distributed fsdp with num_gpus > 1)"
               if auto_speculators else "")
        out.append(f"train.attn_implementation flex: expected auto, sdpa or eager with speculators' forward{why} "
                   "(its flex path failed under torch.compile on the H200), got flex")
    elif t.attn_implementation == "flex" and t.device.startswith("cpu"):
        out.append("train.attn_implementation flex: expected auto, sdpa or eager with train.device cpu (flex "
                   "attention has no backward on the CPU; it is for compiled CUDA training), got flex")
    if t.loss_implementation == "fused" and t.device.startswith("cpu"):
        out.append("train.loss_implementation fused: expected eager with train.device cpu (speculators' fused losses "
                   "are Triton kernels for CUDA), got fused")
    return out


def cross_section_problems(cfg: Any) -> list[str]:
    """Every cross-section rule of the module docstring that ``cfg`` (a RunConfig) breaks; empty when none."""
    return _steps(cfg) + _reference(cfg) + _sglang(cfg) + _train_forward(cfg)
