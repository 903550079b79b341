"""Drafts `eagle3 validate` / `eagle3 convert` must name: a d2t of target ids chosen from a
frequency map (gaps, some adjacent pairs, no t2d), a regenerated d2t without t2d, a rope_scaling
beside rope_parameters, a use_sliding_window given as a string, and a bare data manifest with
nothing to compare. Each case asserts the code and the named key or file; correct
maps and configs are the controls."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from eagle3.convert.stage import convert
from eagle3.convert.validate import validate_report
from eagle3.convert.vocab_reading import TWO_APART_MIN, absolute_reason
from testkit.broken_corpus import good_pair, validate


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_target_dir):
    return good_pair(tmp_path_factory.getbasetemp() / "eagle3-good", tiny_target_dir)


def _cfg(d):
    return json.loads((d / "config.json").read_text())


def _codes(problems):
    return {p.code: p.message for p in problems}


def _copy(src, dst, config=None, tensors=None, drop=(), keep_manifest=False):
    """A copy of draft ``src`` with ``config`` keys set and ``tensors`` replaced / ``drop``ped;
    its manifest removed unless ``keep_manifest`` (a foreign draft: no recorded map hash)."""
    shutil.copytree(src, dst)
    cfg = _cfg(dst)
    cfg.update(config or {})
    (dst / "config.json").write_text(json.dumps(cfg))
    t = load_file(str(dst / "model.safetensors"))
    t.update(tensors or {})
    for k in drop:
        t.pop(k, None)
    save_file(t, str(dst / "model.safetensors"))
    if not keep_manifest:
        (dst / "manifest.json").unlink()
    return dst


def _small_vocab(pair, path, d2t):
    """The good serving draft cut to a draft vocabulary of ``len(d2t)`` ids, no t2d."""
    head = load_file(str(pair[1] / "model.safetensors"))["lm_head.weight"]
    n = d2t.numel()
    return _copy(
        pair[1],
        path,
        config={"draft_vocab_size": n},
        tensors={"d2t": d2t, "lm_head.weight": head[:n].contiguous()},
        drop=("t2d",),
    )


def _frequency_ids(vocab, n, seed, noise):
    """The ``n`` most frequent target ids, sorted, of a text-like frequency map: Zipf in the id
    (a BPE vocabulary numbers frequent tokens first) times log-normal noise of width ``noise``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(vocab, dtype=torch.float)
    log_freq = -1.1 * torch.log(ids + 10) + noise * torch.randn(vocab, generator=g)
    return torch.sort(torch.topk(log_freq, n).indices).values


def _adjacent(ids):
    return int(((ids[1:] - ids[:-1]) == 1).sum())


# -- 1. d2t of target ids from a frequency map, no t2d -------------------------------------------


def test_target_ids_with_gaps_and_34_adjacent_pairs_are_refused(pair, tmp_path):
    vocab = _cfg(pair[1])["vocab_size"]
    # 34 adjacent pairs and 60 lone ids, increasing with gaps: fewer than half the neighbours
    # adjacent, too few ids for "none adjacent" to be telling, all inside the vocabulary as offsets
    pairs = [500 * j + k for j in range(34) for k in (0, 1)]
    lone = [500 * j + 250 for j in range(60)]
    ids = torch.tensor(sorted(pairs + lone))
    n = ids.numel()
    assert _adjacent(ids) == 34 < (n - 1) / 2 and int(ids[-1]) + n < vocab
    bad = _small_vocab(pair, tmp_path / "abs", ids)
    found = _codes(validate(bad))
    assert "VOCAB_MAP_ABSOLUTE" in found, found
    msg = found["VOCAB_MAP_ABSOLUTE"]
    assert msg.startswith("d2t:") and "34 neighbours sit exactly 2 apart" in msg, msg
    # the same target ids stored as offsets: a valid draft
    good = _small_vocab(pair, tmp_path / "off", ids - torch.arange(n))
    assert validate(good) == []


