"""Draft checkpoint → the serving engine's format (the pinned SGLang ``LlamaForCausalLMEagle3``).

Inputs: ``speculators`` (``speculators_model_type: "eagle3"``, nested ``transformer_layer_config``,
top-level aux ids as HF hidden_states indices, ``layers.{i}.*``); ``specforge``
(``architectures: ["LlamaForCausalLMEagle3"]``, ``midlayer.*`` or ``layers.0.*``, aux ids in
SGLang's ``eagle_config``); ``eagle`` (the EAGLE repo's ``pytorch_model.bin``, no embedding).

Conversion (docs/ENGINE_FACTS.md §2, §3): aux ids go to ``eagle_config`` as ``hf_id - 1``
(missing: the EAGLE-3 default rule, which needs the target); ``target_hidden_size``, RoPE and
``max_position_embeddings`` come from the target when given; ``tie_word_embeddings`` false,
``draft_vocab_size`` explicit; ``d2t``/``t2d`` kept; legacy names become ``layers.0.*`` /
``fc_norm.{i}``; a speculators layer ``i >= 1`` also gets its ``input_layernorm`` as
``hidden_norm`` (what SGLang's later layers read). Written atomically and validated before it is
published; SRC is only read.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import time
from pathlib import Path

import torch

from eagle3.artifacts import MANIFEST, atomic_directory, atomic_write_json, write_manifest
from eagle3.convert import checks, draft_checks
from eagle3.convert.checkpoint import Checkpoint, Problem, Target, cfg_get, read_checkpoint
from eagle3.convert.flag_checks import (WRITTEN_FLAGS, check_flag_types, check_recorded_flags,
                                        check_unknown_flags, trained_flag, unsupported_flags)
from eagle3.convert.validate import validate_report
from eagle3.engines.profile import EngineProfile
from eagle3.engines.registry import default_version, get_profile
from eagle3.errors import CheckpointInvalid, ConfigError, DataError, EngineUnsupported

FLAG_NAMES = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
              "embed_requires_grad")
LLAMA_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "num_hidden_layers", "hidden_act", "rms_norm_eps", "vocab_size",
              "bos_token_id", "eos_token_id", "pad_token_id", "attention_bias", "mlp_bias",
              "max_position_embeddings", "rope_theta", "rope_parameters", "rope_scaling",
              "initializer_range", "pretraining_tp")
ROPE_KEYS = ("rope_theta", "rope_parameters", "rope_scaling", "max_position_embeddings")
SGLANG_ARCH = "LlamaForCausalLMEagle3"
AUX_KEY = "eagle_aux_hidden_state_layer_ids"
log = logging.getLogger(__name__)


def detect_format(ck: Checkpoint) -> str:
    """``"speculators"`` | ``"specforge"`` | ``"eagle"``; else DataError naming what was seen."""
    cfg, names = ck.config, set(ck.tensors)
    kind = cfg.get("speculators_model_type")
    if kind == "eagle3":
        return "speculators"
    if kind is not None:
        raise EngineUnsupported(f"{ck.path}/config.json speculators_model_type: expected 'eagle3', "
                                f"got {kind!r}")
    has_mid = any(n.startswith("midlayer.") for n in names)
    if has_mid and all(f.suffix == ".bin" for f in ck.weight_files):
        return "eagle"
    if SGLANG_ARCH in (cfg.get("architectures") or []) or has_mid:
        return "specforge"
    raise DataError(f"{ck.path}: unknown draft format: expected speculators_model_type 'eagle3', "
                    f"architectures ['{SGLANG_ARCH}'] or midlayer.* tensors; got architectures "
                    f"{cfg.get('architectures')} and tensors {sorted(names)[:6]}…")


def _default_hf_ids(tcfg: dict | None, field: str) -> list[int]:
    if tcfg is None:
        raise ConfigError(f"{field}: missing in the draft config; give --target so the EAGLE-3 "
                          "default [2, L//2, L-3] can be written explicitly (got no target)")
    from eagle3.target_model import default_aux_layer_ids

    return default_aux_layer_ids(int(tcfg["num_hidden_layers"]))


def _apply_target(out: dict, tcfg: dict | None, fallback_hidden: int, src: Path,
                  target_dir: Path | None) -> tuple[list[str], dict, list[Problem]]:
    """target_hidden_size, RoPE and context from the target: the RoPE keys changed, the source
    values replaced (``{key: {"source", "target"}}``; RoPE keys only when the RoPE transformers 5
    builds differs) and a ``REPLACED_FROM_TARGET`` warning for each."""
    if tcfg is None:
        out["target_hidden_size"] = int(out.get("target_hidden_size") or fallback_hidden)
        return [], {}, []
    before = {k: out.get(k) for k in ROPE_KEYS + ("target_hidden_size",)}
    rope_before = draft_checks.effective_rope(out)
    for k in ROPE_KEYS:
        out.pop(k, None)
        if tcfg.get(k) is not None:
            out[k] = tcfg[k]
    out["target_hidden_size"] = int(tcfg["hidden_size"])
    keys = ["target_hidden_size", "max_position_embeddings"]
    if draft_checks.effective_rope(out) != rope_before:
        keys += [k for k in ROPE_KEYS if k != "max_position_embeddings"]
    replaced = {k: {"source": before[k], "target": out.get(k)} for k in keys
                if before[k] is not None and before[k] != out.get(k)}
    from_key = {"target_hidden_size": "hidden_size"}
    warnings = [Problem("REPLACED_FROM_TARGET", f"{src}/config.json {k}: the source states "
                        f"{json.dumps(v['source'], sort_keys=True)}, conversion wrote the "
                        f"target's {from_key.get(k, k)} {json.dumps(v['target'], sort_keys=True)} "
                        f"({target_dir}/config.json)") for k, v in replaced.items()]
    changed = [k for k in ROPE_KEYS if before.get(k) != out.get(k) and before.get(k) is not None]
    return changed, replaced, warnings


def _trained_aux_ids(ck: Checkpoint) -> list[int] | None:
    """The aux ids (HF indices) training recorded in SRC's ``manifest.json`` (kind
    ``draft_checkpoint``), else None. CheckpointInvalid ``AUX_IDS_INVALID`` / ``AUX_IDS_MISMATCH``
    for a value that is no list of integers / another convention."""
    man = ck.manifest or {}
    ids = man.get("aux_layer_ids")
    if man.get("kind") != "draft_checkpoint":
        return None
    _refuse([draft_checks.aux_ids_invalid(ids, "aux_layer_ids", f"{ck.path}/manifest.json")])
    if not ids:
        return None
    conv = man.get("layer_id_convention", "hf_hidden_states_index")
    if conv != "hf_hidden_states_index":
        _refuse([Problem("AUX_IDS_MISMATCH", f"{ck.path}/manifest.json layer_id_convention: "
                         f"expected 'hf_hidden_states_index', got {conv!r}")])
    return [int(i) for i in ids]


def _speculators_aux_ids(ck: Checkpoint, tcfg: dict | None) -> tuple[list[int], str]:
    """``(HF ids, where they came from)``: ``config.json``, else the training manifest, else the
    EAGLE-3 default rule; CheckpointInvalid ``AUX_IDS_MISMATCH`` when config and manifest
    disagree."""
    stated = ck.config.get(AUX_KEY)
    trained = _trained_aux_ids(ck)
    if stated and trained is not None and [int(i) for i in stated] != trained:
        _refuse([Problem("AUX_IDS_MISMATCH", f"{ck.path}/config.json {AUX_KEY}={list(stated)}: "
                         f"expected the ids the draft was trained on, {ck.path}/manifest.json "
                         f"aux_layer_ids={trained} (HF hidden_states indices)")])
    if stated:
        return [int(i) for i in stated], f"config.json {AUX_KEY}"
    if trained is not None:
        return trained, "manifest.json aux_layer_ids (training)"
    return _default_hf_ids(tcfg, AUX_KEY), "EAGLE-3 default rule for the target"


def _check_source(ck: Checkpoint, tcfg: dict | None, profile: EngineProfile) -> list[Problem]:
    """What the draft was trained with that the output would silently change: unknown flags, a
    sliding window, two RoPE thetas, a theta other than the target's (which conversion writes)."""
    where = f"{ck.path}/config.json"
    out = list(check_unknown_flags(ck.config, profile))
    out += draft_checks.check_sliding_window(ck.config, where)
    conflict = draft_checks.check_rope_conflict(ck.config, where)
    out += conflict
    trained = draft_checks.trained_theta(ck.config)
    if tcfg is not None and trained is not None and not conflict:
        t_key, t_theta = draft_checks.sglang_theta(tcfg)
        if t_theta != trained[1]:
            out.append(Problem("ROPE_TRAINED_MISMATCH", f"{where} {trained[0]}: the draft's "
                               f"attention was trained with theta {trained[1]:g}; expected the "
                               f"target's {t_key}={t_theta:g}, which conversion writes into the "
                               "served config (the engine would rotate with another theta than "
                               "the trained one): train the draft with the target's RoPE"))
    return out


