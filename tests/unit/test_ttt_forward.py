"""This project's training forward (eagle3/train/ttt_forward.py) against speculators' own.

In float32 on the CPU it must give speculators' ``Eagle3DraftModel.forward`` loss and gradients
(every layer flag, one and two draft layers, each attention layout) and the loop's accuracy counts
(``eagle3.train.metrics.add_batch`` on speculators' draft tokens); compiled with ``fullgraph=True``
it must be one graph per grad mode that no later micro-batch, step or evaluation recompiles.
Compiled here with a counting eager backend: the CPU has no Triton, and graph capture is what
recompiles."""

import json

import pytest
import torch

from eagle3.errors import ConfigError
from eagle3.train import ttt_forward
from eagle3.train.data import collate_host, open_hidden_states, to_device
from eagle3.train.draft_model import build_draft, read_target_config, use_uncompiled_forward
from eagle3.train.metrics import add_batch, new_counts
from eagle3.train.stage import train
from eagle3.train.vocab import build_vocab_map, load_token_freq
from testkit.hs_fixture import build_hidden_states_dir, tiny_train_cfg

FLAGS = [
    {},
    {"norm_before_residual": True},
    {"norm_before_fc": True},
    {"fc_norm": True},
    {"norm_output": True},
]


@pytest.fixture(scope="module")
def hs_dir(tmp_path_factory, tiny_target_dir):
    return build_hidden_states_dir(
        tmp_path_factory.mktemp("hs") / "hs", tiny_target_dir, num_samples=14
    )


@pytest.fixture(scope="module")
def setup(hs_dir, tiny_target_dir):
    conf = json.loads((tiny_target_dir / "config.json").read_text())
    vmap = build_vocab_map(
        load_token_freq(hs_dir / "token_freq.pt"), 128, conf["vocab_size"], pad=True
    )
    aux = json.loads((hs_dir / "manifest.json").read_text())["aux_layer_ids"]
    data = open_hidden_states(
        hs_dir, tiny_target_dir, read_target_config(tiny_target_dir), max_tokens=200
    )
    samples = [data.load_sample(i) for i in (0, 1, 2)]
    batch = to_device(collate_host(samples), torch.device("cpu"), torch.float32)
    return vmap, aux, batch


def _draft(tiny_target_dir, vmap, aux, flags, layers):
    torch.manual_seed(1)
    m = build_draft(
        tiny_target_dir,
        aux_layer_ids=aux,
        d2t=vmap.d2t,
        t2d=vmap.t2d,
        num_layers=layers,
        ttt_steps=3,
        flags=flags,
    )
    use_uncompiled_forward(m)
    with (
        torch.no_grad()
    ):  # away from the init (norm weights of 1, ...), so that every flag changes the result
        for p in m.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.02)
    return m


def _loss_config():
    from speculators.losses import resolve_loss_config

    return resolve_loss_config("kl_div", "eager")


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: ",".join(f) or "default")
def test_loss_gradients_and_counts_equal_speculators(setup, tiny_target_dir, flags, layers):
    vmap, aux, batch = setup
    m = _draft(tiny_target_dir, vmap, aux, flags, layers)
    toks, loss, met = m(**batch, ttt_steps=3, loss_config=_loss_config())
    loss.backward()
    ref = {n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad}
    m.zero_grad(set_to_none=True)
    counts = new_counts(3)
    with torch.no_grad():
        target_ids = m.verifier_lm_head(
            m.verifier_norm(batch["verifier_last_hidden_states"])
        ).argmax(-1)
    add_batch(
        counts,
        toks,
        target_ids,
        batch["loss_mask"],
        batch["document_ids"],
        [met[f"loss_{k}_sum"] for k in range(3)],
    )
    assert counts[1] > 20  # a batch with real loss positions
    if not flags and layers == 1:
        assert 0 < counts[0] < counts[1]  # some right, some wrong
    for attention in ("eager", "sdpa"):
        ours, stats = ttt_forward.ttt_forward(
            m, **batch, ttt_steps=3, loss_config=_loss_config(), attention=attention
        )
        ours.backward()
        assert float(ours.detach()) == pytest.approx(float(loss.detach()), rel=1e-6), attention
        for n, p in m.named_parameters():
            if p.requires_grad:
                scale = float(ref[n].abs().max())
                assert scale > 0 and float((p.grad - ref[n]).abs().max()) <= 1e-5 * scale, (
                    attention,
                    n,
                )
        m.zero_grad(set_to_none=True)
        assert stats.shape == counts.shape
        assert torch.allclose(stats.double(), counts, rtol=0, atol=1e-6), (attention, stats, counts)


