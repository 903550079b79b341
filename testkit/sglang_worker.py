"""The SGLang side of the conformance harness: runs ONLY inside ``.venv-sglang`` (test harness, not
product).

Started by :func:`testkit.sglang_harness.run_jobs` as
``.venv-sglang/bin/python testkit/sglang_worker.py JOBS.json RESULTS.json`` with
``TRITON_INTERPRET=1`` and ``testkit/sglang_shims`` on ``PYTHONPATH``. It imports only sglang,
torch, safetensors and transformers (never the project), so one process can check many checkpoints
after paying SGLang's import cost (~10 s) once. Each job is a dict; each result is a dict with the
job's ``name`` and ``op`` plus:

- ``op: "coverage"``, ``dir``: SGLang 0.5.23's own ``LlamaForCausalLMEagle3`` is built from
  ``dir/config.json`` on the CPU, every parameter is filled with NaN (the sentinel), then
  ``load_weights`` is fed every tensor of ``dir/*.safetensors`` (as SGLang's default loader does).
  Result: ``params`` (all parameter names), ``unfilled`` {name: fraction of elements still NaN},
  ``tensors`` (all tensor names), ``unconsumed`` (tensors that, loaded alone into a fresh NaN-filled
  model, filled nothing and set no ``hot_token_id``), ``ignored_by_design`` (``t2d``: SGLang skips
  it on purpose), ``replaced_at_runtime`` (``embed_tokens`` left unfilled but replaced by the
  target's embedding at serving time), ``unfilled_unused`` (parameters no tensor fills that SGLang's
  forward never reads: changing that one alone leaves an EXTEND forward's outputs unchanged; they
  are not in ``unfilled``), ``hot_token_id_set``, ``error`` (the exception text when building or
  loading raised, else ``None``).
- ``op: "forward"``, ``dir``, ``inputs`` (safetensors: ``input_ids [T] int64``,
  ``positions [T] int64``, ``hidden_states [T, W] float32``, optional ``target_embed [V, H]``),
  ``out`` (safetensors path written with ``logits [T, draft_vocab]``, ``hidden_prenorm [T, H]`` and
  ``last_logits [1, draft_vocab]``): one EXTEND-mode float32 forward through SGLang's
  ``TorchNativeAttnBackend`` with a real ``ReqToTokenPool`` / ``MHATokenToKVPool``. ``logits`` =
  SGLang's final-normed hidden states times its ``lm_head`` (all positions); ``last_logits`` comes
  from SGLang's own ``LogitsProcessor`` (the last position only, as the server computes it) and is a
  cross-check of the former.

The internal APIs used here (``init_single_process_dist``, ``ForwardBatch`` fields,
``forward_context``, pool constructors) are those of SGLang 0.5.23 exactly; expect to adjust them on
any upgrade.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

IGNORED_BY_DESIGN = ("t2d",)
EMBED = "model.embed_tokens.weight"


def _embed_shared(config) -> bool:
    """SGLang's ``LlamaForCausalLM.set_embed`` (``llama.py``) replaces the draft's embedding with
    the target's unless ``target_hidden_size`` is set and differs from ``hidden_size``."""
    tgt = getattr(config, "target_hidden_size", None)
    return tgt is None or tgt == config.hidden_size


def _setup() -> None:
    from sglang.test.layer_ut_utils import init_single_process_dist

    init_single_process_dist(backend="gloo")


def _build(draft_dir: Path):
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    torch.set_default_dtype(torch.float32)
    config = LlamaConfig.from_pretrained(str(draft_dir))
    return LlamaForCausalLMEagle3(config).eval()


def _fill_nan(model) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    model.hot_token_id = None


