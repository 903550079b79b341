"""The data a draft is validated against (``eagle3 validate --data``): an extraction manifest, and
the data's target tokens counted for :func:`eagle3.convert.draft_checks.check_vocab_reach`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from eagle3.errors import ConfigError, DataError

MAX_TOKENS_PER_RECORD = 1 << 20  # no truncation: every token of a record is counted


def _kind(path: Path) -> str:
    """What ``path`` is, in words, for an error message."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:
        return "nothing (not found)"
    return next((name for test, name in ((stat.S_ISCHR, "a character device"),
                                         (stat.S_ISBLK, "a block device"),
                                         (stat.S_ISFIFO, "a named pipe"),
                                         (stat.S_ISSOCK, "a socket")) if test(mode)),
                "neither a folder nor a regular file")


class DataManifest(dict):
    """An extraction manifest (JSON object) with ``path``, the file it came from."""

    path: Path | None = None


def read_data(data: str | Path, target_dir: str | Path | None = None
              ) -> tuple[dict | None, dict[int, int] | None, str | None]:
    """``(DataManifest, token counts, why coverage is not counted)`` for ``--data``: a folder with
    ``manifest.json`` (counts from its ``token_freq.pt`` if present), or a conversations file
    (:func:`token_counts`, needs ``target_dir``). DataError naming the path, what was expected
    and found (missing, a device or pipe, no or a bad ``manifest.json``); ConfigError: a
    conversations file without ``target_dir``."""
    from eagle3.artifacts import MANIFEST, read_manifest

    path = Path(data)
    expected = ("expected an extraction output folder (manifest.json, token_freq.pt) or a "
                "conversations file (JSON/JSONL/.txt)")
    if path.is_dir():
        if not (path / MANIFEST).is_file():
            raise DataError(f"--data {path}: {expected}, got a folder without {MANIFEST}")
        manifest = read_manifest(path)
        if not isinstance(manifest, dict):
            raise DataError(f"--data {path / MANIFEST}: expected a JSON object (the extraction "
                            f"manifest), got a JSON {type(manifest).__name__}")
        manifest = DataManifest(manifest)
        manifest.path = path / MANIFEST
        if not (path / "token_freq.pt").is_file():
            return manifest, None, (f"{path} holds no token_freq.pt: vocabulary coverage not "
                                    "counted")
        return manifest, token_counts(path), None
    if path.is_file():
        return None, token_counts(path, target_dir), None
    raise DataError(f"--data {path}: {expected}, got {_kind(path)}")


def token_counts(data: str | Path, target_dir: str | Path | None = None) -> dict[int, int]:
    """``{target token id: count}`` of the loss-masked tokens in ``data``: an extraction folder's
    ``token_freq.pt``, or a conversations file tokenized as extraction does with ``target_dir``'s
    tokenizer. ConfigError: no ``target_dir`` for a file; DataError: unreadable input or no
    token to count."""
    path = Path(data)
    if path.is_dir():
        from eagle3.train.vocab import load_token_freq

        counts = load_token_freq(path / "token_freq.pt")
    else:
        counts = _count_file(path, target_dir)
    if not sum(counts.values()):
        raise DataError(f"{path}: expected target tokens to count (assistant tokens of the "
                        "conversations, or token_freq.pt entries), got none")
    return counts


def _count_file(path: Path, target_dir: str | Path | None) -> dict[int, int]:
    from eagle3.extract.conversations import read_conversations, tokenize_conversation

    if target_dir is None:
        raise ConfigError(f"--data {path}: a conversations file is tokenized with the target's "
                          "tokenizer; expected --target TARGET_DIR, got none")
    convs, _ = read_conversations(path)
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(target_dir))
    except (OSError, ValueError) as e:
        raise DataError(f"{target_dir}: expected a loadable tokenizer for --data {path} "
                        f"({e})") from e
    counts: Counter = Counter()
    for conv in convs:
        sample = tokenize_conversation(tok, conv, MAX_TOKENS_PER_RECORD)
        counts.update(t for t, m in zip(sample.input_ids, sample.loss_mask) if m)
    return dict(counts)
