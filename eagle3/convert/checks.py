"""The checks behind :func:`eagle3.convert.validate.validate_report`, each returning Problems that
name the key, tensor or field with the expected and actual value."""

from __future__ import annotations

import functools
import json

import torch

from eagle3.convert.checkpoint import VOCAB_SIDE_FILES, Checkpoint, Problem, Target, cfg_get
from eagle3.convert.draft_checks import aux_ids_invalid
from eagle3.convert.vocab_reading import offset_t2d, vocab_map_problems
from eagle3.engines.profile import EngineProfile
from eagle3.engines.sglang.draft_load import rope_parameters
from eagle3.errors import ConfigError

# Keys only a draft's config states: SGLang's LlamaForCausalLMEagle3 reads them, speculators
# writes them, no verifier model defines them.
DRAFT_ONLY_KEYS = ("eagle_config", "speculators_model_type", "draft_vocab_size",
                   "target_hidden_size", "eagle_aux_hidden_state_layer_ids")


def source_content_hash(ck: Checkpoint) -> str:
    """The content hash of the draft's files now, as :func:`eagle3.artifacts.write_manifest`
    computes it (skipping the ``manifest.json`` ``files.exclude`` names, else the manifest)."""
    from eagle3.artifacts import MANIFEST, content_hash

    files = (ck.manifest or {}).get("files")
    exclude = files.get("exclude") if isinstance(files, dict) else None
    ok = isinstance(exclude, list) and all(isinstance(x, str) for x in exclude)
    return content_hash(ck.path, exclude=tuple(exclude) if ok else (MANIFEST,))


def check_content_hash(ck: Checkpoint, actual: str | None = None
                       ) -> tuple[list[Problem], list[Problem]]:
    """``(problems, warnings)`` of the draft's files against its ``manifest.json``
    ``content_hash`` (``actual``: :func:`source_content_hash`, computed when None).
    ``CONTENT_HASH_MISMATCH`` when they differ; warning ``CONTENT_UNCHECKED`` for a manifest
    without one; nothing without a manifest."""
    from eagle3.artifacts import MANIFEST

    man = ck.manifest
    if man is None:
        return [], []
    where = f"{ck.path}/{MANIFEST}"
    recorded = man.get("content_hash")
    if recorded is None:
        return [], [Problem("CONTENT_UNCHECKED", f"{where}: expected a content_hash to compare the "
                            "weights and config with, got none: their integrity is not checked")]
    actual = source_content_hash(ck) if actual is None else actual
    if actual == recorded:
        return [], []
    after = ("after conversion" if man.get("kind") == "serving_checkpoint"
             else "after the manifest was written")
    return [Problem("CONTENT_HASH_MISMATCH", f"{where} content_hash: expected {recorded}, got "
                    f"{actual} (the weights or config changed {after})")], []


def target_draft_signs(raw: dict, profile: EngineProfile) -> list[str]:
    """What in a target folder's whole ``config.json`` ``raw`` says it is an EAGLE-3 draft (a
    ``profile.draft_architectures`` class, :data:`DRAFT_ONLY_KEYS`), each as ``key value``."""
    archs = raw.get("architectures")
    archs = archs if isinstance(archs, list) else []
    keys = [f"{k} {{...}}" if isinstance(raw[k], dict) else f"{k} {raw[k]!r}"
            for k in DRAFT_ONLY_KEYS if raw.get(k) is not None]
    if keys or any(a in profile.draft_architectures for a in archs):
        return [f"architectures {archs}"] + keys
    return []


def check_target_is_draft(target: Target, profile: EngineProfile) -> list[Problem]:
    """``TARGET_IS_DRAFT`` when the folder given as the target holds an EAGLE-3 draft
    (:func:`target_draft_signs`): every target check would compare the draft with itself."""
    signs = target_draft_signs(target.raw, profile)
    if not signs:
        return []
    return [Problem("TARGET_IS_DRAFT", f"--target {target.path}: expected the target (verifier) "
                    f"model folder, got an EAGLE-3 draft ({', '.join(signs)}); give the folder of "
                    "the model the draft was trained for")]


