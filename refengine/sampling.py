"""Token sampling and the speculative-sampling accept/reject rule.

Speculative sampling: Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative
Decoding", Algorithm 1) and Chen et al. 2023 ("Accelerating LLM Decoding with Speculative
Sampling"): a draft token d drawn from q is accepted with probability ``min(1, p(d) / q(d))``; on
rejection the replacement is drawn from ``norm(max(0, p - q))``. The emitted tokens then follow p
exactly, whatever q is.

Temperature and top-p follow SGLang's sampler (``sglang/srt/layers/sampler.py``): temperature below
1e-6 is greedy (argmax); otherwise ``softmax(logits / T)``, then top-p keeps the smallest prefix of
tokens sorted by probability whose mass reaches ``top_p`` (a token is dropped when the mass before
it already exceeds top_p).
"""

from __future__ import annotations

import torch

GREEDY_EPS = 1e-6


def is_greedy(temperature: float) -> bool:
    """True when ``temperature`` selects argmax decoding (SGLang: below 1e-6)."""
    return temperature < GREEDY_EPS


def probs_from_logits(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """``logits [V]`` (any float dtype) → float32 probabilities ``[V]`` after temperature and top-p.

    Raises ValueError for temperature <= 0 (greedy has no distribution) or top_p outside (0, 1].
    """
    if temperature <= 0:
        raise ValueError(f"probs_from_logits: expected temperature > 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"probs_from_logits: expected 0 < top_p <= 1, got {top_p}")
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, idx = probs.sort(descending=True)
        drop = (sorted_p.cumsum(-1) - sorted_p) > top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        probs = probs / probs.sum()
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token id drawn from ``probs [V]`` with ``generator`` (reproducible for a fixed seed).

    ``probs`` is moved to the generator's device first (the decoders seed a CPU generator;
    ``torch.multinomial`` refuses a CPU generator for CUDA probabilities)."""
    if probs.device != generator.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def accept_or_resample(p: torch.Tensor, q: torch.Tensor, token: int,
                       generator: torch.Generator) -> tuple[bool, int | None]:
    """The accept/reject step for one draft ``token`` drawn from ``q`` against the target's ``p``
    (both ``[V]``).

    Returns ``(True, None)`` when accepted, else ``(False, replacement)`` with the replacement drawn
    from ``norm(max(0, p - q))`` (from p itself in the measure-zero case where that residual is all
    zero).
    """
    ratio = float(p[token]) / max(float(q[token]), 1e-30)
    u = float(torch.rand((), generator=generator))
    if u < min(1.0, ratio):
        return True, None
    residual = (p - q).clamp_min(0.0)
    total = float(residual.sum())
    return False, sample(residual / total if total > 0 else p, generator)
