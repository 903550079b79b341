"""vLLM's choice between the draft's own embedding and the target's, decided per tensor-parallel rank (UNPINNED).

What vLLM does, as read in its public source (``v1/spec_decode`` ``EagleProposer.load_model`` /
``_maybe_share_embeddings``, late 2025; no release is pinned here, docs/ENGINE_FACTS.md §6):

- ``has_own_embed_tokens`` is set while loading, from the checkpoint's tensor names: a draft without an
  ``embed_tokens`` tensor always uses the target's embedding.
- A draft with one uses the target's only when ``torch.equal(target_embed.weight, draft_embed.weight)``. Under
  tensor parallelism both are ``VocabParallelEmbedding`` shards, so each rank compares *its own rows* and
  decides alone: a draft embedding equal to the target's in some rows and not in others (a few re-initialised
  or fine-tuned rows, an added token) makes some ranks share and the others keep the draft's, and the ranks
  then run different drafters. With pipeline parallelism > 1 nothing is shared.
- Row split: the vocabulary is padded to a multiple of 64 (``DEFAULT_VOCAB_PADDING_SIZE``) and cut into
  ``tp_size`` equal blocks; rank r holds rows ``[r·n, (r+1)·n)`` of the real vocabulary, n = padded / tp.
- Both tensors are compared after loading, in the serving dtype.

:func:`embedding_decision` reproduces that decision for every rank from the files.
"""

from __future__ import annotations

import torch

PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE


def rank_rows(vocab: int, tp_size: int) -> list[tuple[int, int]]:
    """``[(start, stop)]`` rows of the real vocabulary each tensor-parallel rank holds (stop exclusive)."""
    padded = -(-vocab // PADDING) * PADDING
    per = -(-padded // tp_size)
    return [(min(r * per, vocab), min((r + 1) * per, vocab)) for r in range(tp_size)]


def embedding_decision(draft: torch.Tensor | None, target: torch.Tensor, *, tp_size: int = 1, pp_size: int = 1,
                       dtype: torch.dtype = torch.bfloat16) -> dict:
    """What each rank of a vLLM deployment does with the draft's embedding.

    Args:
        draft: the draft checkpoint's ``embed_tokens.weight`` ``[vocab, H]``, None when it has none.
        target: the target's embedding ``[vocab, H]``. tp_size/pp_size: the deployment's parallel sizes.
        dtype: the serving dtype both are cast to before the comparison.
    Returns ``{"decision": "share" | "own" | "split", "per_rank": ["share" | "own", ...], "ranks_own": [...],
    "rows_differing": int, "reason": str}``; "split" means ranks disagree (the draft differs by rank).
    """
    if draft is None:
        return {"decision": "share", "per_rank": ["share"] * tp_size, "ranks_own": [], "rows_differing": 0,
                "reason": "the draft checkpoint has no embed_tokens tensor (has_own_embed_tokens false)"}
    if pp_size > 1:
        return {"decision": "own", "per_rank": ["own"] * tp_size, "ranks_own": list(range(tp_size)),
                "rows_differing": None, "reason": f"pipeline parallel size {pp_size} > 1: nothing is shared"}
    if tuple(draft.shape) != tuple(target.shape):
        return {"decision": "own", "per_rank": ["own"] * tp_size, "ranks_own": list(range(tp_size)),
                "rows_differing": None, "reason": f"shapes differ: draft {list(draft.shape)}, target "
                f"{list(target.shape)}"}
    differs = (draft.to(dtype) != target.to(dtype)).any(dim=-1)  # [vocab] row differs after the cast
    per_rank = ["own" if bool(differs[a:b].any()) else "share" for a, b in rank_rows(int(target.shape[0]), tp_size)]
    own = [r for r, d in enumerate(per_rank) if d == "own"]
    decision = "share" if not own else "own" if len(own) == tp_size else "split"
    n = int(differs.sum())
    return {"decision": decision, "per_rank": per_rank, "ranks_own": own, "rows_differing": n,
            "reason": f"{n} of {int(target.shape[0])} rows differ from the target's in {str(dtype).replace('torch.', '')}"}
