"""vLLM's EAGLE-3 draft loader — an UNPINNED profile (``pinned=False``).

Built from the facts in docs/ENGINE_FACTS.md §6, not from a release's source:
vLLM loads speculators-format drafts directly (``vllm serve DIR``); maps ``midlayer.`` → ``layers.0.``;
**raises** on unknown tensor names; reads the aux ids from the top-level
``eagle_aux_hidden_state_layer_ids`` in the HF hidden_states-index convention; ``norm_before_residual``
defaults to True when missing. Flags this profile has no source for (``norm_before_fc``, ``fc_norm``,
``norm_output``) are accepted only at their default (False): conservative until pinned. Parameter names are
speculators' names (the loader stacks q/k/v and gate/up internally; shapes are checked per tensor).
"""

from __future__ import annotations

from typing import Mapping

from eagle3.engines.bounds import bounded_int
from eagle3.engines.profile import EngineProfile, FlagRule, ParamSpec, Route
from eagle3.errors import ConfigError

VERSIONS = ("unpinned",)


def _tl(config: Mapping) -> Mapping:
    tl = config.get("transformer_layer_config")
    if not isinstance(tl, Mapping):
        raise ConfigError(f"config.json: 'transformer_layer_config' expected an object (speculators format), "
                          f"got {type(tl).__name__}")
    return tl


def config_view(config: dict) -> dict:
    """A speculators-format config as vLLM reads it: the layer fields of ``transformer_layer_config`` with the
    top-level keys (draft vocabulary, target hidden size, aux ids, flags) over them; top-level None values (e.g.
    speculators' ``target_hidden_size: null`` = "same as hidden_size") do not hide a layer field."""
    tl = config.get("transformer_layer_config")
    top = {k: v for k, v in config.items() if v is not None}
    return {**tl, **top} if isinstance(tl, Mapping) else dict(config)


def engine_params(config: dict) -> dict[str, ParamSpec]:
    """Speculators-named parameters of vLLM's Eagle3 draft for a speculators ``config.json``."""
    tl, where = _tl(config), "config.json transformer_layer_config"
    hidden, heads = bounded_int(tl, "hidden_size", where=where), bounded_int(tl, "num_attention_heads", where=where)
    kv_heads = bounded_int(tl, "num_key_value_heads", heads, where=where)
    head_dim = bounded_int(tl, "head_dim", hidden // heads, where=where)
    inter = bounded_int(tl, "intermediate_size", where=where)
    layers, vocab = bounded_int(tl, "num_hidden_layers", where=where), bounded_int(tl, "vocab_size", where=where)
    draft_vocab = bounded_int(config, "draft_vocab_size", vocab)
    n_aux = len(config.get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0])
    t_hidden = bounded_int(config, "target_hidden_size", hidden)
    p = {"embed_tokens.weight": ParamSpec((vocab, hidden)), "fc.weight": ParamSpec((hidden, t_hidden * n_aux)),
         "norm.weight": ParamSpec((hidden,)), "lm_head.weight": ParamSpec((draft_vocab, hidden))}
    for i in range(layers):
        pre, d_in = f"layers.{i}.", (2 * hidden if i == 0 else hidden)
        p.update({
            pre + "self_attn.q_proj.weight": ParamSpec((heads * head_dim, d_in)),
            pre + "self_attn.k_proj.weight": ParamSpec((kv_heads * head_dim, d_in)),
            pre + "self_attn.v_proj.weight": ParamSpec((kv_heads * head_dim, d_in)),
            pre + "self_attn.o_proj.weight": ParamSpec((hidden, heads * head_dim)),
            pre + "mlp.gate_proj.weight": ParamSpec((inter, hidden)),
            pre + "mlp.up_proj.weight": ParamSpec((inter, hidden)),
            pre + "mlp.down_proj.weight": ParamSpec((hidden, inter)),
            pre + "input_layernorm.weight": ParamSpec((hidden,)),
            pre + "post_attention_layernorm.weight": ParamSpec((hidden,)),
        })
        if i == 0:
            p[pre + "hidden_norm.weight"] = ParamSpec((hidden,))
    return p


def route(name: str, params: Mapping[str, ParamSpec]) -> Route:
    """``midlayer.`` → ``layers.0.``; ``d2t`` special; ``t2d`` ignored; anything else must be a parameter."""
    renamed = name.replace("midlayer.", "layers.0.")
    if renamed == "d2t":
        return Route("special", renamed)
    if renamed == "t2d":
        return Route("ignored", renamed)
    if renamed in params:
        return Route("param", renamed, renamed)
    return Route("unknown", renamed)


FLAGS = {
    "norm_before_residual": FlagRule("norm_before_residual", (False, True), True, ("norm_before_residual",),
                                     "read from the config; True when missing (docs/ENGINE_FACTS.md §6)"),
    "norm_before_fc": FlagRule("norm_before_fc", (False,), False, ("norm_before_fc",), "unpinned: default only"),
    "fc_norm": FlagRule("fc_norm", (False,), False, ("fc_norm",), "unpinned: default only"),
    "norm_output": FlagRule("norm_output", (False,), False, ("norm_output",), "unpinned: default only"),
    "embed_requires_grad": FlagRule("embed_requires_grad", (False, True), False, (),
                                    "the draft's own embed_tokens is loaded"),
}


def build(version: str) -> EngineProfile:
    """The unpinned vLLM profile."""
    return EngineProfile(
        engine="vllm", version=version, pinned=False, source_file="(unpinned: docs/ENGINE_FACTS.md §6)",
        draft_architectures=("Eagle3DraftModel", "Eagle3Speculator"),
        legacy_renames=(("midlayer.", "layers.0."),), stacked=(), name_prefixes=("",),
        unknown_tensor="raise", special_tensors={"d2t": "draft_id_to_target_id"}, ignored_tensors=("t2d",),
        embed_from_target=False, aux_ids_key="eagle_aux_hidden_state_layer_ids",
        aux_ids_convention="HF hidden_states index (input of layer i)", aux_id_offset=0,
        aux_default_rule="HF indices [2, L//2, L-3] when no ids are given", aux_capture_hf_range="[1, L-1]",
        residual_order="per config norm_before_residual (default True)", flags=FLAGS, flags_not_read=(),
        aux_capture_classes=frozenset(), max_draft_layers=None, param_fn=engine_params, route_fn=route,
        notes=("unpinned: facts from docs/ENGINE_FACTS.md §6, not from a vLLM release's source",),
        config_view_fn=config_view,
    )
