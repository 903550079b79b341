"""More drafts the convert/validate checks must name: a d2t of target ids in a small draft
vocabulary (and a t2d that settles the reading), `validate --data` given something that is not
data, RoPE thetas that disagree across the top level and speculators' transformer_layer_config,
coverage judged on too few tokens, and a lone sliding_window. Each case asserts the code and the
named key; correct maps and configs are the controls."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from eagle3.convert.draft_checks import COVERAGE_MIN_TOKENS, COVERAGE_REFUSE
from eagle3.convert.stage import convert
from eagle3.convert.validate import validate_report
from eagle3.convert.vocab_reading import absolute_reason
from eagle3.errors import CheckpointInvalid, DataError
from testkit.broken_corpus import good_pair, validate


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target_dir):
    return good_pair(tmp_path_factory.getbasetemp() / "eagle3-good", tiny_target_dir)


def _cfg(d):
    return json.loads((d / "config.json").read_text())


def _codes(problems):
    return {p.code: p.message for p in problems}


def _copy(src, dst, config=None, tensors=None, drop=(), pop_keys=()):
    """A copy of draft ``src`` with ``config`` keys set / ``pop_keys`` removed and ``tensors``
    replaced / ``drop``ped; its manifest removed (a foreign draft: no recorded map hash)."""
    shutil.copytree(src, dst)
    cfg = _cfg(dst)
    cfg.update(config or {})
    for k in pop_keys:
        cfg.pop(k, None)
    (dst / "config.json").write_text(json.dumps(cfg))
    t = load_file(str(dst / "model.safetensors"))
    t.update(tensors or {})
    for k in drop:
        t.pop(k, None)
    save_file(t, str(dst / "model.safetensors"))
    (dst / "manifest.json").unlink(missing_ok=True)
    return dst


def _small_vocab(pair, path, d2t, t2d=None):
    """The good serving draft cut to a draft vocabulary of ``len(d2t)`` ids with this ``d2t``
    (and ``t2d``, else none)."""
    head = load_file(str(pair[1] / "model.safetensors"))["lm_head.weight"]
    n = d2t.numel()
    tensors = {"d2t": d2t, "lm_head.weight": head[:n].contiguous()}
    if t2d is not None:
        tensors["t2d"] = t2d
    out = _copy(
        pair[1],
        path,
        config={"draft_vocab_size": n},
        tensors=tensors,
        drop=() if t2d is not None else ("t2d",),
    )
    (out / "manifest.json").unlink(missing_ok=True)
    return out


def _sorted_ids(vocab, n, seed, span=None):
    g = torch.Generator().manual_seed(seed)
    return torch.sort(torch.randperm(span or vocab, generator=g)[:n]).values


# -- 1. d2t of target ids, small draft vocabularies -----------------------------------------------


def test_contiguous_target_ids_in_a_small_vocabulary_are_refused(pair, tmp_path):
    n = 16
    bad = _small_vocab(pair, tmp_path / "abs16", 100 + torch.arange(n))  # ids 100..115, no t2d
    found = _codes(validate(bad))
    assert "VOCAB_MAP_ABSOLUTE" in found, found
    msg = found["VOCAB_MAP_ABSOLUTE"]
    assert msg.startswith("d2t:") and f"{n - 1} of the {n - 1} neighbours are adjacent" in msg


@pytest.mark.parametrize("n", [8, 16, 32, 64])
def test_small_absolute_maps_are_named_and_correct_offsets_are_not(n):
    vocab = 49152
    for start in (0, 7, 3000):  # a contiguous stretch of target ids, stored as ids
        assert absolute_reason(start + torch.arange(n), None, vocab) is not None
    two = torch.cat([torch.arange(50, 50 + n // 2), torch.arange(900, 900 + n - n // 2)])
    assert absolute_reason(two, None, vocab) is not None
    for seed in range(20):  # correct offsets: random and clustered (low, dense ids) vocabularies
        for span in (None, 3 * n):
            ids = _sorted_ids(vocab, n, seed, span)
            assert absolute_reason(ids - torch.arange(n), None, vocab) is None, ids.tolist()


def test_ids_whose_offset_reading_leaves_the_vocabulary_are_named(pair, tmp_path):
    vocab = _cfg(pair[1])["vocab_size"]
    ids = torch.sort(torch.cat([_sorted_ids(vocab - 40, 12, 1), vocab - 4 + torch.arange(4)]))
    bad = _small_vocab(pair, tmp_path / "top", ids.values)
    msg = _codes(validate(bad))["VOCAB_MAP_ABSOLUTE"]
    assert f">= vocab_size {vocab}" in msg and "16 distinct ids" in msg


def test_t2d_decides_the_reading_of_a_small_map(pair, tmp_path):
    vocab = _cfg(pair[1])["vocab_size"]
    ids = _sorted_ids(vocab, 16, 3)  # random ids: both readings are valid maps without t2d
    assert absolute_reason(ids, None, vocab) is None
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    bad = _small_vocab(pair, tmp_path / "abs_t2d", ids, t2d)
    found = _codes(validate(bad))
    assert "t2d is true exactly at d2t's 16 values" in found["VOCAB_MAP_ABSOLUTE"], found
    # the same tensors as offsets, with the t2d of that map: valid
    good = _small_vocab(pair, tmp_path / "off_t2d", ids - torch.arange(16), t2d)
    assert validate(good) == []
    # d2t == arange looks like ids, but a t2d marking i + d2t[i] = 2i says offsets
    even = torch.zeros(vocab, dtype=torch.bool)
    even[2 * torch.arange(16)] = True
    assert absolute_reason(torch.arange(16), even, vocab) is None


# -- 2. validate --data given something that is not data -----------------------------------------


def test_validate_data_manifest_list_and_non_data_paths_are_clear_errors(pair, tmp_path):
    from cli.main import app

    ext = tmp_path / "extract"
    ext.mkdir()
    (ext / "manifest.json").write_text(json.dumps([{"kind": "hidden_states"}]))
    r = CliRunner().invoke(app, ["validate", str(pair[1]), "--data", str(ext)])
    assert r.exit_code == 2 and not isinstance(r.exception, AttributeError), r.output
    assert f"{ext / 'manifest.json'}: expected a JSON object" in r.output
    assert "got a list" in r.output
    r = CliRunner().invoke(app, ["validate", str(pair[1]), "--data", "/dev/null"])
    assert r.exit_code == 2, r.output
    assert "--data /dev/null" in r.output and "got a character device" in r.output
    empty = tmp_path / "empty"
    empty.mkdir()
    r = CliRunner().invoke(app, ["validate", str(pair[1]), "--data", str(empty)])
    assert r.exit_code == 2 and "got a folder without manifest.json" in r.output
    with pytest.raises(DataError, match="data manifest: expected a JSON object.*list"):
        validate_report(pair[1], data_manifest=[{"kind": "hidden_states"}])


def test_validate_data_folder_without_token_counts_says_coverage_was_not_counted(pair, tmp_path):
    from cli.main import app

    ext = tmp_path / "extract"
    ext.mkdir()
    (ext / "manifest.json").write_text(json.dumps({"kind": "hidden_states"}))
    r = CliRunner().invoke(app, ["validate", str(pair[1]), "--data", str(ext)])
    assert r.exit_code == 0, r.output
    assert "no token_freq.pt: vocabulary coverage not counted" in r.output


# -- 3. RoPE thetas that disagree across levels ---------------------------------------------------


@pytest.mark.parametrize(
    "top",
    [
        {"rope_theta": 500000.0},
        {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}},
    ],
)
def test_top_level_theta_unlike_the_layer_config_refuses_conversion(
    pair, tmp_path, tiny_target_dir, top
):
    cfg = _cfg(pair[0])
    nested = cfg["transformer_layer_config"]["rope_parameters"]["rope_theta"]
    src = _copy(pair[0], tmp_path / "two", config=top)
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    msg = _codes(e.value.problems)["ROPE_CONFLICT"]
    key = next(iter(top)) + (".rope_theta" if "rope_parameters" in top else "")
    assert f"{key}=500000" in msg
    assert f"transformer_layer_config.rope_parameters.rope_theta={nested:g}" in msg
    assert "speculators 0.9.0 trained the draft layer with transformer_layer_config" in msg
    assert "SGLang 0.5.16 and 0.5.23 do not load this format" in msg
    assert f"{key} is read by none of them: delete it or set it to {nested:g}" in msg
    assert not (tmp_path / "out").exists()


def test_equal_thetas_across_levels_convert(pair, tmp_path, tiny_target_dir):
    cfg = _cfg(pair[0])
    nested = cfg["transformer_layer_config"]["rope_parameters"]["rope_theta"]
    src = _copy(pair[0], tmp_path / "same", config={"rope_theta": nested})
    assert (
        convert(src, tmp_path / "out", target_dir=tiny_target_dir)["validation"]["warnings"] == []
    )


def test_serving_conflict_message_names_the_read_key_and_what_to_do(pair, tmp_path):
    bad = _copy(
        pair[1],
        tmp_path / "three",
        config={
            "rope_scaling": {"rope_theta": 7.0, "rope_type": "default"},
            "rope_parameters": {"rope_theta": 9.0, "rope_type": "default"},
        },
        pop_keys=("rope_theta",),
    )
    msg = _codes(validate(bad))["ROPE_CONFLICT"]
    assert "rope_scaling.rope_theta=7, rope_parameters.rope_theta=9" in msg
    assert "SGLang 0.5.16 and 0.5.23 read rope_scaling.rope_theta=7" in msg
    assert "reference engine" not in msg  # it reads RoPE as transformers 5 does: no divergence
    assert "keep only the key holding it" in msg and "transformer_layer_config" not in msg


# -- 4. coverage on too few tokens; a lone sliding_window -----------------------------------------


def _prefix(pair, path):
    cfg = _cfg(pair[1])
    dv, vocab = cfg["draft_vocab_size"], cfg["vocab_size"]
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:dv] = True
    return _copy(pair[1], path, tensors={"d2t": torch.zeros(dv, dtype=torch.long), "t2d": t2d})


def test_coverage_is_not_judged_on_a_handful_of_tokens(pair, tmp_path):
    bad = _prefix(pair, tmp_path / "prefix")
    (bad / "manifest.json").unlink(missing_ok=True)
    found = validate_report(bad, token_counts={1: 3, 100000: 7})  # 30 % of 10 tokens
    assert "VOCAB_COVERAGE_LOW" not in _codes(found.problems)
    msg = _codes(found.warnings)["VOCAB_COVERAGE_UNJUDGED"]
    assert f"at least {COVERAGE_MIN_TOKENS} target tokens" in msg and "got 10 (3 in" in msg
    assert found.figures == {
        "tokens_counted": 10,
        "tokens_covered": 3,
        "vocab_coverage_judged": False,
    }
    inside = int(COVERAGE_MIN_TOKENS * 0.3)  # the same share on enough tokens: refused
    found = validate_report(bad, token_counts={1: inside, 100000: COVERAGE_MIN_TOKENS - inside})
    assert "VOCAB_COVERAGE_LOW" in _codes(found.problems)
    assert found.figures["vocab_coverage"] < COVERAGE_REFUSE


@pytest.mark.parametrize(
    "extra,warned",
    [
        ({"sliding_window": 4}, True),
        ({"sliding_window": 4, "use_sliding_window": False}, False),
        ({"sliding_window": None}, False),
        ({"sliding_window": 4, "layer_types": ["full_attention"]}, False),
    ],
)
def test_lone_sliding_window_is_warned_disabled_ones_are_not(pair, tmp_path, extra, warned):
    d = _copy(pair[1], tmp_path / "sw", config=extra)
    found = validate_report(d)
    assert found.problems == []
    warn = _codes(found.warnings)
    assert ("SLIDING_WINDOW" in warn) == warned, warn
    if warned:
        assert (
            "sliding_window=4: stated without layer_types or use_sliding_window"
            in warn["SLIDING_WINDOW"]
        )


def test_lone_sliding_window_in_a_speculators_draft_is_recorded_by_convert(
    pair, tmp_path, tiny_target_dir
):
    cfg = _cfg(pair[0])
    tl = cfg["transformer_layer_config"]
    for k in ("layer_types", "use_sliding_window"):
        tl.pop(k, None)
    tl["sliding_window"] = 8
    src = _copy(pair[0], tmp_path / "sw", config=cfg)
    man = convert(src, tmp_path / "out", target_dir=tiny_target_dir)
    warnings = man["validation"]["warnings"]
    assert any(
        w.startswith("SLIDING_WINDOW:") and "transformer_layer_config.sliding_window=8" in w
        for w in warnings
    ), warnings


def test_top_level_theta_beside_a_layer_config_without_one_names_the_default():
    from eagle3.convert.draft_checks import check_rope_conflict

    cfg = {
        "speculators_model_type": "eagle3",
        "rope_theta": 500000.0,
        "transformer_layer_config": {"model_type": "llama"},
    }
    msg = _codes(check_rope_conflict(cfg, "src/config.json"))["ROPE_CONFLICT"]
    assert msg.startswith("src/config.json: expected one RoPE theta, got rope_theta=500000.")
    assert "transformers' default theta 10000 (transformer_layer_config states none)" in msg
    assert "rope_theta is read by none of them: delete it or set it to 10000" in msg
    cfg["rope_theta"] = 10000.0  # the same value as the default: nothing to say
    assert check_rope_conflict(cfg) == []
