"""How much of a conversations file's answers repeats itself (``eagle3.extract.repetition``).

Counts, for each file, the tokens of its assistant turns (the target's tokenizer) that repeat an
earlier 9-gram of their answer, by position in the answer, and the answers that loop. With a
regeneration manifest beside a file (``<file>.manifest.json``), only the regenerated turns are
read (those its ``kept_turns`` lists kept their original answer). ``--ids-from FILE`` reads only
the conversations whose ids that file holds: the same conversations as they are and regenerated.
Exit 0; 2 for bad arguments or a file that cannot be read (the file named).

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

from eagle3.errors import Eagle3Error  # noqa: E402


REPO = Path(__file__).resolve().parents[1]


def _named(p: argparse.ArgumentParser, raw: str) -> tuple[str, Path]:
    name, sep, path = raw.partition("=")
    if not sep or not name or not Path(path).is_file():
        p.error(f"--file: expected NAME=FILE with an existing file, got {raw!r}")
    return name, Path(path)


def _manifest_of(path: Path) -> Path:
    """``<file>.manifest.json`` beside a file, ``.gz``/``.xz`` left out of the name (the study
    writes ``regenerated.jsonl.manifest.json`` beside ``regenerated.jsonl.xz``)."""
    plain = path.name[:-len(path.suffix)] if path.suffix in (".gz", ".xz") else path.name
    return path.with_name(plain + ".manifest.json")


def _kept_turns(man: Path) -> dict:
    """``regeneration.kept_turns`` of a regeneration manifest; ValueError naming the file when it
    is not one."""
    try:
        data = json.loads(man.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{man}: expected a regeneration manifest (JSON), could not read it "
                         f"({type(e).__name__}: {e})") from e
    regen = data.get("regeneration") if isinstance(data, dict) else None
    kept = regen.get("kept_turns", {}) if isinstance(regen, dict) else None
    if not isinstance(kept, dict):
        raise ValueError(f"{man}: expected a regeneration manifest with regeneration.kept_turns "
                         f"{{id: [turns]}}, got {type(data).__name__} "
                         f"{str(data)[:80]!r}")
    return kept


def _plain(path: Path, tmp: Path) -> Path:
    """``path`` itself, or its ``.gz``/``.xz`` content decompressed into ``tmp``."""
    from lab.harness import data_file

    return data_file(argparse.Namespace(data=str(path)), tmp)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(REPO / "configs" / "smollm2-cpu.yaml"),
                   help="its target's tokenizer")
    p.add_argument("--file", action="append", default=[], help="NAME=FILE (repeatable; .gz/.xz "
                   "read as they are decompressed)")
    p.add_argument("--ids-from", default=None, help="read only the conversations of this file")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if not a.file:
        p.error("--file: expected at least one NAME=FILE")
    files = [_named(p, raw) for raw in a.file]
    if len({n for n, _ in files}) < len(files):
        p.error(f"--file: expected each NAME once, got {[n for n, _ in files]}")
    if a.ids_from is not None and not Path(a.ids_from).is_file():
        p.error(f"--ids-from: expected a file, got {a.ids_from!r}")
    out_path = Path(a.out)
    if out_path.is_dir() or (out_path.parent.exists() and not out_path.parent.is_dir()):
        p.error(f"--out: expected a file path in a folder, got {a.out!r}")
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.with_name(f".{out_path.name}.probe").touch()
        out_path.with_name(f".{out_path.name}.probe").unlink()
    except OSError as e:
        p.error(f"--out: expected a writable place, got {a.out!r} ({e})")
    try:
        return _count(a, files, out_path)
    except (Eagle3Error, ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _count(a, files: list[tuple[str, Path]], out_path: Path) -> int:
    import tempfile

    from transformers import AutoTokenizer

    from eagle3.assets import resolve_target
    from eagle3.config import load_config
    from eagle3.extract.conversations import read_conversations
    from eagle3.extract.repetition import regenerated_answers, repetition_summary

    kept = {name: _kept_turns(m) if (m := _manifest_of(path)).is_file() else None
            for name, path in files}  # every manifest checked before any work
    tok = AutoTokenizer.from_pretrained(str(resolve_target(load_config(a.config, []))))
    out = {"config": a.config, "ids_from": a.ids_from, "python": platform.python_version(),
           "files": {}}
    with tempfile.TemporaryDirectory(prefix="answer_repetition.") as tmp:
        ids = ({c.id for c in read_conversations(_plain(Path(a.ids_from), Path(tmp)))[0]}
               if a.ids_from else None)
        for name, path in files:
            convs = [c for c in read_conversations(_plain(path, Path(tmp)))[0]
                     if ids is None or c.id in ids]
            if not convs:
                print(f"warning: {name}: none of the conversations of {path} is in --ids-from "
                      f"{a.ids_from}", file=sys.stderr)
            s = repetition_summary(regenerated_answers(tok, convs, kept[name] or {}))
            man = _manifest_of(path)
            out["files"][name] = {"path": str(path), "conversations": len(convs),
                                  "manifest": str(man) if kept[name] is not None else None, **s}
            parts = ", ".join(f"{b['from']}-{'' if b['to'] is None else b['to'] - 1}: "
                              f"{b['repeated_share']}" for b in s["by_position"])
            print(f"{name}: {len(convs)} conversations, {s['answers']} answers, {s['tokens']} "
                  f"tokens, repeated {s['repeated_share']} ({parts}), looping "
                  f"{s['looping_answers']}")
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
