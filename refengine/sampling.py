"""Token sampling and the speculative-sampling accept/reject rule.

Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023: a draft token d drawn from q is accepted
with probability ``min(1, p(d) / q(d))``, else replaced by a draw from ``norm(max(0, p - q))``; the
emitted tokens follow p exactly. Temperature and top-p as SGLang's sampler
(``sglang/srt/layers/sampler.py``): below 1e-6 greedy; else ``softmax(logits / T)``, top-p keeping
the smallest prefix by probability whose mass reaches ``top_p``."""

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
    """One token id drawn from ``probs [V]`` with ``generator`` (moved to the generator's device:
    ``torch.multinomial`` refuses a CPU generator for CUDA probabilities)."""
    if probs.device != generator.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def accept_or_resample(p: torch.Tensor, q: torch.Tensor, token: int,
                       generator: torch.Generator) -> tuple[bool, int | None]:
    """Accept/reject one draft ``token`` drawn from ``q`` against ``p`` (both ``[V]``): ``(True,
    None)``, or ``(False, replacement)`` drawn from ``norm(max(0, p - q))`` (from p when that
    residual is all zero)."""
    ratio = float(p[token]) / max(float(q[token]), 1e-30)
    u = float(torch.rand((), generator=generator))
    if u < min(1.0, ratio):
        return True, None
    residual = (p - q).clamp_min(0.0)
    total = float(residual.sum())
    return False, sample(residual / total if total > 0 else p, generator)
