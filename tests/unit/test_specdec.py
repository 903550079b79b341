"""SpeculativeDecoder: greedy output equals the target's own greedy output; sampling keeps the
target's distribution; acceptance counts follow SGLang's definitions."""

from __future__ import annotations

import json
import math

import pytest
import torch

from refengine import sampling
from eagle3.engines.sglang.draft import SGLangEagle3Draft
from eagle3.errors import EngineUnsupported
from refengine.server import accept_length, accept_rate
from refengine.specdec import SpeculativeDecoder
from eagle3.target_model import load_target
from testkit.sglang_drafts import (
    OracleDraft,
    draft_config,
    make_random_draft,
    random_draft_tensors,
    write_draft,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


PROMPTS = ["Hello, how are you today?", "Write a haiku about the sea.", "1, 2, 3, 4,"]


@pytest.fixture(scope="module")
def tiny(tiny_target_dir):
    model, tok = load_target(tiny_target_dir, dtype="float32", device="cpu")
    return tiny_target_dir, model, tok


def _embed(model):
    return model.get_input_embeddings().weight.detach()


def _hf_greedy(model, ids, n, eos=(2,)):
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[
        0, len(ids) :
    ].tolist()
    for i, t in enumerate(out):
        if t in eos:
            return out[: i + 1]
    return out


def _plain_greedy(model, ids, n):
    """Greedy decoding by full recomputation, ignoring EOS (an independent reference)."""
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]


def _oracle(tmp_path, target_dir, model, noise=0.0, steps=3):
    cfg = json.loads((target_dir / "config.json").read_text())
    dcfg = draft_config(cfg, aux_hf_ids=[2, 4, 5], draft_vocab_size=cfg["vocab_size"])
    d = write_draft(tmp_path / "oracle", dcfg, random_draft_tensors(dcfg, seed=2))
    inner = SGLangEagle3Draft.from_dir(d, target_embed=_embed(model))
    return OracleDraft(inner, model, noise=noise)


@pytest.mark.parametrize("steps,capture_aux", [(3, True), (1, True), (3, False)])
def test_greedy_equals_target_greedy_with_random_draft(tmp_path, tiny, steps, capture_aux):
    target_dir, model, tok = tiny
    draft = SGLangEagle3Draft.from_dir(
        make_random_draft(tmp_path / "d", target_dir), target_embed=_embed(model)
    )
    dec = SpeculativeDecoder.from_models(
        model, draft, tok, num_steps=steps, capture_aux=capture_aux
    )
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        res = dec.generate(ids, 20)
        assert res.output_ids == _hf_greedy(model, ids, 20)
        assert res.verify_ct >= 1 and res.num_draft_tokens == steps * res.verify_ct
        assert 1.0 <= accept_length(res) <= steps + 1
        assert accept_length(res) == res.completion_tokens / res.verify_ct
        assert sum(res.histogram) == res.verify_ct


def test_always_agreeing_draft_reaches_max_acceptance_and_same_output(tmp_path, tiny):
    target_dir, model, tok = tiny
    oracle = _oracle(tmp_path, target_dir, model)
    dec = SpeculativeDecoder.from_models(model, oracle, tok, num_steps=3)
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        oracle.reset(ids)
        res = dec.generate(
            ids, 1 + 4 * 5, ignore_eos=True
        )  # prefill token + 5 full rounds of 3 drafts + bonus
        assert res.output_ids == _plain_greedy(model, ids, 21)
        assert (
            res.verify_ct == 5
            and res.accepted_per_position == [5, 5, 5]
            and res.histogram == [0, 0, 0, 5]
        )
        assert accept_rate(res) == 1.0 and accept_length(res) == pytest.approx(21 / 5)


def test_stop_token_ends_generation_and_is_kept(tmp_path, tiny):
    target_dir, model, tok = tiny
    oracle = _oracle(tmp_path, target_dir, model)
    dec = SpeculativeDecoder.from_models(model, oracle, tok, num_steps=3)
    ids = tok(PROMPTS[0])["input_ids"]
    oracle.reset(ids)
    full = dec.generate(ids, 12, ignore_eos=True).output_ids
    stop = full[6]
    oracle.reset(ids)
    res = dec.generate(ids, 12, stop_token_ids=[stop], ignore_eos=True)
    assert res.output_ids == full[: full.index(stop) + 1]
    assert res.finish_reason == {"type": "stop", "matched": stop}
    assert dec.generate(ids, 3, ignore_eos=True).finish_reason == {"type": "length", "length": 3}


