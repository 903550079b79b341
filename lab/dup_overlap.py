"""How much a run's validation split overlaps its training split: duplicate prompts and n-grams.

The split is the extraction's own (:func:`eagle3.extract.plan.build_plan` on the config and
overrides given); nothing is re-implemented but the measures:

1. first user turns: exact duplicates (lower case, whitespace collapsed) of a training sample's,
   and near-duplicates (word 5-gram Jaccard >= ``--jaccard``; a turn of fewer than 5 words is one
   shingle), per validation sample; the same for the development prompts (``--dev-file``, or the
   last ``--dev-holdout`` records of ``--sharegpt`` as ``lab.study_inputs.dev_prompts`` makes them)
   and MT-Bench's first turns;
2. token n-grams: the share of validation loss positions (``loss_mask == 1``) whose n-gram ending
   there (the n-1 tokens before it and the token) occurs anywhere in the training samples' ids,
   for each ``--ngram``; by offset into the assistant turn (``--buckets``), first turn or later; a
   baseline of ``--baseline`` training samples measured leave-one-out against the other training
   samples (and all of them); with ``--generate`` also the target's greedy continuations (HF on
   ``--device``, as the dev meter and offline evaluation make them) of the dev prompts
   (``--dev-prompts`` prompts, ``--dev-tokens``) and of MT-Bench (``--mt-set``, ``--mt-tokens``);
   on a CPU (2 cores) that takes about an hour.

    PYTHONPATH=. .venv/bin/python lab/dup_overlap.py --data /tmp/dups/regenerated.jsonl \
        --generate --out /tmp/dups/overlap.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
_PRIME = np.uint64(1_000_003)


def norm(text: str) -> str:
    """Lower case, whitespace runs as one space, stripped."""
    return re.sub(r"\s+", " ", text).strip().lower()


def shingles(text: str, k: int = 5) -> frozenset:
    """Word ``k``-grams of :func:`norm` ``text`` (the whole word tuple when shorter)."""
    w = norm(text).split()
    return frozenset([tuple(w)] if len(w) < k else (tuple(w[i:i + k])
                                                    for i in range(len(w) - k + 1)))


def jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def first_user(conv) -> str:
    """The first user turn of a Conversation ('' when none)."""
    return next((m["content"] for m in conv.messages or [] if m["role"] == "user"), "")


def gram_hashes(ids, n: int) -> np.ndarray:
    """uint64 polynomial hash of every ``n``-gram of ``ids``; entry ``i`` ends at token
    ``i + n - 1``."""
    a = np.asarray(ids, dtype=np.uint64)
    if len(a) < n:
        return np.zeros(0, dtype=np.uint64)
    h = np.zeros(len(a) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * _PRIME + a[k:len(a) - n + 1 + k] + np.uint64(1)
    return h


def doc_freq(seqs: list, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct n-gram hashes, how many of ``seqs`` hold each)."""
    every = np.concatenate([np.unique(gram_hashes(s, n)) for s in seqs])
    return np.unique(every, return_counts=True)


def loss_positions(mask) -> list[tuple[int, int, int]]:
    """``(position, offset into its assistant turn, turn index)`` of each loss token: a turn is
    one run of consecutive loss tokens."""
    out, turn, off, prev = [], -1, 0, 0
    for t, m in enumerate(mask):
        if m:
            turn, off = (turn + 1, 0) if not prev else (turn, off + 1)
            out.append((t, off, turn))
        prev = m
    return out


def bucket_of(off: int, edges: list[int]) -> str:
    i = sum(off >= e for e in edges)
    return f"{edges[i - 1] if i else 0}-{edges[i] - 1}" if i < len(edges) else f"{edges[-1]}+"


def overlap(items: list, table: tuple, n: int, need: int, edges: list[int]) -> dict:
    """Share of positions whose ``n``-gram is held by ``>= need`` training samples; ``items``:
    ``(ids, [(position, offset, turn)])``. Positions with fewer than n-1 tokens before are
    counted in ``too_early`` (not found). Overall, by offset bucket, first turn vs later."""
    keys, counts = table
    tally: dict[str, list[int]] = {}
    early = 0
    for ids, pos in items:
        h = gram_hashes(ids, n)
        for t, off, turn in pos:
            hit = False
            if t >= n - 1:
                i = np.searchsorted(keys, h[t - n + 1])
                hit = bool(i < len(keys) and keys[i] == h[t - n + 1] and counts[i] >= need)
            else:
                early += 1
            for g in ("all", bucket_of(off, edges), "turn1" if turn == 0 else "turn2+",
                      f"turn1:{bucket_of(off, edges)}" if turn == 0 else None):
                if g:
                    c = tally.setdefault(g, [0, 0])
                    c[0], c[1] = c[0] + 1, c[1] + hit
    return {"too_early": early, **{g: {"positions": c[0], "found": c[1],
                                       "share": round(c[1] / c[0], 4)}
                                   for g, c in sorted(tally.items())}}


