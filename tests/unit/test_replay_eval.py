"""Prompt sets for replay (MT-Bench both turns, the GSM8K sample), the bootstrap spread,
evaluate_drafts and the ``lab/offline_replay.py evaluate`` command."""

from __future__ import annotations

import json

import pytest
import torch

from eagle3.errors import DataError
from eagle3.measure import replay
from eagle3.measure.prompts import (
    encode_conversation,
    encode_prompts,
    gsm8k_sample,
    load_conversations,
    mtbench_conversations,
)
from eagle3.measure.spread import bootstrap_acceptance
from testkit.sglang_drafts import make_random_draft


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# --- prompt sets ---


def test_mtbench_has_both_turns_of_80_questions_in_8_categories():
    convs = load_conversations("mtbench2")
    assert len(convs) == 80 and all(len(c["turns"]) == 2 and c["set"] == "mtbench2" for c in convs)
    assert len({c["category"] for c in convs}) == 8 and convs == [
        {**c, "set": "mtbench2"} for c in mtbench_conversations()
    ]
    assert [len(c["turns"]) for c in load_conversations("mtbench")] == [1] * 80


def test_gsm8k_sample_is_fixed_distinct_and_seeded():
    a, b = gsm8k_sample(200), gsm8k_sample(200)
    ids = [int(p["id"].split("-")[1]) for p in a]
    assert a == b and len(set(ids)) == 200 and ids == sorted(ids) and max(ids) > 1000
    assert [p["id"] for p in load_conversations("gsm8k200")] == [p["id"] for p in a]
    assert {p["id"] for p in gsm8k_sample(200, seed=1)} != {p["id"] for p in a}
    with pytest.raises(DataError, match="1 <= n <= 1319, got 2000"):
        gsm8k_sample(2000)
    with pytest.raises(DataError, match="expected one of"):
        load_conversations("mtbench3")


def test_encode_conversation_first_turn_is_the_single_turn_prompt_and_turn_two_carries_the_answer(
    smollm2_dir,
):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    q = mtbench_conversations()[0]["turns"]
    assert encode_conversation(tok, q[:1], []) == encode_prompts([{"text": q[0]}], tok)[0]
    two = tok.decode(encode_conversation(tok, q, ["MY ANSWER"]))
    assert two.index(q[0]) < two.index("MY ANSWER") < two.index(q[1]) and two.rstrip().endswith(
        "assistant"
    )
    with pytest.raises(DataError, match="len\\(answers\\) == len\\(questions\\) - 1"):
        encode_conversation(tok, q, [])


# --- the spread ---


def _rows(pairs, turns=1):
    return [
        {
            "id": f"r{i}",
            "conversation": f"c{i // turns}",
            "accepted_per_position": [a],
            "verify_ct": v,
        }
        for i, (a, v) in enumerate(pairs)
    ]


def test_bootstrap_of_two_prompts_has_the_exact_percentiles():
    # two prompts 1.0 and 2.0 (10 passes each): a resample is {1.0, 1.5, 2.0} with p = 1/4, 1/2, 1/4
    ci = bootstrap_acceptance(_rows([(0, 10), (10, 10)]), resamples=4000, seed=3)
    assert (ci["low"], ci["high"]) == (1.0, 2.0) and ci["units"] == 2
    assert bootstrap_acceptance(_rows([(0, 10), (10, 10)]), resamples=4000, seed=3) == ci  # seeded
    same = bootstrap_acceptance(_rows([(3, 10)] * 20))
    assert same["low"] == same["high"] == pytest.approx(1.3)


def test_bootstrap_draws_conversations_and_narrows_with_more_of_them():
    g = torch.Generator().manual_seed(0)
    pairs = [(int(torch.randint(0, 30, (1,), generator=g)), 20) for _ in range(400)]
    wide, narrow = bootstrap_acceptance(_rows(pairs[:40])), bootstrap_acceptance(_rows(pairs))
    point = 1 + sum(a for a, _ in pairs) / sum(v for _, v in pairs)
    assert narrow["low"] < point < narrow["high"]
    assert narrow["high"] - narrow["low"] < 0.6 * (wide["high"] - wide["low"])
    assert bootstrap_acceptance(_rows(pairs, turns=2))["units"] == 200  # both turns drawn together
    with pytest.raises(DataError, match="resamples >= 1000"):
        bootstrap_acceptance(_rows(pairs), resamples=100)
    with pytest.raises(DataError, match="verify_ct <= 0"):
        bootstrap_acceptance(_rows([(0, 0)]))


# --- evaluate_drafts and the command ---


@pytest.fixture(scope="module")
def two_drafts(tmp_path_factory, tiny_target_dir):
    from testkit.replay_drafts import distilled_draft
    from eagle3.measure.prompts import encode_prompts as enc
    from eagle3.target_model import load_target

    d = tmp_path_factory.mktemp("drafts")
    model, tok = load_target(tiny_target_dir, dtype="float32", device="cpu")
    trained = distilled_draft(
        d / "trained",
        model,
        enc([{"text": c["turns"][0]} for c in mtbench_conversations()[:8]], tok),
        max_new_tokens=8,
        draft_vocab_size=256,
        steps=40,
        lr=1e-2,
    )
    return {"random": make_random_draft(d / "random", tiny_target_dir), "trained": trained}


