"""How much of a conversations file's answers repeats itself (``eagle3.extract.repetition``).

Counts, for each file, the tokens of its assistant turns (the target's tokenizer) that repeat an
earlier 9-gram of their answer, by position in the answer, and the answers that loop. With a
regeneration manifest beside a file (``<file>.manifest.json``), only the regenerated turns are
read (those its ``kept_turns`` lists kept their original answer). ``--ids-from FILE`` reads only
the conversations whose ids that file holds: the same conversations as they are and regenerated.

    python lab/answer_repetition.py --config configs/smollm2-cpu.yaml \\
        --file regenerated=R.jsonl --file as-is=SHAREGPT.jsonl --ids-from R.jsonl --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _named(p: argparse.ArgumentParser, raw: str) -> tuple[str, Path]:
    name, sep, path = raw.partition("=")
    if not sep or not name or not Path(path).is_file():
        p.error(f"--file: expected NAME=FILE with an existing file, got {raw!r}")
    return name, Path(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/smollm2-cpu.yaml", help="its target's tokenizer")
    p.add_argument("--file", action="append", default=[], help="NAME=FILE (repeatable)")
    p.add_argument("--ids-from", default=None, help="read only the conversations of this file")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if not a.file:
        p.error("--file: expected at least one NAME=FILE")
    files = [_named(p, raw) for raw in a.file]
    if a.ids_from is not None and not Path(a.ids_from).is_file():
        p.error(f"--ids-from: expected a file, got {a.ids_from!r}")

    from transformers import AutoTokenizer

    from eagle3.assets import resolve_target
    from eagle3.config import load_config
    from eagle3.extract.conversations import read_conversations
    from eagle3.extract.repetition import regenerated_answers, repetition_summary

    tok = AutoTokenizer.from_pretrained(str(resolve_target(load_config(a.config, []))))
    ids = ({c.id for c in read_conversations(Path(a.ids_from))[0]} if a.ids_from else None)
    out = {"config": a.config, "ids_from": a.ids_from, "python": platform.python_version(),
           "files": {}}
    for name, path in files:
        convs = [c for c in read_conversations(path)[0] if ids is None or c.id in ids]
        man = path.with_name(path.name + ".manifest.json")
        kept = (json.loads(man.read_text()).get("regeneration", {}).get("kept_turns", {})
                if man.is_file() else {})
        s = repetition_summary(regenerated_answers(tok, convs, kept))
        out["files"][name] = {"path": str(path), "conversations": len(convs),
                              "manifest": str(man) if man.is_file() else None, **s}
        parts = ", ".join(f"{b['from']}-{'' if b['to'] is None else b['to'] - 1}: "
                          f"{b['repeated_share']}" for b in s["by_position"])
        print(f"{name}: {len(convs)} conversations, {s['answers']} answers, {s['tokens']} "
              f"tokens, repeated {s['repeated_share']} ({parts}), looping {s['looping_answers']}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