def check_architecture(ck: Checkpoint, profile: EngineProfile) -> list[Problem]:
    """Class 22: the config names an EAGLE-3 draft class *first*: engines build the first entry
    they support (SGLang ``models/registry.py`` ``resolve_model_cls``)."""
    archs = ck.config.get("architectures") or []
    drafts = list(profile.draft_architectures)
    first = next((i for i, a in enumerate(archs) if a in drafts), None)
    if first == 0:
        return []
    if first is not None:
        return [Problem("ARCHITECTURE", "config.json architectures: expected the draft class "
                        f"first ({drafts}), got {archs}: {profile.engine} {profile.version} builds "
                        f"the first entry it supports, so {archs[:first]} would be built instead "
                        f"of {archs[first]}")]
    hint = " (a speculators-format draft: run `eagle3 convert SRC DST --to sglang` first)" \
        if ck.config.get("speculators_model_type") else ""
    return [Problem("ARCHITECTURE", f"config.json architectures: expected one of {drafts} "
                                    f"for {profile.engine} {profile.version}, got {archs}{hint}")]


def _fc_source(param: str, ck: Checkpoint, profile: EngineProfile) -> str:
    """For ``fc``: the config keys its input width comes from (SGLang: ``num_aux_hidden_states``,
    else the aux ids' count, else 3)."""
    if param.split(".")[-2:] != ["fc", "weight"]:
        return ""
    n = ck.config.get("num_aux_hidden_states")
    if isinstance(n, int):
        return f" (num_aux_hidden_states={n})"
    ids = cfg_get(ck.config, profile.aux_ids_key)
    if ids:
        return f" ({len(ids)} aux states from {profile.aux_ids_key}={ids})"
    return f" (no {profile.aux_ids_key}: the engine assumes 3 aux states)"


def check_tensors(ck: Checkpoint, profile: EngineProfile) -> list[Problem]:
    """Classes 1-3: replay the engine's loader over the tensor names and the config's shapes."""
    try:
        params = profile.engine_params(ck.config)
    except (ConfigError, KeyError, TypeError, ValueError) as e:
        return [Problem("CONFIG_FIELD", "config.json: cannot derive the engine's parameters "
                                        f"({e})")]
    out: list[Problem] = []
    filled: dict[tuple, str] = {}
    for name, tensor in sorted(ck.tensors.items()):
        r = profile.route(name, params)
        if r.kind == "unknown":
            how = ("skipped without any message" if profile.unknown_tensor == "skip"
                   else "a load error")
            out.append(Problem("UNKNOWN_TENSOR", f"tensor {name!r} (loader name {r.renamed!r}) "
                               f"matches no parameter of {profile.engine} {profile.version}'s "
                               f"{profile.draft_architectures[0]}: {how}"))
        if r.kind != "param":
            continue
        spec, key = params[r.param], (r.param, r.shard)
        want = spec.shards.get(r.shard) if spec.shards else spec.shape
        if key in filled:
            out.append(Problem("DUPLICATE_TENSOR", f"tensor {name!r} fills {r.param}"
                               f"{'' if r.shard is None else f' shard {r.shard!r}'} already filled "
                               f"by {filled[key]!r}: expected one tensor, got two"))
        filled[key] = name
        if want is not None and tuple(tensor.shape) != tuple(want):
            out.append(Problem("SHAPE_MISMATCH", f"tensor {name!r} → {r.param}"
                               f"{'' if r.shard is None else f'[{r.shard}]'}: expected shape "
                               f"{list(want)} from config.json{_fc_source(r.param, ck, profile)}"
                               f", got {list(tensor.shape)}"))
    for pname, spec in params.items():
        missing = [s for s in (list(spec.shards) if spec.shards else [None])
                   if (pname, s) not in filled]
        if missing and not (spec.runtime_source or spec.unused):
            part = "" if missing == [None] else f" (shards {missing})"
            out.append(Problem("MISSING_TENSOR", f"parameter {pname}{part}: expected a checkpoint "
                               f"tensor, found none; {profile.engine} {profile.version} would "
                               "keep its random init"))
    return out


