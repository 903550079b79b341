"""Micro-batches padded to one length (``train.pad_to_max_tokens``, on with ``train.compile``): the
run's losses are those of the unpadded run, and a compiled forward compiles once instead of once per
micro-batch length (the recompile-limit failure of ``train.compile`` on the H200, lab/NOTEBOOK.md).
The compiler here is torch.compile with a counting eager backend: the CPU has no Triton, and graph
capture is what recompiles."""

import json

import pytest
import torch

from eagle3.train.stage import train
from testkit.hs_fixture import build_hidden_states_dir, tiny_train_cfg


# the compile-counting tests below are about speculators' own forward
# (train.forward_impl=speculators); this project's forward has its own in
# tests/unit/test_ttt_forward.py
SPECULATORS = "train.forward_impl=speculators"


@pytest.fixture(scope="module")
def hs_dir(tmp_path_factory, tiny_target_dir):
    return build_hidden_states_dir(
        tmp_path_factory.mktemp("hs") / "hs", tiny_target_dir, num_samples=14
    )


def _losses(out):
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [
        (r["step"], r.get("train/loss"), r.get("val/loss"), r.get("train/acc_full_0")) for r in rows
    ]


@pytest.fixture
def recompile_limit_64():
    """One compile per micro-batch length is what the unpadded run shows: allow more than dynamo's
    default 8 (``config.patch`` restores it; monkeypatch would delete the config entry on undo)."""
    with torch._dynamo.config.patch(recompile_limit=64):
        yield


def _compile_counting(monkeypatch) -> list:
    """Make eagle3.train.stage's draft forward compiled (as speculators does on CUDA) with a backend
    that records each graph it gets."""
    import types

    import eagle3.train.stage as train_mod

    graphs: list = []

    def backend(gm, example_inputs):
        graphs.append(tuple(tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)))
        return gm.forward

    build = train_mod.build_draft

    def build_compiled(*args, **kwargs):
        model = build(*args, **kwargs)
        fwd = type(model).forward
        orig = (
            getattr(fwd, "_torchdynamo_orig_callable", None)
            or getattr(fwd, "__wrapped__", None)
            or fwd
        )
        model.forward = torch.compile(types.MethodType(orig, model), backend=backend, dynamic=False)
        return model

    monkeypatch.setattr(train_mod, "build_draft", build_compiled)
    torch._dynamo.reset()
    return graphs


def test_padding_keeps_the_losses(hs_dir, tmp_path):
    out = {}
    for pad in ("false", "true"):
        cfg = tiny_train_cfg(
            tmp_path / f"runs-{pad}",
            "train.max_steps=4",
            "train.eval_every=4",
            f"train.pad_to_max_tokens={pad}",
        )
        train(cfg, hs_dir, tmp_path / f"t-{pad}", progress=False)
        out[pad] = _losses(tmp_path / f"t-{pad}")
    assert [r[0] for r in out["true"]] == [r[0] for r in out["false"]]
    for a, b in zip(out["false"], out["true"]):
        for x, y in zip(a[1:], b[1:]):
            assert (x is None) == (y is None) and (
                x is None or y == pytest.approx(x, rel=1e-4, abs=1e-5)
            ), (a, b)


def test_compiled_forward_compiles_once_with_padding_and_per_length_without(
    hs_dir, tmp_path, monkeypatch, recompile_limit_64
):
    def masks(graphs) -> set:
        """Attention-mask shapes [1, 1, N, N*(k+1)] captured: one per TTT step k and micro-batch
        length N."""
        return {x for g in graphs for x in g if len(x) == 4 and x[:2] == (1, 1)}

    graphs = _compile_counting(monkeypatch)
    cfg = tiny_train_cfg(
        tmp_path / "r1",
        "train.max_steps=4",
        "train.eval_every=4",
        "train.compile=true",
        "train.pad_to_max_tokens=false",
        SPECULATORS,
    )
    train(cfg, hs_dir, tmp_path / "unpadded", progress=False)
    unpadded = list(graphs)
    graphs.clear()
    torch._dynamo.reset()
    cfg = tiny_train_cfg(
        tmp_path / "r2",
        "train.max_steps=4",
        "train.eval_every=4",
        "train.compile=true",
        SPECULATORS,
    )
    train(cfg, hs_dir, tmp_path / "padded", progress=False)  # compile on: padding on by default
    # padded: every micro-batch is 96 positions, so the 3 TTT steps give the only 3 mask shapes
    assert masks(graphs) == {(1, 1, 96, 96), (1, 1, 96, 192), (1, 1, 96, 288)}
    assert len(masks(unpadded)) > 3 * 2 and len(unpadded) > len(graphs), (
        len(unpadded),
        len(graphs),
    )