def _read_tensors(draft_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of the folder, chosen as SGLang's default loader does: ``*.safetensors`` when
    there is any, else ``*.bin``."""
    files = sorted(draft_dir.glob("*.safetensors"))
    use_st = bool(files)
    files = files or sorted(draft_dir.glob("*.bin"))
    if not files:
        raise FileNotFoundError(f"{draft_dir}: no *.safetensors or *.bin weight file")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(
            load_file(str(f))
            if use_st
            else torch.load(str(f), map_location="cpu", weights_only=True)
        )
    return tensors


def _nan_fraction(model) -> dict[str, float]:
    return {n: float(torch.isnan(p).float().mean()) for n, p in model.named_parameters()}


def coverage(draft_dir: Path) -> dict:
    """Sentinel-fill coverage of one checkpoint through SGLang's real ``load_weights`` (see module
    doc)."""
    out: dict = {
        "params": [],
        "unfilled": {},
        "tensors": [],
        "unconsumed": [],
        "ignored_by_design": [],
        "hot_token_id_set": False,
        "replaced_at_runtime": [],
        "unfilled_unused": [],
        "error": None,
    }
    try:
        model = _build(draft_dir)
        tensors = _read_tensors(draft_dir)
        out["params"] = [n for n, _ in model.named_parameters()]
        out["tensors"] = sorted(tensors)
        with torch.no_grad():
            _fill_nan(model)
            model.load_weights(iter(tensors.items()))
            out["hot_token_id_set"] = model.hot_token_id is not None
            out["unfilled"] = {n: f for n, f in _nan_fraction(model).items() if f > 0}
            if EMBED in out["unfilled"] and _embed_shared(model.config):
                out["replaced_at_runtime"].append(EMBED)
                del out["unfilled"][EMBED]
            out["unfilled_unused"] = _unused(
                model, list(out["unfilled"]), out["replaced_at_runtime"]
            )
            for name in out["unfilled_unused"]:
                del out["unfilled"][name]
            for name in sorted(tensors):
                if any(key in name for key in IGNORED_BY_DESIGN):
                    out["ignored_by_design"].append(name)
                    continue
                _fill_nan(model)
                model.load_weights(iter([(name, tensors[name])]))
                filled = [n for n, f in _nan_fraction(model).items() if f < 1.0]
                if not filled and model.hot_token_id is None:
                    out["unconsumed"].append(name)
    except (
        Exception
    ) as exc:  # reported to the caller as "fails to load", with the traceback's last lines
        out["error"] = f"{type(exc).__name__}: {exc}\n" + "".join(
            traceback.format_exc().splitlines(True)[-6:]
        )
    return out


def _probe_forward(model) -> torch.Tensor:
    """One EXTEND forward on fixed random inputs; returns logits and next-step hidden state
    concatenated."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    g = torch.Generator().manual_seed(0)
    n = 6
    ids = torch.randint(0, model.config.vocab_size, (n,), generator=g)
    hs = torch.randn(n, model.model.fc.in_features, generator=g)
    backend, batch = _extend_batch(model, ids, torch.arange(n), hs)
    with forward_context(ForwardContext(attn_backend=backend)):
        backend.init_forward_metadata(batch)
        normed, aux = model.model(ids, torch.arange(n), batch)
    return torch.cat([normed @ model.lm_head.weight.T, aux[0]], dim=-1)


def _unused(model, unfilled: list[str], replaced: list[str]) -> list[str]:
    """Unfilled parameters SGLang's forward never reads (e.g. ``layers.{i>=1}.input_layernorm``).

    Every unfilled (or runtime-replaced) parameter gets finite random values; then each unfilled one
    in turn is given two different random values: identical EXTEND-forward outputs show it is
    unused. (A NaN sentinel cannot be used for this probe: torch's CPU
    ``scaled_dot_product_attention`` returns finite output when a whole key tensor is NaN, so a
    missing ``k_proj`` would look unused.) All of them are reset to NaN afterwards.
    """
    params = dict(model.named_parameters())
    gen = torch.Generator().manual_seed(1)
    for name in unfilled + replaced:
        params[name].normal_(0.0, 0.3, generator=gen)
    unused = []
    for name in unfilled:
        saved = params[name].detach().clone()
        first = _probe_forward(model)
        params[name].normal_(0.0, 0.3, generator=gen)
        if torch.equal(first, _probe_forward(model)):
            unused.append(name)
        params[name].copy_(saved)
    for name in unfilled + replaced:
        params[name].fill_(float("nan"))
    return unused


