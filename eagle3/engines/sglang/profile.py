"""SGLang's EAGLE-3 draft loader as data (``sglang/srt/models/llama_eagle3.py``), per pinned
release.

:data:`VERSION` is the one place the pinned release is written; :data:`RELEASES` holds what differs
by release (source lines, capturing classes, serving defaults), keyed by version. Facts read from
the released wheel (re-read by ``tests/unit/test_profiles.py``):

- Draft class ``LlamaForCausalLMEagle3``; parameters ``model.embed_tokens``, ``model.fc`` (in =
  ``target_hidden_size`` (else ``hidden_size``) × num_aux, bias = ``config.bias``), optional
  ``model.input_norm`` (``norm_before_fc``), ``model.fc_norm.{i}`` (``fc_norm``/``use_aux_norm``),
  ``model.layers.{i}`` (layer 0: q/k/v input ``2 × hidden``, qkv bias always False;
  ``hidden_norm``), ``model.norm``, ``lm_head`` (``[draft_vocab_size, hidden]`` unless
  ``tie_word_embeddings``).
- ``load_weights``: legacy ``midlayer``→``layers.0``,
  ``aux_norm_{low,mid,high}``->``fc_norm.{0,1,2}`` (substring replace); ``d2t`` -> ``hot_token_id =
  d2t + arange``; ``t2d`` dropped; q/k/v and gate/up stacked; each name tried as-is then with
  ``model.``; **a name matching no parameter is skipped silently**.
- Decoder layer 0: ``residual = hidden_states`` *before* ``hidden_norm`` (norm_before_residual
  False). Layers ≥ 1 use ``hidden_norm`` (fused add) where a plain Llama layer uses
  ``input_layernorm``.
- ``fc`` runs only if the incoming hidden states are wider than the embeddings.
- Aux ids: ``eagle_config.eagle_aux_hidden_state_layer_ids`` (``model_runner_components/
  spec_aux_hidden_state.py``); explicit id k captures the input of layer k+1 (``llama.py``
  ``set_eagle3_layers_to_capture``: ``val + 1``) = HF index k+1; no ids → ``[2, L//2, L-3]``.
  Capture happens at the input of layers ``0..L-1`` only, so HF index L is never captured.
- The target's embedding replaces the draft's (``eagle_worker_v2.py``: ``set_embed``).
"""

from __future__ import annotations

import functools
from typing import Mapping

from eagle3.engines.bounds import bounded_int
from eagle3.engines.profile import EngineProfile, FlagRule, ParamSpec, Route

VERSION = "0.5.23"  # the pinned SGLang release: the one place it is written

LEGACY_RENAMES = (("midlayer", "layers.0"), ("aux_norm_low", "fc_norm.0"),
                  ("aux_norm_mid", "fc_norm.1"), ("aux_norm_high", "fc_norm.2"))
STACKED = ((".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"),
           (".qkv_proj", ".v_proj", "v"), (".gate_up_proj", ".gate_proj", 0),
           (".gate_up_proj", ".up_proj", 1))

# Where each release decides each flag: (file in the wheel, line, text on that line), cited by
# messages; re-read from each wheel by tests/unit/test_profiles.py. A flag the release does not
# implement has no line.
FLAG_SOURCE_LINES = {
    "norm_before_residual": ("sglang/srt/models/llama_eagle3.py", 99, "residual = hidden_states"),
    "norm_before_fc": ("sglang/srt/models/llama_eagle3.py", 174,
                       'eagle_config.get("norm_before_fc", getattr(config, "norm_before_fc", '
                       'False))'),
    "fc_norm": ("sglang/srt/models/llama_eagle3.py", 185,
                'use_fc_norm = getattr(config, "fc_norm", None) or getattr('),
    "norm_output": ("sglang/srt/models/llama_eagle3.py", 207,
                    'self.norm_output = getattr(config, "norm_output", False)'),
    "embed_requires_grad": ("sglang/srt/speculative/eagle_worker_v2.py", 363,
                            "self.draft_runner.model.set_embed(embed)"),
}
FLAG_SOURCE_LINES_0516 = {
    "norm_before_residual": ("sglang/srt/models/llama_eagle3.py", 91, "residual = hidden_states"),
    "fc_norm": ("sglang/srt/models/llama_eagle3.py", 162,
                'use_fc_norm = getattr(config, "fc_norm", None) or getattr('),
    "norm_output": ("sglang/srt/models/llama_eagle3.py", 183,
                    'self.norm_output = getattr(config, "norm_output", False)'),
    "embed_requires_grad": ("sglang/srt/speculative/eagle_worker_v2.py", 330,
                            "self.draft_runner.model.set_embed(embed)"),
}


