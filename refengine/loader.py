"""Load what the reference engine serves: the HF target, the SGLang-format draft (with the target's
embedding and head, as ``SpeculativeDecoder.__init__``; none: plain decoding), and the decoder
:func:`refengine.fastpath.build_decoder` picks (the fast path for Llama targets, else the generic HF
path, with a draft only)."""

from __future__ import annotations

from pathlib import Path

from eagle3.engines.sglang.draft import SGLangEagle3Draft
from refengine.fastpath import build_decoder
from eagle3.target_model import load_target, torch_dtype


def load_decoder(model_path: str | Path, draft_path: str | Path | None, *, num_steps: int = 3,
                 dtype: str = "float32", device: str = "cpu", capture_aux: bool = True,
                 context_length: int | None = None, cuda_graphs: bool = True) -> tuple[object, str]:
    """``(decoder, path line)`` for a target and an SGLang draft folder (None: plain decoding).
    ``context_length``: positions of the static KV caches (fast path) / the longest request (generic
    path); None = ``max_position_embeddings`` capped at 8192 on the fast path.
    ``cuda_graphs=False``: ``--disable-cuda-graph``. Raises the loaders' ConfigError,
    CheckpointInvalid, EngineUnsupported."""
    target, tokenizer = load_target(model_path, dtype=dtype, device=device)
    draft = None
    if draft_path is not None:
        draft = SGLangEagle3Draft.from_dir(
            draft_path, dtype=torch_dtype(dtype), device=device,
            target_embed=target.get_input_embeddings().weight.detach(),
            target_head=target.get_output_embeddings().weight.detach())
    return build_decoder(target, draft, tokenizer, num_steps=num_steps, capture_aux=capture_aux,
                         max_context=context_length, use_cuda_graphs=None if cuda_graphs else False)
