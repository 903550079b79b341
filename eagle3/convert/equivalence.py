"""Equivalence check: the draft as trained vs the draft as the serving engine will compute it, on
the same target forward (HF ``hidden_states`` on a few tokens):

- *trained*: speculators' ``Eagle3DraftModel`` (``sdpa``, float32), one TTT step on the
  speculators config's aux ids, positions ``1..T`` as the trainer feeds them;
- *engine*: :class:`eagle3.engines.sglang.draft.SGLangEagle3Draft` (EXTEND) on
  ``hidden_states[k + 1]`` for the ``eagle_config`` ids, positions ``0..T-1``, the target's
  embedding, and what the target class really captures (else one layer's state, ``fc`` bypassed).

Components are compared in data-flow order (aux states, embeddings, fc, decoder layer, final norm,
logits, id map); the first over ``atol`` is named in :class:`eagle3.errors.CheckpointInvalid`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle3.engines.sglang.profile import VERSION as SGLANG_VERSION
from eagle3.errors import CheckpointInvalid, ConfigError
from eagle3.target_model import (capture_hidden_states, default_aux_layer_ids, load_target,
                                 num_layers)

DEFAULT_TEXT = ("The capital of France is Paris. EAGLE drafts predict the next tokens from the "
                "target's features.")


def _tokens(target_dir: Path, data_dir: Path | None, num_tokens: int, tokenizer) -> torch.Tensor:
    if data_dir is not None:
        from safetensors.torch import load_file

        files = sorted((Path(data_dir) / "hidden_states").glob("hs_*.safetensors"))
        if files:
            return load_file(str(files[0]))["token_ids"][:num_tokens].long()
    ids = tokenizer(DEFAULT_TEXT * 4, add_special_tokens=False)["input_ids"][:num_tokens]
    return torch.tensor(ids, dtype=torch.long)


def _hooks(pairs: dict[str, torch.nn.Module], store: dict) -> list:
    """Forward hooks keeping each module's first output in ``store``."""
    def hook(name: str):
        def keep(_m, _inp, out) -> None:  # returns None: the module's output is kept
            store.setdefault(name, out)
        return keep

    return [mod.register_forward_hook(hook(name)) for name, mod in pairs.items()]


def _trained_side(spec_dir: Path, aux: torch.Tensor, input_ids: torch.Tensor,
                  target_dir: Path | None = None) -> tuple[dict, object]:
    """Speculators' forward for one TTT step: per-component outputs ``[T, ·]`` and the model."""
    from eagle3.train.draft_model import load_draft

    model = load_draft(spec_dir, attn_impl="sdpa", verifier_dir=target_dir).eval()
    T = input_ids.numel()
    got: dict[str, torch.Tensor] = {}
    handles = _hooks({"embeddings": model.embed_tokens, "fc": model.fc, "layers": model.layers[-1],
                      "norm": model.norm, "logits": model.lm_head}, got)
    try:
        with torch.no_grad():  # hidden_states [1, T, n_aux*H], input_ids [1, T]
            model(hidden_states=aux[None].float(), input_ids=input_ids[None],
                  document_ids=torch.zeros(1, T, dtype=torch.long),
                  position_ids=torch.arange(1, T + 1)[None], ttt_steps=1)
    finally:
        for h in handles:
            h.remove()
    out = {k: (v[0] if isinstance(v, tuple) else v).reshape(T, -1).float() for k, v in got.items()}
    out["prenorm"] = out.pop("layers")
    return out, model