def prompt_dups(texts: dict, train: dict, threshold: float) -> dict:
    """Exact / near duplicates among ``train`` (id → first user turn) of each of ``texts`` (an id
    of both is not compared with itself: leave-one-out)."""
    exact: dict[str, list] = {}
    for i, t in train.items():
        exact.setdefault(norm(t), []).append(i)
    sh = {i: shingles(t) for i, t in train.items()}
    rows = {}
    for i, t in texts.items():
        s = shingles(t)
        best = max(((jaccard(s, v), j) for j, v in sh.items() if j != i and s & v),
                   default=(0.0, None))
        rows[i] = {"exact": [j for j in exact.get(norm(t), []) if j != i],
                   "jaccard": round(best[0], 4),
                   "nearest": best[1]}
    n = len(rows)
    ex = sum(bool(r["exact"]) for r in rows.values())
    near = sum(r["jaccard"] >= threshold for r in rows.values())
    return {"n": n, "exact": ex, "exact_share": round(ex / max(1, n), 4), "near": near,
            "near_share": round(near / max(1, n), 4), "rows": rows}


def dev_texts(a, work: Path) -> list[dict]:
    """The development prompts: ``--dev-file`` (prompts file), else the first user turns of the
    last ``--dev-holdout`` records of ``--sharegpt`` (``lab.study_inputs.dev_prompts``)."""
    from eagle3.measure.prompts import file_prompts

    if a.dev_file:
        return file_prompts(a.dev_file)
    from lab.study_inputs import dev_prompts

    lines = [ln for ln in Path(a.sharegpt).read_text(encoding="utf-8").splitlines() if ln.strip()]
    prompts = dev_prompts(lines[-a.dev_holdout:], work)
    (work / "dev_prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return prompts


def generated(a, cfg, dev: list[dict]) -> dict:
    """``{"dev": [...], "mt": [...]}``: ``(prompt ids, continuation ids, turn)`` of the target's
    greedy continuations (cached in ``--gen-cache``)."""
    cache = Path(a.gen_cache)
    if cache.is_file():
        return json.loads(cache.read_text())
    from eagle3.assets import prepared_target
    from eagle3.measure.prompts import encode_prompts, load_conversations
    from eagle3.measure.replay import generate_requests, greedy_continuations
    from eagle3.target_model import load_target

    dtype = "float32" if a.device == "cpu" else "bfloat16"
    target, tok = load_target(prepared_target(cfg), dtype=dtype, device=a.device)
    prompts = encode_prompts(dev[:a.dev_prompts], tok)
    conts = greedy_continuations(target, prompts, a.dev_tokens, pad_id=tok.pad_token_id)
    reqs = generate_requests(target, tok, load_conversations(a.mt_set), a.mt_tokens,
                             num_steps=cfg.train.ttt_steps)
    out = {"dev": [(p, c, 1) for p, c in zip(prompts, conts)],
           "mt": [(list(r.prompt_ids), list(r.output_ids), r.turn) for r in reqs]}
    cache.write_text(json.dumps(out))
    return out


def cont_items(rows: list) -> list:
    """:func:`overlap` items of generated ``(prompt, continuation, turn)`` rows."""
    return [(p + c, [(len(p) + j, j, turn - 1) for j in range(len(c))]) for p, c, turn in rows]


def main(argv: list[str] | None = None) -> dict:
    from eagle3.config import PathsConfig

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO / "configs" / "smollm2-gpu.yaml"))
    p.add_argument("--data", required=True, help="the run's conversations file (JSONL)")
    p.add_argument("--num-conversations", type=int, default=2000)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("-o", "--override", action="append", default=[], help="more config overrides")
    p.add_argument("--ngram", type=int, nargs="+", default=[9, 16])
    p.add_argument("--buckets", type=int, nargs="+", default=[64, 256, 512])
    p.add_argument("--jaccard", type=float, default=0.5)
    p.add_argument("--baseline", type=int, default=100, help="training samples left out one by one")
    p.add_argument("--seed", type=int, default=0, help="picks the baseline's training samples")
    cache = PathsConfig().resolved_cache_dir()
    p.add_argument("--sharegpt", default=str(cache / "data" / "sharegpt_en.jsonl"))
    p.add_argument("--dev-holdout", type=int, default=200)
    p.add_argument("--dev-file", default=None, help="a prompts file instead of the held-out turns")
    p.add_argument("--dev-prompts", type=int, default=64)
    p.add_argument("--dev-tokens", type=int, default=64)
    p.add_argument("--mt-tokens", type=int, default=256)
    p.add_argument("--mt-set", default="mtbench2", help="mtbench2 (both turns) or mtbench")
    p.add_argument("--generate", action="store_true", help="measure generated continuations too")
    p.add_argument("--device", default="cpu")
    p.add_argument("--work", default="/tmp/dups")
    p.add_argument("--gen-cache", default="/tmp/dups/generated.json")
    p.add_argument("--out", default="/tmp/dups/overlap.json")
    a = p.parse_args(argv)

    from transformers import AutoTokenizer

    from eagle3.assets import prepared_target
    from eagle3.config import load_config
    from eagle3.extract.conversations import read_conversations
    from eagle3.extract.plan import build_plan
    from eagle3.measure.prompts import mtbench_prompts

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    over = ["data.source=file", f"data.path={a.data}", "data.regenerate=none",
            f"data.num_conversations={a.num_conversations}", f"data.max_seq_len={a.max_seq_len}",
            "target.kind=smollm2", *a.override]
    cfg = load_config(a.config, over)
    plan = build_plan(cfg, AutoTokenizer.from_pretrained(prepared_target(cfg)))
    nt = plan.num_train
    tr, va = plan.ids[:nt], plan.ids[nt:]
    convs = {c.id: c for c in read_conversations(a.data)[0]}
    first = {i: first_user(convs[i]) for i in plan.ids}
    res: dict = {"overrides": over, "samples": len(plan.ids), "train": nt, "val": len(va),
                 "truncated": plan.truncated, "val_ids": va, "train_ids": tr}
    pick = sorted(random.Random(a.seed).sample(range(nt), min(a.baseline, nt)))
    res["baseline_rows"] = pick
    train_first = {i: first[i] for i in tr}
    res["val_prompts"] = prompt_dups({i: first[i] for i in va}, train_first, a.jaccard)
    base_tr = {i.rsplit("_", 1)[0] for i in tr}
    res["val_same_sharegpt_conversation"] = sum(i.rsplit("_", 1)[0] in base_tr for i in va)
    res["train_prompts_loo_baseline"] = prompt_dups(
        {i: first[i] for i in (tr[r] for r in pick)}, train_first, a.jaccard)
    res["train_prompts_loo_all"] = prompt_dups(train_first, train_first, a.jaccard)
    res["train_prompts_loo_all"].pop("rows")
    dev = dev_texts(a, work)
    res["dev_prompts_all"] = prompt_dups({d["id"]: d["text"] for d in dev}, train_first,
                                         a.jaccard)
    res["dev_prompts_used"] = prompt_dups({d["id"]: d["text"] for d in dev[:a.dev_prompts]},
                                          train_first, a.jaccard)
    res["mtbench_prompts"] = prompt_dups({d["id"]: d["text"] for d in mtbench_prompts()},
                                         train_first, a.jaccard)
    for k in ("dev_prompts_all", "dev_prompts_used", "mtbench_prompts"):
        res[k]["rows"] = {i: r for i, r in res[k]["rows"].items() if r["exact"]
                          or r["jaccard"] >= a.jaccard}

    items = [(plan.input_ids[r], loss_positions(plan.loss_masks[r])) for r in range(len(plan.ids))]
    gen = generated(a, cfg, dev) if a.generate else None
    dup = {i for i, r in res["val_prompts"]["rows"].items() if r["exact"]}
    res["ngrams"] = {}
    for n in a.ngram:
        table = doc_freq(plan.input_ids[:nt], n)
        g = {"val": overlap(items[nt:], table, n, 1, a.buckets),
             "val_exact_dup_prompt": overlap([items[nt + k] for k, i in enumerate(va) if i in dup],
                                             table, n, 1, a.buckets),
             "val_other": overlap([items[nt + k] for k, i in enumerate(va) if i not in dup],
                                  table, n, 1, a.buckets),
             "train_loo_baseline": overlap([items[r] for r in pick], table, n, 2, a.buckets),
             "train_loo_all": overlap(items[:nt], table, n, 2, a.buckets)}
        if gen:
            g["dev_generated"] = overlap(cont_items(gen["dev"]), table, n, 1, a.buckets)
            g["mtbench_generated"] = overlap(cont_items(gen["mt"]), table, n, 1, a.buckets)
        res["ngrams"][str(n)] = g
    Path(a.out).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
