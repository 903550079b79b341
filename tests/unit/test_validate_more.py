"""Cases `eagle3 validate` / `eagle3 convert` must not let through: nested and unknown
flags carried or reported by conversion, absurd numbers refused quickly, a target stored as
pytorch_model.bin, and vLLM's view of a speculators draft (no false alarm on the project's own
draft; the embedding decision per TP rank)."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3.convert.stage import convert
from eagle3.errors import CheckpointInvalid, ConfigError
from testkit.broken_corpus import good_data_manifest, good_pair, validate


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target_dir):
    return good_pair(tmp_path_factory.getbasetemp() / "eagle3-good", tiny_target_dir)


def _copy(src, dst, edit=None, tensors=None):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    if edit:
        edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    if tensors:
        t = load_file(str(dst / "model.safetensors"))
        tensors(t)
        save_file(t, str(dst / "model.safetensors"))
    (dst / "manifest.json").unlink(missing_ok=True)
    return dst


def _specforge_style(serving, dst, **eagle_extra):
    """A SpecForge-style draft (SGLang format) whose flags sit under eagle_config."""

    def edit(cfg):
        for k in ("norm_output", "fc_norm", "norm_before_residual"):
            cfg.pop(k, None)
        cfg["eagle_config"].update(eagle_extra)

    return _copy(serving, dst, edit)


def test_nested_norm_output_is_carried_to_where_sglang_reads_it(pair, tmp_path, tiny_target_dir):
    _, serving = pair
    src = _specforge_style(serving, tmp_path / "sf", norm_output=True)
    assert [p.code for p in validate(src)] == [
        "NESTED_FLAG"
    ]  # as it is, SGLang would compute norm_output=False
    man = convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["norm_output"] is True and man["trained_flags"]["norm_output"] is True
    assert (
        "norm_output" not in cfg["eagle_config"]
        and validate(tmp_path / "out", target_dir=tiny_target_dir) == []
    )


def test_flag_stated_twice_with_two_values_is_refused(pair, tmp_path):
    _, serving = pair
    src = _copy(
        serving,
        tmp_path / "twice",
        lambda c: (
            c.__setitem__("norm_output", False),
            c["eagle_config"].__setitem__("norm_output", True),
        ),
    )
    with pytest.raises(
        ConfigError,
        match=r"flag norm_output is stated twice.*'norm_output': False.*"
        r"'eagle_config.norm_output': True",
    ):
        convert(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["top", "nested"])
def test_unknown_flag_is_reported_by_convert_not_dropped(pair, tmp_path, where):
    spec, serving = pair
    if where == "top":
        src = _copy(spec, tmp_path / "src", lambda c: c.__setitem__("use_gated_fc", True))
        needle = "use_gated_fc=True"
    else:
        src = _specforge_style(serving, tmp_path / "src", share_target_norm=True)
        needle = "eagle_config.share_target_norm=True"
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out")
    assert [p.code for p in e.value.problems] == ["UNKNOWN_FLAG"] and needle in str(
        e.value.problems[0]
    )
    assert not (tmp_path / "out").exists()


def test_absurd_layer_count_is_refused_in_seconds(pair, tmp_path):
    spec, serving = pair
    t0 = time.monotonic()
    bad = _copy(
        serving, tmp_path / "bad", lambda c: c.__setitem__("num_hidden_layers", 1_000_000_000)
    )
    problems = validate(bad)
    assert any(
        p.code == "CONFIG_FIELD"
        and "'num_hidden_layers' expected an integer in [1, 1024], got 1000000000" in p.message
        for p in problems
    ), problems
    src = _copy(
        spec,
        tmp_path / "src",
        lambda c: c["transformer_layer_config"].__setitem__("num_hidden_layers", 10**9),
    )
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out")
    assert any("num_hidden_layers" in str(p) for p in e.value.problems)
    assert time.monotonic() - t0 < 30  # it used to loop over a billion layers and grow to gigabytes


def test_bin_only_target_is_checked_not_skipped(pair, tmp_path, tiny_target_dir):
    _, serving = pair
    target = tmp_path / "target-bin"
    target.mkdir()
    for f in tiny_target_dir.iterdir():
        if f.suffix != ".safetensors":
            (target / f.name).symlink_to(f)
    torch.save(load_file(str(tiny_target_dir / "model.safetensors")), target / "pytorch_model.bin")
    assert [p for p in validate(serving, target_dir=target) if p.code.startswith("EMBED")] == []
    broken = _copy(
        serving,
        tmp_path / "reinit",
        tensors=lambda t: t.__setitem__(
            "embed_tokens.weight", torch.randn_like(t["embed_tokens.weight"])
        ),
    )
    assert "EMBED_MISMATCH" in [p.code for p in validate(broken, target_dir=target)]


def test_same_config_other_weights_is_a_target_mismatch(pair, tmp_path, tiny_target_dir):
    _, serving = pair
    data = good_data_manifest(tiny_target_dir)
    assert validate(serving, target_dir=tiny_target_dir, data_manifest=data) == []
    finetuned = tmp_path / "finetuned"  # identical config.json and tokenizer, one weight changed
    finetuned.mkdir()
    for f in tiny_target_dir.iterdir():
        if f.suffix != ".safetensors":
            (finetuned / f.name).symlink_to(f)
    w = load_file(str(tiny_target_dir / "model.safetensors"))
    key = next(k for k in w if "layers.3.mlp.down_proj" in k)
    w[key] = w[key] * 1.01
    save_file(w, str(finetuned / "model.safetensors"))
    problems = validate(serving, target_dir=finetuned, data_manifest=data)
    assert [p.code for p in problems] == ["TARGET_WEIGHTS_MISMATCH"], problems
    assert (
        "target.weights_hash" in problems[0].message
        and data["target"]["weights_hash"][:12] in problems[0].message
    )


def test_a_training_output_not_converted_yet_is_one_problem_with_the_way_on(
    tmp_path, tiny_target_dir
):
    """A new-user trial ran `eagle3 validate runs/<name>/train`: the speculators checkpoint gave
    CONFIG_FIELD and AUX_IDS_MISSING findings that only follow from its format; one problem that
    says to convert it is the answer."""
    from eagle3.errors import DataError
    from testkit.broken_corpus import make_speculators_draft

    spec = make_speculators_draft(tiny_target_dir, tmp_path / "spec")
    problems = validate(spec, target_dir=tiny_target_dir)
    assert [p.code for p in problems] == ["ARCHITECTURE"]
    assert (
        "a speculators-format draft: run `eagle3 convert SRC DST --to sglang` first"
        in problems[0].message
    )
    with pytest.raises(
        DataError, match=r"config.json: is a file; expected a draft checkpoint directory"
    ):
        validate(spec / "config.json")