def _refuse(problems: list[Problem | None]) -> None:
    """CheckpointInvalid listing ``problems`` (None entries left out), if any."""
    problems = [p for p in problems if p is not None]
    if problems:
        raise CheckpointInvalid("; ".join(map(str, problems)), problems)


@contextlib.contextmanager
def _also_refused(problems: list[Problem]):
    """Re-raise a CheckpointInvalid from the block with ``problems`` (SRC against its manifest)
    appended where it lacks them."""
    try:
        yield
    except CheckpointInvalid as e:
        extra = [p for p in problems if p not in (e.problems or [])]
        if not extra:
            raise
        raise CheckpointInvalid("; ".join([str(e)] + [str(p) for p in extra]),
                                list(e.problems or []) + extra) from e


def _from_speculators(ck: Checkpoint, profile: EngineProfile,
                      tcfg: dict | None) -> tuple[dict, dict, dict]:
    cfg = ck.config
    tl = cfg.get("transformer_layer_config")
    if not isinstance(tl, dict):
        raise DataError(f"{ck.path}/config.json transformer_layer_config: expected an object, got "
                        f"{tl!r}")
    if tl.get("model_type", "llama") != "llama":
        raise EngineUnsupported(f"{ck.path}/config.json transformer_layer_config.model_type: "
                                f"{profile.engine} {profile.version}'s {SGLANG_ARCH} computes a "
                                f"Llama layer, got {tl['model_type']!r}")
    flags = {k: trained_flag(cfg, k, f"{ck.path}/config.json") for k in FLAG_NAMES}
    _refuse(unsupported_flags(flags, profile, f"{ck.path}/config.json"))
    hf_ids, ids_from = _speculators_aux_ids(ck, tcfg)
    out = {k: tl[k] for k in LLAMA_KEYS if k in tl}
    out.update(architectures=[SGLANG_ARCH], model_type="llama", tie_word_embeddings=False,
               draft_vocab_size=int(cfg.get("draft_vocab_size") or tl["vocab_size"]))
    if cfg.get("target_hidden_size"):
        out["target_hidden_size"] = int(cfg["target_hidden_size"])
    tensors: dict[str, torch.Tensor] = {}
    renamed: dict[str, str] = {}
    for name, t in ck.tensors.items():
        if name.startswith("verifier_"):
            renamed[name] = "(dropped: training-only)"
            continue
        m = re.fullmatch(r"layers\.(\d+)\.input_layernorm\.weight", name)
        # SGLang's later layers read hidden_norm; input_layernorm kept (unused)
        if m and int(m.group(1)) >= 1:
            tensors[f"layers.{m.group(1)}.hidden_norm.weight"] = t
            renamed[name] = f"{name} + layers.{m.group(1)}.hidden_norm.weight (copy)"
        tensors[name] = t
    trained = {k: bool(v) for k, v in flags.items() if v is not None}
    trained.setdefault("norm_before_residual", False)  # speculators 0.9.0's default
    return out, tensors, {"hf_ids": list(hf_ids), "trained_flags": trained, "renamed": renamed,
                          "aux_ids_from": ids_from}


