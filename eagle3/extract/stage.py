"""Hidden-state extraction: conversations → the target's aux hidden states, speculators' offline
layout. ``extract(cfg, out_dir)`` reads ``cfg.target``, ``cfg.data``, ``cfg.extract`` and writes:

    out_dir/data/                  HF ``datasets`` folder (torch format), a row per sample in
                                   file-index order: ``input_ids`` [T] int64, ``loss_mask`` [T]
                                   int64 (1 = assistant token), ``seq_len`` int, ``id`` str
    out_dir/hidden_states/hs_{i}.safetensors
                                   row i (:mod:`eagle3.extract.store`); slot j < n_aux =
                                   HF ``hidden_states[aux_layer_ids[j]]``
    out_dir/token_freq.pt          ``{token_id: count}`` over loss-masked train tokens
    out_dir/online.json            ``extract.mode: online`` only (no ``hidden_states/``): what
                                   training needs to compute the states (:data:`ONLINE_FILE`)
    out_dir/.progress/             plan hash and one marker per committed shard (resume)
    out_dir/manifest.json          kind "hidden_states"

Manifest keys (stable; the trainer reads them): ``target`` {name, path, config_hash, weights_hash,
num_layers, hidden_size, vocab_size, architecture, dtype}, ``tokenizer_hash``,
``chat_template_hash``, ``template_switches``, ``aux_layer_ids`` (HF indices),
``layer_id_convention`` = ``"hf_hidden_states_index"``, ``num_slots`` (n_aux+1), ``dtype``,
``counts`` {samples, train_samples, val_samples, records, skipped, truncated, tokens, loss_tokens,
unique_tokens}, ``skipped_by_reason``, ``bytes``, ``bytes_per_token``, ``tokens_per_s``, ``splits``
{"train": [rows], "val": [rows]} (train rows first, so speculators' ``train_ratio`` split agrees),
``data_source`` {kind, path, sha256}, ``plan_hash``, ``resumed``, ``content_hash``,
``regeneration`` (None unless ``data.regenerate``; else :func:`regeneration_counts`).

Selection: records in a ``data.seed``-seeded order, the first ``data.num_conversations`` with a loss
token kept, cut to ``data.max_seq_len`` (counted as truncated); ``data.regenerate`` first replaces
assistant turns with the target's answers (:mod:`eagle3.extract.regen`). Free disk is checked first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections import Counter
from pathlib import Path

from eagle3.artifacts import (atomic_directory, atomic_write_bytes, output_intact, sha256_file,
                              weights_hash, write_manifest)
from eagle3.errors import ConfigError, DataError, EngineUnsupported
from eagle3.extract.plan import Plan, build_plan
from eagle3.extract.precheck import aux_ids
from eagle3.extract.store import (
    HS_DIR, ONLINE_FILE, PROGRESS_DIR, assign_shards, bytes_per_token, completed_shards,
    make_shards, remove_stale_temporaries, start_or_resume,
)
from eagle3.target_config import text_config

log = logging.getLogger(__name__)

LAYER_ID_CONVENTION = "hf_hidden_states_index"
DATA_OVERHEAD_BYTES_PER_TOKEN = 24  # data/ arrow columns (input_ids + loss_mask int64) + slack


def target_identity(target_dir: Path, cfg) -> dict:
    """Target facts for the manifest: name (the folder's name, e.g. ``smollm2-135m-instruct``),
    path, sha256 of config.json and of the weights, shape, architecture."""
    from transformers import AutoConfig

    from eagle3.target_model import num_layers

    conf = AutoConfig.from_pretrained(target_dir, trust_remote_code=cfg.target.trust_remote_code)
    text = text_config(conf)
    wh = weights_hash(target_dir)
    if wh is None:
        raise DataError(f"target {target_dir}: no *.safetensors weights found")
    return {"name": target_dir.name, "path": str(target_dir),
            "config_hash": sha256_file(target_dir / "config.json"), "weights_hash": wh,
            "num_layers": num_layers(conf), "hidden_size": int(text.hidden_size),
            "vocab_size": int(text.vocab_size),
            "architecture": (conf.architectures or [type(conf).__name__])[0],
            "dtype": cfg.target.dtype}


def estimate_bytes(num_tokens: int, n_slots: int, hidden_size: int, dtype: str) -> int:
    """Bytes an extraction of ``num_tokens`` tokens writes: sample files + the ``data/`` columns."""
    return num_tokens * (bytes_per_token(n_slots, hidden_size, dtype)
                         + DATA_OVERHEAD_BYTES_PER_TOKEN)


def _check_free_disk(out_dir: Path, need: int, free_bytes: int | None) -> None:
    probe = out_dir
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free if free_bytes is None else int(free_bytes)
    if need > free:
        raise DataError(f"{out_dir}: extraction needs about {need:,} bytes but only {free:,} bytes "
                        "are free; free space, lower data.num_conversations / data.max_seq_len, or "
                        "use extract.dtype=fp8")


def _plan_hash(plan: Plan, target: dict, aux: list[int], cfg) -> str:
    doc = {"ids": plan.ids, "input_ids": plan.input_ids, "loss_masks": plan.loss_masks,
           "num_train": plan.num_train, "weights": target["weights_hash"], "aux": aux,
           "model_dtype": cfg.target.dtype, "dtype": cfg.extract.dtype,
           "batch_size": cfg.extract.batch_size, "shard_size": cfg.extract.shard_size}
    if cfg.extract.mode != "offline":  # offline keeps the hash it had before modes existed
        # no shard is written: the shard size is hashed at its default (64), changing nothing;
        # the cached window is written to online.json, so a new size is a new plan
        doc.update(mode=cfg.extract.mode, shard_size=64)
        if cfg.extract.mode == "cached":
            doc["cache_max_bytes"] = cfg.extract.cache_max_bytes
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


def extract(cfg, out_dir: Path, *, progress: bool = True, free_bytes: int | None = None,
            warn: bool = True) -> dict:
    """Extract hidden states for ``cfg`` into ``out_dir`` (resuming its committed shards); returns
    the manifest. ``free_bytes`` overrides the measured free disk; ``warn`` False drops the
    warnings about the selected data (for a caller that has already given them). ConfigError (aux
    ids, devices), DataError (inputs, integrity, disk, a directory holding another extraction),
    EngineUnsupported (backend 'sglang' without a usable SGLang, or its engine failing)."""
    from transformers import AutoTokenizer

    from eagle3.assets import resolve_target
    from eagle3.precision import resolved

    t0 = time.perf_counter()
    cfg = resolved(cfg)  # every ``auto`` dtype concrete (load_config has done it already)
    out_dir = Path(out_dir)
    _check_backend(cfg)
    target_dir = resolve_target(cfg)
    target = target_identity(target_dir, cfg)
    aux = aux_ids(cfg, target["num_layers"])
    if cfg.extract.backend == "sglang":
        from eagle3.extract.sglang_backend import sglang_layer_ids

        sglang_layer_ids(aux + [target["num_layers"]], target["num_layers"])  # ConfigError now
    tok = AutoTokenizer.from_pretrained(target_dir, trust_remote_code=cfg.target.trust_remote_code)
    regen, caches = None, []
    if cfg.data.regenerate != "none":
        from eagle3.extract.regen import regenerate_for_plan

        def regen(convs):
            key = json.dumps([[c.id for c in convs], cfg.data.model_dump(mode="json"),
                              target["weights_hash"], cfg.target.dtype], sort_keys=True)
            key = hashlib.sha256(key.encode()).hexdigest()[:16]
            caches.append(out_dir / PROGRESS_DIR / f"regenerated-{key}.jsonl")
            return regenerate_for_plan(cfg, target_dir, tok, convs, caches[-1])
    plan = build_plan(cfg, tok, regen)
    regeneration = regeneration_counts(caches[-1]) if caches else None
    if cfg.data.on_short == "fail" and len(plan.ids) < cfg.data.num_conversations:
        raise DataError(f"DATA_SHORT: data.num_conversations={cfg.data.num_conversations} asked, "
                        f"{plan.source['path']} gives {len(plan.ids)} usable conversations "
                        f"({plan.records} records, skipped: {dict(plan.skipped)}); "
                        "data.on_short=fail stops before extraction (raise the data or lower "
                        "the size)")
    if warn:
        _warn_plan(cfg, plan)
    plan_hash = _plan_hash(plan, target, aux, cfg)
    damaged = False
    if (out_dir / "manifest.json").is_file():
        done = json.loads((out_dir / "manifest.json").read_text())
        if done.get("plan_hash") == plan_hash:
            intact, why = output_intact(out_dir)
            if intact:
                return done
            log.warning("%s; re-extracting the shards whose files are missing, of the wrong size "
                        "or rewritten", why)
            (out_dir / "manifest.json").unlink()
            damaged = True
    if cfg.extract.mode != "offline":
        return _prepare_online(cfg, out_dir, plan, plan_hash, target, aux, tok, t0,
                               regeneration)
    n_slots = len(aux) + 1
    shards = make_shards(len(plan.ids), cfg.extract.shard_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    resumed = (out_dir / PROGRESS_DIR / "plan.json").is_file()
    done = completed_shards(out_dir, shards, written_before_marker=damaged) if resumed else set()
    todo = [s for s in shards if s.index not in done]
    todo_tokens = sum(len(plan.input_ids[i]) for s in todo for i in range(s.start, s.stop))
    _check_free_disk(out_dir, estimate_bytes(todo_tokens, n_slots, target["hidden_size"],
                                             cfg.extract.dtype), free_bytes)
    start_or_resume(out_dir, plan_hash, {"num_samples": len(plan.ids), "num_shards": len(shards),
                                         "shard_size": cfg.extract.shard_size})
    remove_stale_temporaries(out_dir)
    t1 = time.perf_counter()
    _run_backend(cfg, target_dir, aux + [target["num_layers"]], plan, todo, out_dir, progress,
                 todo_tokens)
    t2 = time.perf_counter()
    _finalize_data(out_dir, plan)
    from eagle3.extract.alignment import check_alignment

    # HS_MISALIGNED before a manifest exists: a shifted store never reaches training
    alignment = check_alignment(out_dir, target_dir, [range(s.start, s.stop) for s in shards])
    hs_bytes = sum(p.stat().st_size for p in (out_dir / HS_DIR).glob("hs_*.safetensors"))
    counts = _counts(plan)
    extra = {**_manifest_facts(cfg, plan, plan_hash, target, aux, tok, regeneration),
             "resumed": resumed, "shards": {"total": len(shards), "resumed": len(done)},
             "alignment": alignment, "bytes": hs_bytes,
             "bytes_per_token": hs_bytes / max(1, counts["tokens"]),
             "tokens_per_s": todo_tokens / max(t2 - t1, 1e-9)}
    timings = {"prepare_s": t1 - t0, "extract_s": t2 - t1, "finalize_s": time.perf_counter() - t2}
    return _manifest(out_dir, cfg, target, plan, counts, timings, extra)


def _warn_plan(cfg, plan: Plan) -> None:
    """Warn about records skipped, samples truncated, unstable templates and a short source."""
    src, skipped = plan.source["path"], sum(plan.skipped.values())
    if plan.skipped or plan.truncated:
        log.warning("%s: %d of %d records skipped %s%s; %d of %d samples truncated to "
                    "data.max_seq_len=%d", src, skipped, plan.records, dict(plan.skipped),
                    f" (e.g. {plan.skip_examples[:3]})" if plan.skip_examples else "",
                    plan.truncated, len(plan.ids), cfg.data.max_seq_len)
    warn_unstable(plan.unstable, src)
    if len(plan.ids) < cfg.data.num_conversations:
        log.warning("DATA_SHORT: data.num_conversations=%d asked, %s gives %d usable "
                    "conversations (%d records, %d skipped: %s): the extraction holds %d",
                    cfg.data.num_conversations, src, len(plan.ids), plan.records, skipped,
                    dict(plan.skipped), len(plan.ids))


def _manifest_facts(cfg, plan: Plan, plan_hash: str, target: dict, aux: list[int], tok,
                    regeneration: dict | None) -> dict:
    """The manifest keys both modes write."""
    from eagle3.extract.conversations import template_hash, template_switches, tokenizer_hash

    return {"target": target, "tokenizer_hash": tokenizer_hash(tok),
            "chat_template_hash": template_hash(tok),
            "template_switches": template_switches(tok, cfg.data.chat_template_kwargs),
            "aux_layer_ids": aux, "layer_id_convention": LAYER_ID_CONVENTION,
            "num_slots": len(aux) + 1, "dtype": cfg.extract.dtype,
            "model_dtype": cfg.target.dtype, "auto_resolved": cfg.auto_resolved,
            "splits": {"train": list(range(plan.num_train)),
                       "val": list(range(plan.num_train, len(plan.ids)))},
            "data_source": plan.source, "regenerated": cfg.data.regenerate,
            "plan_hash": plan_hash, "skipped_by_reason": dict(plan.skipped),
            "skipped_examples": plan.skip_examples, "template_unstable": plan.unstable,
            "regeneration": regeneration}


def regeneration_counts(cache: Path) -> dict:
    """The counts of the regeneration cached in ``cache`` (``.progress/regenerated-<key>.jsonl``)
    as written beside it (:func:`eagle3.extract.regen.counts_path`):
    :func:`eagle3.extract.regen.regenerate_counted`'s counts plus ``settings``. A missing or
    unreadable counts file gives ``{"counts": "missing", "why": ...}`` with a warning."""
    from eagle3.extract.regen import counts_path

    path = counts_path(cache)
    try:
        counts = json.loads(path.read_text())
        if isinstance(counts, dict):
            return counts
        why = f"{path}: expected a JSON object, got {type(counts).__name__}"
    except (OSError, json.JSONDecodeError) as e:
        why = f"{path}: {e}"
    log.warning("regeneration counts not recorded in the manifest: %s (the regenerated "
                "conversations in %s are used)", why, cache)
    return {"counts": "missing", "why": why}


def _prepare_online(cfg, out_dir: Path, plan: Plan, plan_hash: str, target: dict,
                    aux: list[int], tok, t0: float, regeneration: dict | None) -> dict:
    """``extract.mode: online`` (or ``cached``): ``data/``, ``token_freq.pt``, :data:`ONLINE_FILE`
    and the manifest, no hidden states (training computes them: :mod:`eagle3.train.online`). The
    manifest has ``mode``, ``folded_into`` "train", ``bytes`` 0 and ``offline_bytes_estimate``
    (tokens x (n_aux+1) x hidden size x dtype bytes, + token ids); ``cached`` adds
    ``cache_max_bytes`` to :data:`ONLINE_FILE`. A folder holding another extraction raises the
    DataError naming both plan hashes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    mode = cfg.extract.mode
    if cfg.extract.device != "auto" and cfg.data.regenerate == "none":
        log.warning("extract.device=%s is not used with extract.mode=%s and data.regenerate none: "
                    "the target runs on the training device(s) (train.device, train.num_gpus)",
                    cfg.extract.device, mode)
    start_or_resume(out_dir, plan_hash, {"num_samples": len(plan.ids), "mode": mode})
    hs_dir = out_dir / HS_DIR
    if hs_dir.is_dir() and not any(hs_dir.iterdir()):
        hs_dir.rmdir()
    t1 = time.perf_counter()
    _finalize_data(out_dir, plan)
    online = {"mode": mode, "plan_hash": plan_hash, "aux_layer_ids": aux,
              "capture_ids": aux + [target["num_layers"]], "dtype": cfg.extract.dtype,
              "model_dtype": cfg.target.dtype, "batch_size": cfg.extract.batch_size,
              "target_weights_hash": target["weights_hash"]}
    if mode == "cached":
        online["cache_max_bytes"] = cfg.extract.cache_max_bytes
    atomic_write_bytes(out_dir / ONLINE_FILE, (json.dumps(online, indent=1) + "\n").encode())
    counts = _counts(plan)
    per_token = bytes_per_token(len(aux) + 1, target["hidden_size"], cfg.extract.dtype)
    extra = {**_manifest_facts(cfg, plan, plan_hash, target, aux, tok, regeneration),
             "mode": mode, "folded_into": "train", "online": online,
             "alignment": {"checked": False, "why": f"extract.mode={mode}: the states are "
                           "computed from these tokens in training, not stored here"},
             "bytes": 0, "bytes_per_token": 0.0, "tokens_per_s": None,
             "offline_bytes_estimate": counts["tokens"] * per_token}
    # no extract_s: no state is computed here (training times its target forwards)
    timings = {"prepare_s": t1 - t0, "finalize_s": time.perf_counter() - t1}
    return _manifest(out_dir, cfg, target, plan, counts, timings, extra)


def _manifest(out_dir: Path, cfg, target: dict, plan, counts: dict, timings: dict,
              extra: dict) -> dict:
    """The extraction manifest; inputs: the target's weights hash and the data file's sha256."""
    return write_manifest(out_dir, "hidden_states",
                          config={"data": cfg.data.model_dump(mode="json"),
                                  "extract": cfg.extract.model_dump(mode="json")},
                          inputs={"target_weights": target["weights_hash"],
                                  "data": plan.source["sha256"]},
                          counts=counts, timings=timings, **extra)


def warn_unstable(unstable: dict, source: str) -> None:
    """Warn with the conversations and tokens dropped because the chat template is not
    prefix-stable (``Plan.unstable``), if any."""
    if unstable.get("conversations"):
        log.warning("%s: %d of %d conversations (%.1f%%) and %d of %d tokens (%.1f%%) dropped: the "
                    "chat template renders an earlier assistant turn differently once later turns "
                    "follow, so no loss mask can be derived (refused above "
                    "data.max_unstable_template_share=%s)", source, unstable["conversations"],
                    unstable["tried"], 100 * unstable["share_conversations"], unstable["tokens"],
                    unstable["tried_tokens"], 100 * unstable["share_tokens"], unstable["threshold"])


def _check_backend(cfg) -> None:
    """For ``extract.backend='sglang'``: SGLang's Python can import sglang, and one worker is asked
    for (SGLang parallelises itself: ``tp_size``/``dp_size`` in ``extract.sglang_engine_args``)."""
    if cfg.extract.backend == "hf":
        return
    if cfg.extract.mode != "offline":  # refused at load (config_checks: MODE_BACKEND)
        raise ConfigError(f"MODE_BACKEND: extract.backend: expected 'hf' with extract.mode="
                          f"{cfg.extract.mode}, got {cfg.extract.backend!r}")
    from eagle3.engines.sglang.environment import (sglang_installed, sglang_python,
                                                   sglang_unusable_reason)
    from eagle3.engines.sglang.profile import RELEASES

    version = cfg.convert.engine_version
    able = sorted(v for v, r in RELEASES.items() if r["return_aux_flag"])
    if RELEASES[version]["return_aux_flag"] is None:
        raise EngineUnsupported(f"extract.backend='sglang' with convert.engine_version {version}: "
                                f"SGLang {version} cannot return the target's aux hidden states "
                                "without a draft (no --enable-return-aux-hidden-states); expected "
                                f"a release that can ({able}) or extract.backend=hf")

    if cfg.extract.num_gpus != 1:
        raise ConfigError("extract.num_gpus: expected 1 with extract.backend='sglang' (set "
                          "tp_size/dp_size in extract.sglang_engine_args instead), got "
                          f"{cfg.extract.num_gpus}")
    if not sglang_installed(sglang_python(cfg)):
        from eagle3.engines.sglang.environment import install_advice

        raise EngineUnsupported("extract.backend='sglang': serve.sglang_python: "
                                f"{sglang_unusable_reason(sglang_python(cfg))}; expected the "
                                f"Python of an environment with sglang=={version} (fix: "
                                f"{install_advice(version)}), or use extract.backend=hf")


def _counts(plan: Plan) -> dict:
    masked = [t for ids, m in zip(plan.input_ids, plan.loss_masks) for t, k in zip(ids, m) if k]
    return {"samples": len(plan.ids), "train_samples": plan.num_train,
            "val_samples": len(plan.ids) - plan.num_train, "records": plan.records,
            "skipped": sum(plan.skipped.values()), "truncated": plan.truncated,
            "tokens": plan.num_tokens, "loss_tokens": len(masked),
            "unique_tokens": len(set(masked))}


def _run_backend(cfg, target_dir: Path, capture_ids: list[int], plan: Plan, todo, out_dir: Path,
                 progress: bool, todo_tokens: int) -> None:
    import os

    from tqdm.auto import tqdm

    from eagle3.extract.hf_backend import WorkerJob, resolve_devices, run_shards
    from eagle3.extract.workers import run_data_parallel

    status_dir = out_dir / PROGRESS_DIR / "workers"
    shutil.rmtree(status_dir, ignore_errors=True)  # an earlier failed run's worker files
    if not todo:
        return
    devices = resolve_devices(cfg.extract.device, cfg.extract.num_gpus)
    cpu_workers = sum(d == "cpu" for d in devices)
    threads = max(1, (os.cpu_count() or 1) // cpu_workers) if cpu_workers > 1 else None
    jobs = [WorkerJob(str(target_dir), cfg.target.dtype, dev, capture_ids, cfg.extract.dtype,
                      cfg.extract.batch_size, str(out_dir), plan.ids, plan.input_ids,
                      plan.loss_masks, mine, threads, cfg.target.trust_remote_code)
            for dev, mine in zip(devices, assign_shards(todo, len(devices)))]
    jobs = [j for j in jobs if j.shards]
    with tqdm(total=todo_tokens, unit="tok", unit_scale=True, desc="extract", disable=not progress,
              dynamic_ncols=True) as bar:
        if cfg.extract.backend == "sglang":
            from eagle3.extract.sglang_backend import run_sglang_shards

            run_sglang_shards(cfg, target_dir, capture_ids, capture_ids[-1], plan.ids,
                              plan.input_ids, plan.loss_masks, todo, out_dir,
                              on_progress=bar.update)
            return
        if len(jobs) == 1:
            run_shards(jobs[0], on_progress=bar.update)
            return
        seen: set[int] = set()

        def poll() -> None:
            for s in todo:
                marker = out_dir / PROGRESS_DIR / f"shard_{s.index}.json"
                if s.index not in seen and marker.is_file():
                    seen.add(s.index)
                    bar.update(sum(len(plan.input_ids[i]) for i in range(s.start, s.stop)))

        run_data_parallel(jobs, poll, status_dir=status_dir,
                          startup_s=cfg.extract.startup_timeout_s,
                          stall_s=cfg.extract.stall_timeout_s)


def _finalize_data(out_dir: Path, plan: Plan) -> None:
    """Write ``data/`` (HF datasets, torch format) and ``token_freq.pt`` atomically."""
    import io

    import datasets
    import torch

    i64 = datasets.Value("int64")
    ds = datasets.Dataset.from_dict(
        {"input_ids": plan.input_ids, "loss_mask": plan.loss_masks,
         "seq_len": [len(x) for x in plan.input_ids], "id": plan.ids},
        features=datasets.Features({"input_ids": datasets.Sequence(i64),
                                    "loss_mask": datasets.Sequence(i64), "seq_len": i64,
                                    "id": datasets.Value("string")}))
    ds.set_format("torch", columns=["input_ids", "loss_mask", "seq_len"], output_all_columns=True)
    was = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        with atomic_directory(out_dir / "data") as tmp:
            ds.save_to_disk(str(tmp))
    finally:
        if was:
            datasets.enable_progress_bars()
    train = zip(plan.input_ids[:plan.num_train], plan.loss_masks[:plan.num_train])
    freq = Counter(t for ids, m in train for t, k in zip(ids, m) if k)
    buf = io.BytesIO()
    torch.save({int(t): int(c) for t, c in sorted(freq.items())}, buf)
    atomic_write_bytes(out_dir / "token_freq.pt", buf.getvalue())
