"""The development-set acceptance meter (eagle3.measure.dev_acceptance) and its use in training
(train.select_best_by=measured): it equals the offline figure on the same prompts and draft, it is
measured again for each checkpoint, and the best checkpoint is the one it rates highest."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from eagle3.measure.dev_acceptance import DevAcceptance, split_prompts
from eagle3.measure.offline import offline_acceptance

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

PROMPTS = [
    {"id": f"p{i}", "category": "dev", "text": t}
    for i, t in enumerate(
        [
            "Write a haiku about rain.",
            "What is 17 times 3?",
            "Name three rivers in Europe.",
            "Explain recursion to a child.",
            "Give me a packing list for a beach day.",
        ]
    )
]


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    from eagle3.target_model import load_target

    return load_target(tiny_target_dir, dtype="float32", device="cpu")


def _prompt_ids(tok):
    from eagle3.measure.prompts import encode_prompts

    return encode_prompts(PROMPTS, tok)


def test_split_prompts_take_the_tokens_before_the_first_loss_token_and_skip_plain_text():
    ids = [torch.arange(10), torch.arange(20, 26), torch.arange(30, 38)]
    masks = [
        torch.tensor([0, 0, 0, 1, 1, 1, 0, 1, 1, 1]),
        torch.ones(6, dtype=torch.long),
        torch.tensor([0, 0, 1, 1, 1, 1, 1, 1]),
    ]
    assert split_prompts(ids, masks, [0, 1, 2], cap=8) == ([[0, 1, 2], [30, 31]], [0, 2])
    assert split_prompts(ids, masks, [2, 0], cap=1) == ([[30, 31]], [2])


def test_meter_equals_offline_acceptance_exactly(tmp_path, tiny_target_dir, target):
    """A briefly distilled draft (it accepts a mix of chain lengths): the meter's acceptance length
    and per-position rates equal offline_acceptance's on the same prompts, float32."""
    from eagle3.engines.sglang.draft import SGLangEagle3Draft
    from testkit.replay_drafts import distilled_draft

    model, tok = target
    ids = _prompt_ids(tok)
    draft_dir = distilled_draft(tmp_path / "draft", model, ids, max_new_tokens=24, steps=40)
    off = offline_acceptance(
        tiny_target_dir,
        draft_dir,
        PROMPTS,
        max_new_tokens=24,
        num_steps=3,
        dtype="float32",
        device="cpu",
    )
    meter = DevAcceptance(model, ids, num_steps=3, max_new_tokens=24, pad_id=tok.pad_token_id)
    draft = SGLangEagle3Draft.from_dir(
        draft_dir,
        target_embed=model.get_input_embeddings().weight.detach(),
        target_head=model.get_output_embeddings().weight.detach(),
    )
    got = meter.measure(draft)
    assert got["acceptance_length"] == off["acceptance_length"]
    assert got["per_position"] == off["per_position"]
    assert got["histogram"] == off["histogram"]
    assert got["acceptance_length"] > 1.5  # drafts accepted: not a comparison of two 1.0s
    m = meter.metrics(got)
    assert m["dev/acceptance_length"] == off["acceptance_length"]
    assert [m[f"dev/per_position_{k}"] for k in range(3)] == off["per_position"]
    every = off["acceptance_length_all_positions"]
    assert got["acceptance_length_all_positions"] == every is not None
    assert m["dev/acceptance_length_all_positions"] == every
    assert m["dev/out_of_draft_vocab_share"] == off["out_of_draft_vocab_share"] is not None


def _training_run(tmp_path: Path, tiny_target_dir, target, *overrides: str):
    """A prepared training run on a tiny hidden-states folder whose draft vocabulary (token
    frequencies rewritten) starts at the target's usual greedy token: draft id 0 maps to it, so an
    LM head of equal rows proposes it always."""
    from eagle3.train.stage import prepare
    from testkit.hs_fixture import build_hidden_states_dir, tiny_train_cfg

    model, tok = target
    conts = DevAcceptance(
        model, _prompt_ids(tok), num_steps=3, max_new_tokens=24, pad_id=tok.pad_token_id
    ).requests
    top = Counter(t for r in conts for t in r.output_ids).most_common(1)[0][0]
    hs = build_hidden_states_dir(tmp_path / "hs", tiny_target_dir, num_samples=8, val_samples=3)
    torch.save({top + i: 1000 - i for i in range(100)}, hs / "token_freq.pt")
    cfg = tiny_train_cfg(tmp_path / "runs", "train.draft_vocab_size=64", *overrides)
    run = prepare(
        cfg, hs, tmp_path / "train", rank=0, world=1, device=torch.device("cpu"), on_metrics=None
    )
    return cfg, hs, run


