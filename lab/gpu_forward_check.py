"""This project's training forward (eagle3/train/ttt_forward.py) against speculators' own, on the
device it runs on.

The CPU tests hold the two equal in float32 with the eager and sdpa attentions; flex attention, the
compiled graph and bf16 autocast exist on CUDA only, so this script checks them there: one packed
micro-batch of ``--seq-len`` positions (three documents and a padding tail, as the loop packs them)
of a draft of the ``--shape`` target, speculators' ``Eagle3DraftModel.forward`` (sdpa, uncompiled)
as the reference, and ours compiled (``--attention``, default flex on CUDA, eager on the CPU), in
float32 and under bf16 autocast. Printed and written to ``--out/gpu_forward_check_<shape>.json``:
the relative loss difference, the largest relative gradient difference over the trainable tensors,
and whether the accuracy counts agree; then the wall time of one forward + backward of each (median
of ``--repeats``).

Exit 1 when float32 differs by more than ``--tol`` (relative; default 1e-3, TF32-free float32 on the
GPU).

    python lab/gpu_forward_check.py --shape smollm2 --out $OUT
    python lab/gpu_forward_check.py --shape llama8b --out $OUT
    python lab/gpu_forward_check.py --shape tiny --seq-len 128 --device cpu --attention eager
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _batch(hs: Path, target: Path, seq_len: int, device):
    """One sample of the synthetic set, re-cut into documents of 35 %, 45 % and the rest less 5 % of
    padding."""
    import torch

    from eagle3.train.data import collate_host, open_hidden_states, to_device
    from eagle3.train.draft_model import read_target_config

    data = open_hidden_states(hs, target, read_target_config(target), max_tokens=seq_len)
    b = to_device(collate_host([data.load_sample(0)]), device, torch.float32)
    S = b["input_ids"].shape[1]
    cuts = [0, int(S * 0.35), int(S * 0.80), int(S * 0.95), S]
    doc = torch.empty(S, dtype=torch.long)
    pos = torch.empty(S, dtype=torch.long)
    for j, (a, e) in enumerate(zip(cuts, cuts[1:])):
        doc[a:e] = j
        pos[a:e] = torch.arange(e - a)
    b["document_ids"], b["position_ids"] = doc[None].to(device), pos[None].to(device)
    b["loss_mask"] = b["loss_mask"].clone()
    b["loss_mask"][0, cuts[3] :] = False  # the padding tail carries no loss
    return b


def _grads(model) -> dict:
    return {
        n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.requires_grad
    }


def _timed(fn, repeats: int, cuda: bool) -> float:
    import torch

    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _writable_folder(folder: Path) -> bool:
    """Create ``folder`` (parents too); True when a file can then be written in it (tried:
    ``os.access`` says yes to root for /proc). Checked before the run spends its time, so its
    figures are not lost at the end."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError:
        return False
    return True