def check_values(ck: Checkpoint) -> list[Problem]:
    """Class 4: NaN/Inf and all-zero float tensors."""
    out: list[Problem] = []
    for name, t in sorted(ck.tensors.items()):
        if not t.is_floating_point() or t.numel() == 0:
            continue
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            out.append(Problem("NAN_INF", f"tensor {name!r}: expected finite values, got {bad} "
                                          f"NaN/Inf of {t.numel()}"))
        elif not bool(t.any()):
            out.append(Problem("ALL_ZERO", f"tensor {name!r}: expected trained values, got all "
                                           f"{t.numel()} zeros"))
    return out


def check_embedding(ck: Checkpoint, target: Target | None) -> list[Problem]:
    """Class 4: the engine uses the target's embedding (``set_embed``, docs/ENGINE_FACTS.md L10):
    EMBED_MISMATCH when the draft's differs; EMBED_UNCHECKED when the target's is not found."""
    emb = ck.tensors.get("embed_tokens.weight", ck.tensors.get("model.embed_tokens.weight"))
    if target is None or emb is None:
        return []
    ref = target.embed()
    if ref is None:
        return [Problem("EMBED_UNCHECKED", "embed_tokens.weight: expected the target's embedding "
                        f"to compare with ({target.path}: {target.embed_searched}), found none")]
    if tuple(ref.shape) != tuple(emb.shape):
        return [Problem("EMBED_MISMATCH", f"embed_tokens.weight: expected the target's shape "
                        f"{list(ref.shape)}, got {list(emb.shape)}")]
    diff = float((emb.float() - ref.float()).abs().max())
    tol = 1e-2 * float(ref.float().abs().max()) + 1e-6  # bf16 rounding of the target's weights
    if diff > tol:
        return [Problem("EMBED_MISMATCH", f"embed_tokens.weight: expected the target's embedding "
                        f"({target.path}), the engine serves with it; got max |diff| {diff:.4g} > "
                        f"{tol:.3g} (re-initialised or trained embedding)")]
    return []


