"""Inputs of ``lab/gpu_study.py``: its data and regen stages (the conversations file, the
development prompts held out of it, the regenerated file), and what is checked before it costs GPU
time: a regenerated conversations file carried back from an earlier call (``--regen-file``) and a
study plan (``--plan``)."""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import shutil
from pathlib import Path

from lab.harness import data_file, log

REPO = Path(__file__).resolve().parents[1]


ALL = 0  # data size 0 = every usable conversation of the data file

# The study: data variants (data-section overrides; "{regen}" is the regenerated file), schedules
# (train overrides, also the one-change-at-a-time levers) and the points, in priority order (the
# first ones matter most).
PLAN = {
    "data": {
        "as-is": [],
        "regenerated": ["data.source=file", "data.path={regen}"],
        "regenerated-seq512": ["data.source=file", "data.path={regen}", "data.max_seq_len=512"],
    },
    "schedules": {
        "cosine-3ep": ["train.schedule=epochs", "train.epochs=3"],
        "cosine-10ep": ["train.schedule=epochs", "train.epochs=10"],
        "constant-30ep": ["train.schedule=constant", "train.epochs=30", "train.eval_every=600"],
        "cosine-3ep-vocab16k": [
            "train.schedule=epochs",
            "train.epochs=3",
            "train.draft_vocab_size=16384",
        ],
        "cosine-3ep-ttt5": ["train.schedule=epochs", "train.epochs=3", "train.ttt_steps=5"],
        "cosine-3ep-lr1e-3": ["train.schedule=epochs", "train.epochs=3", "train.lr=1e-3"],
    },
    "points": [
        ["regenerated", 3000, "cosine-3ep"],
        ["regenerated", 1000, "cosine-3ep"],
        ["as-is", 3000, "cosine-3ep"],
        ["regenerated", 3000, "cosine-10ep"],
        ["regenerated", 1000, "constant-30ep"],
        ["as-is", 1000, "cosine-3ep"],
        ["as-is", ALL, "cosine-3ep"],
        ["regenerated-seq512", 3000, "cosine-3ep"],
        ["regenerated", 3000, "cosine-3ep-vocab16k"],
        ["regenerated", 3000, "cosine-3ep-ttt5"],
        ["regenerated", 3000, "cosine-3ep-lr1e-3"],
    ],
}
TINY_PLAN = {
    "data": {"as-is": [], "regenerated": ["data.source=file", "data.path={regen}"]},
    "schedules": {
        "cosine-1ep": ["train.schedule=epochs", "train.epochs=1"],
        "constant-3ep": ["train.schedule=constant", "train.epochs=3", "train.eval_every=2"],
    },
    "points": [
        ["regenerated", 8, "cosine-1ep"],
        ["as-is", 8, "cosine-1ep"],
        ["as-is", ALL, "cosine-1ep"],
        ["as-is", 8, "constant-3ep"],
    ],
}


def _manifest_of(path: Path) -> Path:
    """``<name>.manifest.json`` beside a regenerated file (``regenerated.jsonl[.xz]`` →
    ``regenerated.jsonl.manifest.json``)."""
    return path.with_name(path.name.removesuffix(".xz") + ".manifest.json")


def regen_file_problem(src: Path, expected: int, max_new_tokens: int | None = None,
                       regen_rounds: int | None = None) -> str | None:
    """What keeps ``src`` (``--regen-file``: ``regenerated.jsonl`` or ``.jsonl.xz`` with its
    manifest beside it, written by :func:`eagle3.extract.regen.regenerate_file`) from standing
    for this call's regeneration, or None. Checked before any stage: a missing manifest; another
    ``--regen`` count; when given, another ``--regen-max-new-tokens`` or ``--regen-rounds``
    (``0``: every turn, the manifest's ``max_rounds: null``; checked where the manifest records
    it); a conversation count unlike the file's line count (a truncated copy); a sha256 unlike the
    recorded one; a corrupt .xz."""
    return _read_regen_file(src, expected, max_new_tokens, regen_rounds)[0]