def _from_sglang_like(ck: Checkpoint, profile: EngineProfile,
                      tcfg: dict | None) -> tuple[dict, dict, dict]:
    cfg = dict(ck.config)
    eagle = dict(cfg.get("eagle_config") or {})
    engine_ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    hf_ids = profile.engine_to_hf_ids(engine_ids) if engine_ids else \
        _default_hf_ids(tcfg, "eagle_config.eagle_aux_hidden_state_layer_ids")
    # a flag nested under eagle_config counts where it is: SpecForge writes it there
    where = f"{ck.path}/config.json"
    flags = {name: bool(trained_flag(cfg, name, where)) for name in
             ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")}
    _refuse(unsupported_flags(flags, profile, where))
    tensors, renamed = {}, {}
    for name, t in ck.tensors.items():
        new = functools.reduce(lambda n, r: n.replace(*r), profile.legacy_renames, name)
        if new != name:
            renamed[name] = new
        tensors[new] = t
    head = tensors.get("lm_head.weight")
    if cfg.get("draft_vocab_size") is None and head is not None:
        cfg["draft_vocab_size"] = int(head.shape[0])
        renamed["config.draft_vocab_size"] = f"{cfg['draft_vocab_size']} (from lm_head.weight rows)"
    cfg.update(architectures=[SGLANG_ARCH], model_type="llama", tie_word_embeddings=False)
    cfg.pop("eagle_config", None)
    ids_from = ("config.json eagle_config.eagle_aux_hidden_state_layer_ids" if engine_ids
                else "EAGLE-3 default rule for the target")
    return cfg, tensors, {"hf_ids": list(hf_ids), "trained_flags": flags, "renamed": renamed,
                          "aux_ids_from": ids_from}


def _fold_rope_scaling(out: dict, src: Path, fmt: str, from_target: bool) -> list[Problem]:
    """Warning ``ROPE_SCALING_CONFLICT`` for a ``rope_scaling`` beside a ``rope_parameters`` it
    disagrees with (:func:`eagle3.convert.draft_checks.rope_scaling_conflict`). With a target its
    RoPE replaces both; without, ``out`` keeps only the ``rope_parameters`` transformers 5 builds
    (``rope_scaling`` wins)."""
    prefix = "transformer_layer_config." if fmt == "speculators" else ""
    what = draft_checks.rope_scaling_conflict(out, prefix)
    if what is None:
        return []
    if from_target:
        did = "conversion writes the target's RoPE keys instead of both"
    else:
        folded = draft_checks.effective_rope(out)
        out["rope_parameters"] = folded
        out.pop("rope_scaling", None)
        out.pop("rope_theta", None)
        did = (f"conversion writes rope_parameters={json.dumps(folded, sort_keys=True)} (the "
               "rope_scaling one, as transformers 5 builds it) and drops rope_scaling")
    return [Problem("ROPE_SCALING_CONFLICT", f"{src}/config.json: {what}; {did}")]


def _vocab_padded(src_manifest: dict) -> bool:
    """Training recorded an explicit pad decision (draft slots beyond the data's tokens)."""
    vocab = src_manifest.get("vocab") or {}
    n_data, size = vocab.get("num_from_data"), vocab.get("draft_vocab_size")
    return bool(src_manifest.get("vocab_padded")) or (
        isinstance(n_data, int) and isinstance(size, int) and n_data < size)


def _map_hash(tensors: dict[str, torch.Tensor], vocab: object) -> str | None:
    """The map hash validate compares (``VOCAB_MAP_CHANGED``), with the ``t2d`` ``d2t`` implies
    when none is stored; None when ``d2t`` is no valid offset map (validation then names it)."""
    from eagle3.convert.vocab_reading import offset_t2d
    from eagle3.train.vocab import vocab_map_hash

    d2t, t2d = tensors["d2t"], tensors.get("t2d")
    if t2d is None:
        if not isinstance(vocab, int) or d2t.dim() != 1 or d2t.is_floating_point():
            return None
        try:
            t2d = offset_t2d(d2t, vocab)
        except ValueError:
            return None
    return vocab_map_hash(d2t, t2d)


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, str(path),
              metadata={"format": "pt"})


