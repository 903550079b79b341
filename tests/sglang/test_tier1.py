"""Tier 1: the real SGLang 0.5.23 ``LlamaForCausalLMEagle3`` as the oracle for loading and the draft
forward.

Everything SGLang computes here runs in ONE ``.venv-sglang`` process
(``testkit/sglang_harness.py``): coverage of every checkpoint (NaN sentinel fill + SGLang's own
``load_weights``), then EXTEND-mode float32 forwards that are compared with the project's
``SGLangEagle3Draft`` (the forward used by the equivalence check and the reference engine). Skipped
with the reason when ``.venv-sglang`` is absent (``make sglang-env``; CI's ``.ci/run`` creates it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.sglang.conftest import SUMMARY, requires_sglang_env
from testkit import sglang_drafts
from testkit.sglang_harness import Coverage, sglang_forward_many

pytestmark = [pytest.mark.sglang, pytest.mark.slow, requires_sglang_env]

FORWARD_ATOL = 1e-5
DECODER_PARAMS = {
    f"model.layers.0.{p}.weight"
    for p in (
        "self_attn.qkv_proj",
        "self_attn.o_proj",
        "mlp.gate_up_proj",
        "mlp.down_proj",
        "input_layernorm",
        "post_attention_layernorm",
        "hidden_norm",
    )
}
# Validator codes about naming, shape or coverage: SGLang must then leave a parameter unfilled, a
# tensor unconsumed, or fail to load (eagle3/convert/validate.py module docstring: failure classes
# 1-3).
LOADER_CODES = {"MISSING_TENSOR", "UNKNOWN_TENSOR", "SHAPE_MISMATCH"}


def _rename(src: Path, dst: Path, rename) -> Path:
    cfg = json.loads((src / "config.json").read_text())
    tensors = {rename(k): v for k, v in load_file(str(src / "model.safetensors")).items()}
    return sglang_drafts.write_draft(dst, cfg, tensors)


def _variant(
    dst: Path, target_dir: Path, *, seed: int, layers: int = 1, flags: dict | None = None
) -> Path:
    """A random SGLang-format draft with ``layers`` decoder layers and optional norm flags (+ their
    tensors)."""
    tcfg = json.loads((target_dir / "config.json").read_text())
    n = tcfg["num_hidden_layers"]
    cfg = sglang_drafts.draft_config(
        tcfg, aux_hf_ids=[2, n // 2, n - 3], draft_vocab_size=512, num_layers=layers
    )
    tensors = sglang_drafts.random_draft_tensors(cfg, seed=seed, with_embed=True)
    g = torch.Generator().manual_seed(seed + 100)
    width = cfg["target_hidden_size"]
    for flag in flags or {}:
        if flag == "fc_norm":
            cfg["fc_norm"] = True
            tensors.update(
                {f"fc_norm.{i}.weight": 1 + 0.1 * torch.randn(width, generator=g) for i in range(3)}
            )
        elif flag == "norm_before_fc":
            cfg["eagle_config"]["norm_before_fc"] = True
            tensors["input_norm.weight"] = 1 + 0.1 * torch.randn(3 * width, generator=g)
        elif flag == "norm_output":
            cfg["norm_output"] = True
    return sglang_drafts.write_draft(dst, cfg, tensors)


def _target_embed(target_dir: Path) -> torch.Tensor:
    for f in sorted(target_dir.glob("*.safetensors")):
        for k, v in load_file(str(f)).items():
            if k.endswith("embed_tokens.weight"):
                return v.float()
    raise FileNotFoundError(f"{target_dir}: no *embed_tokens.weight tensor")


# Converted drafts: speculators-format checkpoints (speculators' Eagle3DraftModel via
# eagle3.train.draft_model) run through eagle3.convert.stage, one per layer-flag combination SGLang
# 0.5.23 implements and with 2 decoder layers.
CONVERTED = {
    "converted_default": {},
    "converted_norm_before_fc": {"flags": {"norm_before_fc": True}},
    "converted_fc_norm": {"flags": {"fc_norm": True}},
    "converted_norm_output_2_layers": {"flags": {"norm_output": True}, "num_layers": 2},
}


def _converted(work: Path, target: Path) -> dict[str, Path]:
    from eagle3.convert.stage import convert

    from testkit.broken_corpus import make_speculators_draft

    out = {}
    for i, (name, kw) in enumerate(CONVERTED.items()):
        spec = make_speculators_draft(target, work / f"{name}-speculators", seed=20 + i, **kw)
        convert(spec, work / name, engine="sglang", target_dir=target)
        out[name] = work / name
    return out


def _corpus(good: Path, work: Path, target: Path) -> list:
    """The broken-checkpoint corpus of testkit/broken_corpus.py (validated later by
    :func:`_validate`)."""
    from testkit.broken_corpus import build_corpus, good_data_manifest

    cases = build_corpus(good, work / "corpus", target, good_data_manifest(target))
    return [
        c for c in cases if c.loads_in_engine
    ]  # SGLang would build a billion layers for the others


def _validate(cases: list) -> None:
    """Attach ``codes`` (the sorted Problem codes of ``eagle3.convert.validate``) to each corpus
    case."""
    from testkit.broken_corpus import validate

    for case in cases:
        case.codes = sorted(
            {
                p.code
                for p in validate(
                    case.path, target_dir=case.target_dir, data_manifest=case.data_manifest
                )
            }
        )


def _inputs(seed: int, t: int, width: int, vocab: int, start: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(0, vocab, (t,), generator=g),
        "positions": torch.arange(start, start + t),
        "hidden_states": torch.randn(t, width, generator=g),
    }


@pytest.fixture(scope="module")
def tier1(tmp_path_factory, tiny_target_dir) -> dict:
    """Build every checkpoint and forward case, run them all through SGLang once; returns the
    results."""
    work = tmp_path_factory.mktemp("sglang_tier1")
    target = Path(tiny_target_dir)
    h = json.loads((target / "config.json").read_text())["hidden_size"]
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    ckpts = {
        "handwritten": sglang_drafts.make_random_draft(
            work / "handwritten", target, with_embed=True
        ),
        "no_embed": sglang_drafts.make_random_draft(work / "no_embed", target, seed=1),
        "legacy_midlayer": sglang_drafts.make_random_draft(
            work / "legacy", target, seed=2, legacy_midlayer=True, with_embed=True
        ),
        "two_layers_fc_norm": _variant(
            work / "two_layers_fc_norm", target, seed=3, layers=2, flags={"fc_norm"}
        ),
        "norm_before_fc_output": _variant(
            work / "nbf", target, seed=4, flags={"norm_before_fc", "norm_output"}
        ),
    }
    ckpts["draft_model_prefixed"] = _rename(
        ckpts["handwritten"],
        work / "prefixed",
        lambda k: f"draft_model.{k}" if k.startswith("layers.") else k,
    )
    ckpts["two_layers_without_later_input_norm"] = _rename(
        ckpts["two_layers_fc_norm"],
        work / "two_layers_no_l1_input_norm",
        lambda k: "unused.dropped" if k == "layers.1.input_layernorm.weight" else k,
    )
    ckpts.update(_converted(work, target))
    corpus = _corpus(ckpts["converted_default"], work, target)
    embed = _target_embed(target)
    cases = {
        "aux_states": (ckpts["handwritten"], _inputs(10, 9, 3 * h, vocab)),
        "fc_bypassed_width_h": (ckpts["handwritten"], _inputs(11, 9, h, vocab)),
        "target_embed": (ckpts["no_embed"], _inputs(12, 7, 3 * h, vocab) | {"target_embed": embed}),
        "midlayer_names": (ckpts["legacy_midlayer"], _inputs(13, 5, 3 * h, vocab)),
        "two_layers_fc_norm_offset": (
            ckpts["two_layers_fc_norm"],
            _inputs(14, 8, 3 * h, vocab, start=17),
        ),
        "norm_before_fc_normed_output": (
            ckpts["norm_before_fc_output"],
            _inputs(15, 6, 3 * h, vocab),
        ),
    }
    for i, name in enumerate(CONVERTED):
        cases[f"fwd_{name}"] = (
            ckpts[name],
            _inputs(30 + i, 8, 3 * h, vocab, start=i) | {"target_embed": embed},
        )
    checked = dict(ckpts) | {f"corpus/{c.name}": c.path for c in corpus}
    jobs = [{"op": "coverage", "name": n, "dir": str(p)} for n, p in checked.items()]
    # The validator runs here while SGLang imports and works in its own process.
    raw = sglang_forward_many(
        cases, work / "sglang", extra_jobs=jobs, during=lambda: _validate(corpus)
    )
    coverage = {n: Coverage(**{k: v for k, v in raw[n].items() if k != "op"}) for n in checked}
    SUMMARY.update(
        checkpoints=len(checked),
        corpus=len(corpus),
        forwards=len(cases),
        max_logit_diff=float("nan"),
        max_hidden_diff=float("nan"),
    )
    return {
        "ckpts": ckpts,
        "coverage": coverage,
        "cases": cases,
        "sglang": {n: raw[n] for n in cases},
        "corpus": corpus,
        "target_embed": embed,
    }


def test_correct_draft_fills_every_parameter_and_consumes_every_tensor(tier1):
    cov = tier1["coverage"]["handwritten"]
    assert cov.complete, cov.summary()
    assert len(cov.params) == 11, cov.params  # embed, fc, 7 decoder-layer parameters, norm, lm_head
    assert cov.hot_token_id_set and cov.ignored_by_design == ["t2d"]
    assert not cov.replaced_at_runtime


def test_draft_without_embedding_relies_on_the_target_embedding(tier1):
    cov = tier1["coverage"]["no_embed"]
    assert cov.complete, cov.summary()
    assert cov.replaced_at_runtime == ["model.embed_tokens.weight"]


@pytest.mark.parametrize(
    "name", ["legacy_midlayer", "two_layers_fc_norm", "norm_before_fc_output", *CONVERTED]
)
def test_variants_load_completely(tier1, name):
    cov = tier1["coverage"][name]
    assert cov.complete, cov.summary()


def test_draft_model_prefix_leaves_the_decoder_layer_unfilled_silently(tier1):
    cov = tier1["coverage"]["draft_model_prefixed"]
    assert cov.error is None  # SGLang raises nothing ...
    assert set(cov.unfilled) == DECODER_PARAMS, (
        cov.summary()
    )  # ... and keeps all 7 decoder parameters unset
    assert all(frac == 1.0 for frac in cov.unfilled.values())
    assert sorted(cov.unconsumed) == sorted(
        t for t in cov.tensors if t.startswith("draft_model.layers.0.")
    )
    assert len(cov.unconsumed) == 10  # q, k, v, o, gate, up, down and three norms


def test_converted_drafts_are_complete_with_the_target_embedding(tier1):
    """What eagle3.convert.stage writes loads completely and SGLang's set_embed would replace the
    embedding."""
    for name in CONVERTED:
        cov = tier1["coverage"][name]
        assert cov.complete and cov.hot_token_id_set, cov.summary()


def test_later_layers_input_layernorm_is_unused_in_sglang(tier1):
    """SGLang 0.5.23 builds ``input_layernorm`` in every draft layer but reads it only in layer 0
    (later layers normalise with ``hidden_norm``): a 2-layer draft without that tensor is still
    complete."""
    cov = tier1["coverage"]["two_layers_without_later_input_norm"]
    assert cov.unfilled_unused == ["model.layers.1.input_layernorm.weight"], cov
    assert cov.unconsumed == ["unused.dropped"] and not cov.unfilled, cov.summary()


def test_validator_agrees_with_sglang_on_the_broken_corpus(tier1):
    """validate passes ⇒ SGLang loads completely; a naming/shape/coverage code ⇒ SGLang leaves
    something unset or fails; SGLang incomplete ⇒ the validator rejects it (otherwise the
    validator missed a silent load error)."""
    disagreements = []
    for case in tier1["corpus"]:
        cov = tier1["coverage"][f"corpus/{case.name}"]
        assert case.code in case.codes, (
            f"{case.name}: validator codes {case.codes} lack the corpus' {case.code}"
        )
        if not case.codes and not cov.complete:
            disagreements.append(f"{case.name}: validator passes but SGLang: {cov.summary()}")
        if set(case.codes) & LOADER_CODES and cov.complete:
            disagreements.append(
                f"{case.name}: validator {case.codes} but SGLang loads it completely"
            )
        if not cov.complete and not case.codes:
            disagreements.append(
                f"{case.name}: SGLang incomplete, validator silent: {cov.summary()}"
            )
    assert not disagreements, "\n".join(disagreements)
    incomplete = sum(not tier1["coverage"][f"corpus/{c.name}"].complete for c in tier1["corpus"])
    assert incomplete >= sum(bool(set(c.codes) & LOADER_CODES) for c in tier1["corpus"]) > 5


def test_project_forward_equals_sglang_extend_forward(tier1):
    from eagle3.engines.sglang.draft import SGLangEagle3Draft

    worst_logits = worst_hidden = 0.0
    for name, (draft_dir, inputs) in tier1["cases"].items():
        ref = tier1["sglang"][name]
        draft = SGLangEagle3Draft.from_dir(
            draft_dir, dtype=torch.float32, target_embed=inputs.get("target_embed")
        )
        logits, hidden = draft(inputs["input_ids"], inputs["positions"], inputs["hidden_states"])
        assert (
            logits.shape == ref["logits"].shape and hidden.shape == ref["hidden_prenorm"].shape
        ), name
        d_logits = float((logits - ref["logits"]).abs().max())
        d_hidden = float((hidden - ref["hidden_prenorm"]).abs().max())
        # SGLang's own LogitsProcessor (last position) agrees with the all-position logits the
        # harness takes.
        assert float((ref["last_logits"][-1] - ref["logits"][-1]).abs().max()) < FORWARD_ATOL, name
        assert d_logits < FORWARD_ATOL and d_hidden < FORWARD_ATOL, (
            f"{name}: logits {d_logits}, hidden {d_hidden}"
        )
        assert float(ref["logits"].abs().max()) > 0.1, (
            f"{name}: degenerate logits make the comparison vacuous"
        )
        worst_logits, worst_hidden = max(worst_logits, d_logits), max(worst_hidden, d_hidden)
    SUMMARY.update(max_logit_diff=worst_logits, max_hidden_diff=worst_hidden)


def test_forward_comparison_detects_a_wrong_residual_order(tier1):
    """The comparison can fail: a norm-before-residual variant of the project's draft differs from
    SGLang."""
    from eagle3.engines.sglang.draft import SGLangEagle3Draft

    draft_dir, inputs = tier1["cases"]["aux_states"]
    draft = SGLangEagle3Draft.from_dir(draft_dir, dtype=torch.float32)
    layer = draft.model.layers[0]
    original = layer.forward

    def norm_before_residual(positions, embeds, h, residual, cache):
        return original(positions, embeds, layer.hidden_norm(h), residual, cache)

    layer.forward = norm_before_residual
    logits, _ = draft(inputs["input_ids"], inputs["positions"], inputs["hidden_states"])
    assert (
        float((logits - tier1["sglang"]["aux_states"]["logits"]).abs().max()) > 100 * FORWARD_ATOL
    )
