"""A small builder of a hidden-states directory in the documented layout (docs/INTERNALS.md), for
tests.

Independent of ``eagle3.extract.stage``: it runs the (tiny) target itself on random token sequences,
captures the aux states (HF ``hidden_states`` indices) and the last layer's output before the final
norm with a forward pre-hook on the final norm, and writes::

    <dir>/manifest.json   kind "hidden_states"
    <dir>/data/           HF datasets folder: input_ids, loss_mask, seq_len
    <dir>/hidden_states/hs_{i}.safetensors   token_ids [T] int64, hidden_states [T, n_aux+1, H]
    <dir>/token_freq.pt   {token_id: count} over loss-masked tokens of the train split

Token streams are drawn from a small id range with a repeating motif so a draft can learn something.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle3.artifacts import sha256_file, write_manifest


def _sequences(
    num_samples: int, min_len: int, max_len: int, token_range: tuple[int, int], seed: int
):
    g = torch.Generator().manual_seed(seed)
    lo, hi = token_range
    out = []
    for _ in range(num_samples):
        n = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        motif = torch.randint(lo, hi, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g)
        seq = motif.repeat(n // motif.numel() + 1)[:n].clone()
        noise = torch.rand(n, generator=g) < 0.3
        seq[noise] = torch.randint(lo, hi, (int(noise.sum()),), generator=g)
        prompt = max(1, n // 4)
        mask = torch.zeros(n, dtype=torch.long)
        mask[prompt:] = 1
        out.append((seq.long(), mask))
    return out


@torch.no_grad()
def build_hidden_states_dir(
    out: Path,
    target_dir: Path,
    *,
    num_samples: int = 12,
    min_len: int = 24,
    max_len: int = 48,
    token_range: tuple[int, int] = (100, 400),
    aux_layer_ids: list[int] | None = None,
    val_samples: int = 2,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    empty: bool = False,
) -> Path:
    """Write a hidden-states directory made by the real (tiny) target at ``target_dir``; returns
    ``out``.

    ``empty=True`` writes a valid layout with zero samples (for the empty-dataset error).
    """
    from datasets import Dataset
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    out = Path(out)
    (out / "hidden_states").mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    conf = model.config
    n_layers = conf.num_hidden_layers
    ids = aux_layer_ids or [2, n_layers // 2, n_layers - 3]
    captured = {}
    hook = model.model.norm.register_forward_pre_hook(
        lambda m, a: captured.__setitem__("last", a[0])
    )
    seqs = [] if empty else _sequences(num_samples, min_len, max_len, token_range, seed)
    rows = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for i, (seq, mask) in enumerate(seqs):
        res = model(seq[None], output_hidden_states=True)
        aux = [res.hidden_states[k][0] for k in ids]  # each [T, H]
        # [T, n_aux+1, H]
        hs = torch.stack(aux + [captured["last"][0]], dim=1).to(dtype).contiguous()
        save_file(
            {"token_ids": seq.contiguous(), "hidden_states": hs},
            str(out / "hidden_states" / f"hs_{i}.safetensors"),
        )
        rows["input_ids"].append(seq.tolist())
        rows["loss_mask"].append(mask.tolist())
        rows["seq_len"].append(int(seq.numel()))
    hook.remove()
    Dataset.from_dict(rows).save_to_disk(str(out / "data"))
    n = len(seqs)
    val = list(range(n - val_samples, n)) if n > val_samples else []
    train = [i for i in range(n) if i not in val]
    freq: dict[int, int] = {}
    for i in train:
        seq, mask = seqs[i]
        for t in seq[mask.bool()].tolist():
            freq[t] = freq.get(t, 0) + 1
    torch.save(freq, out / "token_freq.pt")
    target = {
        "path": str(Path(target_dir).resolve()),
        "config_hash": sha256_file(Path(target_dir) / "config.json"),
        "weights_hash": None,
        "num_layers": n_layers,
        "hidden_size": conf.hidden_size,
        "vocab_size": conf.vocab_size,
    }
    write_manifest(
        out,
        "hidden_states",
        counts={"samples": n, "tokens": sum(rows["seq_len"])},
        target=target,
        aux_layer_ids=ids,
        layer_id_convention="hf_hidden_states_index",
        dtype=str(dtype).replace("torch.", ""),
        splits={"train": train, "val": val},
    )
    return out


def edit_manifest(directory: Path, **changes) -> dict:
    """Rewrite keys of ``<directory>/manifest.json`` (top level; ``target__x`` edits
    ``target.x``)."""
    path = Path(directory) / "manifest.json"
    m = json.loads(path.read_text())
    for k, v in changes.items():
        if "__" in k:
            a, b = k.split("__", 1)
            m[a][b] = v
        else:
            m[k] = v
    path.write_text(json.dumps(m))
    return m


def tiny_train_cfg(runs_dir: Path, *overrides: str):
    """configs/tiny-random.yaml shaped for fast training tests (draft vocab 128, packed 96-token
    batches)."""
    from eagle3.config import load_config

    base = [
        f"paths.runs_dir={runs_dir}",
        "train.draft_vocab_size=128",
        "train.max_tokens_per_batch=96",
        "train.log_every=1",
        "train.warmup_steps=2",
        "train.epochs=1",
    ]
    return load_config(
        Path(__file__).resolve().parents[1] / "configs" / "tiny-random.yaml", base + list(overrides)
    )


def determinism_probe(model, capture_ids: list[int], samples: list[list[int]], pad_id: int) -> dict:
    """Extract ``samples`` one at a time and in one right-padded batch; returns ``{"max_rel_err",
    "per_slot"}``: the largest ``|a - b| / |a|`` (L2 over the hidden dimension) over samples and
    tokens, per captured slot (batch-independent: bf16 ~1e-2, fp32 ~1e-6), of
    :func:`eagle3.extract.hf_backend.forward_capture`."""
    from eagle3.extract.hf_backend import forward_capture

    alone = [forward_capture(model, capture_ids, [s], pad_id)[0].float() for s in samples]
    together = [x.float() for x in forward_capture(model, capture_ids, samples, pad_id)]
    per_slot = torch.zeros(len(capture_ids))
    for a, b in zip(alone, together):
        rel = (a - b).norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-6)  # [T, S]
        per_slot = torch.maximum(per_slot, rel.amax(dim=0))
    return {"max_rel_err": float(per_slot.max()), "per_slot": per_slot.tolist()}