def check_vocab_map(ck: Checkpoint, profile: EngineProfile) -> list[Problem]:
    """Classes 6, 7, 9: presence of d2t when the draft vocabulary is smaller, map invariants
    (``VOCAB_MAP_INVALID``; ``VOCAB_MAP_ABSOLUTE`` for target ids stored instead of offsets), map
    hash."""
    cfg, t = ck.config, ck.tensors
    vocab, dv = cfg.get("vocab_size"), cfg.get("draft_vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool):
        return [Problem("CONFIG_FIELD", "config.json vocab_size: expected an integer, got "
                                        f"{vocab!r}")]
    if dv is None:
        head = t.get("lm_head.weight")
        if head is not None and not cfg.get("tie_word_embeddings"):
            return [Problem("CONFIG_FIELD", "config.json draft_vocab_size: expected "
                            f"{head.shape[0]} (lm_head rows), got none: {profile.engine} "
                            f"{profile.version} then assumes vocab_size={vocab} and replaces the "
                            "draft's lm_head by the target's (load_lm_head_from_target)")]
        dv = vocab
    # the loader matches by substring
    d2t = next((v for k, v in sorted(t.items()) if "d2t" in k), None)
    t2d = next((v for k, v in sorted(t.items()) if "t2d" in k), None)
    if d2t is None:
        if dv < vocab:
            side = sorted(p.name for g in VOCAB_SIDE_FILES for p in ck.path.glob(g))
            where = f"; side files {side} are not read by the engine" if side else ""
            return [Problem("VOCAB_MAP_MISSING", f"d2t: draft_vocab_size {dv} < vocab_size {vocab} "
                            f"needs a d2t tensor in the weights, found none{where}: the engine "
                            "would use the identity map")]
        return []
    out = vocab_map_problems(d2t, t2d, dv, vocab)
    recorded = (ck.manifest or {}).get("vocab_map_hash")
    if recorded and not out:
        from eagle3.train.vocab import vocab_map_hash

        # without a t2d, the one training builds from d2t (the map is valid here)
        mask = t2d if t2d is not None else offset_t2d(d2t, vocab)
        what = "d2t/t2d" if t2d is not None else "d2t (no t2d: hashed with the t2d it implies)"
        actual = vocab_map_hash(d2t, mask)
        if actual != recorded:
            out.append(Problem("VOCAB_MAP_CHANGED", f"{what}: manifest.json vocab_map_hash "
                               f"expected {recorded[:12]}..., got {actual[:12]}... (map "
                               "regenerated: lm_head rows now mean other tokens)"))
    return out


def check_aux_ids(ck: Checkpoint, profile: EngineProfile, target: Target | None,
                  data: dict | None) -> list[Problem]:
    """Class 10: aux ids present where the engine reads them, a list of integers, right count,
    order, range and convention."""
    cfg, out, key = ck.config, [], profile.aux_ids_key
    if cfg_get(cfg, "eagle_config.use_aux_hidden_state", True) is False:
        out.append(Problem("AUX_DISABLED", "eagle_config.use_aux_hidden_state: expected true (else "
                           "the target captures no aux states and fc is bypassed), got false"))
    ids = cfg_get(cfg, key)
    if not ids:
        top_key = "eagle_aux_hidden_state_layer_ids"
        top = cfg.get(top_key) if key != top_key else None
        extra = f"; top-level {top_key}={top} is not read by {profile.engine}" if top else ""
        return out + [Problem("AUX_IDS_MISSING", f"{key}: expected the draft's aux layer ids, got "
                              f"{ids!r}: {profile.engine} {profile.version} falls back to "
                              f"{profile.aux_default_rule}{extra}")]
    bad_type = aux_ids_invalid(ids, key, f"{ck.path}/config.json")
    if bad_type is not None:
        return out + [bad_type]
    if any(b <= a for a, b in zip(ids, ids[1:])):
        out.append(Problem("AUX_IDS_ORDER", f"{key}: expected strictly increasing ids (the engine "
                           f"captures in layer order and drops repeats), got {ids}"))
    fc = ck.tensors.get("fc.weight", ck.tensors.get("model.fc.weight"))
    t_hidden = cfg.get("target_hidden_size") or cfg.get("hidden_size")
    n_cfg = cfg.get("num_aux_hidden_states")
    n_cfg = int(n_cfg) if isinstance(n_cfg, int) else None
    if n_cfg is not None and n_cfg != len(ids):
        out.append(Problem("AUX_IDS_COUNT", f"num_aux_hidden_states {n_cfg}: expected "
                           f"len({key}) = {len(ids)}, got {n_cfg}"))
    if (fc is not None and fc.dim() == 2 and isinstance(t_hidden, int)
            and fc.shape[1] != len(ids) * t_hidden):
        out.append(Problem("AUX_IDS_COUNT", f"fc.weight vs {key}={ids}: expected {len(ids)} aux "
                           f"ids x target hidden {t_hidden} = {len(ids) * t_hidden} input columns, "
                           f"got {fc.shape[1]} ({fc.shape[1] / t_hidden:g} aux states)"))
    hf = profile.engine_to_hf_ids(ids)
    n_layers = target.config.get("num_hidden_layers") if target is not None else None
    bad = [h for h in hf if not 1 <= h <= n_layers - 1] if isinstance(n_layers, int) else []
    if bad:
        out.append(Problem("AUX_IDS_RANGE", f"{key}={ids}: HF indices {hf} expected in "
                           f"{profile.aux_capture_hf_range} = [1, {n_layers - 1}] for a target of "
                           f"{n_layers} layers, got {bad} out of range"))
    for where, want in (("manifest.json aux_layer_ids_hf",
                         (ck.manifest or {}).get("aux_layer_ids_hf")),
                        ("extraction manifest aux_layer_ids", (data or {}).get("aux_layer_ids"))):
        if want is not None and list(want) != hf:
            out.append(Problem("AUX_IDS_MISMATCH", f"{key}={ids} means HF indices {hf} in "
                               f"{profile.engine} ({profile.aux_ids_convention}); {where} expected "
                               f"{list(want)} (= {key} {profile.hf_to_engine_ids(list(want))})"))
    return out


def _rope(cfg: dict) -> tuple:
    """``(theta, scaling JSON)`` of the RoPE transformers 5 builds from ``cfg``
    (:func:`~eagle3.engines.sglang.draft_load.rope_parameters`); ``"{}"`` for default RoPE, a
    legacy ``type`` left out (``rope_type`` holds what transformers uses)."""
    rp = rope_parameters(cfg)
    theta = rp.pop("rope_theta")
    rp.pop("type", None)
    scaling = {} if rp.get("rope_type") in (None, "default") else rp
    return float(theta), json.dumps(scaling, sort_keys=True)


def check_target(ck: Checkpoint, profile: EngineProfile, target: Target, *,
                 aux_capture: bool = True) -> list[Problem]:
    """Classes 7, 11, 12, 13 against the target's config (11 only with ``aux_capture``)."""
    cfg, tc, out = ck.config, target.config, []
    classes = profile.aux_capture_classes
    if aux_capture and classes and target.architecture not in classes:
        out.append(Problem("TARGET_NO_AUX_CAPTURE", "target architectures[0]: "
                           f"{target.architecture} has no set_eagle3_layers_to_capture in "
                           f"{profile.engine} {profile.version}: expected a capturing class, the "
                           "draft would get no aux states (fc bypassed)"))
    th = tc.get("hidden_size")
    if "target_hidden_size" in cfg and cfg["target_hidden_size"] != th:
        out.append(Problem("TARGET_HIDDEN_SIZE", "config.json target_hidden_size: expected the "
                           f"target's hidden_size {th}, got {cfg['target_hidden_size']!r}"))
    elif "target_hidden_size" not in cfg and cfg.get("hidden_size") != th:
        out.append(Problem("TARGET_HIDDEN_SIZE", f"config.json target_hidden_size: expected {th} "
                           f"(draft hidden_size {cfg.get('hidden_size')} differs from the "
                           "target's), got none"))
    if cfg.get("vocab_size") != tc.get("vocab_size"):
        out.append(Problem("VOCAB_SIZE_MISMATCH", f"config.json vocab_size: expected the target's "
                           f"{tc.get('vocab_size')}, got {cfg.get('vocab_size')}"))
    if _rope(cfg) != _rope(tc):
        out.append(Problem("ROPE_MISMATCH", "config.json rope (theta, scaling): expected the "
                                            f"target's {_rope(tc)}, got {_rope(cfg)}"))
    dmax, tmax = cfg.get("max_position_embeddings"), tc.get("max_position_embeddings")
    if isinstance(tmax, int) and (not isinstance(dmax, int) or dmax < tmax):
        out.append(Problem("CONTEXT_LENGTH", "config.json max_position_embeddings: expected >= "
                           f"the target's {tmax} (the serving context), got {dmax!r}"))
    return out


def check_data(ck: Checkpoint, target: Target | None, data: dict) -> list[Problem]:
    """Classes 8, 14, 15, 16 and identity: the extraction manifest vs the draft and the target."""
    out, man = [], ck.manifest or {}
    if data.get("kind") not in (None, "hidden_states"):
        out.append(Problem("DATA_INVALID", "data manifest kind: expected 'hidden_states', got "
                                           f"{data.get('kind')!r}"))
    conv = data.get("layer_id_convention")
    if conv is not None and conv != "hf_hidden_states_index":
        out.append(Problem("AUX_IDS_MISMATCH", f"data manifest layer_id_convention: expected "
                           f"'hf_hidden_states_index', got {conv!r}"))
    dv = ck.config.get("draft_vocab_size")
    uniq = (data.get("counts") or {}).get("unique_tokens")
    if isinstance(uniq, int) and isinstance(dv, int) and uniq < dv and not man.get("vocab_padded"):
        out.append(Problem("VOCAB_DATA_TOO_SMALL", f"draft_vocab_size {dv}: expected <= the {uniq} "
                           "distinct tokens of the training data (or an explicit pad decision "
                           f"recorded as vocab_padded), got {dv}"))
    if "speculative" in json.dumps((data.get("config") or {}).get("extract", {})).lower():
        out.append(Problem("DATA_INVALID", "data manifest config.extract: expected extraction "
                           "without speculative decoding, got speculative settings"))
    ours, theirs = man.get("data_content_hash"), data.get("content_hash")
    if ours and theirs and ours != theirs:
        out.append(Problem("DATA_INVALID", "manifest.json data_content_hash: the draft was "
                           f"trained on hidden states {ours[:12]}…, expected the given data's "
                           f"content_hash {theirs[:12]}…"))
    if target is None:
        return out
    from eagle3.artifacts import sha256_file, weights_hash

    dt = data.get("target") or {}
    th = sha256_file(target.path / "config.json")
    if dt.get("config_hash") and dt["config_hash"] != th:
        out.append(Problem("TARGET_MISMATCH", "data manifest target.config_hash: expected this "
                           f"target's {th[:12]}... ({target.path}), got "
                           f"{dt['config_hash'][:12]}..."))
    # same config.json and tokenizer, other weights (a fine-tune, a file replaced in place)
    wh = weights_hash(target.path) if dt.get("weights_hash") else None
    if wh is not None and wh != dt["weights_hash"]:
        out.append(Problem("TARGET_WEIGHTS_MISMATCH", "data manifest target.weights_hash: "
                           f"expected this target's {str(wh)[:12]}… (sha256 of "
                           f"{target.path}/*.safetensors), got {dt['weights_hash'][:12]}... "
                           "(the hidden states came from other weights)"))
    if "chat_template_hash" in data or "tokenizer_hash" in data:
        out += _template_problems(target, data)
    return out


TARGET_FIELDS = ("target.config_hash", "target.weights_hash", "chat_template_hash",
                 "tokenizer_hash")


def data_unchecked(ck: Checkpoint, target: Target | None, data: dict,
                   where: str = "data manifest") -> list[Problem]:
    """Warning ``DATA_UNCHECKED`` when the extraction manifest ``data`` (named ``where``) holds
    nothing :func:`check_data` and :func:`check_aux_ids` compare, naming each field with why it
    was not compared (absent, no ``--target``, no ``data_content_hash`` in the draft's
    ``manifest.json``). ``[]`` when at least one comparison was made."""
    def why(key: str) -> str | None:
        """None when ``key`` was compared, else why not."""
        if cfg_get(data, key) in (None, {}, ""):
            return f"{key} absent"
        if key == "content_hash" and not (ck.manifest or {}).get("data_content_hash"):
            return f"content_hash (no data_content_hash in {ck.path}/manifest.json)"
        if key in TARGET_FIELDS and target is None:
            return f"{key} (no --target)"
        return None

    reasons = [why(k) for k in ("counts.unique_tokens", "config.extract", "aux_layer_ids",
                                "content_hash") + TARGET_FIELDS]
    if None in reasons:
        return []
    return [Problem("DATA_UNCHECKED", f"{where}: expected fields to compare the draft with, got "
                    f"none that could be compared ({'; '.join(reasons)}; fields present: "
                    f"{sorted(data)}): nothing of the data was compared")]


@functools.lru_cache(maxsize=8)
def _tokenizer_hashes(path: str, stamp: tuple) -> dict[str, str]:
    """The target tokenizer's hashes as extraction computes them; cached per folder and
    ``stamp`` (file mtimes)."""
    from transformers import AutoTokenizer

    from eagle3.extract.conversations import template_hash, tokenizer_hash

    tok = AutoTokenizer.from_pretrained(path)
    return {"chat_template_hash": template_hash(tok), "tokenizer_hash": tokenizer_hash(tok)}


def _template_problems(target: Target, data: dict) -> list[Problem]:
    stamp = tuple(sorted((f.name, f.stat().st_mtime_ns) for f in target.path.iterdir()
                         if f.suffix in (".json", ".jinja", ".txt", ".model")))
    try:
        hashes = _tokenizer_hashes(str(target.path), stamp)
    except (OSError, ValueError) as e:
        return [Problem("TOKENIZER_MISMATCH", f"target tokenizer {target.path}: expected a "
                                              f"loadable tokenizer ({e})")]
    return [Problem(code, f"data manifest {key}: expected the serving target's "
                    f"{hashes[key][:12]}…, got {str(data[key])[:12]}… (the draft learned other "
                    "token streams)")
            for key, code in (("chat_template_hash", "CHAT_TEMPLATE_MISMATCH"),
                              ("tokenizer_hash", "TOKENIZER_MISMATCH"))
            if key in data and data[key] != hashes[key]]
