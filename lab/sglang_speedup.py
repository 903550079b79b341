"""SGLang side by side: the target alone, chain drafting and tree drafting, through the pipeline's
own launcher, readiness gate and benchmark, at several concurrencies; the same prompts replayed
offline; the cost model at batch 1.

Every mode is one server started from the config's ``serve`` section (``serve.engine: sglang``,
``serve.sglang_python``, its ``extra_args``) by ``eagle3.serve.launcher.launch_ready`` (the gate's
phase timeline is kept), then ``eagle3.measure.bench.run_bench`` on the same prompts (target chat
template, greedy) at each ``--concurrency``. Modes: ``plain`` (no draft), ``chain`` (steps
``serve.speculative_num_steps``, top-k 1), ``tree`` (``--tree-topk``, ``--tree-draft-tokens``),
``reference-plain`` / ``reference-chain`` (the project's reference engine on the same device,
concurrency 1 only: it serves one request at a time).

Figures (per mode and concurrency): output tokens/s and the speedup over ``plain`` at the same
concurrency; acceptance length by the project's convention (1 + accepted drafts / verify passes)
and SGLang's own ``spec_accept_length`` (completion tokens / verify passes, the first token
included); at concurrency 1 the cost model: plain ms per token, speculative ms per verify iteration,
their ratio, and the speedup it predicts at the measured acceptance length (AL / ratio).
``--offline``: the chain's acceptance length by exact greedy replay in-process
(``eagle3.measure.offline.offline_acceptance``) on the same prompts; fidelity = served / offline.

``--shape llama8b|smollm2``: random weights at a published shape (target config only, served with
``--load-format dummy``; the tokenizer of the configured target), for the cost model at a size a
user with that target reads.

    python lab/sglang_speedup.py --config configs/smollm2-gpu-sglang.yaml --draft RUN/serving \\
        --offline --out $OUT/sglang_speedup.json
    python lab/sglang_speedup.py --config C --shape llama8b --modes plain,chain,tree \\
        --concurrency 1 --num-prompts 8 --out $OUT/sglang_costmodel_llama8b.json

Before any server starts, the SGLang modes need ``serve.sglang_python`` to import the release of
``convert.engine_version``; when it does not, the message says how to build that release's
environment (``install_advice`` of ``eagle3.engines.sglang.environment``: ``make sglang-env``
builds the profile's release only; another takes ``pip install sglang==V`` in a venv of its own
or its offline kit, ``lab/gpu/sglang_kit.sh`` for 0.5.16).

Writes ``--out`` (JSON) after every mode; prints one line per measurement and the table last.
Exit 0; 1 when a mode failed (the others still run); 2 for bad arguments (a bad config or an
SGLang environment without the configured release included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHAPES = {
    "llama8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                    draft_vocab_size=32000, rope_theta=500000.0),
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                    draft_vocab_size=8192, rope_theta=100000.0),
}
MODES = ("plain", "chain", "tree", "reference-plain", "reference-chain")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/smollm2-gpu-sglang.yaml")
    p.add_argument("-o", "--override", action="append", default=[], help="KEY=VALUE, as eagle3")
    p.add_argument("--draft", help="serving checkpoint folder: the convert stage's "
                   "<run>/serving (its latest.json names the settings folder) or that folder")
    p.add_argument("--shape", choices=sorted(SHAPES), help="random weights at this shape")
    p.add_argument("--modes", default="plain,chain,tree")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--prompts", default="mtbench")
    p.add_argument("--assets", default=None, help="folder with question.jsonl[.xz] (MT-Bench), "
                   "test.jsonl[.xz] (GSM8K), where their wheels are not installed")
    p.add_argument("--num-prompts", type=int, default=80)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--tree-topk", type=int, default=4,
                   help="mode tree: serve.speculative_eagle_topk, >= 2 (top-k 1 is the chain)")
    p.add_argument("--tree-draft-tokens", type=int, default=8,
                   help="mode tree: serve.speculative_num_draft_tokens")
    p.add_argument("--offline", action="store_true", help="replay the chain offline, same prompts")
    p.add_argument("--work", default="/tmp/sglang_speedup", help="server logs, shape models")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    raw_modes = a.modes
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in a.modes if m not in MODES]
    if bad or not a.modes:
        what = f"unknown {bad}" if bad else "no mode"
        p.error(f"--modes: expected a comma list of {', '.join(MODES)}, got {raw_modes!r} "
                f"({what})")
    a.concurrency = _positive_ints(p, "--concurrency", a.concurrency)
    if a.num_prompts < 1 or a.max_new_tokens < 1:
        p.error(f"--num-prompts and --max-new-tokens: expected >= 1, got {a.num_prompts} and "
                f"{a.max_new_tokens}")
    _check_tree(p, a.tree_topk, a.tree_draft_tokens)
    needs_draft = any(m != "plain" and m != "reference-plain" for m in a.modes)
    if needs_draft and not (a.draft or a.shape):
        p.error("--draft DIR (or --shape) is needed for the modes " + ",".join(a.modes))
    if a.draft and a.shape:
        p.error("--draft and --shape exclude each other (a shape builds its own random draft)")
    if a.draft:
        a.draft = str(_check_draft(p, Path(a.draft)))
    if a.assets is not None:
        from lab.study_inputs import ASSET_FILES

        if not Path(a.assets).is_dir():
            p.error(f"--assets: expected a folder, got {a.assets!r}")
        if not any((Path(a.assets) / n).is_file() for n in ASSET_FILES):
            p.error(f"--assets {a.assets}: expected at least one of {', '.join(ASSET_FILES)} "
                    "there, found none")
    return a


def _serve_bounds(field: str) -> tuple[int, int]:
    """(minimum, maximum) of the ``serve`` setting ``field`` as eagle3.config.ServeConfig declares
    them (``Field(ge=, le=)``)."""
    from eagle3.config import ServeConfig

    meta = ServeConfig.model_fields[field].metadata
    lo = next(m.ge for m in meta if hasattr(m, "ge"))
    hi = next(m.le for m in meta if hasattr(m, "le"))
    return lo, hi


def _check_tree(p: argparse.ArgumentParser, topk: int, draft_tokens: int) -> None:
    """``--tree-topk`` becomes ``serve.speculative_eagle_topk`` of mode ``tree`` and
    ``--tree-draft-tokens`` its ``serve.speculative_num_draft_tokens`` (:func:`mode_config` sets
    them without the config's validation). The top-k must be at least 2: SGLang serves top-k 1 as
    the chain (steps + 1 draft tokens, whatever was asked), which mode ``chain`` measures already,
    and refuses 0; both stay within the config's bounds. Else an argparse error (exit 2)."""
    lo, hi = _serve_bounds("speculative_eagle_topk")
    if not max(lo, 2) <= topk <= hi:
        p.error(f"--tree-topk: expected an integer in {max(lo, 2)}..{hi} (the tree's top-k, "
                f"serve.speculative_eagle_topk; top-k 1 is chain drafting, mode chain), got {topk}")
    lo, hi = _serve_bounds("speculative_num_draft_tokens")
    if not lo <= draft_tokens <= hi:
        p.error(f"--tree-draft-tokens: expected an integer in {lo}..{hi} "
                f"(serve.speculative_num_draft_tokens), got {draft_tokens}")


def sglang_env_problem(cfg, modes: list[str]) -> str | None:
    """Why the SGLang modes among ``modes`` cannot start: ``serve.sglang_python`` cannot import
    sglang, or has a release other than ``convert.engine_version``; with how to build that
    release's environment (``eagle3.engines.sglang.environment.install_advice``, per release).
    None when no mode needs SGLang or the environment has the release."""
    from eagle3.engines.sglang.environment import (sglang_installed, sglang_python,
                                                   sglang_unusable_reason, sglang_version)
    from eagle3.engines.sglang.environment import install_advice

    need = [m for m in modes if not m.startswith("reference")]
    if not need:
        return None
    py, want = sglang_python(cfg), cfg.convert.engine_version
    if not sglang_installed(py):
        got = sglang_unusable_reason(py)
    elif (version := sglang_version(py)) != want:
        got = f"SGLang {version} in {py}"
    else:
        return None
    return (f"serve.sglang_python (modes {','.join(need)}): expected the Python of an environment "
            f"with sglang=={want} (convert.engine_version), got {got}; fix: "
            f"{install_advice(want)}, then set serve.sglang_python (-o serve.sglang_python=PATH)")


def _positive_ints(p: argparse.ArgumentParser, flag: str, raw: str) -> list[int]:
    """``"1,4,16"`` -> ``[1, 4, 16]``; an argparse error (exit 2) naming ``flag`` and the bad item
    for anything else (an empty item, a non-integer, zero or a negative number)."""
    items = [c.strip() for c in raw.split(",")]
    for c in items:
        if not c.isdigit() or int(c) < 1:
            p.error(f"{flag}: expected a comma list of positive integers (e.g. 1,4,16), got "
                    f"{raw!r} ({c!r} is not a positive integer)")
    return [int(c) for c in items]


def _check_draft(p: argparse.ArgumentParser, draft: Path) -> Path:
    """``--draft`` must be a serving folder (the convert stage's ``serving``): a directory with
    ``config.json`` and ``*.safetensors``, or ``<run>/serving`` whose ``latest.json`` names it
    (``tasks.stage_config.latest_output``). Returns that folder; else an argparse error (exit 2)
    saying what is there."""
    from eagle3.errors import DataError
    from tasks.stage_config import LATEST_FILE, latest_output

    if not draft.exists():
        p.error(f"--draft {draft}: expected the convert stage's serving folder, got a path that "
                "does not exist")
    if not draft.is_dir():
        p.error(f"--draft {draft}: expected the convert stage's serving folder, got a file")
    if (draft / LATEST_FILE).is_file():
        try:
            named = latest_output(draft.parent, draft.name)
        except DataError as e:
            p.error(f"--draft: {e}")
        if not named.is_dir():
            p.error(f"--draft {draft}: its {LATEST_FILE} names the folder {named.name!r}, which "
                    "does not exist (the convert stage's output was removed or moved)")
        draft = named
    missing = [what for what, ok in (("config.json", (draft / "config.json").is_file()),
                                     ("*.safetensors", any(draft.glob("*.safetensors")))) if not ok]
    if missing:
        inside = sorted(f.name for f in draft.iterdir())[:8] if draft.is_dir() else []
        p.error(f"--draft {draft}: expected a serving folder with config.json and *.safetensors, "
                f"missing {' and '.join(missing)} (it holds {inside or 'nothing'}); the convert "
                "stage writes it as <run>/serving")
    from eagle3.engines.registry import get_profile

    wanted = get_profile("sglang").draft_architectures
    try:
        archs = json.loads((draft / "config.json").read_text()).get("architectures")
    except (OSError, ValueError, AttributeError) as e:
        p.error(f"--draft {draft}: config.json: expected a JSON object, could not read it ({e})")
    if not isinstance(archs, list) or not set(archs) & set(wanted):
        p.error(f"--draft {draft}: config.json architectures: expected one of {list(wanted)} (a "
                f"serving folder, the convert stage's <run>/serving), got {archs!r}; a training "
                "checkpoint (<run>/train) is not served as it is")
    return draft


def shape_models(shape: str, tokenizer_dir: Path, work: Path) -> tuple[Path, Path]:
    """Config-only target (with ``tokenizer_dir``'s tokenizer files) and EAGLE-3 draft folders at
    ``shape``, both served with random weights (``--load-format dummy``)."""
    import shutil

    s = SHAPES[shape]
    base = {"model_type": "llama", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
            "bos_token_id": 1, "eos_token_id": 2,
            **{k: v for k, v in s.items() if k != "draft_vocab_size"}}
    target, draft = work / f"{shape}-target", work / f"{shape}-draft"
    for d in (target, draft):
        d.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps({**base, "architectures": ["LlamaForCausalLM"]}))
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name.endswith(".jinja"):
            shutil.copy(f, target / f.name)
    n = s["num_hidden_layers"]
    (draft / "config.json").write_text(json.dumps({
        **base, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
        "draft_vocab_size": s["draft_vocab_size"], "target_hidden_size": s["hidden_size"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, n // 2 - 1, n - 4]}}))
    return target, draft


def mode_config(cfg, mode: str, a):
    """The run config ``mode`` serves with: engine, tree settings, room for the concurrency."""
    serve = {"max_running_requests": max(max(a.concurrency), cfg.serve.max_running_requests or 1)}
    if mode.startswith("reference"):
        serve.update(engine="reference", max_running_requests=None, mem_fraction_static=None,
                     cuda_graph_max_bs=None, extra_args=[])
    else:
        serve["engine"] = "sglang"
        serve["cuda_graph_max_bs"] = max(max(a.concurrency), cfg.serve.cuda_graph_max_bs or 1)
        if a.shape:
            serve["extra_args"] = [*cfg.serve.extra_args, "--load-format", "dummy"]
    if mode == "tree":
        serve.update(speculative_eagle_topk=a.tree_topk,
                     speculative_num_draft_tokens=a.tree_draft_tokens)
    elif mode in ("chain", "reference-chain"):
        serve.update(speculative_eagle_topk=1,
                     speculative_num_draft_tokens=cfg.serve.speculative_num_steps + 1)
    return cfg.model_copy(update={"serve": cfg.serve.model_copy(update=serve)})


def cost_row(report: dict) -> dict:
    """Batch-1 timings of one bench report: median ms per output token and per verify pass."""
    rows = report["per_request"]
    per_token = [1000 * r["latency_s"] / r["completion_tokens"] for r in rows
                 if r.get("completion_tokens")]
    per_iter = [1000 * r["latency_s"] / r["verify_ct"] for r in rows if r.get("verify_ct")]
    return {"ms_per_token": statistics.median(per_token) if per_token else None,
            "ms_per_iteration": statistics.median(per_iter) if per_iter else None}


def measure_mode(cfg, mode: str, target: Path, draft: Path | None, plist: list[dict], a) -> dict:
    """Start ``mode``'s server behind the gate, bench it at each concurrency, stop it."""
    from eagle3.measure.bench import run_bench
    from eagle3.serve.launcher import launch_ready

    mcfg = mode_config(cfg, mode, a)
    use_draft = None if mode in ("plain", "reference-plain") else draft
    out: dict = {"serve": mcfg.serve.model_dump(mode="json"), "by_concurrency": {}}
    t0 = time.monotonic()
    with launch_ready(mcfg, target, use_draft, Path(a.work) / mode) as (engine, gate):
        out["gate"] = {"verdict": gate.verdict, "phases": gate.phases,
                       "ready_after_s": round(time.monotonic() - t0, 1), "argv": engine.argv}
        print(f"{mode}: ready after {out['gate']['ready_after_s']} s, phases {gate.phases}",
              flush=True)
        levels = [1] if mode.startswith("reference") else a.concurrency
        for c in levels:
            rep = run_bench(engine.url, prompts=plist, max_new_tokens=a.max_new_tokens,
                            concurrency=c, tokenizer_dir=target,
                            request_timeout_s=mcfg.bench.request_timeout_s)
            s = rep["summary"]
            row = {k: s.get(k) for k in ("output_tokens_per_s", "acceptance_length",
                                         "acceptance_length_sglang", "server_acceptance_length",
                                         "latency_p50_s", "output_tokens", "wall_s",
                                         "num_prompts")}
            if c == 1:
                row.update(cost_row(rep))
            row["per_request"] = [{k: r.get(k) for k in ("id", "completion_tokens", "verify_ct",
                                                          "latency_s", "accepted_drafts")}
                                  for r in rep["per_request"]]
            out["by_concurrency"][str(c)] = row
            print(f"{mode} c={c}: {row['output_tokens_per_s']:.1f} tok/s, AL "
                  f"{row['acceptance_length']}, SGLang AL {row['acceptance_length_sglang']}",
                  flush=True)
    return out


def summarize(res: dict) -> None:
    """Speedups over ``plain`` per concurrency, the batch-1 cost model and its prediction."""
    modes = res["modes"]
    plain = modes.get("plain", {}).get("by_concurrency", {})
    ref_plain = modes.get("reference-plain", {}).get("by_concurrency", {})
    for name, m in modes.items():
        base = ref_plain if name.startswith("reference") else plain
        for c, row in m.get("by_concurrency", {}).items():
            b = base.get(c, {}).get("output_tokens_per_s")
            row["speedup"] = (row["output_tokens_per_s"] / b
                              if b and row.get("output_tokens_per_s") else None)
            p_ms = base.get("1", {}).get("ms_per_token")
            if c == "1" and row.get("ms_per_iteration") and p_ms:
                ratio = row["ms_per_iteration"] / p_ms
                row["cost_ratio_iteration_over_plain_token"] = ratio
                al = row.get("acceptance_length")
                row["predicted_speedup"] = al / ratio if al else None
    off = res.get("offline")
    if off:
        res["fidelity_served_over_offline"] = {
            name: {"ours": row["acceptance_length"] / off["acceptance_length"],
                   "sglang": (row["acceptance_length_sglang"] / off["acceptance_length"]
                              if row.get("acceptance_length_sglang") else None)}
            for name in ("chain", "reference-chain")
            if (row := modes.get(name, {}).get("by_concurrency", {}).get("1", {}))
            .get("acceptance_length")}


def print_table(res: dict) -> None:
    print(f"{'mode':<16}{'conc':>5}{'tok/s':>10}{'speedup':>9}{'AL':>7}{'AL sgl':>8}"
          f"{'ms/tok':>8}{'ms/iter':>9}{'pred':>7}")
    for name, m in res["modes"].items():
        for c, r in m.get("by_concurrency", {}).items():
            def f(k, fmt="{:.3f}"):
                return fmt.format(r[k]) if r.get(k) is not None else "-"
            print(f"{name:<16}{c:>5}{f('output_tokens_per_s', '{:.1f}'):>10}{f('speedup'):>9}"
                  f"{f('acceptance_length'):>7}{f('acceptance_length_sglang'):>8}"
                  f"{f('ms_per_token'):>8}{f('ms_per_iteration'):>9}{f('predicted_speedup'):>7}")
    if res.get("offline"):
        print(f"offline chain AL {res['offline']['acceptance_length']:.3f}; served / offline "
              f"{res.get('fidelity_served_over_offline')}")


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    import torch

    from eagle3.assets import resolve_target
    from eagle3.config import load_config
    from eagle3.measure.prompts import load_prompts

    from eagle3.errors import ConfigError

    try:
        cfg = load_config(a.config, a.override)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if (why := sglang_env_problem(cfg, a.modes)) is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    target = resolve_target(cfg)
    draft = Path(a.draft).resolve() if a.draft else None
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    if a.shape:
        target, draft = shape_models(a.shape, target, work)
    if a.assets is not None:
        from lab.harness import patch_assets

        patch_assets(Path(a.assets))
    plist = load_prompts(a.prompts, a.num_prompts)
    res = {"config": a.config, "overrides": a.override, "target": str(target),
           "draft": str(draft) if draft else None, "shape": a.shape, "prompts": a.prompts,
           "num_prompts": len(plist), "max_new_tokens": a.max_new_tokens,
           "engine_version": cfg.convert.engine_version,
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "modes": {}, "failed": {}}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if a.offline and draft is not None and not a.shape:
        # first: the cheapest figure, kept by a run cut short while the servers measure
        from eagle3.measure.offline import offline_acceptance

        off = offline_acceptance(target, draft, plist, num_prompts=len(plist),
                                 max_new_tokens=a.max_new_tokens,
                                 num_steps=cfg.serve.speculative_num_steps, dtype="bfloat16",
                                 device="cuda" if torch.cuda.is_available() else "cpu")
        res["offline"] = {k: off.get(k) for k in ("acceptance_length", "per_position",
                                                  "num_requests", "verify_ct", "wall_s")}
        del off
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the servers size their memory from what is free
        out.write_text(json.dumps(res, indent=2, default=str))
    for mode in a.modes:
        try:
            res["modes"][mode] = measure_mode(cfg, mode, target, draft, plist, a)
        except Exception as e:  # one failed mode must not lose the others' figures
            res["failed"][mode] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        summarize(res)
        out.write_text(json.dumps(res, indent=2, default=str))
    print_table(res)
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