def test_aux_ids_follow_sglang_convention_and_unreachable_ids_are_refused(tmp_path, tiny):
    target_dir, model, tok = tiny  # 8 layers
    d = make_random_draft(tmp_path / "d", target_dir, aux_hf_ids=[1, 3, 7])  # SGLang ids [0, 2, 6]
    draft = SGLangEagle3Draft.from_dir(d, target_embed=_embed(model))
    assert SpeculativeDecoder.from_models(model, draft, tok).capture_indices == [1, 3, 7]
    bad = make_random_draft(
        tmp_path / "bad", target_dir, aux_hf_ids=[2, 4, 8]
    )  # SGLang id 7 = last layer out
    with pytest.raises(EngineUnsupported, match=r"\[8\]"):
        SpeculativeDecoder.from_models(
            model, SGLangEagle3Draft.from_dir(bad, target_embed=_embed(model)), tok
        )


def test_constructor_loads_from_folders(tmp_path, tiny):
    target_dir, model, tok = tiny
    dec = SpeculativeDecoder(target_dir, make_random_draft(tmp_path / "d", target_dir), num_steps=2)
    ids = tok(PROMPTS[1])["input_ids"]
    assert dec.generate(ids, 8).output_ids == _hf_greedy(model, ids, 8)


# --- temperature > 0: the target's distribution is kept (small vocabulary, exact reference) ---

V = 8


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=None,
        initializer_range=0.5,
    )
    model = LlamaForCausalLM(cfg).eval()
    d = tmp_path_factory.mktemp("small")
    dcfg = draft_config(json.loads(cfg.to_json_string()), aux_hf_ids=[1, 2, 3], draft_vocab_size=V)
    inner = SGLangEagle3Draft.from_dir(
        write_draft(d / "draft", dcfg, random_draft_tensors(dcfg)), target_embed=_embed(model)
    )
    return model, inner


def _exact_marginals(model, prompt, temperature):
    """Exact P(token 2) and P(token 3) of the target alone, by enumeration over the V-token
    vocabulary."""

    def probs(seq):
        with torch.no_grad():
            return sampling.probs_from_logits(
                model(input_ids=torch.tensor([seq])).logits[0, -1], temperature
            )

    p1 = probs(prompt)
    m2, m3 = torch.zeros(V), torch.zeros(V)
    for a in range(V):
        p2 = probs(prompt + [a])
        m2 += p1[a] * p2
        for b in range(V):
            m3 += p1[a] * p2[b] * probs(prompt + [a, b])
    return m2, m3


def _sample_marginals(dec, oracle, prompt, n, temperature):
    c2, c3 = torch.zeros(V), torch.zeros(V)
    accepted = 0
    for seed in range(n):
        oracle.reset(prompt)
        r = dec.generate(prompt, 3, temperature=temperature, seed=seed)
        c2[r.output_ids[1]] += 1
        c3[r.output_ids[2]] += 1
        accepted += r.num_correct_drafts
    return c2, c3, accepted


def _chi2_ok(counts, probs, n):
    """Pearson chi-square against exact probabilities; critical value at p = 0.001
    (Wilson-Hilferty)."""
    keep = probs * n >= 1e-9
    exp = probs[keep] * n
    stat = float(((counts[keep] - exp) ** 2 / exp).sum())
    df = int(keep.sum()) - 1
    crit = df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3
    return stat < crit, stat, crit


