"""Regeneration of assistant turns by the target itself (as EAGLE-3 and SpecForge do), so the draft
learns the target's own distribution: each assistant turn is replaced, in order, by the target's
greedy answer to the conversation so far, by ``hf`` (batched ``model.generate``, left padding,
``max_new_tokens``, target template), or by a served target (:mod:`eagle3.extract.regen_answers`:
``sglang``, SGLang's native ``/generate``, a server launched for it or at a URL; ``openai``,
``POST {url}/chat/completions``).

Each turn asked ends succeeded (truncated ones, which hit ``max_new_tokens``, kept and marked),
failed or skipped (the original turn stays); the counts (:func:`regenerate_counted`) go beside the
output, with how much of the regenerated answers repeats itself
(:mod:`eagle3.extract.repetition`). Results are cached in
``<out>/.progress/regenerated-<key>.jsonl``; finished chunks of :data:`RESUME_CHUNK` conversations
are kept meanwhile (:func:`chunks_path`) so a killed run resumes.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import Counter
from pathlib import Path

from eagle3.errors import ConfigError, DataError
from eagle3.extract.conversations import Conversation, answered, is_blank
from eagle3.extract.regen_answers import (Failed, Truncated, answer_source, served_model,
                                           shown_url)
from eagle3.extract.repetition import log_repetition, regenerated_answers, repetition_summary

log = logging.getLogger(__name__)


OUTCOMES = ("succeeded", "failed", "skipped")  # a partition; truncated ones are succeeded ones
TRUNCATED_POLICY = ("marked: a truncated answer (it hit max_new_tokens before its end-of-turn) is "
                    "kept, counted and listed in its record's truncated_turns")
LOUD_SHARE = 0.05  # a warning when this share of the turns or more is truncated or not regenerated
REGENERATE_MODES = ("hf", "sglang", "openai")  # data.regenerate values that regenerate
RESUME_CHUNK = 1024  # conversations regenerated (all their rounds) between two saved progress lines


def _turn_indices(conv: Conversation) -> list[int]:
    return [i for i, m in enumerate(conv.messages or []) if m["role"] == "assistant"]


def _turn_index(conv: Conversation, r: int) -> int | None:
    idx = _turn_indices(conv)
    return idx[r] if r < len(idx) else None


def _has_user(prefix: list[dict]) -> bool:
    return any(m["role"] == "user" for m in prefix)


def _outcome(answer) -> tuple[str, str | None]:
    """``(outcome, reason)`` of one ``answer_fn`` result."""
    if answer is None:
        return "skipped", "prompt_too_long"
    if isinstance(answer, Failed):
        return "failed", answer.reason
    if not isinstance(answer, str):
        return "failed", f"expected a text answer, got {type(answer).__name__}"
    return "succeeded", None


def _tally(outcomes: list[str], truncated: int) -> dict[str, int]:
    return {"input": len(outcomes), **{k: outcomes.count(k) for k in OUTCOMES},
            "truncated": truncated}


def regenerate_counted(convs: list[Conversation], answer_fn, batch_size: int,
                       max_rounds: int | None = None,
                       on_batch=None) -> tuple[list[Conversation], dict]:
    """Replace each assistant turn with ``answer_fn(message prefixes) -> answers``, round by round:
    round r asks every conversation's (r+1)-th assistant turn, earlier turns already regenerated.
    ``max_rounds``: only the first N assistant turns, dropping every message after the last
    regenerated one. Prefixes are batched by length within a round; ``on_batch(n)`` is called
    after each batch with its number of answers. An ``answer_fn`` with a ``converse`` method (a
    served target, :class:`eagle3.extract.regen_answers.ServedAnswers`) runs the conversations
    side by side instead, each turn after its own conversation's earlier ones (the same prefixes,
    without a round waiting for another conversation); ``on_batch(1)`` after each answer. A turn
    with no user message before it is skipped (``no_user_turn_before``).

    An answer is a ``str`` (succeeded; a :class:`Truncated` also counts as truncated,
    :data:`TRUNCATED_POLICY`; an empty one counts under ``turns.empty``; ``turns.clean`` counts
    those neither truncated nor empty), a :class:`Failed` or non-text (failed) or None (skipped,
    ``prompt_too_long``); the original turn stays unless succeeded.

    Returns ``(conversations, counts)``: new Conversation objects (inputs untouched, plain-text
    records unchanged) and ``{"turns": {input, succeeded, failed, skipped, truncated},
    "conversations": {...}, "per_turn": [{"turn", ...}], "skipped_by_reason", "failed_examples",
    "truncated_turns": {id: [1-based turns]}, "truncated_policy"}``; succeeded + failed + skipped =
    input at each level. A conversation is failed if a turn failed, else skipped if a turn was
    skipped or it has no assistant turn (``no_assistant_turn``), else succeeded. Warns when
    :data:`LOUD_SHARE` or more of the turns are truncated or not regenerated. DataError when
    ``answer_fn`` returns another number of answers than asked."""
    out, raw = _regenerate_raw(convs, answer_fn, batch_size, max_rounds, on_batch)
    return out, _finish(out, raw)


def _regenerate_raw(convs: list[Conversation], answer_fn, batch_size: int,
                    max_rounds: int | None, on_batch) -> tuple[list[Conversation], dict]:
    """The new conversations and JSON-serializable tallies (mergeable across chunks)."""
    out = [Conversation(c.id, [dict(m) for m in c.messages] if c.messages else None, c.text)
           for c in convs]
    rounds = max((len(_turn_indices(c)) for c in out), default=0)
    rounds = rounds if max_rounds is None else min(max_rounds, rounds)
    outcomes: list[list[str]] = [[] for _ in out]
    cut: list[list[int]] = [[] for _ in out]  # truncated turns (1-based) per conversation
    reasons: Counter = Counter()
    failed_examples: list[str] = []
    empty = flagged = 0  # empty answers; answers truncated or empty

    def apply(k: int, r: int, i: int, a) -> None:
        nonlocal empty, flagged
        what, why = _outcome(a)
        outcomes[k].append(what)
        if what == "succeeded":
            out[k].messages[i]["content"] = str(a)
            empty += is_blank(a)
            flagged += isinstance(a, Truncated) or is_blank(a)
            if isinstance(a, Truncated):
                cut[k].append(r + 1)
        elif what == "skipped":
            reasons[why] += 1
        else:
            failed_examples.append(f"{out[k].id} turn {r + 1}: {why}")

    def prefix_of(k: int, i: int) -> list[dict] | None:
        prefix = out[k].messages[:i]
        if _has_user(prefix):
            return prefix
        outcomes[k].append("skipped")  # nothing to answer: the template would refuse it
        reasons["no_user_turn_before"] += 1
        if on_batch is not None:
            on_batch(1)
        return None

    if hasattr(answer_fn, "converse"):  # a server: conversations side by side, no rounds
        jobs = [(k, [(r, i) for r in range(rounds) if (i := _turn_index(c, r)) is not None])
                for k, c in enumerate(out)]

        def applied(k: int, r: int, i: int, a) -> None:
            apply(k, r, i, a)
            if on_batch is not None:
                on_batch(1)

        answer_fn.converse([j for j in jobs if j[1]], prefix_of, applied, lambda k: out[k].id)
    else:
        for r in range(rounds):  # in-process: a round of every conversation at a time
            todo = [(k, i) for k, c in enumerate(out) if (i := _turn_index(c, r)) is not None]
            todo = [(k, i) for k, i in todo if prefix_of(k, i) is not None]
            todo.sort(key=lambda ki: sum(len(m["content"]) for m in out[ki[0]].messages[:ki[1]]))
            for b in range(0, len(todo), batch_size):
                chunk = todo[b: b + batch_size]
                answers = answer_fn([out[k].messages[:i] for k, i in chunk])
                if len(answers) != len(chunk):
                    raise DataError(f"regeneration: expected {len(chunk)} answers for a batch, got "
                                    f"{len(answers)}")
                for (k, i), a in zip(chunk, answers):
                    apply(k, r, i, a)
                if on_batch is not None:
                    on_batch(len(chunk))
    if max_rounds is not None:
        for c in out:
            last = _turn_index(c, max_rounds - 1)
            if c.messages and last is not None:
                del c.messages[last + 1:]
    return out, {"outcomes": outcomes, "cut": cut, "reasons": dict(reasons),
                 "failed_examples": failed_examples, "empty": empty, "flagged": flagged,
                 "rounds": rounds}


def _finish(out: list[Conversation], raw: dict) -> dict:
    """The counts of :func:`regenerate_counted` from :func:`_regenerate_raw`'s tallies (logged)."""
    outcomes, cut = raw["outcomes"], raw["cut"]
    per_conv = [next((o for o in ("failed", "skipped") if o in per), "succeeded") if per
                else "skipped" for per in outcomes]
    unasked = sum(not per for per in outcomes)
    turns = {**_tally([o for per in outcomes for o in per], sum(map(len, cut))),
             "empty": raw["empty"]}
    counts = {"turns": turns,
              # a conversation counts as truncated among the succeeded ones, as turns do
              "conversations": _tally(per_conv, sum(bool(c) and o == "succeeded"
                                                    for c, o in zip(cut, per_conv))),
              "per_turn": [{"turn": r + 1, **_tally([per[r] for per in outcomes if len(per) > r],
                                                    sum(r + 1 in c for c in cut))}
                           for r in range(raw["rounds"])],
              "skipped_by_reason": dict(raw["reasons"], **({"no_assistant_turn": unasked}
                                                           if unasked else {})),
              "failed_examples": raw["failed_examples"][:10],
              "truncated_turns": {c.id: t for c, t in zip(out, cut) if t},
              "kept_turns": {c.id: k for c, per in zip(out, outcomes)
                             if (k := [r + 1 for r, o in enumerate(per) if o != "succeeded"])},
              "truncated_policy": TRUNCATED_POLICY}
    turns["clean"] = turns["succeeded"] - raw["flagged"]
    missed = turns["input"] - turns["clean"]
    if missed:
        level = logging.WARNING if missed >= LOUD_SHARE * turns["input"] else logging.INFO
        log.log(level, "regeneration: %d of %d assistant turns (%.0f%%) truncated or not "
                "regenerated: %d truncated at max_new_tokens (%s; raise "
                "data.regenerate_max_new_tokens to finish them), %d failed %s, %d skipped %s, "
                "%d empty; conversations: %s", missed, turns["input"],
                100 * missed / turns["input"], turns["truncated"], TRUNCATED_POLICY,
                turns["failed"], counts["failed_examples"][:3], turns["skipped"],
                counts["skipped_by_reason"], turns["empty"], counts["conversations"])
    return counts


