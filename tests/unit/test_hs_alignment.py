"""Hidden states shifted by one position against their tokens are refused (HS_MISALIGNED) at
extraction end and when training opens the store; an aligned store passes, and a target that does
not predict the text (random weights on random tokens) is inconclusive, never refused, unless its
earliest stored layer shows the shift. The tiny
target and its greedy texts are built here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle3.errors import DataError
from eagle3.extract.alignment import MIN_RATE, check_alignment, load_head
from eagle3.train.data import open_hidden_states
from testkit import hs_fixture


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    conf = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    out = tmp_path_factory.mktemp("target")
    LlamaForCausalLM(conf).eval().save_pretrained(out)
    return out


def _greedy(target: Path):
    """Sequences the target wrote itself (6 random prompt tokens, 40 greedy ones): the stored
    token t+1 is what its head predicts from the state at t."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)

    def sequences(num_samples, min_len, max_len, token_range, seed):
        out = []
        for _ in range(num_samples):
            prompt = torch.randint(3, 256, (1, 6), generator=g)
            seq = model.generate(prompt, max_new_tokens=40, min_new_tokens=40, do_sample=False)[
                0
            ].long()
            mask = torch.zeros(seq.numel(), dtype=torch.long)
            mask[6:] = 1
            out.append((seq, mask))
        return out

    return sequences


def _store(tmp_path, target, monkeypatch, *, greedy=True, shift=0) -> Path:
    if greedy:
        monkeypatch.setattr(hs_fixture, "_sequences", _greedy(target))
    out = hs_fixture.build_hidden_states_dir(
        tmp_path / f"hs{shift}",
        target,
        num_samples=8,
        aux_layer_ids=[1, 2, 3],
        token_range=(3, 250),
    )
    if shift:
        from safetensors.torch import load_file, save_file

        for path in (out / "hidden_states").glob("hs_*.safetensors"):
            t = load_file(str(path))
            t["hidden_states"] = torch.roll(t["hidden_states"], -shift, dims=0).contiguous()
            save_file(t, str(path))
    return out


def _open(store: Path, target: Path):
    from transformers import AutoConfig

    return open_hidden_states(store, target, AutoConfig.from_pretrained(target), max_tokens=256)


def test_aligned_store_passes_with_its_rates(tmp_path, target, monkeypatch):
    store = _store(tmp_path, target, monkeypatch)
    rec = check_alignment(store, target, [range(0, 4), range(4, 8)])
    assert rec["status"] == "passed" and rec["positions"] == 128 and rec["inconclusive"] == 0
    r = rec["rates"]
    assert r["next"] > max(r["previous"], r["after_next"]) and r["next"] >= MIN_RATE
    assert _open(store, target).train_ids


@pytest.mark.parametrize("shift", [1, -1])
def test_store_shifted_by_one_is_refused_naming_the_rates(tmp_path, target, monkeypatch, shift):
    store = _store(tmp_path, target, monkeypatch, shift=shift)
    with pytest.raises(DataError) as e:
        check_alignment(store, target, [range(0, 8)])
    msg = str(e.value)
    assert msg.startswith(f"HS_MISALIGNED: {store}/hidden_states") and "samples 0..7" in msg
    assert "token t+1 (aligned) at" in msg and "token t+2 at" in msg and "token t at" in msg
    with pytest.raises(DataError, match="^HS_MISALIGNED: "):
        _open(store, target)  # training refuses it too


def test_target_that_does_not_predict_the_text_is_inconclusive_not_refused(
    tmp_path, target, monkeypatch
):
    store = _store(tmp_path, target, monkeypatch, greedy=False)
    rec = check_alignment(store, target, [range(0, 8)])
    assert rec["status"] == "passed" and rec["inconclusive"] == 1
    r = rec["rates"]
    assert max(r["previous"], r["next"], r["after_next"]) < MIN_RATE
    assert r["input"]["own"] > max(r["input"]["before"], r["input"]["after"])


def test_shift_is_seen_in_the_early_layer_even_when_the_head_cannot_tell(
    tmp_path, target, monkeypatch
):
    """The earliest stored layer still carries its own input token: a shifted row is nearest to
    its neighbour's token although the head predicts nothing of the random text."""
    store = _store(tmp_path, target, monkeypatch, greedy=False, shift=1)
    with pytest.raises(DataError, match=r"HS_MISALIGNED: .*t-1 / t / t\+1 at 0\.0% / 0\.0% / "):
        check_alignment(store, target, [range(0, 8)])


def test_a_head_copying_its_input_is_no_shift(tmp_path):
    """A random target with tied embeddings predicts its own input token (the head reads the
    embedding back): the rows are in place, so it is not refused as shifted by one."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    conf = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    tied = tmp_path / "tied"
    model = LlamaForCausalLM(conf).eval()
    with torch.no_grad():  # weak layers: the residual stream stays close to the input embedding
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.01)
            layer.mlp.down_proj.weight.mul_(0.01)
    model.save_pretrained(tied)
    store = hs_fixture.build_hidden_states_dir(
        tmp_path / "hs", tied, num_samples=8, aux_layer_ids=[1, 2, 3], token_range=(3, 250)
    )
    rec = check_alignment(store, tied, [range(0, 8)])
    assert rec["rates"]["previous"] >= MIN_RATE  # the head copies its input
    assert rec["status"] == "passed"


def test_head_read_from_safetensors_and_missing_head_recorded(tmp_path, target):
    head = load_head(target)
    assert head is not None and tuple(head.lm_head.shape) == (256, 64)
    empty = tmp_path / "no-weights"
    empty.mkdir()
    (empty / "config.json").write_text((target / "config.json").read_text())
    rec = check_alignment(tmp_path, empty, [])
    assert rec["status"] == "skipped" and str(empty) in rec["reason"]


def test_the_projects_own_extraction_records_the_check_and_is_not_refused(tiny_cfg, tmp_path):
    from eagle3.extract.stage import extract
    from tests.unit.test_extract import file_cfg, write_convs

    cfg = file_cfg(tiny_cfg, write_convs(tmp_path / "c.jsonl", 6), n=6, shard=2)
    m = extract(cfg, tmp_path / "hs", progress=False)
    rec = m["alignment"]
    assert rec["status"] == "passed" and rec["groups"] == 3 and rec["positions"] > 0
    assert set(rec["rates"]) == {"previous", "next", "after_next", "input"}
    assert m["template_unstable"]["conversations"] == 0 and m["template_unstable"]["tried"] == 6
