"""Building, saving and loading speculators' EAGLE-3 draft for a target, configured for the serving
engine (docs/ENGINE_FACTS.md §2, §5): the layer flags ``norm_before_residual``,
``norm_before_fc``, ``fc_norm``, ``norm_output`` are checked against the engine profile
(``eagle3.engines.profile.get_profile(engine, version).check_flags``) before training; SGLang is
``norm_before_residual=False``. Aux layer ids are HF ``hidden_states`` indices, stored at the top of
``config.json`` as ``eagle_aux_hidden_state_layer_ids``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle3.errors import CheckpointInvalid, ConfigError
from eagle3.target_config import text_config
from eagle3.train.verifier_weights import verifier_notices

FLAG_NAMES = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
REQUIRED_TENSORS = ("embed_tokens.weight", "fc.weight", "norm.weight", "lm_head.weight", "d2t",
                    "t2d")


def resolve_flags(cfg) -> dict[str, bool]:
    """The draft's layer flags for ``cfg``, checked against ``cfg.convert.engine`` at
    ``engine_version``; ``train.norm_before_residual = None`` takes the engine's value (SGLang:
    False). ConfigError for a flag the engine ignores or implements differently (profile's
    ``check_flags``), EngineUnsupported without a profile."""
    from eagle3.engines.registry import get_profile

    t = cfg.train
    profile = get_profile(cfg.convert.engine, cfg.convert.engine_version)
    flags = {k: bool(getattr(t, k)) for k in FLAG_NAMES}
    if t.norm_before_residual is None:
        flags["norm_before_residual"] = bool(profile.norm_before_residual)
    if flags["norm_before_fc"] and flags["fc_norm"]:
        raise ConfigError("train.norm_before_fc and train.fc_norm: mutually exclusive "
                          "(speculators), got both true")
    profile.check_flags(flags)
    return flags


def read_target_config(target_dir: str | Path):
    """The target's text config (``text_config`` for multimodal ones); ConfigError if missing."""
    from transformers import AutoConfig

    target_dir = Path(target_dir)
    if not (target_dir / "config.json").is_file():
        raise ConfigError(f"target {target_dir}: expected an HF model folder with config.json, "
                          "found none")
    return text_config(AutoConfig.from_pretrained(target_dir))


def build_draft(target_dir: str | Path, *, aux_layer_ids: list[int], d2t: torch.Tensor,
                t2d: torch.Tensor, num_layers: int, ttt_steps: int, flags: dict[str, bool],
                attn_impl: str = "sdpa"):
    """A fresh ``Eagle3DraftModel`` for the target's HF folder, vocab map and verifier weights
    loaded, in float32 and train mode, with the static-shape accuracy counts
    (:mod:`eagle3.train.metrics`). aux_layer_ids: HF hidden_states indices (``fc`` input =
    len(ids) × hidden); d2t, t2d: :mod:`eagle3.train.vocab`; ttt_steps: recorded as
    ``speculative_tokens``; flags: :func:`resolve_flags`; attn_impl: ``sdpa`` or ``eager``
    (speculators' flex has no CPU backward). ConfigError for an invalid layer-id list."""
    from eagle3.train import metrics

    metrics.install()
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from speculators.train.cli import create_transformer_layer_config

    target_dir = str(target_dir)
    n_target_layers = read_target_config(target_dir).num_hidden_layers
    if not aux_layer_ids or len(set(aux_layer_ids)) != len(aux_layer_ids) or \
            min(aux_layer_ids) < 0 or max(aux_layer_ids) > n_target_layers:
        raise ConfigError(f"aux_layer_ids: expected distinct HF indices in [0, {n_target_layers}], "
                          f"got {aux_layer_ids}")
    tl = create_transformer_layer_config(target_dir, num_layers, "llama", None, 0,
                                         list(range(num_layers)))
    tl._attn_implementation = attn_impl  # noqa: SLF001  (speculators reads it in __init__)
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=int(d2t.numel()),
        eagle_aux_hidden_state_layer_ids=list(aux_layer_ids),
        architectures=["Eagle3DraftModel"],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=ttt_steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(target_dir)),
        **flags)
    model = Eagle3DraftModel(config)
    model.load_vocab_mappings(t2d.to(torch.bool), d2t.to(torch.long))
    with verifier_notices(target_dir):
        model.load_verifier_weights()
    return model.float().train()