def regenerate_resumable(convs: list[Conversation], make_answer_fn, batch_size: int,
                         max_rounds: int | None, progress: Path, on_batch=None, *,
                         settings: dict | None = None,
                         max_failed_share: float = 1.0) -> tuple[list[Conversation], dict]:
    """:func:`regenerate_counted` in chunks of :data:`RESUME_CHUNK` conversations, each finished
    chunk appended to ``progress`` (JSONL, a line a chunk: ids, ``settings``, records, tallies) so
    a later call with the same ``convs`` and ``settings`` redoes only the rest. ``make_answer_fn()``
    (a target load or a server launch) is called only when a chunk is left. Returns
    ``(conversations, counts)`` over every chunk, ``counts["this_call"]`` the chunks and turns
    regenerated by this call.

    DataError: ``REGEN_PROGRESS_MISMATCH`` when a line of ``progress`` holds other conversations
    than its chunk or was made with other ``settings`` (answers of two settings would be mixed);
    ``REGEN_FAILED`` when more than ``max_failed_share`` of a chunk's turns failed (the chunk is
    not saved, so a re-run asks again); ``REGEN_NOTHING`` when turns were asked and none was
    regenerated."""
    chunks = [convs[b:b + RESUME_CHUNK] for b in range(0, len(convs), RESUME_CHUNK)]
    done = _read_progress(progress, chunks, settings)
    if done:
        log.warning("regeneration: %d of %d chunks (%d of %d conversations) finished earlier, "
                    "read from %s; regenerating the rest", len(done), len(chunks),
                    sum(len(d["ids"]) for d in done), len(convs), progress)
        if on_batch is not None:
            on_batch(sum(len(per) for d in done for per in d["raw"]["outcomes"]))
    answer_fn, earlier, turns_now = None, len(done), 0
    for chunk in chunks[len(done):]:
        if answer_fn is None:
            answer_fn = make_answer_fn()
        out, raw = _regenerate_raw(chunk, answer_fn, batch_size, max_rounds, on_batch)
        _check_failed_share(raw, max_failed_share, len(done), progress)
        _check_some_answer(raw, len(done), progress)
        line = {"ids": [c.id for c in chunk], "settings": settings, "raw": raw,
                "records": [{"id": c.id, "messages": c.messages, "text": c.text} for c in out]}
        progress.parent.mkdir(parents=True, exist_ok=True)
        with open(progress, "a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())
        done.append(line)
        turns_now += sum(map(len, raw["outcomes"]))
        log.info("regeneration: chunk %d of %d saved (%d conversations) to %s", len(done),
                 len(chunks), len(chunk), progress)
    out = [Conversation(r["id"], r.get("messages"), r.get("text"))
           for d in done for r in d["records"]]
    raws = [d["raw"] for d in done]
    merged = {k: [x for r in raws for x in r[k]] for k in ("outcomes", "cut", "failed_examples")}
    merged.update(reasons=dict(sum((Counter(r["reasons"]) for r in raws), Counter())),
                  empty=sum(r["empty"] for r in raws), flagged=sum(r["flagged"] for r in raws),
                  rounds=max((r["rounds"] for r in raws), default=0))
    counts = _finish(out, merged)
    t = counts["turns"]
    if t["input"] and t["succeeded"] <= t["empty"]:
        raise DataError(f"REGEN_NOTHING: regeneration: none of {t['input']} assistant turns got a "
                        f"non-empty answer (failed {t['failed']}, skipped {t['skipped']}: "
                        f"{counts['skipped_by_reason']}, empty {t['empty']}; failures "
                        f"{counts['failed_examples'][:3]})"
                        + ("; prompts over data.max_seq_len tokens are skipped"
                           if counts["skipped_by_reason"].get("prompt_too_long") else "")
                        + f"; the saved chunks are {progress}")
    counts["this_call"] = {"chunks": len(done) - earlier, "turns": turns_now}
    return out, counts


def _check_some_answer(raw: dict, index: int, progress: Path) -> None:
    """DataError ``REGEN_NOTHING`` when one chunk asked turns and got no non-empty answer (all
    failed or empty), so that such a chunk is never saved (a re-run asks again)."""
    outcomes = [o for per in raw["outcomes"] for o in per]
    asked = outcomes.count("succeeded") + outcomes.count("failed")
    if asked and outcomes.count("succeeded") <= raw["empty"]:
        raise DataError(f"REGEN_NOTHING: regeneration: chunk {index + 1} got no non-empty answer "
                        f"for any of its {asked} asked assistant turns "
                        f"({outcomes.count('failed')} failed, e.g. {raw['failed_examples'][:3]}; "
                        f"{raw['empty']} empty); it was not saved{_kept_note(progress)}: fix the "
                        "server or the target and run again")


def _kept_note(progress: Path) -> str:
    return f" (finished chunks stay in {progress})" if progress.is_file() else ""


def _check_failed_share(raw: dict, share: float, index: int, progress: Path) -> None:
    """DataError ``REGEN_FAILED`` when more than ``share`` of one chunk's turns failed or came
    back blank (their conversations would be left out: an answer that is nothing is no answer)."""
    outcomes = [o for per in raw["outcomes"] for o in per]
    failed, empty = outcomes.count("failed"), raw["empty"]
    if failed + empty and failed + empty > share * len(outcomes):
        raise DataError(f"REGEN_FAILED: regeneration: {failed + empty} of {len(outcomes)} "
                        f"assistant turns of chunk {index + 1} failed ({failed}, e.g. "
                        f"{raw['failed_examples'][:3]}) or came back blank ({empty}), above "
                        f"data.regenerate_max_failed_share={share}; the chunk was not saved"
                        f"{_kept_note(progress)}: fix the server or the target and run again")


def _chunk_problem(line: dict, ids: list[str]) -> str | None:
    """What a progress line of the conversations ``ids`` lacks to be merged, or None: the tallies
    (``raw``) and ``records`` of its types, one record and one outcome list per id in order,
    known outcomes, and as many blank answers as the records hold."""
    raw, recs = line.get("raw"), line.get("records")
    if not (isinstance(raw, dict) and isinstance(recs, list)
            and all(isinstance(raw.get(k), list) for k in ("outcomes", "cut", "failed_examples"))
            and isinstance(raw.get("reasons"), dict)
            and all(type(raw.get(k)) is int for k in ("empty", "flagged", "rounds"))):
        return ("a chunk record with 'raw' tallies (outcomes, cut, failed_examples, reasons, "
                f"empty, flagged, rounds) and 'records', got keys {sorted(line)}")
    if (len(recs) != len(ids) or len(raw["outcomes"]) != len(ids)
            or not all(isinstance(r, dict) and r.get("id") == i for r, i in zip(recs, ids))):
        return (f"{len(ids)} records and outcome lists, one per id in order, got "
                f"{len(recs)} records and {len(raw['outcomes'])} outcome lists")
    blank = 0
    for r, per in zip(recs, raw["outcomes"]):
        said = [m.get("content") for m in r.get("messages") or []
                if isinstance(m, dict) and m.get("role") == "assistant"]
        if not isinstance(per, list) or not set(per) <= set(OUTCOMES) or len(per) > len(said):
            return f"outcomes of {OUTCOMES} for the assistant turns of {r['id']!r}, got {per!r}"
        blank += sum(o == "succeeded" and is_blank(str(a)) for o, a in zip(per, said))
    if blank != raw["empty"]:
        return f"'empty' to count the {blank} blank answers its records hold, got {raw['empty']}"
    return None


def _read_progress(progress: Path, chunks: list[list[Conversation]],
                   settings: dict | None = None) -> list[dict]:
    """The finished chunks saved in ``progress``, in order; a last line cut short by a kill is
    dropped from the file (its chunk is redone). DataError ``REGEN_PROGRESS_MISMATCH`` for a line
    of other conversations or other ``settings``."""
    if not progress.is_file():
        return []
    lines = progress.read_bytes().split(b"\n")
    done, keep = [], 0
    for n, raw_line in enumerate(lines):
        if not raw_line.strip():
            continue
        try:
            line = json.loads(raw_line)
        except json.JSONDecodeError:
            if any(x.strip() for x in lines[n + 1:]):
                raise DataError(f"REGEN_PROGRESS_MISMATCH: {progress} line {n + 1}: expected a "
                                "JSON chunk record, got unreadable text before further lines; "
                                "delete the file to regenerate from the start") from None
            log.info("%s: line %d was cut short (a killed run); its chunk is regenerated",
                     progress, n + 1)
            break
        want = [c.id for c in chunks[len(done)]] if len(done) < len(chunks) else []
        if not isinstance(line, dict) or line.get("ids") != want:
            got = line.get("ids", [])[:3] if isinstance(line, dict) else type(line).__name__
            raise DataError(f"REGEN_PROGRESS_MISMATCH: {progress} line {n + 1}: expected the "
                            f"conversations of chunk {len(done)} ({len(want)} ids, first "
                            f"{want[:3]}), got {got!r}...; it was written for another selection "
                            "or chunk size: delete the file to regenerate from the start")
        if (problem := _chunk_problem(line, want)) is not None:
            raise DataError(f"REGEN_PROGRESS_MISMATCH: {progress} line {n + 1}: expected "
                            f"{problem}; delete the file to regenerate from the start")
        if line.get("settings") != settings:
            theirs = line.get("settings") or {}
            diff = {k: (theirs.get(k), (settings or {}).get(k))
                    for k in sorted(set(theirs) | set(settings or {}))
                    if theirs.get(k) != (settings or {}).get(k)}
            raise DataError(f"REGEN_PROGRESS_MISMATCH: {progress} line {n + 1}: its chunk was "
                            f"regenerated with other settings (key: saved, now): {diff}; go back "
                            "to those settings to finish it, or delete the file to regenerate "
                            "from the start")
        done.append(line)
        keep += len(raw_line) + 1
    if keep < progress.stat().st_size:
        with open(progress, "r+b") as f:
            f.truncate(keep)
    return done


def _regenerate(cfg, target_dir: Path, tokenizer, convs: list[Conversation], progress: Path,
                on_batch=None) -> tuple[list[Conversation], dict]:
    """:func:`regenerate_resumable` with the answer function and batch size of ``cfg.data``
    (:func:`eagle3.extract.regen_answers.answer_source`), opened only when a chunk is left and
    released (server stopped, target freed) when the regeneration ends; a launched server's logs
    go to ``<progress name>.server/``."""
    import contextlib

    d = cfg.data
    logs = progress.with_name(progress.name.removesuffix(".chunks.jsonl") + ".server")
    with contextlib.ExitStack() as stack:
        return regenerate_resumable(
            convs, lambda: stack.enter_context(answer_source(cfg, target_dir, tokenizer, logs)),
            d.regenerate_batch_size or cfg.extract.batch_size, d.regenerate_max_rounds, progress,
            on_batch, settings=answer_settings(cfg, target_dir),
            max_failed_share=d.regenerate_max_failed_share)


def answer_settings(cfg, target_dir: Path) -> dict:
    """What makes two regenerations' answers comparable (saved with each chunk and in the
    manifest): mode, server URL (credentials removed) and the model it says it serves, or the
    launched server's engine and dtype, target folder and dtype, token limits, rounds and template
    switches."""
    d = cfg.data
    launched = d.regenerate == "sglang" and not d.regenerate_url
    model = (served_model(d.regenerate, d.regenerate_url, d.regenerate_timeout_s)
             if d.regenerate_url and d.regenerate in ("sglang", "openai") else None)
    return {"mode": d.regenerate, "url": shown_url(d.regenerate_url) if d.regenerate_url else None,
            **({"served_by": {"engine": cfg.serve.engine, "dtype": cfg.serve.dtype}}
               if launched else {}), **({"served_model": model} if model else {}),
            "target": str(target_dir), "target_dtype": cfg.target.dtype,
            "max_new_tokens": d.regenerate_max_new_tokens, "max_rounds": d.regenerate_max_rounds,
            "max_seq_len": d.max_seq_len, "chat_template_kwargs": d.chat_template_kwargs}


def _write_jsonl(path: Path, convs: list[Conversation], counts: dict) -> None:
    """One ``{"id", "messages", "text"}`` line per conversation, plus ``truncated_turns`` and
    ``kept_turns`` (1-based turns cut at ``max_new_tokens``; turns that kept their original answer,
    failed or skipped) where :func:`regenerate_counted`'s ``counts`` list any."""
    from eagle3.artifacts import atomic_write_bytes

    marks = {k: counts.get(k) or {} for k in ("truncated_turns", "kept_turns")}
    atomic_write_bytes(path, "".join(
        json.dumps({"id": c.id, "messages": c.messages, "text": c.text,
                    **{k: m[c.id] for k, m in marks.items() if c.id in m}}) + "\n"
        for c in convs).encode())


def counts_path(cache: Path) -> Path:
    """Where :func:`regenerate_for_plan` writes the counts of the regeneration cached in
    ``cache``."""
    return cache.with_name(cache.name + ".counts.json")


def regenerate_for_plan(cfg, target_dir: Path, tokenizer, convs: list[Conversation],
                        cache: Path) -> list:
    """Regenerate ``convs`` as ``cfg.data.regenerate`` says, reusing ``cache`` (JSONL) if any; the
    counts (:func:`regenerate_counted`) go to :func:`counts_path` beside it. Returns them less
    those left with an empty assistant turn (:func:`~eagle3.extract.conversations.answered`)."""
    from eagle3.artifacts import atomic_write_json

    if cache.is_file():
        recs = [json.loads(line) for line in cache.read_text().splitlines() if line.strip()]
        if [r["id"] for r in recs] == [c.id for c in convs]:
            out = [Conversation(r["id"], r.get("messages"), r.get("text")) for r in recs]
            return answered(out)[0]
    progress = chunks_path(cache)
    out, counts = _regenerate(cfg, target_dir, tokenizer, convs, progress)
    _write_jsonl(cache, out, counts)
    # as regenerate_file: the answers of the conversations written with an answer each
    repeats = repetition_summary(regenerated_answers(tokenizer, answered(out)[0],
                                                     counts["kept_turns"]))
    log_repetition(repeats, str(cache))
    atomic_write_json(counts_path(cache), {**counts, "repetition": repeats,
                                           "settings": answer_settings(cfg, target_dir)})
    progress.unlink(missing_ok=True)  # the finished file holds every chunk
    return answered(out)[0]


def chunks_path(out: Path) -> Path:
    """``<name>.chunks.jsonl`` beside the regenerated file ``out``: the finished chunks of a
    regeneration under way, removed once ``out`` is written."""
    return out.with_name(out.name.removesuffix(".jsonl") + ".chunks.jsonl")


def _check_out(out: Path) -> None:
    """ConfigError unless ``out`` can be written as a regular file: not an existing folder,
    device, link or other entry (the write replaces the path), in a writable folder."""
    why = ("a folder" if out.is_dir() else "a symbolic link (give the file it points to)"
           if out.is_symlink() else "a device or other entry that is not a regular file"
           if out.exists() and not out.is_file() else None)
    if why is None and out.parent.exists() and not out.parent.is_dir():
        why = f"a path under {out.parent}, which is a file"
    if why is not None:
        raise ConfigError(f"--out {str(out)!r}: expected a regular file to write, got {why}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=".write-probe.", suffix=".tmp"):
            pass
    except OSError as e:
        raise ConfigError(f"--out {str(out)!r}: expected a writable folder, {out.parent} is not "
                          f"({type(e).__name__}: {e})") from e


def regenerate_file(cfg, out_path: Path, *, progress: bool = True) -> dict:
    """Regenerate the conversations an extraction of ``cfg`` would select (``data.*``: source,
    seed, ``num_conversations``, ``max_seq_len``, template switches) once, into a file many runs
    can share (``data.source=file``, ``data.path=<out_path>``, ``data.regenerate=none``).

    Writes ``out_path`` (JSONL, ``{"id", "messages"}`` per line) and
    ``<out_path>.manifest.json`` (kind ``regenerated_conversations``: source path and sha256,
    target, settings, counts (``unanswered_left_out``: conversations left with an empty
    assistant turn, not written: :func:`eagle3.extract.conversations.answered`), ``selection``
    (conversations asked for, selected, and the records skipped by reason), ``regeneration``
    (:func:`regenerate_counted`'s counts), seconds,
    regenerated turns per second of this call). ConfigError unless ``cfg.data.regenerate`` is in
    :data:`REGENERATE_MODES`, or when ``out_path`` is a folder or the source file itself (checked
    before any work); DataError when the source gives no usable conversation, and as
    :func:`regenerate_resumable`."""
    import time

    from transformers import AutoTokenizer

    from eagle3.artifacts import atomic_write_json, sha256_file
    from eagle3.assets import resolve_target
    from eagle3.extract.plan import selected_conversations
    from eagle3.precision import resolved

    if cfg.data.regenerate not in REGENERATE_MODES:
        raise ConfigError(f"data.regenerate: expected one of {list(REGENERATE_MODES)} to "
                          f"regenerate a file, got {cfg.data.regenerate!r}")
    _check_out(Path(out_path))  # before loading anything
    cfg = resolved(cfg)  # target.dtype concrete
    target = resolve_target(cfg)
    tok = AutoTokenizer.from_pretrained(str(target), trust_remote_code=cfg.target.trust_remote_code)
    chosen, stats, skipped, path, _ = selected_conversations(cfg, tok)
    if not chosen:
        raise DataError(f"{path}: no usable conversation among {stats.records} records (skipped: "
                        f"{dict(skipped)})")
    d, out_path = cfg.data, Path(out_path)
    if len(chosen) < d.num_conversations:
        log.warning("regeneration: %s gives %d usable conversations of the %d asked for "
                    "(data.num_conversations; %d records, skipped %s)", path, len(chosen),
                    d.num_conversations, stats.records, dict(skipped))
    if Path(path).resolve() in (out_path.resolve(), chunks_path(out_path).resolve()):
        raise ConfigError(f"--out {str(out_path)!r}: expected a file other than the source, got "
                          f"the source file {path} or the file its progress would be kept in "
                          f"({chunks_path(out_path)})")
    ids = Counter(c.id for c, _ in chosen)
    if twice := [i for i, n in ids.items() if n > 1]:  # tallies and marks are kept by id
        raise DataError(f"{path}: expected one conversation per id, got {len(twice)} ids more "
                        f"than once (e.g. {twice[:3]}); give each conversation its own id")
    source_sha = sha256_file(path)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc="regenerate", unit="answer")
    t0 = time.perf_counter()
    try:
        out, regen_counts = _regenerate(cfg, target, tok, [c for c, _ in chosen],
                                        chunks_path(out_path),
                                        bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - t0
    out, unanswered = answered(out)
    if not out:
        raise DataError(f"REGEN_NOTHING: regeneration: all {unanswered} conversations have a "
                        f"blank assistant turn, none is left to write to {out_path} (failed, "
                        f"skipped or blank answers: {regen_counts['turns']})")
    if unanswered:
        log.warning("regeneration: %d conversations left out of %s: an assistant turn is empty "
                    "(an answer that failed, was skipped or decoded to nothing, with no original "
                    "to keep)", unanswered, out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out_path, out, regen_counts)
    repeats = repetition_summary(regenerated_answers(tok, out, regen_counts["kept_turns"]))
    log_repetition(repeats, str(out_path))
    answers = sum(m["role"] == "assistant" for c in out for m in (c.messages or []))
    kept = regen_counts["kept_turns"]  # turns that kept their original answer, by id
    written = answers - sum(len(kept.get(c.id, [])) for c in out if c.messages)
    now = regen_counts["this_call"]["turns"]
    manifest = {"kind": "regenerated_conversations", "path": str(out_path),
                "sha256": sha256_file(out_path),
                "source": {"path": str(path), "sha256": source_sha}, "target": str(target),
                "settings": {**answer_settings(cfg, target), "seed": d.seed,
                             "num_conversations": d.num_conversations},
                "counts": {"conversations": len(out), "answers": answers,
                           "regenerated": regen_counts["turns"]["succeeded"]
                           - regen_counts["turns"]["empty"], "regenerated_in_file": written,
                           "records": stats.records, "unanswered_left_out": unanswered},
                "selection": {"asked": d.num_conversations, "selected": len(chosen),
                              "skipped_by_reason": dict(skipped)},
                "regeneration": regen_counts, "repetition": repeats,
                "seconds": round(seconds, 2),
                "answers_per_s": round(now / seconds, 2) if seconds > 0 and now else None}
    atomic_write_json(out_path.with_name(out_path.name + ".manifest.json"), manifest)
    chunks_path(out_path).unlink(missing_ok=True)  # out_path holds every chunk
    return manifest