def test_compile_forward_static_shapes_same_outputs_and_bad_mode(hs_dir, tiny_target_dir):
    """``eagle3.train.draft_model.compile_forward`` (what ``train.compile`` uses on CUDA): the
    compiled forward gives the plain forward's loss and draft tokens, compiles with static shapes (a
    new length is a new graph, never a dynamic one), and an unknown ``train.compile_mode`` is
    refused by name."""
    from eagle3.train.draft_model import build_draft, compile_forward
    from eagle3.errors import ConfigError
    from eagle3.train.data import collate_host, open_hidden_states, to_device
    from eagle3.train.vocab import build_vocab_map, load_token_freq

    conf = json.loads((tiny_target_dir / "config.json").read_text())
    vmap = build_vocab_map(
        load_token_freq(hs_dir / "token_freq.pt"), 128, conf["vocab_size"], pad=True
    )
    aux = json.loads((hs_dir / "manifest.json").read_text())["aux_layer_ids"]
    torch.manual_seed(0)
    model = build_draft(
        tiny_target_dir,
        aux_layer_ids=aux,
        d2t=vmap.d2t,
        t2d=vmap.t2d,
        num_layers=1,
        ttt_steps=3,
        flags={},
    )
    from eagle3.train.draft_model import read_target_config

    data = open_hidden_states(
        hs_dir, tiny_target_dir, read_target_config(tiny_target_dir), max_tokens=96
    )
    batches = [
        to_device(collate_host([data.load_sample(i)]), torch.device("cpu"), torch.float32)
        for i in (0, 1)
    ]
    assert batches[0]["input_ids"].shape != batches[1]["input_ids"].shape  # two lengths

    from speculators.losses import resolve_loss_config

    loss_config = resolve_loss_config("kl_div", "eager")

    def call(b):
        toks, loss, _ = model(**b, ttt_steps=3, loss_config=loss_config)
        return [t.clone() for t in toks], loss.detach().clone()

    plain = [call(b) for b in batches]
    graphs: list = []

    def backend(gm, example_inputs):
        graphs.append([tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)])
        return gm.forward

    torch._dynamo.reset()
    compile_forward(model, "default", backend=backend)
    compiled = [call(b) for b in batches]
    for (pt, pl), (ct, cl) in zip(plain, compiled):
        assert torch.allclose(pl, cl, rtol=1e-5, atol=1e-6), (pl, cl)
        assert all(torch.equal(a, b) for a, b in zip(pt, ct))
    lengths = {s[1] for g in graphs for s in g if len(s) == 2 and s[0] == 1}
    assert {
        b["input_ids"].shape[1] for b in batches
    } <= lengths  # each length traced with its own static size
    with pytest.raises(ConfigError, match=r"train.compile_mode.*'fast'"):
        compile_forward(model, "fast")


def test_compiled_step_compiles_nothing_after_the_first_step_and_evaluation(
    hs_dir, tmp_path, monkeypatch
):
    """With train.compile the draft's frames hold one graph per TTT step and grad mode
    (training and the no-grad evaluation), all made by the first optimizer step and the first
    evaluation; later micro-batches, steps and evaluations compile nothing, and no frame reaches
    dynamo's recompile limit (default 8, after which it would run eagerly). Counted on the CPU with
    a counting backend: graph capture is what recompiles."""
    from torch._dynamo.utils import guard_failures

    graphs = _compile_counting(monkeypatch)
    cfg = tiny_train_cfg(
        tmp_path / "r1",
        "train.max_steps=2",
        "train.eval_every=2",
        "train.compile=true",
        SPECULATORS,
    )
    train(cfg, hs_dir, tmp_path / "short", progress=False)
    short = len(graphs)
    graphs.clear()
    torch._dynamo.reset()
    guard_failures.clear()
    cfg = tiny_train_cfg(
        tmp_path / "r2",
        "train.max_steps=5",
        "train.eval_every=2",
        "train.compile=true",
        SPECULATORS,
    )
    train(cfg, hs_dir, tmp_path / "long", progress=False)  # 2.5× the steps, 3 evaluations
    assert len(graphs) == short > 0, (short, len(graphs))
    ttt = cfg.train.ttt_steps
    limit = torch._dynamo.config.recompile_limit
    for (
        code,
        reasons,
    ) in guard_failures.items():  # one failed guard per extra cache entry of a frame
        entries = len({str(r).split(":")[0] for r in reasons}) + 1
        assert entries <= 2 * ttt < limit, (
            code.co_filename,
            code.co_firstlineno,
            entries,
            reasons[:3],
        )


@pytest.mark.parametrize("impl", ["fused", "foreach"])
def test_optimizer_impl_keeps_the_losses(hs_dir, tmp_path, impl, monkeypatch):
    """train.optimizer_impl (the fused-AdamW lever): the optimizer is built with it, and the
    run's losses are those of torch's default AdamW."""
    made = []

    class Recording(torch.optim.AdamW):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append({k: self.defaults.get(k) for k in ("fused", "foreach")})

    monkeypatch.setattr(torch.optim, "AdamW", Recording)
    out = {}
    for name in ("auto", impl):  # auto = torch's default AdamW on the CPU
        cfg = tiny_train_cfg(
            tmp_path / f"r-{name}",
            "train.max_steps=4",
            "train.eval_every=4",
            f"train.optimizer_impl={name}",
        )
        train(cfg, hs_dir, tmp_path / f"t-{name}", progress=False)
        out[name] = _losses(tmp_path / f"t-{name}")
    assert made[0] == {"fused": None, "foreach": None} and made[-1][impl] is True, made
    assert [r[0] for r in out[impl]] == [r[0] for r in out["auto"]] and len(out[impl]) >= 2
    for a, b in zip(out["auto"], out[impl]):
        for x, y in zip(a[1:], b[1:]):
            assert (x is None) == (y is None) and (
                x is None or y == pytest.approx(x, rel=1e-4, abs=1e-5)
            ), (a, b)