def test_flex_attention_forward_equals_speculators(setup, tiny_target_dir):
    """flex attention (CUDA's choice) has no CPU backward: its forward is checked here, its speed on
    the H200."""
    vmap, aux, batch = setup
    m = _draft(tiny_target_dir, vmap, aux, {}, 1)
    with torch.no_grad():
        _, loss, _ = m(**batch, ttt_steps=3, loss_config=_loss_config())
        ours, stats = ttt_forward.ttt_forward(
            m, **batch, ttt_steps=3, loss_config=_loss_config(), attention="flex"
        )
        eager, eager_stats = ttt_forward.ttt_forward(
            m, **batch, ttt_steps=3, loss_config=_loss_config(), attention="eager"
        )
    assert float(ours) == pytest.approx(float(loss), rel=1e-6)
    assert torch.allclose(stats, eager_stats, atol=1e-6)


def test_document_mask_is_speculators_first_block():
    from speculators.models.eagle3.attention import create_combined_mask_mod
    from torch.nn.attention.flex_attention import create_mask

    doc = torch.tensor([[0, 0, 0, 1, 1, -1, 2, 2]])
    ref = create_mask(create_combined_mask_mod(doc[0], 8), None, None, 8, 8, device="cpu")[0, 0]
    assert torch.equal(ttt_forward.document_mask(doc), ref)
    assert (
        not ttt_forward.document_mask(doc)[5, :5].any() and ttt_forward.document_mask(doc)[5, 5]
    )  # padding row


def _install_counting(monkeypatch) -> list:
    """Make the training stage install this forward compiled (as on CUDA) with fullgraph=True and a
    backend that records each graph; returns the list of graphs (their input shapes)."""
    graphs: list = []

    def backend(gm, example_inputs):
        graphs.append(tuple(tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)))
        return gm.forward

    real = ttt_forward.install

    def counting(model, *, attention, compile_mode=None, **_):
        real(model, attention=attention, compile_mode="default", backend=backend, fullgraph=True)

    monkeypatch.setattr(ttt_forward, "install", counting)
    torch._dynamo.reset()
    return graphs


def test_compiled_step_is_one_graph_per_grad_mode_for_the_whole_run(hs_dir, tmp_path, monkeypatch):
    """With fullgraph=True (a graph break would be an error) the training forward is one graph
    with gradients and one without (evaluation), made by the first step and the first evaluation;
    a run of 2.5× the steps and three evaluations — other micro-batches, every TTT step —
    compiles nothing more, and no guard fails."""
    from torch._dynamo.utils import guard_failures

    graphs = _install_counting(monkeypatch)
    cfg = tiny_train_cfg(
        tmp_path / "r1", "train.max_steps=2", "train.eval_every=2", "train.compile=true"
    )
    train(cfg, hs_dir, tmp_path / "short", progress=False)
    assert len(graphs) == 2, graphs
    graphs.clear()
    torch._dynamo.reset()
    guard_failures.clear()
    cfg = tiny_train_cfg(
        tmp_path / "r2", "train.max_steps=5", "train.eval_every=2", "train.compile=true"
    )
    train(cfg, hs_dir, tmp_path / "long", progress=False)
    assert len(graphs) == 2, graphs
    reasons = [str(r) for rs in guard_failures.values() for r in rs]
    assert len(reasons) == 1 and "grad_mode" in reasons[0], (
        reasons
    )  # the evaluation's no-grad graph, once
    rows = [json.loads(x) for x in (tmp_path / "long" / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "eval" for r in rows) == 3 and all(
        r.get("train/loss", 1) > 0 for r in rows
    )


def _losses(out):
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    keys = (
        "train/loss",
        "val/loss",
        "train/acc_full_0",
        "val/acc_cond_1",
        "val/simulated_acceptance_length",
    )
    return [(r["step"], *(r.get(k) for k in keys)) for r in rows]


def test_training_runs_match_speculators_forward(hs_dir, tmp_path):
    """The whole loop (AdamW, clipping, schedule, evaluation, best export) on either forward: the
    same losses, accuracies and simulated acceptance length step by step, and the same exported
    weights."""
    from safetensors.torch import load_file

    out = {}
    for impl in ("speculators", "project"):
        cfg = tiny_train_cfg(
            tmp_path / f"r-{impl}",
            "train.max_steps=6",
            "train.eval_every=3",
            f"train.forward_impl={impl}",
        )
        train(cfg, hs_dir, tmp_path / impl, progress=False)
        out[impl] = _losses(tmp_path / impl)
    assert [r[0] for r in out["project"]] == [r[0] for r in out["speculators"]] and len(
        out["project"]
    ) >= 8
    for a, b in zip(out["speculators"], out["project"]):
        for x, y in zip(a[1:], b[1:]):
            assert (x is None) == (y is None) and (
                x is None or y == pytest.approx(x, rel=1e-4, abs=1e-5)
            ), (a, b)
    wa, wb = (
        load_file(str(tmp_path / i / "model.safetensors")) for i in ("speculators", "project")
    )
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k].float(), wb[k].float(), rtol=1e-4, atol=1e-5), k


