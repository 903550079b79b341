"""The offline figure (eagle3.measure.offline.offline_acceptance, exact greedy replay) is the same
number as decoding every bench prompt with the reference engine's decoder
(refengine.loader.load_decoder), and bench settings it cannot follow are labelled, not compared."""

from __future__ import annotations

import pytest

from eagle3.measure.bench import acceptance_verdict
from eagle3.measure.offline import offline_acceptance, unlike_served

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

ROW_KEYS = (
    "id",
    "completion_tokens",
    "verify_ct",
    "accepted_per_position",
    "histogram",
    "num_draft_tokens",
    "acceptance_length",
)


def _both(target_dir, tmp_path, num_prompts, max_new_tokens):
    from refengine.loader import load_decoder
    from eagle3.target_model import load_target
    from testkit.echo_draft import make_echo_draft

    model, _ = load_target(target_dir, dtype="float32", device="cpu")
    draft = make_echo_draft(tmp_path / "echo", target_dir, model)
    new = offline_acceptance(
        target_dir,
        draft,
        "mtbench",
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        num_steps=3,
    )
    dec, _ = load_decoder(target_dir, draft, num_steps=3, dtype="float32", device="cpu")
    old = offline_acceptance(
        target_dir,
        draft,
        "mtbench",
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        decoder=dec,
    )
    return new, old


def _assert_same(new, old):
    assert [{k: r[k] for k in ROW_KEYS} for r in new["per_request"]] == [
        {k: r[k] for k in ROW_KEYS} for r in old["per_request"]
    ]
    for key in (
        "acceptance_length",
        "acceptance_length_sglang",
        "acceptance_rate",
        "per_position",
        "histogram",
        "per_category",
    ):
        assert new[key] == old[key], key
    assert new["settings"]["method"].startswith("replay") and old["settings"]["method"] == "decoder"
    assert new["unlike_served"] is None


def test_replay_figure_equals_the_reference_decoder_on_tiny_random(tiny_target_dir, tmp_path):
    new, old = _both(tiny_target_dir, tmp_path, 8, 16)
    _assert_same(new, old)
    assert sum(new["histogram"][1:]) > 0  # some drafts accepted: the comparison has teeth


@pytest.mark.slow
def test_replay_figure_equals_the_reference_decoder_at_demo_size(smollm2_dir, tmp_path):
    """The demo's bench (configs/smollm2-cpu.yaml: 8 MT-Bench prompts x 64 tokens, 3 steps) on
    SmolLM2 in float32."""
    new, old = _both(smollm2_dir, tmp_path, 8, 64)
    _assert_same(new, old)


def test_bench_settings_the_greedy_figure_cannot_follow_are_labelled_not_compared():
    assert unlike_served(0.0, 1) is None
    assert "temperature 0.7" in unlike_served(0.7, 1) and "topk 4" in unlike_served(0.0, 4)
    label = unlike_served(0.0, 4)
    verdict = acceptance_verdict(1.02, 1.8, 1.3, label)
    assert "not compared" in verdict and "serving integration" not in verdict
    assert acceptance_verdict(1.5, 1.8, 1.3, label) is None
    # comparable settings: the diagnosis as before
    assert "serving integration" in acceptance_verdict(1.02, 1.8, 1.3)
