"""Tier 1 for EAGLE-3.1 drafts the pipeline trained: ``train.fc_norm`` and ``train.norm_output``.

Each draft goes through the pipeline's own stages on the tiny config (extract once, a short
training, convert with the extraction manifest, ``eagle3 validate``, the equivalence check
trained-vs-engine forward), then through the real SGLang 0.5.23 in one ``.venv-sglang`` process: its
own ``LlamaForCausalLMEagle3.load_weights`` (every parameter filled, every tensor consumed) and its
EXTEND forward on the target's real aux hidden states, compared with the project's engine-side
forward (which the equivalence check compared with the trained model). Both flags are read by SGLang
0.5.23 at the top level of the draft's config (``sglang/srt/models/llama_eagle3.py``: ``fc_norm`` /
``use_aux_norm`` at the ``use_fc_norm = getattr(config, "fc_norm", None) …`` line, ``norm_output``
at ``self.norm_output = getattr(config, "norm_output", False)``; pinned by
tests/unit/test_profiles.py), so the validator accepts them; the tests also show that each flag
changes what SGLang computes or loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.sglang.conftest import EAGLE31_SUMMARY, requires_sglang_env
from testkit.sglang_harness import Coverage, sglang_forward_many

pytestmark = [pytest.mark.sglang, pytest.mark.slow, requires_sglang_env]

FORWARD_ATOL = 1e-5
VARIANTS = {"fc_norm": ["train.fc_norm=true"], "norm_output": ["train.norm_output=true"]}
STEPS = 6  # optimizer steps per draft: enough to move every trained weight off its initial value


def _without_flag(src: Path, dst: Path, flag: str) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg[flag] = False
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    (dst / "manifest.json").unlink()  # a test device, not an artifact
    return dst


def _aux_inputs(
    target_dir: Path, serving_dir: Path, extract_dir: Path, num_tokens: int = 16
) -> dict:
    """The target's real aux states for the first extracted sample's tokens, as SGLang captures
    them: engine id k = the input of layer k + 1 = HF ``hidden_states[k + 1]``; positions 0..T-1;
    the target's embedding."""
    from eagle3.convert.equivalence import _tokens
    from eagle3.target_model import capture_hidden_states, load_target

    target, tok = load_target(target_dir, dtype="float32", device="cpu")
    ids = _tokens(target_dir, extract_dir, num_tokens, tok)
    eng_ids = json.loads((serving_dir / "config.json").read_text())["eagle_config"][
        "eagle_aux_hidden_state_layer_ids"
    ]
    hf = [k + 1 for k in eng_ids]
    with capture_hidden_states(target, hf) as hs, torch.no_grad():
        target(ids[None])
        hidden = torch.cat([hs[i][0].float() for i in hf], -1)
    return {
        "input_ids": ids.long(),
        "positions": torch.arange(ids.numel()),
        "hidden_states": hidden,
        "target_embed": target.get_input_embeddings().weight.detach().float(),
    }


@pytest.fixture(scope="module")
def eagle31(tmp_path_factory, tiny_target_dir) -> dict:
    """Extract once, train + convert + validate + equivalence-check each variant, then one SGLang
    process."""
    from eagle3.config import load_config
    from eagle3.convert.equivalence import check_equivalence
    from eagle3.convert.stage import convert
    from testkit.broken_corpus import validate
    from eagle3.extract.stage import extract
    from eagle3.train.stage import train

    from tests.conftest import CONFIGS

    work, target = tmp_path_factory.mktemp("eagle31"), Path(tiny_target_dir)
    base = [
        f"paths.runs_dir={work / 'runs'}",
        f"train.max_steps={STEPS}",
        "data.num_conversations=8",
    ]
    extract(load_config(CONFIGS / "tiny-random.yaml", base), work / "extract", progress=False)
    data_manifest = json.loads((work / "extract" / "manifest.json").read_text())
    out: dict = {"serving": {}, "train": {}, "problems": {}, "equivalence": {}}
    cases, jobs = {}, []
    for name, overrides in VARIANTS.items():
        cfg = load_config(CONFIGS / "tiny-random.yaml", base + overrides)
        tdir, sdir = work / f"train-{name}", work / f"serving-{name}"
        train(cfg, work / "extract", tdir, progress=False)
        convert(tdir, sdir, engine="sglang", target_dir=target, data_manifest=data_manifest)
        out["train"][name], out["serving"][name] = tdir, sdir
        out["problems"][name] = [
            str(p) for p in validate(sdir, target_dir=target, data_manifest=data_manifest)
        ]
        out["equivalence"][name] = check_equivalence(
            tdir, sdir, work / "extract", target_dir=target
        )
        inputs = _aux_inputs(target, sdir, work / "extract")
        cases[name] = (sdir, inputs)
        off = _without_flag(sdir, work / f"serving-{name}-flag-off", name)
        out["problems"][f"{name}_off"] = sorted({p.code for p in validate(off, target_dir=target)})
        cases[f"{name}_off"] = (off, inputs)
        jobs += [
            {"op": "coverage", "name": f"cov/{n}", "dir": str(d)}
            for n, d in ((name, sdir), (f"{name}_off", off))
        ]
    raw = sglang_forward_many(cases, work / "sglang", extra_jobs=jobs)
    out["coverage"] = {
        n[4:]: Coverage(**{k: v for k, v in raw[n].items() if k != "op"})
        for n in raw
        if n.startswith("cov/")
    }
    out["sglang"], out["cases"] = {n: raw[n] for n in cases}, cases
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_trained_eagle31_draft_validates_and_is_equivalent(eagle31, name):
    """The converted draft carries the flag, passes the validator and the trained-vs-engine
    equivalence check."""
    cfg = json.loads((eagle31["serving"][name] / "config.json").read_text())
    assert cfg[name] is True, cfg
    manifest = json.loads((eagle31["serving"][name] / "manifest.json").read_text())
    assert manifest["trained_flags"][name] is True, manifest["trained_flags"]
    assert eagle31["problems"][name] == []
    eq = eagle31["equivalence"][name]
    assert eq["passed"] and max(eq["max_abs_diff"].values()) < 1e-4, eq["max_abs_diff"]