def test_training_draft_is_measured_as_converted_and_again_when_it_changes(
    tmp_path, tiny_target_dir, target
):
    """The speculators draft being trained, measured through the convert stage's path, equals
    offline_acceptance of the draft converted by the convert stage; after a weight change the
    meter measures again and gets the new draft's figure."""
    from eagle3.convert.stage import convert
    from eagle3.train.draft_model import save_draft

    model, tok = target
    _, _, run = _training_run(tmp_path, tiny_target_dir, target)
    meter = DevAcceptance(
        model, _prompt_ids(tok), num_steps=3, max_new_tokens=24, pad_id=tok.pad_token_id
    )
    figures = []
    for k in range(2):
        got = meter.measure_training_draft(run.model, tiny_target_dir, work_dir=tmp_path / "w")
        save_draft(run.model, tmp_path / f"spec{k}")
        convert(
            tmp_path / f"spec{k}",
            tmp_path / f"serving{k}",
            target_dir=tiny_target_dir,
            aux_capture=False,
        )
        off = offline_acceptance(
            tiny_target_dir,
            tmp_path / f"serving{k}",
            PROMPTS,
            max_new_tokens=24,
            num_steps=3,
            dtype="float32",
            device="cpu",
        )
        assert got["acceptance_length"] == off["acceptance_length"]
        assert got["per_position"] == off["per_position"]
        figures.append(got["acceptance_length"])
        with torch.no_grad():  # equal rows: draft id 0 (the usual token) wins every argmax
            run.model.lm_head.weight.fill_(0.01)
    assert figures[1] > figures[0] + 0.5, figures
    assert not list((tmp_path / "w").iterdir())  # the converted folders are removed


def test_conversion_warnings_are_logged_once_per_meter_not_at_every_evaluation(
    tmp_path, tiny_target_dir, target, caplog
):
    """A draft whose vocabulary is the first target ids (all-zero d2t: VOCAB_MAP_PREFIX) measured
    three times: the warning is logged once; a meter of another run logs it again."""
    model, tok = target
    _, _, run = _training_run(tmp_path, tiny_target_dir, target)
    n = run.model.d2t.numel()
    t2d = torch.zeros_like(run.model.t2d)
    t2d[:n] = True
    with torch.no_grad():
        run.model.d2t.zero_()
        run.model.t2d.copy_(t2d)
    meters = [
        DevAcceptance(
            model, _prompt_ids(tok)[:2], num_steps=3, max_new_tokens=8, pad_id=tok.pad_token_id
        )
        for _ in range(2)
    ]
    caplog.set_level("WARNING")
    for meter, times in zip(meters, (3, 1)):
        for _ in range(times):
            meter.measure_training_draft(run.model, tiny_target_dir, work_dir=tmp_path / "w")
    prefix = [r for r in caplog.records if "VOCAB_MAP_PREFIX" in r.getMessage()]
    assert len(prefix) == 2, [r.getMessage() for r in caplog.records]
    assert all("logged once per run" in r.getMessage() for r in prefix)
    assert meters[0].warned == meters[1].warned == {"VOCAB_MAP_PREFIX"}


class _ScriptedMeter:
    """Stands in for DevAcceptance in the loop: scripted acceptance lengths, one per evaluation,
    and a record of the weights each call saw (so each evaluation is a new measurement)."""

    def __init__(self, values):
        self.values, self.seen = list(values), []

    def measure_training_draft(self, model, target_dir, *, state_dict=None, work_dir=None):
        self.seen.append(float(model.fc.weight.detach().double().sum()))
        return {
            "acceptance_length": self.values[len(self.seen) - 1],
            "per_position": [0.5],
            "wall_s": 0.0,
        }

    def metrics(self, result, prefix="dev"):
        return {
            f"{prefix}/acceptance_length": result["acceptance_length"],
            f"{prefix}/per_position_0": 0.5,
            f"{prefix}/acceptance_length_all_positions": result["acceptance_length"] + 0.25,
        }


def test_best_by_measured_picks_the_step_the_meter_rates_highest(
    tmp_path, tiny_target_dir, target, monkeypatch
):
    """Evaluations at every step, the meter rating step 2 highest: best/ and the exported draft are
    step 2's, the manifest says the measured figure chose, and simulated would have chosen another
    step (so the test tells the two rules apart)."""
    import eagle3.measure.dev_acceptance as da
    from eagle3.train.stage import train
    from eagle3.train.state import read_info

    meter = _ScriptedMeter([1.2, 2.5, 1.4, 1.3])
    monkeypatch.setattr(da, "meter_for_training", lambda *a, **k: meter)
    cfg, hs, _ = _training_run(
        tmp_path,
        tiny_target_dir,
        target,
        "train.select_best_by=measured",
        "train.max_steps=4",
        "train.schedule=constant",
        "train.eval_every=1",
        "train.lr=3e-3",
    )
    out = tmp_path / "train2"
    manifest = train(cfg, hs, out, progress=False)
    evals = [
        json.loads(x)
        for x in (out / "metrics.jsonl").read_text().splitlines()
        if json.loads(x)["kind"] == "eval"
    ]
    assert [e["dev/acceptance_length"] for e in evals] == [1.2, 2.5, 1.4, 1.3]
    assert len(set(meter.seen)) == 4  # measured again at each evaluation, on new weights
    sims = [e["val/simulated_acceptance_length"] for e in evals]
    assert sims.index(max(sims)) + 1 != 2, sims
    assert manifest["best"]["step"] == 2 and manifest["exported"] == {"which": "best", "step": 2}
    assert manifest["best"]["selected_by"] == "dev/acceptance_length"
    assert manifest["metrics"]["best_selected_by"] == "dev/acceptance_length"
    assert manifest["metrics"]["dev_acceptance_length"] == 2.5
    assert manifest["metrics"]["dev_acceptance_length_all_positions"] == 2.75  # step 2's too
    assert read_info(out / "state" / "best")["step"] == 2
    assert evals[-1]["best/dev_acceptance_length"] == 2.5 and evals[-1]["best/step"] == 2.0