def test_choice_of_forward_and_attention(tmp_path):
    def t(*o):
        return tiny_train_cfg(tmp_path, *o).train

    assert ttt_forward.choose(t(), "cpu", 1) == ("project", "eager")
    assert ttt_forward.choose(t("train.compile=true"), "cuda", 1) == ("project", "flex")
    assert ttt_forward.choose(t(), "cuda", 1) == ("project", "sdpa")
    assert ttt_forward.choose(t("train.attn_implementation=sdpa"), "cpu", 1) == ("project", "sdpa")
    assert ttt_forward.choose(t("train.forward_impl=speculators"), "cuda", 1) == (
        "speculators",
        "sdpa",
    )
    assert ttt_forward.choose(t("train.distributed=fsdp"), "cuda", 2) == ("speculators", "sdpa")
    assert ttt_forward.choose(t("train.distributed=fsdp"), "cuda", 1) == (
        "project",
        "sdpa",
    )  # one process: no fsdp
    with pytest.raises(ConfigError, match=r"forward_impl=project.*fsdp"):
        ttt_forward.choose(t("train.distributed=fsdp", "train.forward_impl=project"), "cuda", 2)
    with pytest.raises(ConfigError, match=r"attn_implementation.flex.*speculators"):
        ttt_forward.choose(
            t("train.forward_impl=speculators", "train.attn_implementation=flex"), "cuda", 1
        )


def test_unsupported_draft_is_refused(setup, tiny_target_dir):
    vmap, aux, _ = setup
    m = _draft(tiny_target_dir, vmap, aux, {}, 1)
    m.layers.append(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match=r"Llama draft layers.*Linear.*forward_impl=speculators"):
        ttt_forward.install(m, attention="eager")


def test_flex_on_the_cpu_and_flex_under_auto_fsdp_are_refused_with_the_reason(tmp_path):
    from eagle3.train.stage import check_settings

    def t(*o):
        return tiny_train_cfg(tmp_path, *o).train

    with pytest.raises(
        ConfigError,
        match=r"attn_implementation=flex: expected auto, sdpa or eager on a cpu "
        r"training device .*got flex",
    ):
        ttt_forward.choose(t("train.attn_implementation=flex"), "cpu", 1)
    with pytest.raises(
        ConfigError, match=r"forward_impl=auto takes speculators' forward under .*fsdp"
    ):
        ttt_forward.choose(t("train.distributed=fsdp", "train.attn_implementation=flex"), "cuda", 2)
    assert ttt_forward.choose(t("train.attn_implementation=flex"), "cuda", 1) == ("project", "flex")
    if not torch.cuda.is_available():  # train.device auto resolves to the CPU here
        with pytest.raises(ConfigError, match=r"on a cpu training device"):
            check_settings(tiny_train_cfg(tmp_path, "train.attn_implementation=flex"))
    # refused when the config loads where the device or the forward is already known from the config
    with pytest.raises(
        ConfigError, match=r"flex: expected auto, sdpa or eager with train.device cpu"
    ):
        tiny_train_cfg(tmp_path, "train.device=cpu", "train.attn_implementation=flex")
    with pytest.raises(
        ConfigError,
        match=r"forward_impl auto takes speculators' forward under train.distributed "
        r"fsdp with num_gpus > 1",
    ):
        tiny_train_cfg(
            tmp_path, "train.num_gpus=2", "train.distributed=fsdp", "train.attn_implementation=flex"
        )


def test_what_auto_resolved_to_is_recorded(tmp_path):
    def t(*o):
        return tiny_train_cfg(tmp_path, *o).train

    rec = ttt_forward.resolved_settings(t(), "cpu", 1)
    assert {k: v["value"] for k, v in rec.items()} == {
        "train.forward_impl": "project",
        "train.attn_implementation": "eager",
        "train.optimizer_impl": "default",
    }
    assert all(v["setting"] == "auto" and v["device"] == "cpu" and v["why"] for v in rec.values())
    rec = ttt_forward.resolved_settings(t("train.compile=true"), "cuda", 1)
    assert {k: v["value"] for k, v in rec.items()} == {
        "train.forward_impl": "project",
        "train.attn_implementation": "flex",
        "train.optimizer_impl": "fused",
    }
    assert (
        ttt_forward.resolved_settings(
            t(
                "train.forward_impl=speculators",
                "train.attn_implementation=sdpa",
                "train.optimizer_impl=foreach",
            ),
            "cuda",
            1,
        )
        == {}
    )


