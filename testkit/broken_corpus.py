"""A corpus of small broken serving checkpoints, one or more per file-checkable failure class.

``make_speculators_draft(target_dir, out)`` builds a good speculators-format draft for a target
(random layers, the target's embedding, a valid vocab map);
``validate(ckpt_dir, **kw)``: the problems of :func:`eagle3.convert.validate.validate_report`;
``build_corpus(good_serving_dir, root, target_dir)`` copies a good *converted* checkpoint once per
case and breaks it in one way, returning :class:`Case` records (``expect`` = the Problem code and a
string its message must contain). Run as a script to write the corpus to a folder::

    python -m testkit.broken_corpus TARGET_DIR OUT_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file


def validate(ckpt_dir: str | Path, **kw) -> list:
    """The ``problems`` (``Problem`` records) of :func:`eagle3.convert.validate.validate_report`
    of ``ckpt_dir`` with the same keyword arguments; ``[]`` = valid."""
    from eagle3.convert.validate import validate_report

    return validate_report(ckpt_dir, **kw).problems


ALL_OFF = {
    "norm_before_residual": False,
    "norm_before_fc": False,
    "fc_norm": False,
    "norm_output": False,
}


def make_speculators_draft(
    target_dir: Path,
    out: Path,
    *,
    aux_ids=(2, 4, 5),
    draft_vocab: int = 256,
    flags: dict | None = None,
    seed: int = 0,
    num_layers: int = 1,
) -> Path:
    """A speculators-format draft for ``target_dir`` (random fc/layers from ``seed``) saved into
    ``out``."""
    from eagle3.train.draft_model import build_draft, save_draft

    vocab = json.loads((Path(target_dir) / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(seed)
    ids = torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    d2t = ids - torch.arange(draft_vocab)
    torch.manual_seed(seed)
    model = build_draft(
        target_dir,
        aux_layer_ids=list(aux_ids),
        d2t=d2t,
        t2d=t2d,
        num_layers=num_layers,
        ttt_steps=3,
        flags={**ALL_OFF, **(flags or {})},
    )
    with (
        torch.no_grad()
    ):  # make the norms non-trivial so a swapped norm shows in the equivalence check
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") and not name.startswith("verifier"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
    if out.exists():
        shutil.rmtree(out)
    return save_draft(model, out)


def good_pair(base: Path, target_dir: Path) -> tuple[Path, Path]:
    """``(speculators_dir, serving_dir)``: a good draft for ``target_dir`` and its conversion, built
    once under ``base`` (reused when both already exist)."""
    from eagle3.convert.stage import convert

    spec, serving = Path(base) / "good-speculators", Path(base) / "good-serving"
    if not (spec / "model.safetensors").is_file():
        make_speculators_draft(Path(target_dir), spec)
    if not (serving / "manifest.json").is_file():
        convert(spec, serving, target_dir=Path(target_dir))
    return spec, serving


def good_data_manifest(target_dir: Path, aux_ids=(2, 4, 5), unique_tokens: int = 5000) -> dict:
    """An extraction manifest consistent with ``target_dir`` (hashes computed the way extraction
    does)."""
    from transformers import AutoTokenizer

    from eagle3.artifacts import sha256_file, weights_hash
    from eagle3.extract.conversations import template_hash, tokenizer_hash

    tok = AutoTokenizer.from_pretrained(str(target_dir))
    return {
        "kind": "hidden_states",
        "aux_layer_ids": list(aux_ids),
        "layer_id_convention": "hf_hidden_states_index",
        "target": {
            "path": str(target_dir),
            "config_hash": sha256_file(Path(target_dir) / "config.json"),
            "weights_hash": weights_hash(target_dir),
        },
        "chat_template_hash": template_hash(tok),
        "tokenizer_hash": tokenizer_hash(tok),
        "counts": {"unique_tokens": unique_tokens},
        "config": {"extract": {"backend": "hf"}},
        "content_hash": "4" * 64,
    }


@dataclass
class Case:
    """One broken checkpoint: ``fclass`` (docs/FAILURE_CLASSES.md number), expected ``code`` and
    ``needle``."""

    name: str
    fclass: int
    code: str
    needle: str
    mutate: Callable[["Ckpt"], None] = field(repr=False)
    with_data: bool = False
    loads_in_engine: bool = (
        True  # False: the real engine cannot even build it (a billion layers): tier 1 skips it
    )
    path: Path | None = None
    target_dir: Path | None = None
    data_manifest: dict | None = None


class Ckpt:
    """Mutable view of a copied checkpoint (config, tensors, manifest, data manifest), written back
    by save()."""

    def __init__(self, path: Path, data: dict | None):
        self.path = path
        self.config = json.loads((path / "config.json").read_text())
        self.tensors = load_file(str(path / "model.safetensors"))
        mp = path / "manifest.json"
        self.manifest = json.loads(mp.read_text()) if mp.is_file() else None
        self.data = json.loads(json.dumps(data)) if data is not None else None
        self.target_dir: Path | None = None

    def save(self) -> None:
        (self.path / "config.json").write_text(json.dumps(self.config, indent=2))
        save_file(
            {k: v.contiguous() for k, v in self.tensors.items()},
            str(self.path / "model.safetensors"),
        )
        if self.manifest is not None:
            (self.path / "manifest.json").write_text(json.dumps(self.manifest, indent=2))

    def rename(self, fn: Callable[[str], str]) -> None:
        self.tensors = {fn(k): v for k, v in self.tensors.items()}

    def eagle(self) -> dict:
        return self.config.setdefault("eagle_config", {})


def _set(d: dict, **kw):
    d.update(kw)


def _other_target(c: Ckpt, **changes) -> None:
    """A copy of the target folder whose config differs (weights/tokenizer linked)."""
    src = Path(c.target_dir)
    dst = c.path.parent / f"{c.path.name}-target"
    dst.mkdir(exist_ok=True)
    for f in src.iterdir():
        if f.name != "config.json" and not (dst / f.name).exists():
            (dst / f.name).symlink_to(f)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    c.target_dir = dst


def _target_weights_as(c: Ckpt, fmt: str, rename: Callable[[str], str] = lambda k: k) -> None:
    """A copy of the target folder (config and tokenizer linked) whose weights are rewritten as
    ``fmt`` ("bin": ``pytorch_model.bin`` only, "safetensors") with tensor names passed through
    ``rename``."""
    src = Path(c.target_dir)
    dst = c.path.parent / f"{c.path.name}-target"
    dst.mkdir(exist_ok=True)
    weights = {}
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            weights.update(load_file(str(f)))
        elif not (dst / f.name).exists():
            (dst / f.name).symlink_to(f)
    weights = {rename(k): v for k, v in weights.items()}
    if fmt == "bin":
        torch.save(weights, dst / "pytorch_model.bin")
    else:
        save_file(weights, str(dst / "model.safetensors"))
    c.target_dir = dst


def _reinit_embed(c: Ckpt) -> None:
    c.tensors["embed_tokens.weight"] = torch.randn_like(c.tensors["embed_tokens.weight"])


def _regenerate_map(c: Ckpt) -> None:
    vocab, dv = c.config["vocab_size"], c.config["draft_vocab_size"]
    ids = torch.arange(dv) * 3  # another valid map
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    c.tensors["d2t"], c.tensors["t2d"] = ids - torch.arange(dv), t2d


def _swap_t2d(c: Ckpt) -> None:
    t2d = c.tensors["t2d"].clone()
    on = int(torch.nonzero(t2d)[0])
    off = int(torch.nonzero(~t2d)[0])
    t2d[on], t2d[off] = False, True
    c.tensors["t2d"] = t2d


def _side_file_map(c: Ckpt) -> None:
    torch.save(c.tensors.pop("d2t"), c.path / "d2t.pt")
    c.tensors.pop("t2d")
    c.manifest.pop("vocab_map_hash", None)


def _nan(c: Ckpt, name: str) -> None:
    t = c.tensors[name].clone()
    t.view(-1)[0] = float("nan")
    c.tensors[name] = t


# the cases as a compact table, one case on a line or two (the formatter would give each argument a
# line and the module would outgrow the size limit)
# fmt: off
CASES: list[Case] = [
    # 1 missing tensors
    Case("missing_lm_head", 1, "MISSING_TENSOR", "lm_head.weight",
         lambda c: c.tensors.pop("lm_head.weight")),
    Case("missing_k_proj", 1, "MISSING_TENSOR", "qkv_proj.weight (shards ['k'])",
         lambda c: c.tensors.pop("layers.0.self_attn.k_proj.weight")),
    Case("missing_fc", 1, "MISSING_TENSOR", "model.fc.weight",
         lambda c: c.tensors.pop("fc.weight")),
    # 2 unknown names
    Case("draft_model_prefix", 2, "UNKNOWN_TENSOR", "draft_model.layers.0",
         lambda c: c.rename(lambda k: "draft_model." + k if k.startswith("layers.") else k)),
    Case("model_prefix_everywhere", 2, "UNKNOWN_TENSOR", "model.lm_head.weight",
         lambda c: c.rename(lambda k: "model." + k)),
    Case("qwen3_q_norm", 2, "UNKNOWN_TENSOR", "q_norm",
         lambda c: c.tensors.__setitem__("layers.0.self_attn.q_norm.weight", torch.ones(16))),
    Case("input_norm_without_flag", 2, "UNKNOWN_TENSOR", "input_norm.weight",
         lambda c: c.tensors.__setitem__("input_norm.weight", torch.ones(192))),
    Case("attn_bias_tensor", 2, "UNKNOWN_TENSOR", "q_proj.bias",
         lambda c: c.tensors.__setitem__("layers.0.self_attn.q_proj.bias", torch.ones(64))),
    # 3 shapes
    Case("fc_two_aux_wide", 3, "SHAPE_MISMATCH", "fc.weight",
         lambda c: c.tensors.__setitem__("fc.weight", c.tensors["fc.weight"][:, :128].clone())),
    Case("head_dim_set", 3, "SHAPE_MISMATCH", "q_proj.weight",
         lambda c: _set(c.config, head_dim=32)),
    Case("lm_head_rows", 3, "SHAPE_MISMATCH", "lm_head.weight",
         lambda c: c.tensors.__setitem__("lm_head.weight",
                                         c.tensors["lm_head.weight"][:200].clone())),
    Case("draft_vocab_size_missing", 3, "CONFIG_FIELD", "draft_vocab_size",
         lambda c: c.config.pop("draft_vocab_size")),
    # 4 values
    Case("nan_fc", 4, "NAN_INF", "fc.weight", lambda c: _nan(c, "fc.weight")),
    Case("zero_o_proj", 4, "ALL_ZERO", "o_proj.weight",
         lambda c: c.tensors["layers.0.self_attn.o_proj.weight"].zero_()),
    Case("embed_reinit", 4, "EMBED_MISMATCH", "embed_tokens.weight", _reinit_embed),
    Case("bin_target_embed_reinit", 4, "EMBED_MISMATCH", "embed_tokens.weight",
         lambda c: (_target_weights_as(c, "bin"), _reinit_embed(c))),
    Case("target_embed_not_found", 4, "EMBED_UNCHECKED", "pytorch_model.bin",
         lambda c: _target_weights_as(c, "bin",
                                      lambda k: k.replace("embed_tokens", "word_embeddings"))),
    # 5 flags
    Case("norm_before_residual", 5, "UNSUPPORTED_FLAG", "norm_before_residual",
         lambda c: _set(c.config, norm_before_residual=True)),
    Case("norm_output_dropped", 5, "FLAG_MISMATCH", "norm_output",
         lambda c: c.manifest["trained_flags"].__setitem__("norm_output", True)),
    Case("fc_norm_flag_no_tensors", 5, "MISSING_TENSOR", "fc_norm.0.weight",
         lambda c: _set(c.config, fc_norm=True)),
    Case("attention_bias_flag", 5, "UNSUPPORTED_FLAG", "attention_bias",
         lambda c: _set(c.config, attention_bias=True)),
    Case("tied_head", 5, "UNSUPPORTED_FLAG", "tie_word_embeddings",
         lambda c: _set(c.config, tie_word_embeddings=True)),
    Case("norm_output_nested", 5, "NESTED_FLAG", "eagle_config.norm_output",
         lambda c: c.eagle().__setitem__("norm_output", True)),
    Case("unknown_flag_top", 5, "UNKNOWN_FLAG", "use_gated_residual",
         lambda c: _set(c.config, use_gated_residual=True)),
    Case("unknown_flag_nested", 5, "UNKNOWN_FLAG", "eagle_config.share_target_norm",
         lambda c: c.eagle().__setitem__("share_target_norm", True)),
    # 6 map missing
    Case("no_d2t", 6, "VOCAB_MAP_MISSING", "d2t",
         lambda c: (c.tensors.pop("d2t"), c.tensors.pop("t2d"))),
    Case("d2t_side_file", 6, "VOCAB_MAP_MISSING", "d2t.pt", _side_file_map),
    # 7 map invariants
    Case("d2t_short", 7, "VOCAB_MAP_INVALID", "d2t",
         lambda c: c.tensors.__setitem__("d2t", c.tensors["d2t"][:-1].clone())),
    Case("t2d_short", 7, "VOCAB_MAP_INVALID", "t2d: expected length",
         lambda c: c.tensors.__setitem__("t2d", c.tensors["t2d"][:-5].clone())),
    Case("t2d_sum", 7, "VOCAB_MAP_INVALID", "t2d: sum",
         lambda c: c.tensors["t2d"].__setitem__(torch.nonzero(~c.tensors["t2d"])[0], True)),
    Case("d2t_out_of_range", 7, "VOCAB_MAP_INVALID", "i + d2t[i]",
         lambda c: c.tensors["d2t"].__setitem__(-1, 10 ** 6)),
    Case("t2d_disagrees", 7, "VOCAB_MAP_INVALID", "t2d[i + d2t[i]]", _swap_t2d),
    Case("vocab_size_vs_target", 7, "VOCAB_SIZE_MISMATCH", "vocab_size",
         lambda c: _set(c.config, vocab_size=50000)),
    # 8 data too small
    Case("draft_vocab_over_data", 8, "VOCAB_DATA_TOO_SMALL", "draft_vocab_size",
         lambda c: c.data["counts"].__setitem__("unique_tokens", 100), with_data=True),
    # 9 map regenerated
    Case("map_regenerated", 9, "VOCAB_MAP_CHANGED", "vocab_map_hash", _regenerate_map),
    # 10 aux ids
    Case("aux_ids_top_level_only", 10, "AUX_IDS_MISSING",
         "eagle_config.eagle_aux_hidden_state_layer_ids",
         lambda c: c.config.__setitem__("eagle_aux_hidden_state_layer_ids",
                                        c.eagle().pop("eagle_aux_hidden_state_layer_ids"))),
    Case("aux_ids_hf_convention", 10, "AUX_IDS_MISMATCH", "[2, 4, 5]",
         lambda c: c.eagle().__setitem__("eagle_aux_hidden_state_layer_ids", [2, 4, 5])),
    Case("aux_ids_vs_data", 10, "AUX_IDS_MISMATCH", "extraction manifest",
         lambda c: c.data.__setitem__("aux_layer_ids", [1, 4, 6]), with_data=True),
    Case("aux_ids_out_of_range", 10, "AUX_IDS_RANGE", "[1, 7]",
         lambda c: (c.eagle().__setitem__("eagle_aux_hidden_state_layer_ids", [1, 3, 7]),
                    c.manifest.__setitem__("aux_layer_ids_hf", [2, 4, 8]))),
    Case("aux_ids_count", 10, "AUX_IDS_COUNT", "fc.weight",
         lambda c: (c.eagle().__setitem__("eagle_aux_hidden_state_layer_ids", [1, 3]),
                    c.manifest.__setitem__("aux_layer_ids_hf", [2, 4]))),
    Case("aux_ids_order", 10, "AUX_IDS_ORDER", "strictly increasing",
         lambda c: (c.eagle().__setitem__("eagle_aux_hidden_state_layer_ids", [3, 1, 4]),
                    c.manifest.__setitem__("aux_layer_ids_hf", [4, 2, 5]))),
    Case("aux_disabled", 10, "AUX_DISABLED", "use_aux_hidden_state",
         lambda c: c.eagle().__setitem__("use_aux_hidden_state", False)),
    # 11 target without capture
    Case("target_gpt2", 11, "TARGET_NO_AUX_CAPTURE", "GPT2LMHeadModel",
         lambda c: _other_target(c, architectures=["GPT2LMHeadModel"])),
    # 12 target hidden
    Case("target_hidden_wrong", 12, "TARGET_HIDDEN_SIZE", "target_hidden_size",
         lambda c: _set(c.config, target_hidden_size=128)),
    # 13 rope / context
    Case("rope_theta", 13, "ROPE_MISMATCH", "rope",
         lambda c: _set(c.config,
                        rope_parameters={"rope_theta": 500000.0, "rope_type": "default"})),
    Case("rope_scaling", 13, "ROPE_MISMATCH", "llama3",
         lambda c: _set(c.config, rope_parameters={"rope_theta": 10000.0, "rope_type": "llama3",
                                                   "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 2048})),
    Case("short_context", 13, "CONTEXT_LENGTH", "max_position_embeddings",
         lambda c: _set(c.config, max_position_embeddings=512)),
    # 14 template / tokenizer / target identity
    Case("chat_template", 14, "CHAT_TEMPLATE_MISMATCH", "chat_template_hash",
         lambda c: c.data.__setitem__("chat_template_hash", "0" * 64), with_data=True),
    Case("tokenizer", 14, "TOKENIZER_MISMATCH", "tokenizer_hash",
         lambda c: c.data.__setitem__("tokenizer_hash", "1" * 64), with_data=True),
    Case("other_target", 14, "TARGET_MISMATCH", "config_hash",
         lambda c: c.data["target"].__setitem__("config_hash", "2" * 64), with_data=True),
    Case("other_weights", 14, "TARGET_WEIGHTS_MISMATCH", "weights_hash",
         lambda c: c.data["target"].__setitem__("weights_hash", "5" * 64), with_data=True),
    # 15/16 data
    Case("other_data", 15, "DATA_INVALID", "data_content_hash",
         lambda c: c.manifest.__setitem__("data_content_hash", "3" * 64), with_data=True),
    Case("speculative_extraction", 16, "DATA_INVALID", "speculative",
         lambda c: c.data["config"]["extract"].__setitem__("speculative_algorithm", "EAGLE3"),
         with_data=True),
    # 22 not an EAGLE-3 draft class
    Case("plain_llama_arch", 22, "ARCHITECTURE", "LlamaForCausalLMEagle3",
         lambda c: _set(c.config, architectures=["LlamaForCausalLM"])),
    Case("draft_class_second", 22, "ARCHITECTURE", "['LlamaForCausalLM'] would be built",
         lambda c: _set(c.config, architectures=["LlamaForCausalLM", "LlamaForCausalLMEagle3"])),
    # 26 numbers that would size a loop or a shape
    Case("absurd_layer_count", 26, "CONFIG_FIELD",
         "'num_hidden_layers' expected an integer in [1, 1024]",
         lambda c: _set(c.config, num_hidden_layers=10 ** 9), loads_in_engine=False),
    Case("zero_heads", 26, "CONFIG_FIELD",
         "'num_attention_heads' expected an integer in [1, 4096], got 0",
         lambda c: _set(c.config, num_attention_heads=0), loads_in_engine=False),
]
# fmt: on


def build_corpus(
    good: Path, root: Path, target_dir: Path, data_manifest: dict | None = None
) -> list[Case]:
    """Copy ``good`` (a converted, valid checkpoint) once per case under ``root`` and break each
    copy."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for case in CASES:
        dst = root / case.name
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(good, dst)
        ck = Ckpt(dst, data_manifest if case.with_data else None)
        ck.target_dir = Path(target_dir)
        case.mutate(ck)
        ck.save()
        out.append(
            Case(
                case.name,
                case.fclass,
                case.code,
                case.needle,
                case.mutate,
                case.with_data,
                case.loads_in_engine,
                dst,
                ck.target_dir,
                ck.data,
            )
        )
    return out


if __name__ == "__main__":  # pragma: no cover - manual use
    from eagle3.convert.stage import convert

    target, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    spec = make_speculators_draft(target, out_dir / "_speculators")
    convert(spec, out_dir / "_good", target_dir=target)
    for c in build_corpus(out_dir / "_good", out_dir, target, good_data_manifest(target)):
        print(f"{c.name}: class {c.fclass} → {c.code}")