def _read_regen_file(src: Path, expected: int, max_new_tokens: int | None,
                     regen_rounds: int | None) -> tuple[str | None, bytes, dict]:
    """``(problem, content, manifest)`` of :func:`regen_file_problem` (content and manifest empty
    where a problem stops the reading)."""
    man_path = _manifest_of(src)
    if not man_path.is_file():
        return (f"--regen-file {src}: expected its manifest {man_path} beside it, found none",
                b"", {})
    try:
        man = json.loads(man_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"--regen-file {src}: expected {man_path} to be a JSON manifest, got {e}", b"", {}
    settings = (man.get("settings") or {}) if isinstance(man, dict) else {}
    made_for = settings.get("num_conversations")
    if made_for != expected:
        return (f"--regen-file {src}: {man_path} settings.num_conversations is {made_for}, "
                f"expected --regen {expected}"), b"", {}
    cap = settings.get("max_new_tokens")
    if max_new_tokens is not None and cap != max_new_tokens:
        return (f"--regen-file {src}: {man_path} settings.max_new_tokens is {cap}, expected "
                f"--regen-max-new-tokens {max_new_tokens}"), b"", {}
    rounds = None if regen_rounds == 0 else regen_rounds
    if regen_rounds is not None and "max_rounds" in settings and settings["max_rounds"] != rounds:
        made = settings["max_rounds"]
        return (f"--regen-file {src}: {man_path} settings.max_rounds is {made} ("
                f"{'every turn' if made is None else f'{made} turns'}), expected --regen-rounds "
                f"{regen_rounds} (--regen-rounds {0 if made is None else made} for this file)"), \
            b"", {}
    try:
        data = lzma.decompress(src.read_bytes()) if src.suffix == ".xz" else src.read_bytes()
    except lzma.LZMAError as e:
        return f"--regen-file {src}: expected a complete .xz file, decompressing failed: {e}", \
            b"", {}
    lines = sum(1 for ln in data.splitlines() if ln.strip())
    want = (man.get("counts") or {}).get("conversations")
    if lines != want:
        return (f"--regen-file {src}: {lines} conversations in the file, its manifest's "
                f"counts.conversations says {want} (truncated copy?)"), b"", {}
    digest = hashlib.sha256(data).hexdigest()
    if man.get("sha256") != digest:
        return (f"--regen-file {src}: its content's sha256 is {digest}, {man_path} records "
                f"{man.get('sha256')!r} (a changed or different file)"), b"", {}
    return None, data, man


def reuse_regen(src: Path, expected: int, out: Path, max_new_tokens: int | None = None,
                regen_rounds: int | None = None) -> dict:
    """The regen stage from a file an earlier call carried back (``--regen-file``), instead of
    regenerating: ``src`` is copied (decompressed) to ``out`` with its manifest. Raises
    RuntimeError with :func:`regen_file_problem`'s message."""
    problem, data, man = _read_regen_file(src, expected, max_new_tokens, regen_rounds)
    if problem:
        raise RuntimeError(problem)
    lines = man["counts"]["conversations"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    man = {**man, "path": str(out), "reused_from": str(src)}
    _manifest_of(out).write_text(json.dumps(man, indent=1))
    log(f"regen: reusing {lines} regenerated conversations from {src} (made in "
        f"{man.get('seconds')} s)")
    return {"path": str(out), "counts": man["counts"], "seconds": 0.0,
            "answers_per_s": man.get("answers_per_s"), "settings": man.get("settings"),
            "repetition": man.get("repetition"), "reused_from": str(src)}


def carry_back_regen(regen_path: Path, out: Path) -> None:
    """Write ``out/regenerated.jsonl.xz`` and its manifest (once), so a later call on a fresh
    machine can pass them as ``--regen-file`` instead of regenerating (minutes of device time)."""
    dst = out / "regenerated.jsonl.xz"
    if dst.is_file() or not regen_path.is_file() or out.resolve() == regen_path.parent.resolve():
        return
    dst.write_bytes(lzma.compress(regen_path.read_bytes(), preset=6))
    shutil.copyfile(_manifest_of(regen_path), _manifest_of(dst))


PLAN_OWNED = ("data.num_conversations", "name")  # set per point by the sweep


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict; ValueError naming the key when one is given twice (the
    ``json`` module would keep the last silently)."""
    seen: dict = {}
    for k, v in pairs:
        if k in seen:
            raise ValueError(f"key {k!r} given twice in one object")
        seen[k] = v
    return seen


def _key(override) -> str:
    """The key of a ``KEY=VALUE`` override string as given in a plan."""
    return str(override).split("=", 1)[0].strip()


def _keys(overrides: list) -> set[str]:
    return {_key(o) for o in overrides}


def check_plan(path: str) -> dict:
    """Read and check a ``--plan`` file before any stage runs: a JSON object with ``data`` and
    ``schedules`` (name → list of override strings) and a non-empty ``points`` list of ``[data,
    size, schedule]`` naming them (size: conversations, 0 = all usable). Raises ValueError naming
    ``--plan``, the key and expected vs actual."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--plan {path}: expected a readable UTF-8 file, got "
                         f"{type(e).__name__}: {e}") from e
    try:
        plan = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise ValueError(f"--plan {path}: expected JSON, got {e}") from e
    except ValueError as e:  # _unique_keys: a key given twice
        raise ValueError(f"--plan {path}: expected each key once, got {e}") from e
    if not isinstance(plan, dict):
        raise ValueError(f"--plan {path}: expected a JSON object, got {type(plan).__name__}")
    extra = sorted(set(plan) - {"data", "schedules", "points", "about"})
    if extra:
        raise ValueError(f"--plan {path}: expected the keys data, schedules, points and an "
                         f"optional about, got also {extra}")
    for key in ("data", "schedules"):
        v = plan.get(key)
        if not isinstance(v, dict) or not v or not all(isinstance(o, list) for o in v.values()):
            raise ValueError(
                f"--plan {path}: '{key}' expected a non-empty "
                f"object of name -> list of overrides, got {v!r}"
            )
    for key in ("data", "schedules"):
        for name, overrides in plan[key].items():
            keys = [_key(o) for o in overrides]
            owned = [k for k in keys if k in PLAN_OWNED or k.startswith("paths.")]
            twice = sorted({k for k in keys if keys.count(k) > 1})
            if owned or twice:
                raise ValueError(
                    f"--plan {path}: {key}.{name}: expected no override of "
                    f"{', '.join(PLAN_OWNED)} or paths.* (the study sets them: a point's size, "
                    f"name and folders) and each key once, got {owned or twice}")
    points = plan.get("points")
    if not isinstance(points, list) or not points:
        raise ValueError(
            f"--plan {path}: 'points' expected a non-empty "
            f"list of [data, size, schedule], got {points!r}"
        )
    for i, pt in enumerate(points):
        ok = (
            isinstance(pt, list)
            and len(pt) == 3
            and isinstance(pt[0], str) and pt[0] in plan["data"]
            and isinstance(pt[2], str) and pt[2] in plan["schedules"]
            and isinstance(pt[1], int)
            and not isinstance(pt[1], bool)
            and pt[1] >= 0
        )
        if not ok:
            raise ValueError(
                f"--plan {path}: points[{i}] = {pt!r}: expected [data in {sorted(plan['data'])}, "
                f"size >= 0 (0 = all), schedule in {sorted(plan['schedules'])}]"
            )
        both = sorted(_keys(plan["data"][pt[0]]) & _keys(plan["schedules"][pt[2]]))
        if both:
            raise ValueError(f"--plan {path}: points[{i}] = {pt!r}: expected data.{pt[0]} and "
                             f"schedules.{pt[2]} to set different keys (the schedule's would "
                             f"win silently), got both setting {both}")
        if pt in points[:i]:
            raise ValueError(f"--plan {path}: points[{i}] = {pt!r}: expected each point once, "
                             f"got it also at points[{points.index(pt)}]")
    return plan


def plan_digest(a) -> str:
    """What ``--resume`` compares: the sha256 of the plan's contents (a changed plan is refused, the
    same plan under another path is not), or ``default`` / ``tiny`` for the built-in plans."""
    if not a.plan:
        return "tiny" if a.tiny else "default"
    return hashlib.sha256(
        json.dumps(json.loads(Path(a.plan).read_text()), sort_keys=True).encode()
    ).hexdigest()


ASSET_FILES = ("question.jsonl", "question.jsonl.xz", "test.jsonl", "test.jsonl.xz")


def plan_problem(a, plan: dict, config: Path) -> str | None:
    """What is wrong with ``plan`` for these arguments, before any stage costs GPU time, or None: a
    point on the regenerated file asking for more conversations than ``--regen`` makes (it would
    train on fewer and still be labelled with its size), a point or the regeneration asking for
    more records than ``--data`` holds after ``--dev-holdout`` (an upper bound: the extraction's
    selection may drop some, ``DATA_SHORT``), or override strings the config refuses
    (checked with :func:`load_config` on ``config``, the study's config, ``{regen}`` standing for a
    file path)."""
    from eagle3.config import load_config
    from eagle3.errors import ConfigError

    for d, n, sched in plan["points"]:
        size = a.all_size if n == 0 else n  # 0 = all usable (ALL)
        if any("{regen}" in o for o in plan["data"][d]) and size > a.regen:
            return (
                f"--plan {a.plan or '(built-in)'}: point [{d!r}, {n}, {sched!r}] needs {size} "
                f"regenerated conversations, --regen makes {a.regen}: raise "
                f"--regen (and --all-size for size 0) or lower the point's size"
            )
    if a.data:  # the pool the points and the regeneration draw from, known before any stage
        try:
            pool = count_records(Path(a.data)) - a.dev_holdout
        except ValueError as e:
            return str(e)
        for d, n, sched in plan["points"]:
            regen = any("{regen}" in o for o in plan["data"][d])
            need = a.regen if regen else (a.all_size if n == 0 else n)
            if need > pool:
                return (f"--plan {a.plan or '(built-in)'}: point [{d!r}, {n}, {sched!r}] needs "
                        f"{need} {'conversations to regenerate' if regen else 'conversations'}, "
                        f"--data {a.data} holds {pool} records"
                        f"{f' after --dev-holdout {a.dev_holdout}' if a.dev_holdout else ''}: "
                        "lower the point's size (--regen, --all-size) or the holdout")
    for kind in ("data", "schedules"):
        for name, overrides in plan[kind].items():
            bad = [o for o in overrides if not isinstance(o, str) or "=" not in o]
            if bad:
                return (f"--plan {a.plan or '(built-in)'}: {kind}.{name}: expected KEY=VALUE "
                        f"strings, got {bad!r}")
            try:
                load_config(config, [o.replace("{regen}", "/regenerated.jsonl") for o in overrides])
            except ConfigError as e:
                lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
                return f"--plan {a.plan or '(built-in)'}: {kind}.{name}: " + "; ".join(lines)
    return None


def read_records(data: Path) -> list[str]:
    """The non-blank lines of the conversations file ``data`` (UTF-8 JSONL, or ``.gz`` / ``.xz``
    JSONL). Raises ValueError naming ``--data`` when it cannot be read or decoded."""
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(data.suffix, open)
    try:
        with opener(data.expanduser(), "rt", encoding="utf-8") as f:
            return [ln.rstrip("\n") for ln in f if ln.strip()]
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as e:
        raise ValueError(f"--data {data}: expected a readable UTF-8 JSONL file (plain, .gz or "
                         f".xz), got {type(e).__name__}: {e}") from None


def count_records(data: Path) -> int:
    """How many records :func:`read_records` finds in ``data``; raises as it does."""
    return len(read_records(data))


def dev_prompts(held: list[str], work: Path) -> list[dict]:
    """The first user turn of each held-out record (JSONL lines ``held``) as a development prompt,
    ``{"id", "category": "sharegpt-dev", "text"}``; records with no usable conversation or no
    non-blank user turn give none. ``work`` holds the scratch file the conversation reader needs.
    """
    from eagle3.errors import DataError
    from eagle3.extract.conversations import read_conversations

    scratch = work / "held-out.scratch.jsonl"
    scratch.write_text("\n".join(held) + "\n", encoding="utf-8")
    try:
        convs, _ = read_conversations(scratch)
    except DataError:  # no usable record among them
        convs = []
    finally:
        scratch.unlink()
    prompts = []
    for c in convs:
        first = next((m["content"] for m in c.messages or [] if m["role"] == "user"), None)
        if first and first.strip():
            prompts.append({"id": c.id, "category": "sharegpt-dev", "text": first})
    return prompts


def _no_prompt_message(n: int, src: Path) -> str:
    return (f"--dev-holdout {n}: expected the last {n} records of {src} to hold a user turn to "
            "use as a development prompt, got none")


def holdout_problem(data: Path, n: int) -> str | None:
    """Why ``--dev-holdout n`` cannot be held out of the conversations file ``data``
    (:func:`read_records`): it cannot be read, it holds under 2 records, ``n`` is not below its
    record count, or its last ``n`` records hold no user turn (:func:`dev_prompts`). None when it
    can."""
    import tempfile

    try:
        lines = read_records(data)
    except ValueError as e:
        return str(e)
    if len(lines) < 2:
        return (f"--dev-holdout {n}: expected --data {data} to hold at least 2 records (one held "
                f"out, one to train on), got {len(lines)}")
    if n >= len(lines):
        return (f"--dev-holdout {n}: expected 1 to {len(lines) - 1} (the records of --data "
                f"{data} less one), got {n}")
    with tempfile.TemporaryDirectory() as tmp:
        if not dev_prompts(lines[-n:], Path(tmp)):
            return _no_prompt_message(n, data)
    return None


def split_dev_holdout(src: Path, n: int, pool: Path, dev: Path) -> dict:
    """Hold the last ``n`` records of the conversations file ``src`` (JSONL) out of every point:
    the other records go to ``pool`` as they are (the sweep's and the regeneration's data), and
    the first user turn of each held-out conversation to ``dev`` (a prompts file,
    ``{"id", "category": "sharegpt-dev", "text"}`` per line: ``train.dev_prompts_file``, the
    development set whose measured acceptance picks the checkpoints and draws the curves). A
    held-out record with no usable conversation or no user turn gives no prompt and is counted.
    Returns ``{"pool_records", "held_out_records", "dev_prompts", "no_prompt"}``. Raises
    ValueError naming the file when ``n`` is not below its record count."""
    lines = [ln for ln in src.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not 0 < n < len(lines):
        raise ValueError(f"--dev-holdout {n}: expected 1 to {len(lines) - 1} (the records of "
                         f"{src} less one), got {n}")
    pool.write_text("\n".join(lines[:-n]) + "\n", encoding="utf-8")
    prompts = dev_prompts(lines[-n:], dev.parent)
    if not prompts:
        raise ValueError(_no_prompt_message(n, src))
    dev.write_text("".join(json.dumps(p) + "\n" for p in prompts), encoding="utf-8")
    return {"pool_records": len(lines) - n, "held_out_records": n, "dev_prompts": len(prompts),
            "no_prompt": n - len(prompts)}


def config_path(a) -> Path:
    """The study's config: configs/smollm2-gpu.yaml, or tiny-random.yaml with ``--tiny``."""
    return REPO / "configs" / ("tiny-random.yaml" if a.tiny else "smollm2-gpu.yaml")


def do_data(a, work: Path) -> dict:
    """The data stage: ``--data`` as a plain JSONL file (else the prepared ShareGPT file); with
    ``--dev-holdout N`` its last N records are held out of every point
    (:func:`lab.study_inputs.split_dev_holdout`): ``dir`` is then the rest and
    ``dev_prompts_file`` the held-out conversations' first user turns, with the counts."""
    src = Path(data_file(a, work) if a.data else _cached_sharegpt(work))
    if not a.dev_holdout:
        return {"dir": str(src)}
    pool, dev = work / "train_pool.jsonl", work / "dev_prompts.jsonl"
    counts = split_dev_holdout(src, a.dev_holdout, pool, dev)
    log(f"data: {counts['held_out_records']} records held out of {src} as "
        f"{counts['dev_prompts']} development prompts ({dev})")
    return {"dir": str(pool), "dev_prompts_file": str(dev), "source": str(src), **counts}


def _cached_sharegpt(work: Path) -> str:
    from eagle3.assets import prepare_sharegpt
    from eagle3.config import PathsConfig

    return str(prepare_sharegpt(PathsConfig().resolved_cache_dir()))


def do_regen(a, base: list[str], out: Path) -> dict:
    from eagle3.config import load_config
    from eagle3.extract.regen import regenerate_file

    if a.regen_file:
        return reuse_regen(Path(a.regen_file), a.regen, out,
                           getattr(a, "regen_max_new_tokens", None),
                           getattr(a, "regen_rounds", None))
    rounds = "null" if a.regen_rounds == 0 else a.regen_rounds  # null: every assistant turn
    engine = getattr(a, "regen_engine", "hf")
    cfg = load_config(
        config_path(a),
        base + [f"data.num_conversations={a.regen}", f"data.regenerate={engine}",
                f"data.regenerate_max_rounds={rounds}"]
        + ([f"data.regenerate_max_new_tokens={cap}"]
           if (cap := getattr(a, "regen_max_new_tokens", None)) is not None else []),
    )
    if engine == "sglang":
        cfg = regen_server_config(cfg, a.device)
    m = regenerate_file(cfg, out, progress=not a.quiet)
    return {
        "path": str(out),
        **{k: m[k] for k in ("counts", "seconds", "answers_per_s", "settings")},
        "repetition": m.get("repetition"),
    }


REGEN_IN_FLIGHT = 1024  # one chunk's round (eagle3.extract.regen.RESUME_CHUNK) in one batch
REGEN_GRAPH_BS = 512  # CUDA graphs up to this decode batch: a 135M target is launch-bound


def regen_server_config(cfg, device: str):
    """``cfg`` for ``--regen-engine sglang``: on a GPU the serve section of
    configs/smollm2-gpu-sglang.yaml (the SGLang kit's interpreter and flags) with the GPU's memory
    for the target alone and CUDA graphs up to :data:`REGEN_GRAPH_BS`; on a CPU the config's own
    reference engine (the rehearsal). :data:`REGEN_IN_FLIGHT` requests in flight either way."""
    from eagle3.config import load_config

    data = cfg.data.model_copy(update={"regenerate_batch_size": REGEN_IN_FLIGHT})
    if device != "cuda":
        serve = cfg.serve.model_copy(update={"engine": "reference"})
    else:
        srv = load_config(REPO / "configs" / "smollm2-gpu-sglang.yaml").serve
        serve = srv.model_copy(update={"mem_fraction_static": 0.8,
                                       "cuda_graph_max_bs": REGEN_GRAPH_BS})
    return cfg.model_copy(update={"data": data, "serve": serve})


def resolve_plan(a, regen_file: str) -> dict:
    """The study's plan (``--plan``, else :data:`TINY_PLAN` with ``--tiny`` or :data:`PLAN`)
    with ``{regen}`` replaced by ``regen_file`` and size 0 by ``--all-size``. RuntimeError when
    a data variant reads the regenerated file and the regen stage has none."""
    plan = json.loads(Path(a.plan).read_text()) if a.plan else (TINY_PLAN if a.tiny else PLAN)
    needs = sorted(k for k, v in plan["data"].items() if any("{regen}" in o for o in v))
    if needs and not regen_file:
        raise RuntimeError(
            f"the plan's data variant(s) {', '.join(needs)} read the regenerated file, but the "
            f"regen stage has no result (see its failure above in results.json's 'failures')"
        )
    data = {k: [o.replace("{regen}", regen_file) for o in v] for k, v in plan["data"].items()}
    all_n = a.all_size
    points = [[d, (all_n if n == ALL else n), s] for d, n, s in plan["points"]]
    return {"data": data, "schedules": plan["schedules"], "points": points}


def rebuild_command(a, base: list[str], regen: dict | None, row: dict) -> str:
    """The ``eagle3 run`` command that trains a sweep point's draft again into its own run folder
    (the point's overrides as the sweep built them: :func:`flows.sweep._point_overrides`)."""
    import shlex

    from eagle3.config import load_config
    from flows.sweep import _point_overrides

    plan = resolve_plan(a, regen["path"] if regen else "")
    name = load_config(config_path(a), base).name
    ov = _point_overrides(base, name, plan["data"][row["data"]], int(row["data_size"]),
                          row["point"], plan["schedules"][row["schedule"]])
    return " ".join(["eagle3 run", str(config_path(a)), *(f"-o {shlex.quote(o)}" for o in ov)])


def raw_plan(a) -> dict:
    """The plan as given (``--plan``'s JSON, else the built-in one), ``{regen}`` unresolved.
    Raises ValueError when a key appears twice in one of its objects (:func:`check_plan` names
    the file first)."""
    if not a.plan:
        return TINY_PLAN if a.tiny else PLAN
    return json.loads(Path(a.plan).read_text(), object_pairs_hook=_unique_keys)