def _flags(lines: dict, version: str) -> dict[str, FlagRule]:
    def at(flag: str) -> str:
        return f"{lines[flag][0]}:{lines[flag][1]}"

    if "norm_before_fc" in lines:
        before_fc = FlagRule(
            "norm_before_fc", (False, True), False,
            ("eagle_config.norm_before_fc", "norm_before_fc"), "RMSNorm over the concatenated aux "
            f"states before fc, tensor input_norm.weight ({at('norm_before_fc')})")
    else:
        before_fc = FlagRule(
            "norm_before_fc", (False,), False, (),
            f"SGLang {version} has no input_norm: the flag is not read and input_norm.weight is "
            "skipped silently by load_weights (sglang/srt/models/llama_eagle3.py)")
    return {
        "norm_before_residual": FlagRule(
            "norm_before_residual", (False,), False, (),
            "layer 0 takes the residual from the un-normalised hidden state, then applies "
            f"hidden_norm (LlamaDecoderLayer.forward, {at('norm_before_residual')}); the flag is "
            "not read"),
        "norm_before_fc": before_fc,
        "fc_norm": FlagRule(
            "fc_norm", (False, True), False, ("fc_norm", "use_aux_norm"),
            f"one RMSNorm per aux chunk before fc, tensors fc_norm.{{i}}.weight ({at('fc_norm')}; "
            "EAGLE-3.1)"),
        "norm_output": FlagRule(
            "norm_output", (False, True), False, ("norm_output",),
            "the next draft step receives the final-normed hidden state instead of the pre-norm "
            f"one ({at('norm_output')}; EAGLE-3.1)"),
        "embed_requires_grad": FlagRule(
            "embed_requires_grad", (False,), False, (),
            "the draft's embed_tokens is replaced by the target's at run time (set_embed, "
            f"{at('embed_requires_grad')}), so a trained embedding is discarded"),
    }


# What the release reads inside the draft's ``eagle_config``: the aux ids and
# ``use_aux_hidden_state`` (model_runner_components/spec_aux_hidden_state.py), ``norm_before_fc``
# (llama_eagle3.py, 0.5.23 only). Every other key there, ``norm_output`` and ``fc_norm`` included
# (read at the top level only), is never read.
EAGLE_CONFIG_KEYS = ("eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state", "norm_before_fc")

# Registered architectures implementing set_eagle3_layers_to_capture (71 classes, 29 model files);
# re-derived from the released source by tests/unit/test_profiles.py.
AUX_CAPTURE_CLASSES = frozenset("""
ApertusForCausalLM BailingMoEForCausalLM BailingMoeForCausalLM BailingMoeV2ForCausalLM
Cosmos3ForConditionalGeneration DeepseekV2ForCausalLM DeepseekV32ForCausalLM DeepseekV3ForCausalLM
DeepseekV3ForCausalLMNextN EmbeddingGemmaModel ExaoneMoEForCausalLM ExaoneMoEForCausalLMMTP
ExaoneMoeForCausalLM Gemma3ForCausalLM Gemma3ForConditionalGeneration Gemma4AssistantForCausalLM
Gemma4ForCausalLM Gemma4ForConditionalGeneration Gemma4UnifiedAssistantForCausalLM
Gemma4UnifiedForConditionalGeneration Glm4MoeForCausalLM Glm4MoeForCausalLMNextN
Glm4MoeLiteForCausalLM Glm4MoeLiteForCausalLMNextN Glm5NextForConditionalGeneration
Glm5NextForConditionalGenerationNextN GlmMoeDsaForCausalLM GlmMoeDsaForCausalLMNextN
GptOssForCausalLM IQuestCoderForCausalLM InternLM3ForCausalLM InternS1ProForConditionalGeneration
InternS2MobiusForConditionalGeneration InternS2PreviewForConditionalGeneration
KimiK25ForConditionalGeneration Llama4ForCausalLM Llama4ForConditionalGeneration LlamaForCausalLM
LlamaForCausalLMEagle LlamaForCausalLMEagle3 LongcatFlashForCausalLM LongcatFlashForCausalLMNextN
MellumForCausalLM MindSporeForCausalLM MiniMaxM2ForCausalLM MiniMaxM3SparseForCausalLM
MiniMaxM3SparseForConditionalGeneration Ministral3ForCausalLM MistralForCausalLM
MistralForCausalLMEagle MistralLarge3ForCausalLM MistralLarge3ForCausalLMEagle Phi3ForCausalLM
Qwen2ForCausalLM Qwen2ForCausalLMEagle Qwen2MoeForCausalLM Qwen2_5_VLForConditionalGeneration
Qwen3ForCausalLM Qwen3MoeForCausalLM Qwen3MoeForCausalLMMTP Qwen3NextForCausalLM
Qwen3NextForCausalLMMTP Qwen3VLForConditionalGeneration Qwen3VLMoeForConditionalGeneration
Qwen3_5ForCausalLM Qwen3_5ForConditionalGeneration Qwen3_5MoeForCausalLM
Qwen3_5MoeForConditionalGeneration Qwen4ExpForConditionalGeneration SarvamMoEForCausalLM
TeleFLMForCausalLM
""".split())
# 0.5.16 lacks ten of them (61 classes); a class without the method raises a bare AttributeError
# there (model_runner_components/attention_backend_setup.py:54), where 0.5.23 names it.
AUX_CAPTURE_CLASSES_0516 = AUX_CAPTURE_CLASSES - frozenset("""
Cosmos3ForConditionalGeneration EmbeddingGemmaModel ExaoneMoeForCausalLM
Glm5NextForConditionalGeneration Glm5NextForConditionalGenerationNextN
InternS2MobiusForConditionalGeneration MiniMaxM3SparseForConditionalGeneration Qwen3_5ForCausalLM
Qwen3_5MoeForCausalLM Qwen4ExpForConditionalGeneration
""".split())

