"""Where the served draft's embedding comes from, and whether that is the one it was trained with (class 4).

- SGLang 0.5.23 replaces the draft's embedding by the target's (``set_embed``, docs/ENGINE_FACTS.md L10), so a
  draft embedding unlike the target's was trained for inputs the engine never gives it: ``EMBED_MISMATCH``.
- vLLM keeps the draft's own embedding unless it equals the target's, and decides per tensor-parallel rank
  (:mod:`eagle3.engines.vllm.embedding`, unpinned): the decision is recorded for every rank, and ranks that
  disagree are ``EMBED_SHARING_SPLIT``.
- When the target's embedding cannot be found in its weight files (``*.safetensors``, ``pytorch_model*.bin``),
  the check cannot be made: ``EMBED_UNCHECKED`` says so instead of skipping it.
"""

from __future__ import annotations

import torch

from eagle3.convert.checkpoint import Checkpoint, Problem, Target
from eagle3.engines.profile import EngineProfile

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def draft_embedding(ck: Checkpoint) -> torch.Tensor | None:
    """The draft checkpoint's ``embed_tokens.weight`` (or ``model.embed_tokens.weight``), None when absent."""
    return ck.tensors.get("embed_tokens.weight", ck.tensors.get("model.embed_tokens.weight"))


def serving_dtype(target: Target) -> torch.dtype:
    """The dtype an engine serving ``dtype: auto`` loads both embeddings in: the target config's ``torch_dtype``
    (or ``dtype``), bfloat16 when it names none."""
    raw = target.config.get("torch_dtype") or target.config.get("dtype") or "bfloat16"
    return _DTYPES.get(str(raw).replace("torch.", ""), torch.bfloat16)


def _sglang(emb: torch.Tensor, ref: torch.Tensor, target: Target) -> list[Problem]:
    if tuple(ref.shape) != tuple(emb.shape):
        return [Problem("EMBED_MISMATCH", f"embed_tokens.weight: expected the target's shape {list(ref.shape)}, "
                        f"got {list(emb.shape)}")]
    diff = float((emb.float() - ref.float()).abs().max())
    tol = 1e-2 * float(ref.float().abs().max()) + 1e-6  # bf16 rounding of the target's weights
    if diff > tol:
        return [Problem("EMBED_MISMATCH", f"embed_tokens.weight: expected the target's embedding ({target.path}), "
                        f"the engine serves with it; got max |diff| {diff:.4g} > {tol:.3g} (re-initialised or "
                        f"trained embedding)")]
    return []


def check_embedding(ck: Checkpoint, profile: EngineProfile, target: Target | None, *, tp_size: int = 1,
                    decisions: dict | None = None) -> list[Problem]:
    """The embedding checks of the module docstring for ``profile``'s engine; with ``target`` only.

    ``tp_size``: the deployment's tensor-parallel size (vLLM decides per rank). ``decisions``: when a dict, the
    vLLM decision (:func:`eagle3.engines.vllm.embedding.embedding_decision`) is stored there under
    ``"embedding"``, so a caller can record it.
    """
    if target is None:
        return []
    emb = draft_embedding(ck)
    if profile.embed_from_target and emb is None:
        return []  # the engine uses the target's embedding and the draft brings none: nothing to compare
    ref = target.embed()
    if ref is None:
        return [Problem("EMBED_UNCHECKED", f"embed_tokens.weight: expected the target's embedding to compare with "
                        f"({target.path}: {target.embed_searched}), found none")]
    if profile.embed_from_target:
        return _sglang(emb, ref, target)
    from eagle3.engines.vllm.embedding import embedding_decision

    d = embedding_decision(emb, ref, tp_size=tp_size, dtype=serving_dtype(target))
    d = {**d, "engine": f"{profile.engine} {profile.version}", "tp_size": tp_size}
    if decisions is not None:
        decisions["embedding"] = d
    if d["decision"] != "split":
        return []
    share = [r for r, x in enumerate(d["per_rank"]) if x == "share"]
    return [Problem("EMBED_SHARING_SPLIT", f"embed_tokens.weight: expected one embedding decision for all {tp_size} "
                    f"tensor-parallel ranks, got ranks {share} sharing the target's and ranks {d['ranks_own']} keeping "
                    f"the draft's ({d['reason']}): the ranks would run different drafters; save the target's "
                    f"embedding unchanged in the draft, or drop embed_tokens.weight from it")]