def set_attention(model, attn_impl: str) -> None:
    """Set a built/loaded draft's attention (``from_pretrained`` restores flex)."""
    from speculators.models.attention import create_float_mask
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    model.config.transformer_layer_config._attn_implementation = attn_impl  # noqa: SLF001
    for layer in model.layers:
        layer.self_attn.config._attn_implementation = attn_impl  # noqa: SLF001
    model._attn_impl = attn_impl  # noqa: SLF001
    model._create_mask_fn = (create_block_mask if attn_impl == "simple_flex_attention"
                             else create_float_mask if attn_impl == "eager" else create_mask)


def use_uncompiled_forward(model) -> bool:
    """Bind the plain Python ``forward`` of speculators' draft (which ``conditional_torch_compile``
    wraps on CUDA; docs/ENGINE_FACTS.md §6); True when a compiled wrapper was bypassed."""
    import types

    fwd = type(model).forward
    orig = getattr(fwd, "_torchdynamo_orig_callable", None) or getattr(fwd, "__wrapped__", None)
    if orig is None:
        return False
    model.forward = types.MethodType(orig, model)
    return True


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


def compiled(fn, mode: str = "default", backend: str | None = None, fullgraph: bool = False):
    """``torch.compile(fn, dynamic=False)`` in ``mode`` (one of :data:`COMPILE_MODES`);
    ``backend`` (None = inductor) and ``fullgraph`` for tests. ConfigError for an unknown mode."""
    if mode not in COMPILE_MODES:
        raise ConfigError(f"train.compile_mode: expected one of {list(COMPILE_MODES)}, got "
                          f"{mode!r}")
    return torch.compile(fn, dynamic=False, fullgraph=fullgraph, backend=backend or "inductor",
                         **({} if mode == "default" else {"mode": mode}))


def compile_forward(model, mode: str = "default", backend: str | None = None) -> None:
    """Replace the draft's forward by :func:`compiled` of its plain forward (speculators'
    ``conditional_torch_compile`` bypassed). ConfigError for an unknown mode."""
    import types

    use_uncompiled_forward(model)
    plain = (model.forward if isinstance(model.forward, types.MethodType)
             else types.MethodType(type(model).forward, model))
    model.forward = compiled(plain, mode, backend)


def save_draft(model, out_dir: str | Path, state_dict: dict | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (speculators format; ``state_dict`` if given)
    into ``out_dir``. CheckpointInvalid unless every :data:`REQUIRED_TENSORS` tensor is present,
    every float tensor finite and ``config.json`` holds the top-level aux ids."""
    from safetensors import safe_open

    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True, state_dict=state_dict)
    got = json.loads((out_dir / "config.json").read_text()).get("eagle_aux_hidden_state_layer_ids")
    want = list(model.config.eagle_aux_hidden_state_layer_ids)
    if got != want:
        raise CheckpointInvalid(f"{out_dir}/config.json: eagle_aux_hidden_state_layer_ids expected "
                                f"{want}, got {got}")
    with safe_open(out_dir / "model.safetensors", framework="pt") as f:
        missing = [n for n in REQUIRED_TENSORS if n not in f.keys()]
        if missing:
            raise CheckpointInvalid(f"{out_dir}/model.safetensors: required tensors missing: "
                                    f"{missing}")
        for n in f.keys():
            t = f.get_tensor(n)
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise CheckpointInvalid(f"{out_dir}/model.safetensors: tensor {n} has NaN/Inf "
                                        "values")
    return out_dir


def load_draft(ckpt_dir: str | Path, attn_impl: str = "sdpa",
               verifier_dir: str | Path | None = None):
    """Load a speculators-format draft (float32) with ``attn_impl`` and an eager forward
    (:func:`use_uncompiled_forward`). ``verifier_dir`` overrides the checkpoint's
    ``speculators_config.verifier.name_or_path``; the file on disk is unchanged."""
    from speculators.models.eagle3 import Eagle3DraftModel

    config = Eagle3DraftModel.config_class.from_pretrained(str(ckpt_dir))
    if verifier_dir is not None:
        config.speculators_config.verifier.name_or_path = str(verifier_dir)
    with verifier_notices(config.speculators_config.verifier.name_or_path):
        model = Eagle3DraftModel.from_pretrained(str(ckpt_dir), config=config)
    set_attention(model, attn_impl)
    use_uncompiled_forward(model)
    return model.float()