# What differs by release, keyed by version (lab/plans/sglang-0.5.16-facts.md has 0.5.16's, file
# and line each):
# - ``spec_max_running_requests``: the request limit SGLang sets when speculation is on and none is
#   given (0.5.23 arg_groups/speculative_hook.py _handle_eagle_family; 0.5.16 the same hook :507).
# - ``return_aux_flag``: the server flag that returns the target's aux states without a draft
#   (0.5.23 ``--enable-return-aux-hidden-states``); None: absent, so the ``sglang`` extraction
#   backend captures through its registered model class only.
# - ``cuda_graph_bs_flag``: the name of the decode CUDA-graph batch limit (0.5.16 also accepts the
#   deprecated ``--cuda-graph-max-bs``, 0.5.23 only this one).
RELEASES: dict[str, dict] = {
    VERSION: {"flag_source_lines": FLAG_SOURCE_LINES, "aux_capture_classes": AUX_CAPTURE_CLASSES,
              "eagle_config_keys": EAGLE_CONFIG_KEYS, "spec_max_running_requests": 48,
              "return_aux_flag": "--enable-return-aux-hidden-states",
              "cuda_graph_bs_flag": "--cuda-graph-max-bs-decode"},
    "0.5.16": {"flag_source_lines": FLAG_SOURCE_LINES_0516,
               "aux_capture_classes": AUX_CAPTURE_CLASSES_0516,
               "eagle_config_keys": EAGLE_CONFIG_KEYS[:2], "spec_max_running_requests": 48,
               "return_aux_flag": None, "cuda_graph_bs_flag": "--cuda-graph-max-bs-decode"},
}


def num_aux_states(config: Mapping) -> int:
    """num_aux as SGLang resolves it: ``num_aux_hidden_states`` > len(eagle_config ids) > 3."""
    if config.get("num_aux_hidden_states") is not None:
        return bounded_int(config, "num_aux_hidden_states")
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return len(ids) if ids else 3


def target_hidden(config: Mapping) -> int:
    """fc input width per aux state: ``target_hidden_size`` if present, else ``hidden_size``."""
    return bounded_int(config, "target_hidden_size" if "target_hidden_size" in config
                       else "hidden_size")