def test_frequency_chosen_maps_are_named_as_ids_and_pass_as_offsets():
    flagged = 0
    for vocab in (32000, 49152, 128256):
        for n in (64, 128, 256, 512, 1024, 4096):
            for seed in range(4):
                for noise in (0.5, 1.0, 2.0, 3.0, 5.0, 1000.0):
                    ids = _frequency_ids(vocab, n, seed, noise)
                    assert absolute_reason(ids - torch.arange(n), None, vocab) is None, (
                        vocab,
                        n,
                        seed,
                        noise,
                    )
                    if _adjacent(ids) >= TWO_APART_MIN:
                        assert absolute_reason(ids, None, vocab) is not None, (
                            vocab,
                            n,
                            seed,
                            noise,
                        )
                        flagged += 1
    assert flagged > 100  # the rule was exercised, not skipped
    # the project's own tiny drafts (random ids) and identity maps stay offsets
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        ids = torch.sort(torch.randperm(49152, generator=g)[:256]).values
        assert absolute_reason(ids - torch.arange(256), None, 49152) is None
    assert absolute_reason(torch.zeros(256, dtype=torch.long), None, 49152) is None


def test_regenerated_map_without_t2d_is_a_changed_map(pair, tmp_path):
    cfg = _cfg(pair[1])
    dv, vocab = cfg["draft_vocab_size"], cfg["vocab_size"]
    assert json.loads((pair[1] / "manifest.json").read_text())["vocab_map_hash"]
    same = _copy(pair[1], tmp_path / "same", drop=("t2d",), keep_manifest=True)
    assert "VOCAB_MAP_CHANGED" not in _codes(validate(same))
    g = torch.Generator().manual_seed(7)
    ids = torch.sort(torch.randperm(vocab, generator=g)[:dv]).values
    other = _copy(
        pair[1],
        tmp_path / "other",
        tensors={"d2t": ids - torch.arange(dv)},
        drop=("t2d",),
        keep_manifest=True,
    )
    msg = _codes(validate(other))["VOCAB_MAP_CHANGED"]
    assert "vocab_map_hash" in msg and "no t2d" in msg


def test_convert_records_the_map_hash_of_a_draft_without_t2d(pair, tmp_path, tiny_target_dir):
    src = _copy(pair[0], tmp_path / "spec", drop=("t2d",), keep_manifest=True)
    man = convert(src, tmp_path / "served", target_dir=tiny_target_dir)
    assert man["vocab_map_hash"]
    t = load_file(str(tmp_path / "served" / "model.safetensors"))
    assert "t2d" not in t
    t["d2t"] = 3 * torch.arange(t["d2t"].numel()) - torch.arange(t["d2t"].numel())
    save_file(t, str(tmp_path / "served" / "model.safetensors"))
    assert "VOCAB_MAP_CHANGED" in _codes(validate(tmp_path / "served"))


# -- 2. rope_scaling beside rope_parameters ------------------------------------------------------

LINEAR = {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize(
    "cfg",
    [
        {
            "rope_scaling": LINEAR,
            "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
        },
        {
            "rope_theta": 7.0,
            "rope_scaling": LINEAR,
            "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
        },
        {
            "rope_scaling": {"type": "linear", "factor": 4.0, "rope_theta": 9.0},
            "rope_parameters": {"rope_theta": 9.0, "rope_type": "default"},
        },
        {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}},
    ],
)
def test_rope_read_as_transformers_5_builds_it(cfg):
    from transformers import LlamaConfig

    from eagle3.convert.draft_checks import effective_rope, sglang_theta

    built = dict(LlamaConfig.from_dict(json.loads(json.dumps(cfg))).rope_parameters)
    assert effective_rope(cfg) == built
    assert sglang_theta(cfg)[1] == float(built["rope_theta"])


def test_rope_scaling_beside_rope_parameters_is_refused_naming_both(pair, tmp_path):
    rp = _cfg(pair[1])["rope_parameters"]
    bad = _copy(pair[1], tmp_path / "both", config={"rope_scaling": LINEAR})
    msg = _codes(validate(bad))["ROPE_SCALING_CONFLICT"]
    assert f"rope_scaling={json.dumps(LINEAR, sort_keys=True)}" in msg, msg
    assert f"rope_parameters={json.dumps(rp, sort_keys=True)}" in msg, msg
    assert "disagree on factor, rope_type" in msg
    # the same RoPE stated twice is one setting
    same = _copy(pair[1], tmp_path / "same", config={"rope_scaling": dict(rp)})
    assert "ROPE_SCALING_CONFLICT" not in _codes(validate(same))