def check_destination(src: Path, dst: Path) -> None:
    """ConfigError unless DST is absent, empty, or an earlier ``serving_checkpoint`` (replaced once
    the new one is complete), or when DST is equal to, inside or above SRC."""
    if src == dst or src in dst.parents:
        raise ConfigError(f"convert: DST {dst} must be outside SRC {src} (SRC is never modified)")
    if dst in src.parents:
        raise ConfigError(f"convert: DST {dst} contains SRC {src}; replacing it would delete SRC")
    if dst.exists() and not dst.is_dir():
        raise ConfigError(f"convert: DST {dst} is an existing file; expected a new or empty "
                          "directory")
    if dst.is_dir() and any(dst.iterdir()):
        try:
            kind = json.loads((dst / "manifest.json").read_text()).get("kind")
        except (OSError, ValueError, AttributeError):
            kind = None
        if kind != "serving_checkpoint":
            raise ConfigError(f"convert: DST {dst} is a non-empty directory that is not an earlier "
                              "serving checkpoint (manifest kind: expected 'serving_checkpoint', "
                              f"got {kind!r}); choose a new directory or empty it first")


def convert(src: Path, dst: Path, *, engine: str = "sglang", target_dir: Path | None = None,
            version: str | None = None, data_manifest: dict | None = None,
            aux_capture: bool = True, log_warnings: bool = True, data: Path | None = None) -> dict:
    """Convert the draft in ``src`` to ``engine``'s format in ``dst``; returns its manifest.

    Writes ``config.json``, ``model.safetensors`` and ``manifest.json`` (kind
    ``"serving_checkpoint"``: ``source_format``, ``aux_layer_ids_hf`` / ``_engine``,
    ``trained_flags``, ``vocab_map_hash``, ``renamed``, ``rope_from_target``,
    ``replaced_from_target``, ``vocab_padded``, ``aux_ids_from``, the source's
    ``data_manifest_hash``, ``data_content_hash``, ``target``, ``inputs.source`` (SRC's content
    hash computed here) and ``validation.warnings``, logged unless ``log_warnings`` is False).
    ``dst`` appears only if :func:`eagle3.convert.validate.validate_report` finds no problem in
    the written files (``aux_capture`` False leaves capture to the pre-flight); its warnings join
    ``validation.warnings``, each code once. ``data``: an extraction folder or conversations file
    (:func:`eagle3.convert.coverage.read_data`), instead of ``data_manifest``.

    Raises:
        ConfigError: ``src == dst``, a flag stated twice with two values, aux ids that need
            ``target_dir``.
        DataError: unreadable SRC or target. EngineUnsupported: unknown engine/format/layer type.
        CheckpointInvalid: validation failed (``.problems``); ``CONTENT_HASH_MISMATCH``,
            ``FLAG_MISMATCH`` (config vs its ``trained_flags``), ``FLAG_TYPE``,
            ``AUX_IDS_INVALID``, ``DUPLICATE_TENSOR``, ``TARGET_IS_DRAFT``, or what the output
            would drop or change (``UNSUPPORTED_FLAG``, ``UNKNOWN_FLAG``, ``SLIDING_WINDOW``,
            ``ROPE_CONFLICT``, ``ROPE_TRAINED_MISMATCH``, ``AUX_IDS_MISMATCH``).
    """
    src, dst = Path(src).resolve(), Path(dst).resolve()
    check_destination(src, dst)
    if engine != "sglang":
        raise EngineUnsupported(f"convert --to {engine}: only 'sglang' is a conversion target "
                                f"(vLLM serves the speculators format directly)")
    profile = get_profile(engine, version or default_version(engine))
    if data is not None and data_manifest is not None:
        raise ConfigError(f"convert: give data ({data}) or data_manifest, got both")
    counts = None
    if data is not None:
        from eagle3.convert.coverage import read_data

        data_manifest, counts, _ = read_data(data, target_dir)
    t0 = time.monotonic()
    ck = read_checkpoint(src)
    # provenance is the hash of what was read here, never the one SRC's manifest states
    source_hash = checks.source_content_hash(ck)
    hashed, hash_warnings = checks.check_content_hash(ck, source_hash)
    with _also_refused(hashed):
        # a tensor in two weight files: which copy is the trained one is unknown
        _refuse(ck.problems)
        where = f"{src}/config.json"
        # read by truthiness below, the string "false" would be written as true
        _refuse(check_flag_types(ck.config, profile, where))
        fmt = detect_format(ck)
        aux_key = AUX_KEY if fmt == "speculators" else f"eagle_config.{AUX_KEY}"
        # read as ids below, a string would become one id per character
        _refuse([draft_checks.aux_ids_invalid(cfg_get(ck.config, aux_key), aux_key, where)])
        target = Target.read(Path(target_dir)) if target_dir is not None else None
        if target is not None:
            _refuse(checks.check_target_is_draft(target, profile))
        tcfg = target.config if target is not None else None
        refused = _check_source(ck, tcfg, profile)  # the output would drop or change these
        if refused:
            raise CheckpointInvalid(f"{src}/config.json: conversion would drop or change what "
                                    "the draft was trained with: "
                                    + "; ".join(map(str, refused)), refused)
        warnings = hash_warnings + draft_checks.sliding_window_warnings(ck.config, where)
        build = _from_speculators if fmt == "speculators" else _from_sglang_like
        out_cfg, tensors, info = build(ck, profile, tcfg)
        warnings += _fold_rope_scaling(out_cfg, src, fmt, tcfg is not None)
        rope_changed, replaced, replaced_warnings = _apply_target(
            out_cfg, tcfg, int(out_cfg["hidden_size"]), src, target_dir)
        warnings += replaced_warnings
        # a source edited after its manifest was written: refused, never re-recorded
        _refuse(check_recorded_flags(ck, where) + hashed)
    for k in WRITTEN_FLAGS:
        out_cfg[k] = bool(info["trained_flags"].get(k, False))
    engine_ids = profile.hf_to_engine_ids(info["hf_ids"])
    out_cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": engine_ids,
                               "use_aux_hidden_state": True,
                               "norm_before_fc": out_cfg["norm_before_fc"]}
    floats = [t.dtype for t in tensors.values() if t.is_floating_point()]
    out_cfg["torch_dtype"] = str(floats[0]).replace("torch.", "") if floats else "float32"
    src_manifest = ck.manifest or {}
    extra = {"engine": engine, "engine_version": profile.version, "source_format": fmt,
             "aux_layer_ids_hf": info["hf_ids"], "layer_id_convention": "hf_hidden_states_index",
             "aux_layer_ids_engine": engine_ids,
             "trained_flags": info["trained_flags"], "renamed": info["renamed"],
             "rope_from_target": rope_changed, "replaced_from_target": replaced,
             "target": ({"path": str(target_dir)} if target_dir is not None
                        else src_manifest.get("target")),
             "data_manifest_hash": src_manifest.get("data_manifest_hash"),
             "data_content_hash": (src_manifest.get("inputs") or {}).get("hidden_states"),
             "vocab_padded": _vocab_padded(src_manifest), "aux_ids_from": info["aux_ids_from"]}
    if "d2t" in tensors:
        extra["vocab_map_hash"] = _map_hash(tensors, out_cfg.get("vocab_size"))
    with atomic_directory(dst) as tmp:
        _save_tensors(tensors, tmp / "model.safetensors")
        atomic_write_json(tmp / "config.json", out_cfg)
        manifest = write_manifest(
            tmp, "serving_checkpoint", config={"engine": engine, "engine_version": profile.version},
            inputs={"source": source_hash}, counts={"tensors": len(tensors)},
            timings={"convert_s": round(time.monotonic() - t0, 3)},
            validation={"engine": engine, "version": profile.version, "problems": 0,
                        "warnings": [str(w) for w in warnings],
                        "target_checked": target_dir is not None,
                        "data_checked": data_manifest is not None,
                        "aux_capture_checked": "here" if aux_capture and target_dir is not None else
                        "by the pre-flight of the deployment" if target_dir is not None else "no"},
            **extra)
        found = validate_report(tmp, target_dir=target_dir, engine=engine,
                                version=profile.version, data_manifest=data_manifest,
                                aux_capture=aux_capture, token_counts=counts)
        if found.problems:
            raise CheckpointInvalid(f"converted {src} ({fmt}) fails validation for {engine} "
                                    f"{profile.version}: " + "; ".join(map(str, found.problems)),
                                    found.problems)
        # the warnings `eagle3 validate DST --data` gives, each code once (a source warning
        # such as SLIDING_WINDOW names SRC's file and stands for the output's)
        codes = {w.code for w in warnings}
        added = [w for w in found.warnings if w.code not in codes]
        if added or found.figures:
            warnings += added
            manifest["validation"]["warnings"] = [str(w) for w in warnings]
            manifest["validation"]["figures"] = found.figures
            atomic_write_json(tmp / MANIFEST, manifest)  # outside the content hash
    for w in warnings if log_warnings else ():
        log.warning("convert %s: %s", src, w)
    return manifest