def test_evaluate_drafts_generates_once_and_replays_every_draft(
    tiny_target_dir, two_drafts, monkeypatch
):
    from eagle3.measure.acceptance import ACCEPTANCE_CONVENTION
    from eagle3.measure.offline import evaluate_drafts
    from refengine.specdec import SpeculativeDecoder

    calls = []
    real = replay.greedy_continuations
    monkeypatch.setattr(
        replay, "greedy_continuations", lambda *a, **k: calls.append(len(a[1])) or real(*a, **k)
    )
    out = evaluate_drafts(
        tiny_target_dir,
        two_drafts,
        prompt_sets=["mtbench2", "gsm8k6"],
        max_new_tokens=5,
        batch_size=64,
        check_against_decoder=3,
        make_decoder=SpeculativeDecoder.from_models,
        progress=False,
    )
    assert calls == [86, 80]  # turn 1 of every conversation, then turn 2: once for both drafts
    json.dumps(out)
    for name, r in out.items():
        assert r["settings"]["convention"] == ACCEPTANCE_CONVENTION and r["settings"][
            "capture_indices"
        ] == [2, 4, 5]
        assert (
            r["overall"]["num_requests"] + len(r["no_verify_pass"]) == 166
            and len(r["per_request"]) == 166
        )
        assert (
            set(r["per_set"]) == {"mtbench2", "gsm8k6"} and len(r["per_category"]["mtbench2"]) == 8
        )
        assert (
            set(r["per_turn"]["mtbench2"]) == {"turn1", "turn2"} and "gsm8k6" not in r["per_turn"]
        )
        o = r["overall"]
        assert (
            o["ci"]["low"] <= o["acceptance_length"] <= o["ci"]["high"] and o["ci"]["units"] == 86
        )
        assert o["acceptance_length"] == pytest.approx(
            1 + sum(o["histogram"][j] * j for j in range(4)) / o["verify_ct"]
        )
        assert r["decoder_check"]["n"] == 3 and r["decoder_check"]["equal"] == 3, r["decoder_check"]
        assert r["wall_s"]["replay"] > 0 and r["wall_s"]["shared"] > r["wall_s"]["replay"]
        flat = r["offline_format"]  # offline_acceptance's shape, all requests pooled
        assert flat["acceptance_length"] == o["acceptance_length"] and set(
            flat["per_category"]
        ) >= {"writing", "gsm8k"}
    assert (
        out["random"]["overall"]["acceptance_length"]
        < out["trained"]["overall"]["acceptance_length"]
    )


def test_command_checks_arguments_before_loading(tmp_path, tiny_target_dir, two_drafts):
    from typer.testing import CliRunner

    from lab.offline_replay import app

    ok = f"trained={two_drafts['trained']}"
    spec = tmp_path / "speculators-checkpoint"
    spec.mkdir()
    (spec / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    cases = [
        (["--draft", "nodir"], "expected NAME=DIR, got 'nodir'"),
        (["--draft", ok, "--draft", ok], "name 'trained' given twice"),
        (
            ["--draft", f"x={tmp_path / 'missing'}"],
            "expected an SGLang draft folder with config.json",
        ),
        (["--draft", ok, "--sets", "mtbench2,nosuchset"], "got 'nosuchset'"),
        (["--draft", ok, "--num-steps", "0"], "num_steps: expected an integer >= 1, got 0"),
        (["--draft", ok, "--dtype", "fp8"], "dtype: expected one of"),
        (
            ["--draft", ok, "--out", str(tmp_path / "no" / "x.json")],
            "expected a file path in an existing folder",
        ),
        (
            ["--draft", f"s={spec}"],
            "got a speculators training checkpoint; convert it first: eagle3 convert",
        ),
        (
            ["--draft", ok, "--device", "foo"],
            "device: expected auto, cpu, cuda or cuda:N, got 'foo'",
        ),
    ]
    runner = CliRunner()
    for extra, message in cases:
        args = [
            "evaluate",
            "--target",
            str(tiny_target_dir),
            "--out",
            str(tmp_path / "o.json"),
        ] + extra
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and message in r.output, (extra, r.output)
    r = runner.invoke(
        app,
        [
            "evaluate",
            "--target",
            str(tiny_target_dir),
            "--draft",
            ok,
            "--sets",
            "gsm8k4",
            "--quiet",
            "--out",
            str(tmp_path / "o.json"),
            "--max-new-tokens",
            "4",
            "--check-against-decoder",
            "2",
        ],
    )
    assert r.exit_code == 0, r.output
    saved = json.loads((tmp_path / "o.json").read_text())["drafts"]["trained"]
    assert saved["overall"]["num_requests"] + len(saved["no_verify_pass"]) == 4
    assert "decoder check: 2/2 equal" in r.output and "trained: acceptance length" in r.output


def test_python_dash_m_runs_the_command(tmp_path, tiny_target_dir):
    """``python lab/offline_replay.py evaluate`` (the documented entry) parses its arguments and
    exits 2 on a bad one."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "lab" / "offline_replay.py"
    r = subprocess.run(
        [
            sys.executable,
            str(script),
            "evaluate",
            "--target",
            str(tiny_target_dir),
            "--draft",
            "nodir",
            "--out",
            str(tmp_path / "o.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "expected NAME=DIR, got 'nodir'" in r.stdout + r.stderr, (
        r.returncode,
        r.stderr,
    )