def _speculators_with_rope_scaling(pair, path):
    out = _copy(pair[0], path, keep_manifest=True)
    cfg = _cfg(out)
    cfg["transformer_layer_config"]["rope_scaling"] = LINEAR
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_convert_says_what_it_does_with_rope_scaling_beside_rope_parameters(
    pair, tmp_path, tiny_target_dir, caplog
):
    src = _speculators_with_rope_scaling(pair, tmp_path / "spec")
    with caplog.at_level(logging.WARNING, logger="eagle3.convert.stage"):
        man = convert(src, tmp_path / "alone")
    warned = [w for w in man["validation"]["warnings"] if w.startswith("ROPE_SCALING_CONFLICT")]
    assert len(warned) == 1, man["validation"]["warnings"]
    assert "transformer_layer_config.rope_scaling=" in warned[0]
    assert "transformer_layer_config.rope_parameters=" in warned[0]
    assert "drops rope_scaling" in warned[0] and "ROPE_SCALING_CONFLICT" in caplog.text
    served = _cfg(tmp_path / "alone")
    assert "rope_scaling" not in served
    assert served["rope_parameters"] == {**LINEAR, "rope_theta": 10000.0}
    man = convert(src, tmp_path / "with-target", target_dir=tiny_target_dir)
    warned = [w for w in man["validation"]["warnings"] if w.startswith("ROPE_SCALING_CONFLICT")]
    assert len(warned) == 1 and "the target's RoPE keys instead of both" in warned[0]


# -- 3. use_sliding_window given as a string -----------------------------------------------------


def _releases():
    from eagle3.engines.sglang.profile import RELEASES

    versions = sorted(RELEASES, key=lambda v: [int(p) for p in v.split(".")])
    return "SGLang " + " and ".join(versions)


@pytest.mark.parametrize("value", ["true", "false", 1])
def test_use_sliding_window_that_is_not_a_boolean_is_refused(pair, tmp_path, value):
    bad = _copy(
        pair[1], tmp_path / "str", config={"use_sliding_window": value, "sliding_window": 4096}
    )
    msg = _codes(validate(bad))["SLIDING_WINDOW"]
    assert msg.startswith("config.json use_sliding_window: expected true or false"), msg
    assert f"got {value!r} (a {type(value).__name__})" in msg and "sliding_window=4096" in msg
    assert f"LlamaForCausalLMEagle3 of {_releases()} reads neither key" in msg


def test_speculators_draft_with_a_string_flag_is_not_converted(pair, tmp_path):
    from eagle3.errors import CheckpointInvalid

    src = _copy(pair[0], tmp_path / "spec", keep_manifest=True)
    cfg = _cfg(src)
    cfg["transformer_layer_config"].update(use_sliding_window="true", sliding_window=512)
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointInvalid) as e:
        convert(src, tmp_path / "out")
    assert "transformer_layer_config.use_sliding_window: expected true or false" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_sliding_window_message_reads_cleanly_and_a_false_flag_passes(pair, tmp_path):
    on = _copy(
        pair[1], tmp_path / "on", config={"use_sliding_window": True, "sliding_window": 4096}
    )
    msg = _codes(validate(on))["SLIDING_WINDOW"]
    assert f"the LlamaForCausalLMEagle3 of {_releases()} reads neither key (its only" in msg, msg
    assert f"{_releases()}'" not in msg
    off = _copy(
        pair[1], tmp_path / "off", config={"use_sliding_window": False, "sliding_window": 4096}
    )
    found = validate_report(off)
    assert "SLIDING_WINDOW" not in _codes(found.problems + found.warnings)


# -- 4. validate --data with a bare manifest ---------------------------------------------------


def test_bare_data_manifest_says_nothing_was_compared(pair, tmp_path):
    from cli.main import app

    ext = tmp_path / "extract"
    ext.mkdir()
    (ext / "manifest.json").write_text(
        json.dumps({"kind": "hidden_states", "target": {"config_hash": "ab" * 32}})
    )
    r = CliRunner().invoke(app, ["validate", str(pair[1]), "--data", str(ext)])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if "DATA_UNCHECKED" in x)
    assert line.startswith(f"warning: DATA_UNCHECKED: --data {ext / 'manifest.json'}:"), line
    assert "counts.unique_tokens absent" in line and "aux_layer_ids absent" in line
    assert "target.config_hash (no --target)" in line and "nothing of the data was compared" in line


def test_data_manifest_with_something_to_compare_has_no_unchecked_warning(pair):
    hf = json.loads((pair[1] / "manifest.json").read_text())["aux_layer_ids_hf"]
    found = validate_report(pair[1], data_manifest={"kind": "hidden_states", "aux_layer_ids": hf})
    assert found.problems == [] and "DATA_UNCHECKED" not in _codes(found.warnings)
    bare = validate_report(pair[1], data_manifest={"kind": "hidden_states"})
    assert _codes(bare.warnings)["DATA_UNCHECKED"].startswith("data manifest: expected fields")