class _Runner:
    """The three attributes ``TorchNativeAttnBackend.__init__`` reads from a model runner."""

    def __init__(self, req_to_token_pool, token_to_kv_pool):
        self.device = "cpu"
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool


def _extend_batch(
    model, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor
):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    cfg = model.config
    n = int(input_ids.shape[0])
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    req_pool = ReqToTokenPool(
        size=1, max_context_len=n + 8, device="cpu", enable_memory_saver=False
    )
    kv_pool = MHATokenToKVPool(
        size=n + 8,
        page_size=1,
        dtype=torch.float32,
        head_num=cfg.num_key_value_heads,
        head_dim=head_dim,
        layer_num=cfg.num_hidden_layers,
        device="cpu",
        enable_memory_saver=False,
    )
    out_cache_loc = torch.arange(1, n + 1, dtype=torch.int64)
    req_pool.req_to_token[1, :n] = out_cache_loc.to(req_pool.req_to_token.dtype)
    backend = TorchNativeAttnBackend(_Runner(req_pool, kv_pool))
    spec_info = EagleDraftInput(hidden_states=hidden_states)
    batch = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=1,
        input_ids=input_ids,
        req_pool_indices=torch.tensor([1], dtype=torch.int64),
        seq_lens=torch.tensor([n], dtype=torch.int64),
        out_cache_loc=out_cache_loc,
        seq_lens_sum=n,
        seq_lens_cpu=torch.tensor([n]),
        positions=positions,
        extend_num_tokens=n,
        extend_seq_lens=torch.tensor([n], dtype=torch.int32),
        extend_prefix_lens=torch.tensor([0], dtype=torch.int32),
        extend_start_loc=torch.tensor([0], dtype=torch.int32),
        extend_prefix_lens_cpu=[0],
        extend_seq_lens_cpu=[n],
        spec_info=spec_info,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        return_logprob=False,
    )
    return backend, batch


def forward(draft_dir: Path, inputs_path: Path, out_path: Path) -> dict:
    """One EXTEND-mode float32 forward of SGLang's draft on the given hidden states (see module
    doc)."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    inputs = load_file(str(inputs_path))
    model = _build(draft_dir)
    model.load_weights(iter(_read_tensors(draft_dir).items()))
    if "target_embed" in inputs:
        model.set_embed(inputs["target_embed"].float())
    ids, pos, hs = (
        inputs["input_ids"].long(),
        inputs["positions"].long(),
        inputs["hidden_states"].float(),
    )
    backend, batch = _extend_batch(model, ids, pos, hs)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
        backend.init_forward_metadata(batch)
        normed, aux = model.model(ids, pos, batch)
        logits = normed @ model.lm_head.weight.T
        backend2, batch2 = _extend_batch(model, ids, pos, hs)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend2)):
        backend2.init_forward_metadata(batch2)
        lp_out = model.forward(ids, pos, batch2)
    last = lp_out.next_token_logits.float()
    save_file(
        {
            "logits": logits.contiguous(),
            "hidden_prenorm": aux[0].contiguous(),
            "last_logits": last.contiguous(),
        },
        str(out_path),
    )
    return {
        "out": str(out_path),
        "tokens": int(ids.shape[0]),
        "last_logits_max_abs_diff": float((last[-1] - logits[-1]).abs().max()),
    }


def main(argv: list[str]) -> int:
    jobs = json.loads(Path(argv[1]).read_text())
    _setup()
    results = []
    for job in jobs:
        res = {"name": job.get("name"), "op": job["op"]}
        try:
            if job["op"] == "coverage":
                res.update(coverage(Path(job["dir"])))
            elif job["op"] == "forward":
                res.update(forward(Path(job["dir"]), Path(job["inputs"]), Path(job["out"])))
            else:
                res["error"] = f"unknown op {job['op']!r} (expected 'coverage' or 'forward')"
        except Exception as exc:
            res["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        results.append(res)
        Path(argv[2]).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
