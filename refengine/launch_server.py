"""Command line of the reference engine, with SGLang's flag names (the profile's release)
(``sglang/srt/server_args.py``).

Implemented: ``--model-path``, ``--tokenizer-path``, ``--speculative-algorithm EAGLE3``,
``--speculative-draft-model-path``, ``--speculative-num-steps``, ``--speculative-eagle-topk 1``,
``--speculative-num-draft-tokens`` (= steps + 1 for chain drafting), ``--host``, ``--port``,
``--dtype``, ``--context-length`` (also the size of the fast path's static KV caches),
``--served-model-name``, ``--skip-server-warmup``, ``--device``, ``--disable-cuda-graph`` (the fast
path's CUDA graphs off; they are on by default on a CUDA device), and the reference engine's own
``--disable-spec-aux-capture`` (feed the draft one layer's state: the broken-integration demo).
Without ``--speculative-algorithm`` the engine serves plain decoding (no draft; SGLang's behaviour),
through the same fast path. Accepted because they hold trivially here: ``--enable-metrics`` (metrics
are always on), ``--tp``/``--tp-size 1``, ``--log-level``, ``--random-seed``. Any other flag is
refused by name with exit code 2, as are values this engine cannot honour (topk > 1, tp > 1, a draft
without ``--speculative-algorithm``, …).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

# (flag, kwargs) — SGLang names; dest is the flag without dashes, "-" → "_"
_FLAGS: list[tuple[str, dict]] = [
    ("--model-path", dict(required=True)),
    ("--tokenizer-path", dict(default=None)),
    ("--speculative-algorithm", dict(default=None)),
    ("--speculative-draft-model-path", dict(default=None)),
    ("--speculative-num-steps", dict(type=int, default=None)),
    ("--speculative-eagle-topk", dict(type=int, default=None)),
    ("--speculative-num-draft-tokens", dict(type=int, default=None)),
    ("--host", dict(default="127.0.0.1")),
    ("--port", dict(type=int, default=30000)),
    ("--dtype", dict(default="auto", choices=["auto", "float32", "bfloat16", "float16"])),
    ("--context-length", dict(type=int, default=None)),
    ("--served-model-name", dict(default=None)),
    ("--device", dict(default="cpu")),
    ("--skip-server-warmup", dict(action="store_true")),
    ("--disable-spec-aux-capture", dict(action="store_true")),
    ("--enable-metrics", dict(action="store_true")),
    ("--disable-cuda-graph", dict(action="store_true")),
    ("--tp-size", dict(type=int, default=1)),
    ("--log-level", dict(default="info")),
    ("--random-seed", dict(type=int, default=0)),
]


@dataclass
class ServerArgs:
    """Parsed and checked flags (field names = SGLang's ``ServerArgs`` names)."""

    model_path: str
    tokenizer_path: str | None
    speculative_algorithm: str | None       # None: plain decoding (speculative_* fields None)
    speculative_draft_model_path: str | None
    speculative_num_steps: int | None
    speculative_eagle_topk: int | None
    speculative_num_draft_tokens: int | None
    host: str
    port: int
    dtype: str
    context_length: int | None
    served_model_name: str
    device: str
    skip_server_warmup: bool
    disable_spec_aux_capture: bool
    random_seed: int
    log_level: str
    disable_cuda_graph: bool = False


class UsageError(Exception):
    """A flag or value the reference engine refuses (exit code 2)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m refengine.launch_server", allow_abbrev=False,
        description="reference engine (SGLang-compatible API, real EAGLE-3 decoding; CPU or CUDA)")
    for flag, kw in _FLAGS:
        names = [flag, "--tp"] if flag == "--tp-size" else [flag]
        p.add_argument(*names, **kw)
    return p


def parse_args(argv: list[str]) -> ServerArgs:
    """Parse SGLang-style flags; raises UsageError naming every unimplemented flag or unsupported
    value."""
    ns, unknown = _parser().parse_known_args(argv)
    if unknown:
        flags = sorted({u.split("=", 1)[0] for u in unknown if u.startswith("-")})
        raise UsageError(f"the reference engine does not implement {flags or unknown} (it "
                         "implements: "
                         f"{', '.join(f for f, _ in _FLAGS)})")
    if ns.tp_size != 1:
        raise UsageError(f"--tp-size: the reference engine runs on one device, got {ns.tp_size}")
    if not 0 <= ns.port <= 65535:
        raise UsageError(f"--port: expected 0..65535, got {ns.port}")
    if str(ns.device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device: {ns.device!r} but torch sees no CUDA device "
                             f"(torch {torch.__version__}); expected cpu here")
    if ns.context_length is not None and ns.context_length < 2:
        raise UsageError(f"--context-length: expected >= 2 positions, got {ns.context_length}")
    nums = (ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens)
    if ns.speculative_algorithm is None:
        flags = (("--speculative-draft-model-path", ns.speculative_draft_model_path),
                 ("--speculative-num-steps", nums[0]), ("--speculative-eagle-topk", nums[1]),
                 ("--speculative-num-draft-tokens", nums[2]))
        given = [f for f, v in flags if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: given without --speculative-algorithm EAGLE3 "
                             "(plain decoding "
                             "serves no draft); expected --speculative-algorithm EAGLE3 or none of "
                             "them")
        return _server_args(ns, None, (None, None, None))
    if ns.speculative_algorithm.upper() != "EAGLE3":
        raise UsageError("--speculative-algorithm: expected EAGLE3, got "
                         f"{ns.speculative_algorithm!r}")
    if not ns.speculative_draft_model_path:
        raise UsageError("--speculative-draft-model-path: required for EAGLE3, got none")
    if any(v is None for v in nums) and any(v is not None for v in nums):
        raise UsageError("--speculative-num-steps, --speculative-eagle-topk, "
                         "--speculative-num-draft-tokens: set "
                         f"all three or none, got {list(nums)}")
    steps, topk, ndraft = nums if nums[0] is not None else (3, 1, 4)
    if steps < 1:
        raise UsageError(f"--speculative-num-steps: expected >= 1, got {steps}")
    if topk != 1:
        raise UsageError("--speculative-eagle-topk: the reference engine implements chain "
                         "drafting only "
                         f"(topk 1), got {topk}")
    if ndraft != steps + 1:
        raise UsageError("--speculative-num-draft-tokens: chain drafting (topk 1) verifies "
                         "num_steps + 1 = "
                         f"{steps + 1} tokens, got {ndraft}")
    return _server_args(ns, "EAGLE3", (steps, topk, ndraft))


def _server_args(ns, algorithm: str | None, nums: tuple) -> ServerArgs:
    steps, topk, ndraft = nums
    return ServerArgs(
        model_path=ns.model_path, tokenizer_path=ns.tokenizer_path, speculative_algorithm=algorithm,
        speculative_draft_model_path=ns.speculative_draft_model_path, speculative_num_steps=steps,
        speculative_eagle_topk=topk, speculative_num_draft_tokens=ndraft, host=ns.host,
        port=ns.port,
        dtype=_dtype(ns.dtype, ns.device), context_length=ns.context_length,
        served_model_name=ns.served_model_name or ns.model_path, device=ns.device,
        skip_server_warmup=ns.skip_server_warmup,
        disable_spec_aux_capture=ns.disable_spec_aux_capture,
        random_seed=ns.random_seed, log_level=ns.log_level,
        disable_cuda_graph=ns.disable_cuda_graph)


def _dtype(value: str, device: str) -> str:
    """``--dtype auto``: bfloat16 where bf16 is fast on ``device`` (CUDA; a CPU with
    AMX/AVX512-BF16, measured), else float32 (eagle3.precision)."""
    from eagle3.precision import resolve_dtype

    return resolve_dtype(value, device)


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse flags (exit 2 on a refused flag), then serve until SIGTERM/SIGINT."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    from refengine.server import serve

    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
