"""Replay acceptance (eagle3.measure.replay): the contract is equality with SpeculativeDecoder,
request by request (output tokens, verify passes, accepted drafts per position, histogram), in
float32 on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from eagle3.engines.sglang.draft import SGLangEagle3Draft
from eagle3.measure.replay import (
    Request,
    capture_indices,
    chain_states,
    generate_requests,
    greedy_continuations,
    replay_requests,
    walk,
)
from refengine.specdec import SpeculativeDecoder
from eagle3.target_model import load_target
from testkit.replay_drafts import distilled_draft
from testkit.sglang_drafts import draft_config, make_random_draft, random_draft_tensors, write_draft

FIELDS = (
    "output_ids",
    "verify_ct",
    "accepted_per_position",
    "histogram",
    "finish_reason",
    "num_draft_tokens",
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _load(draft_dir, model):
    return SGLangEagle3Draft.from_dir(
        draft_dir,
        target_embed=model.get_input_embeddings().weight.detach(),
        target_head=model.get_output_embeddings().weight.detach(),
    )


def _requests(prompts, conts):
    return [
        Request(str(i), "c", "s", 1, str(i), p, c) for i, (p, c) in enumerate(zip(prompts, conts))
    ]


def _same(replayed, decoded):
    return {
        f: (getattr(replayed, f), getattr(decoded, f))
        for f in FIELDS
        if getattr(replayed, f) != getattr(decoded, f)
    }


# --- a chaotic small-vocabulary target: varied greedy text, so a briefly trained draft accepts a
# mix ---

V = 64


@pytest.fixture(scope="module")
def chaotic(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=None,
        initializer_range=0.5,
    )
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(0, V, (int(n),), generator=g).tolist()
        for n in torch.randint(3, 12, (12,), generator=g)
    ]
    d = distilled_draft(
        tmp_path_factory.mktemp("chaotic") / "draft",
        model,
        prompts,
        max_new_tokens=40,
        draft_vocab_size=V,
        steps=60,
        lr=1e-2,
    )
    return model, _load(d, model), prompts


@pytest.mark.parametrize("steps", [1, 3, 5])
def test_replay_equals_decoder_with_a_trained_draft(chaotic, steps):
    model, draft, prompts = chaotic
    conts = greedy_continuations(model, prompts, 40, batch_size=5)
    results, _, _ = replay_requests(
        model, {"d": draft}, _requests(prompts, conts), steps, max_new_tokens=40, batch_size=5
    )
    dec = SpeculativeDecoder.from_models(model, draft, None, num_steps=steps)
    hist = [0] * (steps + 1)
    for p, r in zip(prompts, results["d"]):
        assert _same(r, dec.generate(p, 40)) == {}
        hist = [a + b for a, b in zip(hist, r.histogram)]
    assert sum(h > 0 for h in hist) >= min(steps + 1, 3), (
        hist
    )  # partial acceptances, not all-or-nothing
    assert hist[0] > 0 and hist[-1] > 0


def _passes(dec, prompt, budget):
    """Per verify pass of a decoder run: (tokens emitted before it, accepted drafts counted)."""
    snaps = []
    dec.generate(
        prompt,
        budget,
        on_tokens=lambda r: snaps.append((len(r.output_ids), sum(r.accepted_per_position))),
    )
    return [(snaps[i - 1][0], snaps[i][1] - snaps[i - 1][1]) for i in range(1, len(snaps))]


def test_a_budget_that_cuts_a_verify_pass_counts_only_emitted_drafts(chaotic):
    model, draft, prompts = chaotic
    dec = SpeculativeDecoder.from_models(model, draft, None, num_steps=3)
    conts = greedy_continuations(model, prompts, 40)
    cuts = [
        (i, before + 1)
        for i, p in enumerate(prompts)
        for before, a in _passes(dec, p, 40)
        if a >= 2
    ]
    assert len(cuts) >= 3
    for i, budget in cuts[:6]:  # budget ends one token into a pass that accepted >= 2 drafts
        res, _, _ = replay_requests(
            model, {"d": draft}, _requests([prompts[i]], [conts[i]]), 3, max_new_tokens=budget
        )
        want = dec.generate(prompts[i], budget)
        assert _same(res["d"][0], want) == {} and want.finish_reason == {
            "type": "length",
            "length": budget,
        }
    for budget in range(1, 12):  # every small budget of one prompt, including 1 (no verify pass)
        res, _, _ = replay_requests(
            model, {"d": draft}, _requests([prompts[0]], [conts[0]]), 3, max_new_tokens=budget
        )
        assert _same(res["d"][0], dec.generate(prompts[0], budget)) == {}


def test_a_stop_token_ends_replay_where_it_ends_decoding(chaotic):
    model, draft, prompts = chaotic
    dec = SpeculativeDecoder.from_models(model, draft, None, num_steps=3)
    plain = greedy_continuations(model, prompts, 40)
    stop = plain[0][6]
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = stop
    try:
        conts = greedy_continuations(model, prompts, 40)
        res, _, _ = replay_requests(
            model, {"d": draft}, _requests(prompts, conts), 3, max_new_tokens=40
        )
        dec = SpeculativeDecoder.from_models(model, draft, None, num_steps=3)
        ended = 0
        for p, c, r in zip(prompts, conts, res["d"]):
            want = dec.generate(p, 40)
            assert _same(r, want) == {}
            ended += want.finish_reason == {"type": "stop", "matched": stop}
        assert conts[0] == plain[0][: plain[0].index(stop) + 1] and ended >= 1
    finally:
        model.generation_config.eos_token_id = saved


def test_walk_counts_a_request_ended_by_its_prefill_token_as_no_verify_pass():
    res = walk(3, [5, 6, 7, 2], [[0]] * 3, 1, {2}, 10)
    assert (
        res.verify_ct == 0
        and res.output_ids == [2]
        and res.finish_reason == {"type": "stop", "matched": 2}
    )
    res = walk(
        2, [5, 6, 7, 8, 9], [[9], [8], [9], [0]], 1, set(), 3
    )  # base 1: proposes 8 for seq[3]
    assert res.verify_ct == 1 and res.accepted_per_position == [1] and res.histogram == [0, 1]


def test_every_position_counts_the_positions_decoding_jumps_over():
    """An easy stretch (every draft right) then a hard one (every draft wrong): decoding visits
    the easy stretch every 4 tokens and the hard one at every token, so the per-pass figure is
    below the every-position one that a teacher-forced simulation averages."""
    from eagle3.measure.acceptance import all_positions_acceptance_length

    seq = list(range(25))  # prompt [0], continuation 1..24; a pass at t proposes seq[t+2..t+4]
    proposals = [[t + 2, t + 3, t + 4] if t < 12 else [-1, -1, -1] for t in range(24)]
    res = walk(1, seq, proposals, 3, set(), 24)
    # passes at 0, 4, 8 accept 3; then one pass per token from 12 to 22
    assert res.histogram == [11, 0, 0, 3] and res.verify_ct == 14
    assert res.position_histogram == [11, 0, 0, 12]  # positions 0..22, each counted once
    assert 1 + sum(res.accepted_per_position) / res.verify_ct == pytest.approx(23 / 14)
    assert all_positions_acceptance_length(res.position_histogram) == pytest.approx(59 / 23)
    assert all_positions_acceptance_length([0, 0]) is None
    # near the end a position can accept only what is left of the continuation
    res = walk(1, list(range(6)), [[t + 2, t + 3, t + 4] for t in range(5)], 3, set(), 5)
    assert res.position_histogram == [0, 1, 1, 2] and res.histogram == [0, 0, 0, 1]


def test_every_position_histogram_holds_each_pass_and_counts_every_position(chaotic):
    model, draft, prompts = chaotic
    conts = greedy_continuations(model, prompts, 40, batch_size=5)
    results, _, _ = replay_requests(
        model, {"d": draft}, _requests(prompts, conts), 3, max_new_tokens=40, batch_size=5
    )
    for c, r in zip(conts, results["d"]):
        assert sum(r.position_histogram) == max(len(c) - 1, 0)
        assert all(p >= h for p, h in zip(r.position_histogram, r.histogram))  # passes: a subset
        assert r.out_of_draft_vocab == 0  # the draft's vocabulary is the target's
    pooled = [sum(col) for col in zip(*(r.position_histogram for r in results["d"]))]
    assert 0 < pooled[0] < sum(pooled) and pooled[-1] > 0


def test_out_of_draft_vocab_counts_what_the_d2t_map_cannot_reach(tmp_path, tiny_target_dir):
    from safetensors.torch import load_file

    model, tok = load_target(tiny_target_dir, dtype="float32", device="cpu")
    d = make_random_draft(tmp_path / "draft", tiny_target_dir, draft_vocab_size=512)
    draft = _load(d, model)
    d2t = load_file(str(d / "model.safetensors"))["d2t"]
    reachable = set((d2t + torch.arange(len(d2t))).tolist())
    prompts = _chat(tok, ["Hi", "Write a haiku about the sea."])
    conts = greedy_continuations(model, prompts, 16)
    results, _, _ = replay_requests(model, {"d": draft}, _requests(prompts, conts), 3,
                                    max_new_tokens=16)
    want = [sum(t not in reachable for t in c) for c in conts]
    assert [r.out_of_draft_vocab for r in results["d"]] == want and sum(want) > 0


# --- the TTT forward against the draft's own incremental forward (two layers, forced tokens) ---


def test_chain_states_equal_the_incremental_draft_forward(tmp_path, tiny_target_dir):
    model, _ = load_target(tiny_target_dir, dtype="float32", device="cpu")
    cfg = json.loads((tiny_target_dir / "config.json").read_text())
    dcfg = draft_config(cfg, aux_hf_ids=[2, 4, 5], draft_vocab_size=256, num_layers=2)
    draft = _load(write_draft(tmp_path / "d", dcfg, random_draft_tensors(dcfg, seed=1)), model)
    g = torch.Generator().manual_seed(0)
    tokens, hidden = (
        torch.randint(0, cfg["vocab_size"], (2, 10), generator=g),
        torch.randn(2, 10, 192, generator=g),
    )
    with torch.no_grad():
        states = chain_states(draft, tokens, hidden, 3)
        for b in range(2):
            for t in range(9):
                cache = draft.new_cache()
                logits, h = draft(
                    tokens[b, 1 : t + 2], torch.arange(t + 1), hidden[b, : t + 1], cache
                )
                ref = [logits[-1]]
                for j in (2, 3):
                    tok = tokens[b, t + j] if t + j < 10 else torch.tensor(0)
                    logits, h = draft(tok.view(1), torch.tensor([t + j - 1]), h[-1:], cache)
                    ref.append(logits[-1])
                for j in range(3):
                    torch.testing.assert_close(
                        draft.lm_head(states[j][b, t]).float(), ref[j], atol=1e-5, rtol=1e-5
                    )


def test_capture_indices_go_through_the_engine_profile(tmp_path, tiny_target_dir):
    from eagle3.errors import EngineUnsupported

    model, _ = load_target(tiny_target_dir, dtype="float32", device="cpu")
    d = _load(
        make_random_draft(tmp_path / "d", tiny_target_dir, aux_hf_ids=[1, 3, 7]), model
    )  # SGLang [0, 2, 6]
    assert d.aux_layer_ids == [0, 2, 6] and capture_indices(d, model) == [1, 3, 7]
    bad = _load(make_random_draft(tmp_path / "bad", tiny_target_dir, aux_hf_ids=[2, 4, 8]), model)
    with pytest.raises(EngineUnsupported, match=r"\[8\]"):
        capture_indices(bad, model)


# --- tiny-random and SmolLM2 with their tokenizers ---


def _chat(tok, texts):
    from eagle3.measure.prompts import encode_prompts

    return encode_prompts([{"text": t} for t in texts], tok)


def _batch_one(model, ids, n):
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[
        0, len(ids) :
    ].tolist()
    return out[: out.index(2) + 1] if 2 in out else out


def test_batched_generation_equals_batch_one_on_tiny_random(tiny_target_dir):
    model, tok = load_target(tiny_target_dir, dtype="float32", device="cpu")
    g = torch.Generator().manual_seed(3)
    prompts = _chat(tok, ["Hi", "Write a haiku about the sea.", "1, 2, 3, 4,"]) + [
        torch.randint(3, 49152, (n,), generator=g).tolist() for n in (4, 17)
    ]
    assert greedy_continuations(model, prompts, 12, batch_size=5) == [
        _batch_one(model, p, 12) for p in prompts
    ]


def test_generate_requests_asks_turn_two_after_the_targets_own_answer(tiny_target_dir):
    from eagle3.measure.prompts import encode_conversation

    model, tok = load_target(tiny_target_dir, dtype="float32", device="cpu")
    convs = [
        {"id": "a", "category": "x", "set": "s", "turns": ["Hello there", "And then?"]},
        {"id": "b", "category": "y", "set": "s", "turns": ["One turn only"]},
    ]
    reqs = generate_requests(model, tok, convs, 6)
    assert [(r.id, r.turn, r.conversation) for r in reqs] == [
        ("a/turn1", 1, "a"),
        ("b", 1, "b"),
        ("a/turn2", 2, "a"),
    ]
    answer = tok.decode(reqs[0].output_ids, skip_special_tokens=True)
    assert reqs[2].prompt_ids == encode_conversation(tok, ["Hello there", "And then?"], [answer])
    assert reqs[2].prompt_ids[: len(reqs[0].prompt_ids)] == reqs[0].prompt_ids
    assert reqs[0].output_ids == _batch_one(model, reqs[0].prompt_ids, 6)


@pytest.mark.slow
def test_smollm2_replay_equals_decoder_with_a_trained_draft(tmp_path, smollm2_dir):
    from eagle3.measure.prompts import encode_prompts, mtbench_prompts

    model, tok = load_target(smollm2_dir, dtype="float32", device="cpu")
    prompts = encode_prompts(mtbench_prompts()[:4], tok) + _chat(
        tok, ["Answer with one word: is water wet?"]
    )
    assert greedy_continuations(model, prompts, 24, batch_size=5) == [
        _batch_one(model, p, 24) for p in prompts
    ]
    draft = _load(
        distilled_draft(
            tmp_path / "d",
            model,
            prompts[:4],
            max_new_tokens=32,
            hidden_size=64,
            draft_vocab_size=512,
            steps=30,
        ),
        model,
    )
    conts = greedy_continuations(model, prompts, 32)
    assert (
        conts[-1][-1] == 2 and len(conts[-1]) < 32
    )  # the one-word answer ends early with <|im_end|>
    res, _, _ = replay_requests(
        model, {"d": draft}, _requests(prompts, conts), 3, max_new_tokens=32
    )
    dec = SpeculativeDecoder.from_models(model, draft, tok, num_steps=3)
    hist = [0] * 4
    for p, r in zip(prompts, res["d"]):
        assert _same(r, dec.generate(p, 32)) == {}
        hist = [a + b for a, b in zip(hist, r.histogram)]
    assert sum(h > 0 for h in hist) >= 3, hist
