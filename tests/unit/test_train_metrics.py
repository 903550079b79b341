import math

import pytest
import torch

from eagle3.train.data import collate_host, pack, to_device
from eagle3.train.metrics import add_batch, new_counts, simulated_acceptance_length, summarize
from eagle3.train.state import lr_factor


def test_simulated_acceptance_length_counts_the_bonus_token():
    assert simulated_acceptance_length([0.0, 0.9, 0.9]) == 1.0
    assert simulated_acceptance_length([1.0, 1.0, 1.0]) == 4.0
    assert simulated_acceptance_length([0.5, 0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_full_and_conditional_accuracy_respect_documents_and_mask():
    # 6 positions, two documents [0,0,0,1,1,1]; verifier argmax = 0..5
    tgt = torch.arange(6)[None]
    doc = torch.tensor([[0, 0, 0, 1, 1, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    # step 0 predicts tgt[p]: right at p=0,1,3; step 1 predicts tgt[p+1]: right at p=0,3 and
    # (wrongly) p=2
    d0 = torch.tensor([[0, 1, 9, 3, 9, 9]])
    d1 = torch.tensor([[1, 9, 3, 4, 9, 9]])  # p=2 -> tgt[3] but crosses into doc 1: not valid
    c = new_counts(2)
    add_batch(c, [d0, d1], tgt, mask, doc, [torch.tensor(0.5), torch.tensor(0.25)])
    m = summarize(c, "x")
    assert m["x/acc_full_0"] == pytest.approx(3 / 5)
    # step 1 valid starts: p=0,1 (targets 1,2 in doc 0), p=3 (target 4); p=4 -> target 5 masked
    assert m["x/acc_full_1"] == pytest.approx(2 / 3)
    # conditional: among valid starts whose step 0 was right (p=0,1,3): p=0 and p=3 right
    assert m["x/acc_cond_1"] == pytest.approx(2 / 3)
    assert m["x/simulated_acceptance_length"] == pytest.approx(1 + 0.6 + 0.6 * 2 / 3)
    # chain: starts with valid step 0 (5): runs p0=2, p1=1, p2=0, p3=2, p4=0 -> mean 1.0 + 1
    assert m["x/chain_acceptance_length"] == pytest.approx(1 + 5 / 5)
    assert m["x/loss"] == pytest.approx(0.75)


def test_a_micro_batch_without_loss_positions_has_no_loss_to_average():
    tgt, doc = torch.arange(4)[None], torch.zeros(1, 4, dtype=torch.long)
    d0 = torch.arange(4)[None]
    full, empty = torch.ones(1, 4, dtype=torch.bool), torch.zeros(1, 4, dtype=torch.bool)
    c = new_counts(1)
    add_batch(c, [d0], tgt, full, doc, [torch.tensor(0.8)])
    add_batch(c, [d0], tgt, empty, doc, [torch.tensor(0.0)])  # all cut: its 0 is not a loss
    assert summarize(c, "x")["x/loss"] == pytest.approx(0.8)
    c = new_counts(1)
    add_batch(c, [d0], tgt, empty, doc, [torch.tensor(0.0)])
    assert math.isnan(summarize(c, "x")["x/loss"])  # a window of only such: no loss, not 0


def test_decide_reads_the_last_finite_train_loss():
    from eagle3.decide import history_from_metrics

    rows = [
        {"step": 1, "train/loss": 2.0},
        {"step": 2, "train/loss": math.nan},
        {"step": 2, "val/loss": 2.5},
    ]
    assert history_from_metrics(rows)["train_loss"] == [2.0]


def test_lr_schedules():
    kw = dict(warmup_steps=4, total_steps=14)
    assert [lr_factor(s, schedule="epochs", **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, schedule="epochs", **kw) == 1.0
    assert lr_factor(9, schedule="epochs", **kw) == pytest.approx(0.5)
    assert lr_factor(14, schedule="epochs", **kw) == pytest.approx(0.0)
    assert lr_factor(14, schedule="epochs", min_ratio=0.1, **kw) == pytest.approx(0.1)
    assert lr_factor(1000, schedule="constant", **kw) == 1.0
    assert lr_factor(1, schedule="constant", **kw) == 0.5
    assert math.isfinite(lr_factor(0, schedule="epochs", warmup_steps=0, total_steps=0))


def test_packing_keeps_documents_and_budget():
    batches = pack([5, 1, 7, 2], [40, 50, 30, 96], 96)
    assert batches == [[5, 1], [7], [2]]
    s = [
        {
            "hidden_states": torch.zeros(n, 6),
            "verifier_last_hidden_states": torch.zeros(n, 2),
            "input_ids": torch.arange(n),
            "loss_mask": torch.ones(n, dtype=torch.bool),
            "position_ids": torch.arange(1, n + 1),
        }
        for n in (3, 2)
    ]
    b = to_device(collate_host(s), torch.device("cpu"), torch.float32)
    assert b["document_ids"].tolist() == [[0, 0, 0, 1, 1]]
    assert b["position_ids"].tolist() == [[1, 2, 3, 1, 2]]
    assert b["hidden_states"].shape == (1, 5, 6)


@pytest.mark.parametrize(
    "with_mask,with_prev", [(True, True), (True, False), (False, True), (False, False)]
)
def test_static_accuracy_counts_equal_speculators_and_update_prev_correct_alike(
    with_mask, with_prev
):
    """eagle3.train.metrics.accuracy_single_step: speculators' four counts and its in-place
    prev_correct update, without masked_select's data-dependent shape."""
    import torch
    from speculators.models.metrics import compute_accuracy_single_step

    from eagle3.train.metrics import accuracy_single_step

    g = torch.Generator().manual_seed(3)
    pred = torch.randint(0, 4, (1, 50), generator=g)
    tgt = torch.randint(0, 4, (1, 50), generator=g)
    mask = (torch.rand(1, 50, generator=g) > 0.3) if with_mask else None
    prev = (torch.rand(1, 50, generator=g) > 0.4) if with_prev else None
    prev_a, prev_b = (prev.clone(), prev.clone()) if with_prev else (None, None)
    want = compute_accuracy_single_step(pred, tgt, mask, prev_a)
    got = accuracy_single_step(pred, tgt, mask, prev_b)
    assert [float(x) for x in got] == [float(x) for x in want]
    assert float(got[1]) == (float(mask.sum()) if with_mask else 50.0)
    assert 0 < float(got[0]) < float(got[1])
    if with_prev:
        assert torch.equal(prev_a, prev_b) and not torch.equal(prev_b, prev)


def test_first_tokens_restart_at_each_answer_and_document():
    from eagle3.train import metrics as M

    n = M.FIRST_TOKENS
    # doc 0: prompt (2), answer of n + 3 tokens, prompt (1), answer of 2; doc 1: answer of 4
    valid = [False] * 2 + [True] * (n + 3) + [False] + [True] * 2 + [True] * 4
    doc = [0] * (2 + n + 3 + 1 + 2) + [1] * 4
    got = M.first_tokens(torch.tensor(valid), torch.tensor(doc)).tolist()
    want = [False] * 2 + [True] * n + [False] * 3 + [False] + [True] * 2 + [True] * 4
    assert got == want


def test_the_simulated_figure_over_an_answers_first_tokens():
    from eagle3.train import metrics as M

    n = M.FIRST_TOKENS
    S = 2 * n  # one answer: its first n tokens the draft gets wrong, the rest right
    tgt, doc = torch.arange(S)[None], torch.zeros(1, S, dtype=torch.long)
    pred = torch.where(torch.arange(S) < n, -1, torch.arange(S))[None]
    c = new_counts(1)
    add_batch(c, [pred], tgt, torch.ones(1, S, dtype=torch.bool), doc, [torch.tensor(0.1)])
    m = summarize(c, "v")
    assert m["v/simulated_acceptance_length"] == pytest.approx(1.5)
    assert m[f"v/simulated_acceptance_length_first{n}"] == pytest.approx(1.0)
    assert summarize(new_counts(2), "e")[f"e/simulated_acceptance_length_first{n}"] == 1.0
