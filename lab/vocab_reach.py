"""How far a draft vocabulary reaches into what the target writes, and what that caps.

For each draft vocabulary size built from a data file's answer-token counts (the loss tokens of
the templated conversations, as the extraction counts them into ``token_freq.pt``, and
``eagle3.train.vocab.build_vocab_map``): the share of the target's greedy continuation tokens on
prompt sets that no draft token maps to, and the acceptance length of a *vocabulary-only* draft,
one that proposes the target's next token wherever the vocabulary holds it (greedy chain of
``--num-steps``, bonus counted), per verify pass and over every position a pass could start at.
That is the ceiling the vocabulary alone leaves. With ``--draft NAME=DIR`` (SGLang serving
folders), real drafts are replayed on the same continuations, both counts
(``eagle3.measure.replay``).

    python lab/vocab_reach.py --config configs/smollm2-cpu.yaml --sets mtbench2 \\
        --max-new-tokens 128 --sizes 4096,8192,16384,32768 [--conversations N] \\
        [--max-seq-len 2048] [--draft NAME=DIR ...] [--batch-size 40] --out FILE
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3.errors import Eagle3Error  # noqa: E402


def answer_token_counts(tokenizer, data: Path, limit: int | None, max_seq_len: int) -> Counter:
    """``{target id: count}`` over the loss tokens of the first ``limit`` usable conversations of
    ``data`` (all when None), templated and cut to ``max_seq_len`` as the extraction does."""
    from eagle3.extract.conversations import read_conversations, tokenize_conversation

    convs = read_conversations(data)[0][:limit]
    counts: Counter = Counter()
    for conv in convs:
        sample = tokenize_conversation(tokenizer, conv, max_seq_len)
        counts.update(t for t, m in zip(sample.input_ids, sample.loss_mask) if m)
    return counts


def vocabulary_only(requests, reach: set[int], num_steps: int, stops: set[int],
                    max_new_tokens: int) -> dict:
    """Pooled figures of the draft that proposes ``seq[t+1+j]`` wherever that token is in
    ``reach`` (and a token never emitted elsewhere): ``acceptance_length`` (per verify pass),
    ``acceptance_length_all_positions``, ``out_of_draft_vocab_share`` of the continuation tokens."""
    from eagle3.measure.offline import offline_row, offline_summary
    from eagle3.measure.replay import walk

    rows = []
    for r in requests:
        seq = r.prompt_ids + r.output_ids[:max_new_tokens]
        props = [[seq[t + 1 + j] if t + 1 + j < len(seq) and seq[t + 1 + j] in reach else -1
                  for j in range(1, num_steps + 1)] for t in range(len(seq))]
        res = walk(len(r.prompt_ids), seq, props, num_steps, stops, max_new_tokens)
        res.out_of_draft_vocab = sum(t not in reach for t in res.output_ids)
        if res.verify_ct:
            rows.append(offline_row({"id": r.id, "category": r.category}, res))
    s = offline_summary(rows, 0.0, {})
    return {k: s[k] for k in ("acceptance_length", "acceptance_length_all_positions",
                              "out_of_draft_vocab_share")}


def argument_problem(a) -> str | None:
    """What is wrong with the arguments before anything loads (the sizes' upper bound, the
    target's vocabulary, is checked once its config is read), or None."""
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        return f"--sizes: expected integers separated by commas, got {a.sizes!r}"
    if not sizes or min(sizes) < 2:
        return f"--sizes: expected draft vocabulary sizes >= 2, got {a.sizes!r}"
    for d in a.draft:
        name, _, folder = d.partition("=")
        if not name.strip() or not folder.strip():
            return f"--draft: expected NAME=SGLang serving folder, got {d!r}"
    for flag, value in (("--conversations", a.conversations), ("--max-seq-len", a.max_seq_len),
                        ("--max-new-tokens", a.max_new_tokens), ("--num-steps", a.num_steps),
                        ("--batch-size", a.batch_size)):
        if value is not None and value < 1:
            return f"{flag}: expected an integer >= 1, got {value}"
    out = Path(a.out)
    if out.is_dir() or not out.parent.is_dir():
        return (f"--out {a.out}: expected a file path in an existing folder, got "
                + ("a folder" if out.is_dir() else f"a missing folder {out.parent}"))
    if not [s for s in a.sets.split(",") if s.strip()]:
        return f"--sets: expected prompt set names separated by commas, got {a.sets!r}"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/smollm2-cpu.yaml",
                   help="the run config whose target and data to use (assets prepared)")
    p.add_argument("--data", default=None, help="conversations file (default: the config's)")
    p.add_argument("--conversations", type=int, default=None,
                   help="count answer tokens over the first N usable conversations (default all)")
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--sets", default="mtbench2")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--num-steps", type=int, default=3)
    p.add_argument("--sizes", default="4096,8192,16384,32768")
    p.add_argument("--draft", action="append", default=[], help="NAME=SGLang serving folder")
    p.add_argument("--batch-size", type=int, default=40)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if why := argument_problem(a):
        p.error(why)
    sizes = [int(x) for x in a.sizes.split(",")]
    drafts = dict(d.split("=", 1) for d in a.draft)
    from eagle3.assets import resolve_target
    from eagle3.config import load_config
    from eagle3.measure.offline import _load, replay_summaries
    from eagle3.measure.prompts import load_conversations
    from eagle3.measure.replay import generate_requests, stop_ids
    from eagle3.target_config import target_config_json, text_config
    from eagle3.train.vocab import build_vocab_map

    try:
        cfg = load_config(a.config)
        convs = [c for s in a.sets.split(",") for c in load_conversations(s.strip())]
        target_dir = resolve_target(cfg)
        vocab = int(text_config(target_config_json(target_dir))["vocab_size"])
        if too_big := [n for n in sizes if n >= vocab]:
            p.error(f"--sizes: expected sizes below the target's vocabulary {vocab}, got {too_big}")
        data = Path(a.data) if a.data else cfg.paths.resolved_cache_dir() / "data" / \
            "sharegpt_en.jsonl"
        target, tok, loaded, _ = _load(target_dir, drafts, a.dtype, "cpu")
        t0 = time.perf_counter()
        counts = answer_token_counts(tok, data, a.conversations, a.max_seq_len)
        count_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        requests = generate_requests(target, tok, convs, a.max_new_tokens,
                                     batch_size=a.batch_size, num_steps=a.num_steps)
        gen_s = time.perf_counter() - t0
    except Eagle3Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stops = stop_ids(target)
    out = {"config": a.config, "data": str(data), "answer_tokens_counted": sum(counts.values()),
           "distinct_answer_tokens": len(counts), "sets": a.sets,
           "requests": len(requests), "max_new_tokens": a.max_new_tokens,
           "num_steps": a.num_steps, "dtype": a.dtype,
           "completion_tokens": sum(len(r.output_ids) for r in requests),
           "seconds": {"count": count_s, "generate": gen_s},
           "cpu": platform.processor() or platform.machine(),
           "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "vocabulary_only": {}, "drafts": {}}
    for size in sizes:
        vm = build_vocab_map(dict(counts), size, vocab, pad=True)
        reach = set((vm.d2t + torch.arange(size)).tolist())
        out["vocabulary_only"][size] = {"train_coverage": vm.coverage, **vocabulary_only(
            requests, reach, a.num_steps, stops, a.max_new_tokens)}
    if loaded:
        summaries = replay_summaries(target, loaded, requests, a.num_steps,
                                     max_new_tokens=a.max_new_tokens,
                                     batch_size=min(a.batch_size, 16), skip_no_pass=True)
        for name, s in summaries.items():
            out["drafts"][name] = {k: s[k] for k in (
                "acceptance_length", "acceptance_length_all_positions",
                "out_of_draft_vocab_share", "per_position")}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"{out['requests']} requests, {out['completion_tokens']} continuation tokens; answer "
          f"tokens counted {out['answer_tokens_counted']:,} ({out['distinct_answer_tokens']:,} "
          "distinct)")
    print("| draft | train coverage | continuation tokens outside | per pass | every position |")
    print("|---|---|---|---|---|")
    for size, v in out["vocabulary_only"].items():
        print(f"| vocabulary-only, {size:,} | {v['train_coverage']:.3f} | "
              f"{v['out_of_draft_vocab_share']:.3f} | {v['acceptance_length']:.3f} | "
              f"{v['acceptance_length_all_positions']:.3f} |")
    for name, v in out["drafts"].items():
        print(f"| {name} | | {v['out_of_draft_vocab_share']:.3f} | {v['acceptance_length']:.3f} | "
              f"{v['acceptance_length_all_positions']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