@pytest.mark.slow
def test_sampling_keeps_target_distribution_and_test_detects_a_broken_rule(
    small_vocab, monkeypatch
):
    model, inner = small_vocab
    oracle = OracleDraft(
        inner, model, noise=1.5, seed=0
    )  # disagrees often: both accept and resample paths run
    dec = SpeculativeDecoder.from_models(model, oracle, None, num_steps=2)
    prompt, temperature, n = [0, 3, 5], 0.9, 800
    m2, m3 = _exact_marginals(model, prompt, temperature)
    c2, c3, accepted = _sample_marginals(dec, oracle, prompt, n, temperature)
    assert 0.2 * n < accepted < 1.9 * n  # of at most 2 per run: both accept and reject paths ran
    for counts, probs in ((c2, m2), (c3, m3)):
        ok, stat, crit = _chi2_ok(counts, probs, n)
        assert ok, (
            f"chi-square {stat:.1f} >= {crit:.1f}: counts {counts.tolist()} "
            f"vs expected {(probs * n).tolist()}"
        )
        assert 0.5 * float((counts / n - probs).abs().sum()) < 0.06
    # negative control: accepting every draft token samples the draft's distribution, which the test
    # must see
    monkeypatch.setattr(sampling, "accept_or_resample", lambda p, q, t, g: (True, None))
    c2, c3, _ = _sample_marginals(dec, oracle, prompt, n, temperature)
    assert not (_chi2_ok(c2, m2, n)[0] and _chi2_ok(c3, m3, n)[0])


def test_sampling_is_reproducible_for_a_seed(tmp_path, tiny):
    target_dir, model, tok = tiny
    draft = SGLangEagle3Draft.from_dir(
        make_random_draft(tmp_path / "d", target_dir), target_embed=_embed(model)
    )
    dec = SpeculativeDecoder.from_models(model, draft, tok, num_steps=3)
    ids = tok(PROMPTS[2])["input_ids"]
    a, b = (dec.generate(ids, 10, temperature=1.0, seed=7, ignore_eos=True) for _ in range(2))
    c = dec.generate(ids, 10, temperature=1.0, seed=8, ignore_eos=True)
    assert a.output_ids == b.output_ids and a.output_ids != c.output_ids


@pytest.mark.slow
def test_smollm2_greedy_equals_target_greedy(tmp_path, smollm2_dir):
    model, tok = load_target(smollm2_dir, dtype="float32", device="cpu")
    draft = SGLangEagle3Draft.from_dir(
        make_random_draft(tmp_path / "d", smollm2_dir, draft_vocab_size=2048),
        target_embed=_embed(model),
    )
    dec = SpeculativeDecoder.from_models(model, draft, tok, num_steps=3)
    for text in PROMPTS[:2]:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        res = dec.generate(ids, 16)
        assert res.output_ids == _hf_greedy(model, ids, 16)
        assert res.verify_ct >= 1


def test_converted_speculators_draft_serves_with_unchanged_greedy_output(tmp_path, tiny):
    """speculators checkpoint → eagle3.convert.stage → SpeculativeDecoder (from folders):
    output is the target's."""
    from testkit.broken_corpus import good_pair

    target_dir, model, tok = tiny
    _, serving = good_pair(tmp_path / "pair", target_dir)
    dec = SpeculativeDecoder(target_dir, serving, num_steps=3)
    assert dec.capture_indices == [2, 4, 5] and dec.draft.load_report["unfilled"] == []
    for text in PROMPTS[:2]:
        ids = tok(text)["input_ids"]
        res = dec.generate(ids, 12)
        assert res.output_ids == _hf_greedy(model, ids, 12) and res.verify_ct >= 1


def test_disabled_aux_capture_feeds_one_layer_width_so_fc_is_bypassed(tmp_path, tiny):
    """The broken integration of failure class 11: the draft receives [T, H], never [T, 3H], and
    nothing fails."""
    target_dir, model, tok = tiny
    draft = SGLangEagle3Draft.from_dir(
        make_random_draft(tmp_path / "d", target_dir), target_embed=_embed(model)
    )
    widths = []
    draft.register_forward_pre_hook(lambda _m, args: widths.append(args[2].shape[-1]))
    ids = tok(PROMPTS[0])["input_ids"]
    SpeculativeDecoder.from_models(model, draft, tok, num_steps=3).generate(ids, 6)
    assert 3 * 64 in widths  # healthy: extend calls get the 3 aux states
    widths.clear()
    SpeculativeDecoder.from_models(model, draft, tok, num_steps=3, capture_aux=False).generate(
        ids, 6
    )
    assert set(widths) == {64}  # broken: every call is one layer wide