def test_fc_norm_weights_were_trained_and_sglang_loads_them(eagle31):
    tensors = load_file(str(eagle31["serving"]["fc_norm"] / "model.safetensors"))
    norms = sorted(k for k in tensors if k.startswith("fc_norm."))
    assert norms == ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"], sorted(tensors)
    assert all(float((tensors[k] - 1).abs().max()) > 1e-4 for k in norms), (
        "fc_norm weights never left 1.0"
    )
    cov = eagle31["coverage"]["fc_norm"]
    assert cov.complete and cov.hot_token_id_set, cov.summary()
    assert {f"model.fc_norm.{i}.weight" for i in range(3)} <= set(cov.params), cov.params


def test_fc_norm_tensors_without_the_flag_are_dropped_by_sglang_and_refused_by_the_validator(
    eagle31,
):
    """Without ``fc_norm: true`` SGLang builds no fc_norm and skips the three tensors silently; the
    validator names them."""
    cov = eagle31["coverage"]["fc_norm_off"]
    assert sorted(cov.unconsumed) == [f"fc_norm.{i}.weight" for i in range(3)], cov.summary()
    codes = eagle31["problems"]["fc_norm_off"]
    EAGLE31_SUMMARY["fc_norm without the flag"] = (
        f"SGLang unconsumed {cov.unconsumed}, validator {codes}"
    )
    assert "UNKNOWN_TENSOR" in codes, codes


@pytest.mark.parametrize("name", list(VARIANTS))
def test_project_forward_equals_sglang_on_the_trained_eagle31_draft(eagle31, name):
    from eagle3.engines.sglang.draft import SGLangEagle3Draft

    draft_dir, inputs = eagle31["cases"][name]
    ref = eagle31["sglang"][name]
    assert eagle31["coverage"][name].complete, eagle31["coverage"][name].summary()
    draft = SGLangEagle3Draft.from_dir(
        draft_dir, dtype=torch.float32, target_embed=inputs["target_embed"]
    )
    logits, hidden = draft(inputs["input_ids"], inputs["positions"], inputs["hidden_states"])
    d_logits = float((logits - ref["logits"]).abs().max())
    d_hidden = float((hidden - ref["hidden_prenorm"]).abs().max())
    assert d_logits < FORWARD_ATOL and d_hidden < FORWARD_ATOL, (
        f"{name}: logits {d_logits}, hidden {d_hidden}"
    )
    assert float(ref["logits"].abs().max()) > 0.1, (
        f"{name}: degenerate logits make the comparison vacuous"
    )
    EAGLE31_SUMMARY[name] = (
        f"{inputs['input_ids'].numel()} tokens, |project - SGLang| logits {d_logits:.3g}, "
        f"hidden {d_hidden:.3g}; equivalence max "
        f"{max(eagle31['equivalence'][name]['max_abs_diff'].values()):.3g}"
    )


def test_norm_output_changes_the_state_sglang_hands_to_the_next_draft_step(eagle31):
    """With ``norm_output`` SGLang hands the final-normed state to the next step (the logits are
    unchanged); the same weights without the flag hand on the pre-norm state: the flag is read, not
    ignored."""
    on, off = eagle31["sglang"]["norm_output"], eagle31["sglang"]["norm_output_off"]
    assert float((on["logits"] - off["logits"]).abs().max()) < FORWARD_ATOL
    assert float((on["hidden_prenorm"] - off["hidden_prenorm"]).abs().max()) > 1e-2
    assert (
        eagle31["problems"]["norm_output_off"] == []
    )  # a valid draft either way; what is computed differs