def engine_params(config: dict, *, has_input_norm: bool = True) -> dict[str, ParamSpec]:
    """``LlamaForCausalLMEagle3``'s ``named_parameters()`` for a served config;
    ``has_input_norm``: the release implements ``norm_before_fc`` (0.5.23, not 0.5.16)."""
    hidden = bounded_int(config, "hidden_size")
    heads = bounded_int(config, "num_attention_heads")
    kv_heads = bounded_int(config, "num_key_value_heads", heads)
    head_dim = (bounded_int(config, "head_dim") if config.get("head_dim") is not None
                else hidden // heads)
    inter = bounded_int(config, "intermediate_size")
    layers = bounded_int(config, "num_hidden_layers")
    vocab = bounded_int(config, "vocab_size")
    draft_vocab = bounded_int(config, "draft_vocab_size", vocab)
    n_aux, t_hidden = num_aux_states(config), target_hidden(config)
    eagle = config.get("eagle_config") or {}
    p: dict[str, ParamSpec] = {
        "model.embed_tokens.weight": ParamSpec((vocab, hidden),
                                               runtime_source="target embed_tokens (set_embed)"),
        "model.fc.weight": ParamSpec((hidden, t_hidden * n_aux)),
        "model.norm.weight": ParamSpec((hidden,)),
    }
    if config.get("bias"):
        p["model.fc.bias"] = ParamSpec((hidden,))
    if has_input_norm and bool(eagle.get("norm_before_fc", config.get("norm_before_fc", False))):
        p["model.input_norm.weight"] = ParamSpec((t_hidden * n_aux,))
    if config.get("fc_norm") or config.get("use_aux_norm"):
        p.update({f"model.fc_norm.{i}.weight": ParamSpec((t_hidden,)) for i in range(n_aux)})
    attn_bias = bool(config.get("attention_bias"))
    for i in range(layers):
        pre, d_in = f"model.layers.{i}.", (2 * hidden if i == 0 else hidden)
        q, kv = heads * head_dim, kv_heads * head_dim
        p[pre + "self_attn.qkv_proj.weight"] = ParamSpec(
            (q + 2 * kv, d_in), shards={"q": (q, d_in), "k": (kv, d_in), "v": (kv, d_in)})
        p[pre + "self_attn.o_proj.weight"] = ParamSpec((hidden, q))
        if attn_bias:  # o_proj keeps attention_bias; the overridden qkv_proj is bias=False
            p[pre + "self_attn.o_proj.bias"] = ParamSpec((hidden,))
        p[pre + "mlp.gate_up_proj.weight"] = ParamSpec(
            (2 * inter, hidden), shards={0: (inter, hidden), 1: (inter, hidden)})
        p[pre + "mlp.down_proj.weight"] = ParamSpec((hidden, inter))
        p[pre + "input_layernorm.weight"] = ParamSpec((hidden,), unused=i > 0)
        p[pre + "post_attention_layernorm.weight"] = ParamSpec((hidden,))
        p[pre + "hidden_norm.weight"] = ParamSpec((hidden,))
    if not config.get("tie_word_embeddings", False):
        p["lm_head.weight"] = ParamSpec((draft_vocab, hidden))
    return p


def route(name: str, params: Mapping[str, ParamSpec]) -> Route:
    """Mirror of ``LlamaForCausalLMEagle3.load_weights`` for one tensor name."""
    for legacy, new in LEGACY_RENAMES:
        name = name.replace(legacy, new)
    if "d2t" in name:
        return Route("special", name)
    if "t2d" in name:
        return Route("ignored", name)
    for param_name, weight_name, shard in STACKED:
        if weight_name not in name:
            continue
        renamed = name.replace(weight_name, param_name)
        target = renamed if renamed in params else f"model.{renamed}"
        if target in params:
            return Route("param", renamed, target, shard)
        return Route("unknown", renamed)
    target = name if name in params else f"model.{name}"
    if target in params:
        return Route("param", name, target)
    return Route("unknown", name)


def build(version: str) -> EngineProfile:
    """The SGLang profile for ``version`` (a key of :data:`RELEASES`)."""
    release = RELEASES[version]
    has_input_norm = "norm_before_fc" in release["flag_source_lines"]
    return EngineProfile(
        engine="sglang", version=version, draft_architectures=("LlamaForCausalLMEagle3",),
        legacy_renames=LEGACY_RENAMES, unknown_tensor="skip",
        aux_ids_key="eagle_config.eagle_aux_hidden_state_layer_ids",
        aux_ids_convention="output of layer k (captures the input of layer k+1)", aux_id_offset=1,
        aux_default_rule="HF indices [2, L//2, L-3] when no ids are given",
        aux_capture_hf_range="[1, L-1]", flags=_flags(release["flag_source_lines"], version),
        aux_capture_classes=release["aux_capture_classes"],
        param_fn=functools.partial(engine_params, has_input_norm=has_input_norm), route_fn=route,
        eagle_config_keys=release["eagle_config_keys"], other_bool_keys=("bias", "use_aux_norm"),
    )

