"""The fast path (refengine.fastpath) is exact: in float32 on the CPU it emits the same tokens and
the same per-verify accept counts as SpeculativeDecoder, and its plain decoding equals HF greedy
generation."""

from __future__ import annotations

import json

import pytest
import torch

from eagle3.engines.registry import get_profile
from eagle3.engines.sglang.draft import SGLangEagle3Draft
from eagle3.errors import DataError, EngineUnsupported
from refengine.fastpath import FastDecoder, build_decoder
from refengine.graphs import Step, capture_steps
from refengine.specdec import SpeculativeDecoder
from eagle3.target_model import load_target
from testkit.echo_draft import make_echo_draft
from testkit.sglang_drafts import draft_config, make_random_draft, random_draft_tensors, write_draft

PROMPTS = ["Hello, how are you today?", "Write a haiku about the sea.", "1, 2, 3, 4,"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny(tiny_target_dir):
    model, tok = load_target(tiny_target_dir, dtype="float32", device="cpu")
    return tiny_target_dir, model, tok


def _embed(model):
    return model.get_input_embeddings().weight.detach()


def _hf_greedy(model, ids, n, eos=None):
    """HF ``generate`` greedy; ``eos`` None: no stop token at all (an explicit GenerationConfig
    without one)."""
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return model.generate(torch.tensor([ids]), generation_config=gc)[0, len(ids) :].tolist()


def _echo(tmp_path, target_dir, model, mix=0.3):
    d = make_echo_draft(tmp_path / f"echo{mix}", target_dir, model, mix=mix)
    return SGLangEagle3Draft.from_dir(d, target_embed=_embed(model))


@pytest.mark.parametrize(
    "steps,capture_aux,static",
    [(3, True, False), (3, True, True), (1, True, False), (5, True, True), (3, False, False)],
)
def test_fast_path_equals_slow_decoder_tokens_and_accept_counts(
    tmp_path, tiny, steps, capture_aux, static
):
    target_dir, model, tok = tiny
    draft = _echo(tmp_path, target_dir, model)
    slow = SpeculativeDecoder.from_models(
        model, draft, tok, num_steps=steps, capture_aux=capture_aux
    )
    fast = FastDecoder(
        model,
        draft,
        tok,
        num_steps=steps,
        max_context=320,
        capture_aux=capture_aux,
        static_shapes=static,
    )
    counts = set()
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        a, b = slow.generate(ids, 40, ignore_eos=True), fast.generate(ids, 40, ignore_eos=True)
        assert b.output_ids == a.output_ids
        assert b.accept_counts == a.accept_counts and b.verify_ct == a.verify_ct
        assert (b.accepted_per_position, b.histogram, b.finish_reason) == (
            a.accepted_per_position,
            a.histogram,
            a.finish_reason,
        )
        assert b.output_ids == _hf_greedy(model, ids, 40)
        counts.update(b.accept_counts)
    if capture_aux:
        assert 0 in counts and max(counts) >= min(steps, 3), (
            counts
        )  # rejections and long accepts compared
    if steps == 3 and capture_aux:
        assert counts == {0, 1, 2, 3}, counts


def test_aux_states_equal_the_hook_captured_ones_repeated_ids_and_last_layer_included(tiny):
    """The static target writes what eagle3.target_model.capture_hidden_states captures, every chunk
    filled."""
    from refengine.static_target import StaticLlamaTarget
    from eagle3.target_model import capture_hidden_states

    _, model, tok = tiny
    n_layers = model.config.num_hidden_layers
    ids = tok(PROMPTS[0])["input_ids"]
    for capture in ([2, 2, 3], [1, n_layers // 2, n_layers]):
        st = StaticLlamaTarget(model, 64, capture)
        out = torch.full((len(ids), st.hidden_width), float("nan"))
        logits = st.forward(torch.tensor(ids), torch.arange(len(ids)), len(ids), out)
        with torch.no_grad(), capture_hidden_states(model, sorted(set(capture))) as cap:
            ref = model(input_ids=torch.tensor([ids])).logits[0]
        want = torch.cat([cap[i][0] for i in capture], -1)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)


def test_a_draft_reading_a_repeated_aux_id_gets_the_same_states_as_on_the_generic_path(
    tmp_path, tiny
):
    target_dir, model, tok = tiny
    n_layers = model.config.num_hidden_layers  # 4: SGLang's default rule repeats index 2
    d = make_echo_draft(
        tmp_path / "rep", target_dir, model, mix=0.0, aux_hf_ids=[2, 2, n_layers - 1], pass_chunk=1
    )
    draft = SGLangEagle3Draft.from_dir(d, target_embed=_embed(model))
    slow = SpeculativeDecoder.from_models(model, draft, tok, num_steps=3)
    fast = FastDecoder(model, draft, tok, num_steps=3, max_context=256, static_shapes=True)
    assert fast.capture_indices == [2, 2, n_layers - 1]
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        a, b = slow.generate(ids, 24, ignore_eos=True), fast.generate(ids, 24, ignore_eos=True)
        assert (b.output_ids, b.accept_counts) == (a.output_ids, a.accept_counts)


def test_plain_decoding_equals_hf_greedy_and_stops_like_it(tmp_path, tiny):
    target_dir, model, tok = tiny
    fast = FastDecoder(model, None, tok, max_context=256)
    assert fast.num_steps == 0 and fast.graph_status == "off (device cpu)"
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        res = fast.generate(ids, 30, ignore_eos=True)
        assert res.output_ids == _hf_greedy(model, ids, 30) and res.verify_ct == 0
        eos_stop = fast.generate(ids, 30, stop_token_ids=[res.output_ids[5]], ignore_eos=True)
        assert eos_stop.output_ids == res.output_ids[: res.output_ids.index(res.output_ids[5]) + 1]
        assert eos_stop.finish_reason == {"type": "stop", "matched": res.output_ids[5]}
    # the same engine with a draft, asked for plain decoding, gives the same tokens
    with_draft = FastDecoder(
        model, _echo(tmp_path, target_dir, model), tok, max_context=256, static_shapes=True
    )
    ids = tok(PROMPTS[0])["input_ids"]
    assert with_draft.generate(
        ids, 30, ignore_eos=True, speculative=False
    ).output_ids == _hf_greedy(model, ids, 30)


def test_request_longer_than_the_static_cache_is_a_data_error_naming_both_lengths(tmp_path, tiny):
    target_dir, model, tok = tiny
    fast = FastDecoder(model, _echo(tmp_path, target_dir, model), tok, num_steps=3, max_context=64)
    ids = list(range(10, 30))  # 20 tokens
    assert fast.generate(ids, 41, ignore_eos=True).completion_tokens == 41  # 20 + 41 + 3 = 64 fits
    with pytest.raises(
        DataError,
        match=r"prompt 20 \+ max_new_tokens 42 \+ num_steps 3 = 65 positions exceeds "
        r"the static KV cache of 64 positions",
    ):
        fast.generate(ids, 42)
    with pytest.raises(DataError, match=r"= 65 positions exceeds the static KV cache of 64"):
        fast.generate(ids, 45, speculative=False)
    with pytest.raises(DataError, match="outside the target vocabulary"):
        fast.generate([10**6], 4)


def test_sampling_runs_the_generic_path_with_a_draft_and_is_seeded_without(tmp_path, tiny):
    target_dir, model, tok = tiny
    draft = _echo(tmp_path, target_dir, model)
    fast = FastDecoder(model, draft, tok, num_steps=3, max_context=256)
    slow = SpeculativeDecoder.from_models(model, draft, tok, num_steps=3)
    ids = tok(PROMPTS[1])["input_ids"]
    a = fast.generate(ids, 12, temperature=1.0, seed=3, ignore_eos=True)
    assert (
        a.output_ids == slow.generate(ids, 12, temperature=1.0, seed=3, ignore_eos=True).output_ids
    )
    p1, p2, p3 = (
        fast.generate(ids, 12, temperature=1.0, seed=s, ignore_eos=True, speculative=False)
        for s in (5, 5, 6)
    )
    assert p1.output_ids == p2.output_ids != p3.output_ids and len(p1.output_ids) == 12


def test_aux_ids_come_from_the_engine_profile(tmp_path, tiny):
    target_dir, model, tok = tiny
    d = make_random_draft(tmp_path / "d", target_dir, aux_hf_ids=[1, 3, 7])
    draft = SGLangEagle3Draft.from_dir(d, target_embed=_embed(model))
    fast = FastDecoder(model, draft, tok, max_context=128)
    assert (
        fast.capture_indices
        == get_profile("sglang").engine_to_hf_ids(draft.aux_layer_ids)
        == [1, 3, 7]
    )
    assert fast.tgt.hidden_width == 3 * model.config.hidden_size


def test_profile_times_every_piece(tmp_path, tiny):
    target_dir, model, tok = tiny
    fast = FastDecoder(model, _echo(tmp_path, target_dir, model), tok, num_steps=3, max_context=256)
    ids = tok(PROMPTS[2])["input_ids"]
    prof: dict = {}
    res = fast.generate(ids, 24, ignore_eos=True, profile=prof)
    iv = prof["intervals_ms"]
    assert len(iv["verify"]) == len(iv["chain"]) == len(iv["host"]) == res.verify_ct
    assert sum(len(v) for k, v in iv.items() if k.startswith("extend")) == res.verify_ct - 1
    assert len(prof["iteration_ms"]) == res.verify_ct - 1 and all(x > 0 for x in iv["verify"])
    plain: dict = {}
    fast.generate(ids, 10, ignore_eos=True, speculative=False, profile=plain)
    assert len(plain["intervals_ms"]["decode"]) == 9 and len(plain["iteration_ms"]) == 8


def test_graph_capture_failure_falls_back_and_says_why():
    calls = []
    steps = [Step("verify@256", lambda: calls.append(1))]
    status = capture_steps(
        steps, torch.device("cuda"), reset=lambda: None
    )  # no CUDA in this build: it fails
    assert status.startswith("off (capture of ") and "failed" in status
    assert steps[0].graph is None
    steps[0]()
    assert calls == [1]
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        capture_steps(steps, torch.device("cpu"), reset=lambda: None)


def test_other_architectures_keep_the_generic_path_named(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    dcfg = draft_config(
        json.loads(cfg.to_json_string()), aux_hf_ids=[1, 2, 3], draft_vocab_size=128
    )
    draft = SGLangEagle3Draft.from_dir(
        write_draft(tmp_path / "d", dcfg, random_draft_tensors(dcfg)), target_embed=_embed(model)
    )
    dec, line = build_decoder(model, draft, None, num_steps=2)
    assert isinstance(dec, SpeculativeDecoder) and "Qwen2ForCausalLM" in line and "generic" in line
    with pytest.raises(EngineUnsupported, match="Qwen2ForCausalLM"):
        build_decoder(model, None, None)
    with pytest.raises(EngineUnsupported, match="Qwen2ForCausalLM"):
        FastDecoder(model, draft)


@pytest.mark.slow
def test_smollm2_fast_path_equals_slow_decoder_and_hf_greedy(tmp_path, smollm2_dir):
    model, tok = load_target(smollm2_dir, dtype="float32", device="cpu")
    draft = _echo(tmp_path, smollm2_dir, model, mix=0.0)
    slow = SpeculativeDecoder.from_models(model, draft, tok, num_steps=3)
    fast = FastDecoder(model, draft, tok, num_steps=3, max_context=256, static_shapes=True)
    accepted = 0
    for text in PROMPTS[
        ::2
    ]:  # a chat prompt and a counting one: 2 × 4 decodes of 32 tokens (suite time where
        # bf16/AVX512 kernels are unavailable)
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        a, b = slow.generate(ids, 32), fast.generate(ids, 32)
        assert b.output_ids == a.output_ids and b.accept_counts == a.accept_counts
        hf = _hf_greedy(model, ids, 32, eos=2)
        assert b.output_ids == hf[: hf.index(2) + 1] if 2 in hf else b.output_ids == hf
        assert fast.generate(ids, 32, speculative=False).output_ids == b.output_ids
        accepted += sum(b.accept_counts)
    assert accepted > 0


def test_llama31_features_llama3_rope_untied_head_gqa4_are_exact(monkeypatch):
    """A scaled-down Llama-3.1 (llama3 RoPE scaling, untied LM head, 4 query heads per KV head)
    built by the benchmark's own builders (testkit.random_models): fast path == generic path == HF
    greedy."""
    from testkit import random_models

    shape = dict(
        random_models.SHAPES["llama8b"],
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=1024,
    )
    monkeypatch.setitem(random_models.SHAPES, "mini31", shape)
    target = random_models.random_target("mini31", "cpu")
    assert (
        target.config.rope_parameters["rope_type"] == "llama3"
        and not target.config.tie_word_embeddings
    )
    draft = random_models.random_draft(target, 256, "cpu")
    fast = FastDecoder(target, draft, None, num_steps=3, max_context=9000, static_shapes=True)
    assert fast.buckets == [
        256,
        512,
        1024,
        2048,
        4096,
        8192,
        9000,
    ]  # the last window is the context itself
    slow = SpeculativeDecoder.from_models(target, draft, None, num_steps=3)
    for ids in (list(range(3, 40)), [5] * 20):
        a, b = slow.generate(ids, 24, ignore_eos=True), fast.generate(ids, 24, ignore_eos=True)
        assert (b.output_ids, b.accept_counts) == (a.output_ids, a.accept_counts)
        assert fast.generate(ids, 24, ignore_eos=True, speculative=False).output_ids == _hf_greedy(
            target, ids, 24
        )