def test_fused_loss_and_unknown_devices_are_refused_before_training(tmp_path):
    from eagle3.train.stage import check_settings

    with pytest.raises(
        ConfigError, match=r"loss_implementation fused: expected eager with train.device cpu"
    ):
        tiny_train_cfg(tmp_path, "train.device=cpu", "train.loss_implementation=fused")
    with pytest.raises(ConfigError, match=r"train.device.*foo"):
        tiny_train_cfg(tmp_path, "train.device=foo")
    with pytest.raises(
        ConfigError, match=r"train.device: String should match pattern .*got 'cpu:0'"
    ):
        tiny_train_cfg(tmp_path, "train.device=cpu:0")
    if not torch.cuda.is_available():  # train.device auto is the CPU here
        with pytest.raises(
            ConfigError, match=r"loss_implementation=fused: expected eager on a cpu training device"
        ):
            check_settings(tiny_train_cfg(tmp_path, "train.loss_implementation=fused"))


def test_a_training_that_fails_before_its_first_checkpoint_gives_the_earlier_draft_back(
    tmp_path, monkeypatch
):
    """A finished draft of other settings is moved aside, not deleted, and comes back when the new
    training fails before it saved anything (e.g. a setting only the training itself refuses)."""
    import contextlib

    import tasks.train as task_mod
    from eagle3.artifacts import write_manifest

    write_manifest(tmp_path, "hidden_states", mode="offline")  # the extraction it trains from
    out = tmp_path / "train"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"weights of the earlier settings")
    write_manifest(out, "draft_checkpoint", config={"lr": 1.0})
    monkeypatch.setattr(
        task_mod.tracking, "stage_run", lambda *a, **k: contextlib.nullcontext(_NoRun())
    )
    monkeypatch.setattr(task_mod, "prefect_tags", lambda: {})

    def failing_train(cfg, data_dir, out_dir, **_):
        (out_dir / "state").mkdir(parents=True)
        raise RuntimeError("refused at the first step")

    monkeypatch.setattr("eagle3.train.stage.train", failing_train)
    with pytest.raises(RuntimeError, match="first step"):
        task_mod.train_task.fn(tiny_train_cfg(tmp_path), _Data(tmp_path), out, "parent")
    assert (out / "model.safetensors").read_bytes() == b"weights of the earlier settings"
    assert not (tmp_path / "train.superseded").exists()

    def failing_after_a_checkpoint(cfg, data_dir, out_dir, **_):
        (out_dir / "state" / "ckpt-00000005").mkdir(parents=True)
        (out_dir / "state" / "ckpt-00000005" / "COMPLETE").write_text("")
        raise RuntimeError("died at step 7")

    monkeypatch.setattr("eagle3.train.stage.train", failing_after_a_checkpoint)
    monkeypatch.setattr(
        "eagle3.train.state.list_checkpoints",
        lambda d: sorted(p for p in d.glob("ckpt-*") if p.is_dir()),
    )
    with pytest.raises(RuntimeError, match="step 7"):
        task_mod.train_task.fn(tiny_train_cfg(tmp_path), _Data(tmp_path), out, "parent")
    assert (out / "state" / "ckpt-00000005").is_dir()  # the new training's progress, to resume
    assert (
        tmp_path / "train.superseded" / "model.safetensors"
    ).is_file()  # the earlier draft, kept aside


class _NoRun:
    on_metrics = None

    def set_tags(self, tags):
        pass

    def log_dataset(self, *a, **k):
        pass


class _Data:
    def __init__(self, d):
        self.dir = d


def test_a_refused_setting_keeps_the_finished_draft_of_earlier_settings(tmp_path, monkeypatch):
    """The task checks the settings before it replaces a finished draft of other settings (a
    flex-on-CPU run used to delete the earlier draft, then fail)."""
    import contextlib

    import tasks.train as task_mod
    from eagle3.artifacts import write_manifest

    write_manifest(tmp_path, "hidden_states", mode="offline")  # the extraction it trains from
    out = tmp_path / "train"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"weights of the earlier settings")
    write_manifest(out, "draft_checkpoint", config={"lr": 1.0})
    monkeypatch.setattr(
        task_mod.tracking, "stage_run", lambda *a, **k: contextlib.nullcontext(None)
    )
    monkeypatch.setattr(task_mod, "prefect_tags", lambda: {})
    cfg = tiny_train_cfg(tmp_path, "train.attn_implementation=flex")
    if torch.cuda.is_available():
        pytest.skip("train.device auto is CUDA here, where flex is allowed")
    with pytest.raises(ConfigError, match="flex"):
        task_mod.train_task.fn(cfg, None, out, "parent")
    assert (out / "model.safetensors").read_bytes() == b"weights of the earlier settings"