def test_a_measured_tie_goes_to_the_higher_simulated_figure(tmp_path, tiny_target_dir, target,
                                                            monkeypatch):
    import eagle3.measure.dev_acceptance as da
    import eagle3.train.loop as loop
    from eagle3.train.stage import train

    monkeypatch.setattr(da, "meter_for_training", lambda *a, **k: _ScriptedMeter([1.0] * 4))
    sims = iter([1.1, 1.3, 1.2, 1.05])  # the simulated figure of each evaluation, scripted
    real = loop.summarize

    def scripted(counts, prefix):
        out = real(counts, prefix)
        if prefix == "val":
            out["val/simulated_acceptance_length"] = next(sims)
        return out

    monkeypatch.setattr(loop, "summarize", scripted)
    cfg, hs, _ = _training_run(tmp_path, tiny_target_dir, target, "train.select_best_by=measured",
                               "train.max_steps=4", "train.schedule=constant",
                               "train.eval_every=1", "train.lr=3e-3")
    out = tmp_path / "tie"
    manifest = train(cfg, hs, out, progress=False)
    sims = [json.loads(x)["val/simulated_acceptance_length"]
            for x in (out / "metrics.jsonl").read_text().splitlines()
            if json.loads(x)["kind"] == "eval"]
    assert sims == [1.1, 1.3, 1.2, 1.05]
    assert manifest["best"]["step"] == 2 and manifest["exported"] == {"which": "best", "step": 2}


def _metrics_rows(dev: bool) -> list[dict]:
    rows = []
    for step, (sim, al) in enumerate([(2.9, 1.6), (3.1, 1.9), (3.2, 1.8)], start=1):
        rows.append({"step": step * 10, "kind": "train", "train/loss": 2.0 - step * 0.1})
        rows.append(
            {
                "step": step * 10,
                "kind": "eval",
                "val/loss": 2.2 - step * 0.1,
                "val/simulated_acceptance_length": sim,
                **({"dev/acceptance_length": al} if dev else {}),
            }
        )
    return rows


def test_decision_and_training_length_curve_read_the_measured_figure_when_logged(tmp_path):
    from eagle3.decide import history_from_metrics, recommend, training_signals
    from flows.sweep_decision import training_curves

    h = history_from_metrics(_metrics_rows(dev=True), epochs=1.0)
    assert h["dev_acceptance"] == [1.6, 1.9, 1.8]
    s = training_signals(h)
    assert s["dev_acceptance_last"] == 1.8 and s["dev_acceptance_slope_rel"] > 0
    assert recommend(h, {}).evidence["dev_acceptance_last"] == 1.8
    assert "dev_acceptance" not in history_from_metrics(_metrics_rows(dev=False))
    assert "dev_acceptance_last" not in training_signals(
        history_from_metrics(_metrics_rows(dev=False))
    )
    for name, dev in (("m", True), ("s", False)):
        (tmp_path / name / "train").mkdir(parents=True)
        (tmp_path / name / "train" / "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in _metrics_rows(dev))
        )
    curves = training_curves([{"run_dir": str(tmp_path / n), "point": n} for n in "ms"])
    assert [(c["label"], c["kind"], c["acceptance"]) for c in curves] == [
        ("m", "measured", [1.6, 1.9, 1.8]),
        ("s", "simulated", [2.9, 3.1, 3.2]),
    ]
    assert [c["steps"] for c in curves] == [[10, 20, 30]] * 2


def test_no_dev_prompt_is_an_error_naming_the_setting(tiny_target_dir, tmp_path):
    from types import SimpleNamespace

    from eagle3.errors import DataError
    from eagle3.measure.dev_acceptance import meter_for_training

    t = SimpleNamespace(dev_prompts_file=None, dev_prompts=4, ttt_steps=3, dev_max_new_tokens=8)
    plain = SimpleNamespace(input_ids=[torch.arange(5)], loss_mask=[torch.ones(5)], val_ids=[0])
    with pytest.raises(
        DataError,
        match="select_best_by=measured: expected dev prompts from the "
        "validation split \\(1 samples\\), got none",
    ):
        meter_for_training(t, plain, tiny_target_dir, torch.device("cpu"))
    (tmp_path / "p.txt").write_text("What is the capital of France?\nCount to five.\n")
    t.dev_prompts_file = str(tmp_path / "p.txt")
    meter = meter_for_training(t, plain, tiny_target_dir, torch.device("cpu"))
    assert len(meter.requests) == 2 and all(len(r.output_ids) == 8 for r in meter.requests)