def _engine_side(serving_dir: Path, hidden: torch.Tensor, input_ids: torch.Tensor,
                 embed: torch.Tensor) -> tuple[dict, object]:
    """SGLangEagle3Draft (EXTEND, positions 0..T-1, target embedding): per-component outputs."""
    from eagle3.engines.sglang.draft import SGLangEagle3Draft

    draft = SGLangEagle3Draft.from_dir(serving_dir, dtype=torch.float32, target_embed=embed.float())
    T = input_ids.numel()
    got: dict[str, object] = {}
    m = draft.model
    handles = _hooks({"embeddings": m.embed_tokens, "fc": m.fc, "layers": m.layers[-1],
                      "norm": m.norm, "logits": draft.lm_head}, got)
    try:
        draft(input_ids, torch.arange(T), hidden.float())
    finally:
        for h in handles:
            h.remove()
    mlp_out, residual = got.pop("layers")
    normed = got.pop("norm")[0]
    out = {k: v.float() for k, v in got.items()}  # embeddings, fc (unless bypassed), logits
    out.update(prenorm=(mlp_out + residual).float(), norm=normed.float())
    return out, draft


def _engine_hidden(serving_cfg: dict, target_arch: str, n_layers: int, hs: dict[int, torch.Tensor],
                   engine: str, version: str,
                   assume_capture: bool = False) -> tuple[torch.Tensor, list[int] | None, str]:
    """The hidden states the engine hands the draft: aux states at its ids, or one layer's (fc
    bypassed). ``assume_capture``: capture is checked by the pre-flight."""
    from eagle3.engines.registry import get_profile

    profile = get_profile(engine, version)
    eagle = serving_cfg.get("eagle_config") or {}
    if not assume_capture and target_arch not in profile.aux_capture_classes:
        return hs[n_layers], None, (f"one layer's state ({target_arch} captures no aux states in "
                                    f"{engine} {version})")
    if eagle.get("use_aux_hidden_state", True) is False:
        return hs[n_layers], None, "one layer's state (eagle_config.use_aux_hidden_state is false)"
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    hf = profile.engine_to_hf_ids(ids) if ids else default_aux_layer_ids(n_layers)
    hf = sorted(set(hf))  # captured in layer order, once each
    return torch.cat([hs[i] for i in hf], -1), hf, f"HF indices {hf}"


def _first_divergence(trained: dict, served: dict, atol: float) -> tuple[dict, str | None, str]:
    order = [("embeddings", "embed_tokens (engine uses the target's)"), ("fc", "fc"),
             ("prenorm", "layers (decoder layer: residual order, norms, attention, MLP)"),
             ("norm", "norm (final RMSNorm)"), ("logits", "lm_head (logits)")]
    diffs: dict[str, float] = {}
    for key, label in order:
        a, b = trained.get(key), served.get(key)
        if b is None:
            return diffs, label, ("the engine never ran this component (fc bypassed: incoming "
                                  "width = hidden size)")
        if a.shape != b.shape:
            return diffs, label, f"shapes differ: trained {list(a.shape)}, engine {list(b.shape)}"
        diffs[key] = float((a - b).abs().max())
        if diffs[key] > atol:
            return diffs, label, f"max |diff| {diffs[key]:.4g} > atol {atol}"
    return diffs, None, ""