def main() -> int:
    import torch

    import lab.train as bt
    from eagle3.train import ttt_forward
    from eagle3.train.draft_model import build_draft, use_uncompiled_forward
    from eagle3.train.metrics import add_batch, new_counts
    from eagle3.train.vocab import build_vocab_map, load_token_freq
    from speculators.losses import resolve_loss_config

    p = argparse.ArgumentParser()
    p.add_argument(
        "--shape", default="smollm2", help="lab/train.py SHAPES, or tiny (CPU smoke test)"
    )
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument(
        "--draft-vocab", type=int, default=None, help="default: 8192 (smollm2, tiny: 512) / 32000"
    )
    p.add_argument(
        "--attention",
        default=None,
        choices=list(ttt_forward.ATTENTIONS),
        help="default: flex on CUDA, eager on the CPU (flex has no CPU backward)",
    )
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tol", type=float, default=1e-3)
    p.add_argument("--work", default="/tmp/eagle3-forward-check")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    try:
        kind = torch.device(a.device).type
    except RuntimeError:
        kind = None
    if kind not in ("cuda", "cpu"):
        p.error(f"--device: expected cuda, cuda:N or cpu, got {a.device!r}")
    cuda = kind == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error(f"--device {a.device}: no CUDA device here (use --device cpu for a smoke test)")
    a.attention = a.attention or ("flex" if cuda else "eager")
    if a.attention == "flex" and not cuda:
        p.error(
            "--attention flex: expected eager or sdpa with "
            "--device cpu (flex attention has no CPU backward)"
        )
    if a.seq_len < 64:
        p.error(f"--seq-len: expected at least 64 positions, got {a.seq_len}")
    if a.repeats < 1:
        p.error(f"--repeats: expected at least 1, got {a.repeats}")
    if not 0 < a.tol < float("inf"):
        p.error(f"--tol: expected a finite relative tolerance > 0, got {a.tol}")
    if a.seq_len > 1 << 16:
        p.error(
            f"--seq-len: expected at most {1 << 16} positions "
            f"(one packed micro-batch), got {a.seq_len}"
        )
    if a.draft_vocab is not None and a.draft_vocab < 2:
        p.error(f"--draft-vocab: expected at least 2 draft tokens, got {a.draft_vocab}")
    if a.out and not _writable_folder(Path(a.out)):
        p.error(f"--out {a.out}: expected a folder that exists or can be created, and is writable")
    if not _writable_folder(Path(a.work)):
        p.error(
            f"--work {a.work}: expected a folder that exists or can be created, and is writable"
        )
    if a.shape == "tiny":
        from lab.gpu_train import TINY

        bt.SHAPES["tiny"] = TINY
    if a.shape not in bt.SHAPES:
        p.error(f"--shape: expected one of {sorted(bt.SHAPES)} or tiny, got {a.shape!r}")
    dv = a.draft_vocab or {"llama8b": 32000, "tiny": 512}.get(a.shape, 8192)
    if dv >= bt.SHAPES[a.shape]["vocab_size"]:
        p.error(
            f"--draft-vocab: expected fewer than the target's "
            f"{bt.SHAPES[a.shape]['vocab_size']} tokens, got {dv}"
        )
    device = torch.device(a.device)
    target, hs = bt.synthetic(Path(a.work), a.shape, 4, a.seq_len)
    conf = json.loads((target / "config.json").read_text())
    vmap = build_vocab_map(load_token_freq(hs / "token_freq.pt"), dv, conf["vocab_size"], pad=True)
    aux = json.loads((hs / "manifest.json").read_text())["aux_layer_ids"]
    torch.manual_seed(0)
    model = build_draft(
        target, aux_layer_ids=aux, d2t=vmap.d2t, t2d=vmap.t2d, num_layers=1, ttt_steps=3, flags={}
    )
    use_uncompiled_forward(model)
    model.to(device)
    batch = _batch(hs, target, a.seq_len, device)
    lc = resolve_loss_config("kl_div", "eager")
    compiled = (
        torch.compile(
            lambda **kw: ttt_forward.ttt_forward(model, attention=a.attention, **kw), dynamic=False
        )
        if cuda
        else (lambda **kw: ttt_forward.ttt_forward(model, attention=a.attention, **kw))
    )

    def reference(autocast: bool):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            toks, loss, met = model(**batch, ttt_steps=3, loss_config=lc)
        loss.backward()
        with torch.no_grad():
            tids = model.verifier_lm_head(
                model.verifier_norm(batch["verifier_last_hidden_states"])
            ).argmax(-1)
        counts = new_counts(3, device)
        add_batch(
            counts,
            toks,
            tids,
            batch["loss_mask"],
            batch["document_ids"],
            [met[f"loss_{k}_sum"] for k in range(3)],
        )
        return loss.detach(), counts

    def ours(autocast: bool):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss, stats = compiled(**batch, ttt_steps=3, loss_config=lc)
        loss.backward()
        return loss.detach(), stats.detach().double()

    rows = {}
    for name, autocast in (("float32", False), ("bf16-autocast", True)):
        model.zero_grad(set_to_none=True)
        ref_loss, ref_counts = reference(autocast)
        ref = _grads(model)
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss, counts = ours(autocast)
        first = time.perf_counter() - t0
        got = _grads(model)
        rel = max(
            float((got[n] - ref[n]).abs().max() / ref[n].abs().max().clamp_min(1e-30)) for n in ref
        )
        per_step = [
            (round(float(counts[6 * k]), 1), round(float(ref_counts[6 * k]), 1)) for k in range(3)
        ]
        rows[name] = {
            "loss_reference": float(ref_loss),
            "loss_ours": float(loss),
            "loss_rel_diff": abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)),
            "max_grad_rel_diff": rel,
            "counts_equal": bool(
                torch.equal(counts[:-2].round(), ref_counts[:-2].round())
                if name == "float32"
                else True
            ),
            "correct_per_step_ours_vs_reference": per_step,
            "first_call_s": first,
        }
        rows[name]["ms_reference"] = _timed(
            lambda: (model.zero_grad(set_to_none=True), reference(autocast)), a.repeats, cuda
        )
        rows[name]["ms_ours"] = _timed(
            lambda: (model.zero_grad(set_to_none=True), ours(autocast)), a.repeats, cuda
        )
        print(name, json.dumps(rows[name]), flush=True)
    out = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "shape": a.shape,
        "seq_len": a.seq_len,
        "draft_vocab": dv,
        "attention": a.attention,
        "tol": a.tol,
        "results": rows,
    }
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / f"gpu_forward_check_{a.shape}.json").write_text(
            json.dumps(out, indent=1) + "\n"
        )
    f32 = rows["float32"]
    ok = (
        f32["loss_rel_diff"] <= a.tol
        and f32["max_grad_rel_diff"] <= a.tol * 10
        and f32["counts_equal"]
    )
    print(
        f"float32: loss {f32['loss_rel_diff']:.2e}, gradients "
        f"{f32['max_grad_rel_diff']:.2e} (tol {a.tol:g} / {a.tol * 10:g}), counts "
        f"{'equal' if f32['counts_equal'] else 'DIFFER'} -> {'OK' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
