"""How the draft is spread over the ranks (``train.distributed``, ``train.num_gpus > 1``).

- ``ddp``: every rank holds the whole draft and AdamW state; gradients are all-reduced.
- ``fsdp``: FSDP2 (``fully_shard``) shards the *trainable* modules (``fc``, each decoder layer, the
  final norm, other trainable children): weights, gradients and AdamW moments take 1/N per rank.
  Frozen tensors (embedding, LM heads, verifier norm, d2t/t2d) stay whole on every rank.

``model.safetensors`` always holds the full state dict (gathered to rank 0 under ``fsdp``);
``optimizer.pt`` is ``optimizer.state_dict()``, under ``fsdp`` torch's full optimizer state dict
keyed by parameter name (a resume in another mode is refused). Every method that gathers is a
collective: all ranks call it, in the same order.
"""

from __future__ import annotations

import contextlib

import torch

from eagle3.errors import ConfigError


class Whole:
    """One process (or no sharding): the model is called as it is."""

    name = "none"

    def wrap(self, model: torch.nn.Module, device: torch.device):
        return model

    def clip_grad_norm_(self, params: list, max_norm: float) -> torch.Tensor:
        """``clip_grad_norm_`` over every rank's gradients; the total norm as a plain tensor."""
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    @contextlib.contextmanager
    def gathered(self, model: torch.nn.Module, optimizer=None):
        """``(model state, optimizer state)`` to write, full on rank 0 (None: read directly)."""
        yield None, None

    @contextlib.contextmanager
    def evaluating(self, model: torch.nn.Module):
        """Around an evaluation, where ranks may run different numbers of forward passes."""
        yield

    def load_optimizer_state(self, model: torch.nn.Module, optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)


class DDP(Whole):
    name = "ddp"

    def wrap(self, model, device):
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)


class _ShardedCall:
    """What the loop calls under FSDP: the draft itself, plus DDP's ``no_sync()`` (gradients of the
    micro-batches before the last of a step are kept unreduced: FSDP2's
    ``set_requires_gradient_sync(False)``)."""

    def __init__(self, model, units):
        self.model, self.units = model, units

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        _each(self.units, "set_requires_gradient_sync", False)
        try:
            yield
        finally:
            _each(self.units, "set_requires_gradient_sync", True)


def _each(units: list, method: str, *args) -> None:
    """Call ``method(*args)`` on every FSDP unit."""
    for u in units:
        getattr(u, method)(*args)


class FSDP(Whole):
    name = "fsdp"

    def __init__(self):
        self.units: list = []

    def wrap(self, model, device):
        """Shard the trainable children of ``model`` in place (each decoder layer on its own);
        ConfigError for a trainable parameter on the draft itself (no child could own it)."""
        from torch.distributed.fsdp import fully_shard

        own = [n for n, p in model.named_parameters(recurse=False) if p.requires_grad]
        if own:
            raise ConfigError("train.distributed='fsdp': the draft holds trainable parameters "
                              f"{own} outside any submodule; expected them inside fc / layers / "
                              "norm (use train.distributed=ddp)")
        for child in model.children():
            for part in child if isinstance(child, torch.nn.ModuleList) else [child]:
                if any(p.requires_grad for p in part.parameters()):
                    fully_shard(part)
                    self.units.append(part)
        return _ShardedCall(model, self.units)

    def clip_grad_norm_(self, params, max_norm):
        from torch.distributed.tensor import DTensor

        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # over the shards of every rank
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    @contextlib.contextmanager
    def gathered(self, model, optimizer=None):
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        yield (get_model_state_dict(model, options=opts),
               None if optimizer is None else get_optimizer_state_dict(model, optimizer,
                                                                       options=opts))

    @contextlib.contextmanager
    def evaluating(self, model):
        """Gather every sharded module once, whole until the end (no collective per forward)."""
        _each(self.units, "set_reshard_after_forward", False)
        _each(self.units, "unshard")
        try:
            yield
        finally:
            _each(self.units, "reshard")
            _each(self.units, "set_reshard_after_forward", True)

    def load_optimizer_state(self, model, optimizer, state):
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             set_optimizer_state_dict)

        set_optimizer_state_dict(model, optimizer, state,
                                 options=StateDictOptions(full_state_dict=True))


def make_parallel(mode: str, world: int) -> Whole:
    """The strategy for ``train.distributed=mode`` and ``world`` processes (one: :class:`Whole`)."""
    if world <= 1:
        return Whole()
    if mode not in ("ddp", "fsdp"):
        raise ConfigError(f"train.distributed: expected 'ddp' or 'fsdp', got {mode!r}")
    return DDP() if mode == "ddp" else FSDP()