def check_equivalence(speculators_dir: str | Path, serving_dir: str | Path,
                      data_dir: str | Path | None = None, *,
                      target_dir: str | Path | None = None, atol: float = 2e-2,
                      num_tokens: int = 24, engine: str = "sglang", version: str = SGLANG_VERSION,
                      assume_capture: bool = False) -> dict:
    """Compare the trained (speculators) and served drafts on one target forward of ``num_tokens``
    tokens. ``data_dir``: first sample's tokens and, without ``target_dir``, its target. Target runs
    float32 on CPU; ``atol`` per component (logits float32; 2e-2 ≈ bf16 rounding).
    ``assume_capture``: as if the target captured aux states (see :mod:`eagle3.serve.preflight`).
    Returns ``{"passed": True, "num_tokens", "atol", "max_abs_diff": {component: float},
    "trained_aux_hf", "engine_aux_hf", "argmax_agreement", "target_ids_agree"}``.
    CheckpointInvalid naming the first diverging component; ConfigError when no target.
    """
    speculators_dir, serving_dir = Path(speculators_dir), Path(serving_dir)
    if target_dir is None and data_dir is not None:
        manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
        target_dir = manifest.get("target", {}).get("path")
    if target_dir is None:
        raise ConfigError("check_equivalence: target_dir expected (or data_dir with manifest "
                          "target.path), got none")
    spec_cfg = json.loads((speculators_dir / "config.json").read_text())
    serving_cfg = json.loads((serving_dir / "config.json").read_text())
    target, tok = load_target(target_dir, dtype="float32", device="cpu")
    n_layers = num_layers(target)
    input_ids = _tokens(Path(target_dir), Path(data_dir) if data_dir else None, num_tokens, tok)
    trained_hf = spec_cfg.get("eagle_aux_hidden_state_layer_ids") or default_aux_layer_ids(n_layers)
    with capture_hidden_states(target, list(range(n_layers + 1))) as hs, torch.no_grad():
        target(input_ids[None])
        hs = {i: h[0].float() for i, h in hs.items()}
    arch = (target.config.architectures or [type(target).__name__])[0]
    served_in, engine_hf, how = _engine_hidden(serving_cfg, arch, n_layers, hs, engine, version,
                                               assume_capture)
    trained_in = torch.cat([hs[i] for i in trained_hf], -1)
    report = {"num_tokens": int(input_ids.numel()), "atol": atol,
              "trained_aux_hf": list(trained_hf), "engine_aux_hf": engine_hf}
    if served_in.shape != trained_in.shape or float((served_in - trained_in).abs().max()) > atol:
        if served_in.shape[-1] not in (trained_in.shape[-1], int(serving_cfg["hidden_size"])):
            raise CheckpointInvalid("equivalence: first diverging component aux hidden states (fc "
                                    f"input): trained on width {trained_in.shape[-1]} (HF "
                                    f"{list(trained_hf)}), the engine provides width "
                                    f"{served_in.shape[-1]} ({how}) which its fc cannot take")
        if served_in.shape == trained_in.shape:
            raise CheckpointInvalid("equivalence: first diverging component aux hidden states "
                                    f"(layer ids): trained on HF indices {list(trained_hf)}, the "
                                    f"engine captures {how}")
    embed = target.get_input_embeddings().weight.detach()
    trained, model = _trained_side(speculators_dir, trained_in, input_ids, Path(target_dir))
    served, draft = _engine_side(serving_dir, served_in, input_ids, embed)
    diffs, label, why = _first_divergence(trained, served, atol)
    report["max_abs_diff"] = diffs
    if label is not None:
        raise CheckpointInvalid(f"equivalence: first diverging component {label}: {why} (engine "
                                f"input: {how}; diffs so far "
                                f"{', '.join(f'{k} {v:.3g}' for k, v in diffs.items())})")
    same = trained["logits"].argmax(-1) == served["logits"].argmax(-1)
    report["argmax_agreement"] = float(same.float().mean())
    report.update(_map_agreement(model, draft))
    report["passed"] = True
    return report


def _map_agreement(model, draft) -> dict:
    d2t = getattr(model, "d2t", None)
    if d2t is None or draft.hot_token_id is None:
        if (d2t is None) != (draft.hot_token_id is None):
            raise CheckpointInvalid("equivalence: first diverging component d2t (draft→target "
                                    f"ids): trained {'with' if d2t is not None else 'without'} "
                                    "a map, engine "
                                    f"{'with' if draft.hot_token_id is not None else 'without'} "
                                    "hot_token_id")
        return {"target_ids_agree": True}
    trained_ids = d2t.long() + torch.arange(d2t.numel())
    if not torch.equal(trained_ids, draft.hot_token_id.cpu().long()):
        bad = int((trained_ids != draft.hot_token_id.cpu().long()).sum())
        raise CheckpointInvalid("equivalence: first diverging component d2t (draft→target ids): "
                                f"{bad} of {d2t.numel()} draft indices map to other target tokens "
                                "in the engine")
    return {"target_ids_agree": True}
