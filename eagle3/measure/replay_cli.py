"""``python -m eagle3.measure.replay_cli``: replay acceptance of several drafts on prompt sets, one JSON file out.

    python -m eagle3.measure.replay_cli --target T --draft NAME=DIR [--draft NAME=DIR ...] \\
        [--sets mtbench2,gsm8k200] --out FILE [--max-new-tokens 256] [--num-steps 3] [--dtype float32] \\
        [--device auto] [--batch-size 16] [--resamples 2000] [--seed 0] [--check-against-decoder N] [--no-requests]

Every argument is checked before a model loads (exit 2 with ``error: ...``). The output file holds
``{"drafts": {name: evaluate_drafts result}}``; one line per draft is printed at the end (overall acceptance
length with its interval, per set, and the decoder check when asked).
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from eagle3.errors import ConfigError, DataError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                  help="Replay acceptance of EAGLE-3 drafts (greedy chain decoding) on whole prompt sets.")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def parse_drafts(specs: List[str]) -> dict[str, Path]:
    """``["NAME=DIR", ...]`` → ``{NAME: Path(DIR)}``; raises ConfigError for a malformed or repeated name."""
    out: dict[str, Path] = {}
    for s in specs:
        name, sep, path = s.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--draft: expected NAME=DIR, got {s!r}")
        if name in out:
            raise ConfigError(f"--draft: name {name!r} given twice ({out[name]} and {path})")
        out[name] = Path(path)
    return out


def _line(name: str, r: dict) -> str:
    o = r["overall"]
    sets = ", ".join(f"{s} {g['acceptance_length']:.3f}" for s, g in r["per_set"].items())
    text = (f"{name}: acceptance length {o['acceptance_length']:.3f} [{o['ci']['low']:.3f}, {o['ci']['high']:.3f}] "
            f"over {o['num_requests']} requests ({sets}); replay {r['wall_s']['replay']:.1f} s")
    check = r.get("decoder_check")
    if check:
        text += f"; decoder check: {check['equal']}/{check['n']} equal"
        if check["different"]:
            text += f", different: {[d['id'] for d in check['different']]}"
    return text


@app.command()
def run(target: Path = typer.Option(..., "--target", help="HF target folder"),
        draft: List[str] = typer.Option(..., "--draft", help="NAME=DIR of an SGLang-format draft (repeatable)"),
        sets: str = typer.Option(",".join(("mtbench2", "gsm8k200")), "--sets",
                                 help="comma list: mtbench2, mtbench, gsm8k, gsm8k<N>, humaneval or files"),
        out: Path = typer.Option(..., "--out", help="JSON file to write"),
        max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
        num_steps: int = typer.Option(3, "--num-steps", help="draft tokens per verify pass (chain, topk 1)"),
        dtype: str = typer.Option("float32", "--dtype"), device: str = typer.Option("auto", "--device"),
        batch_size: int = typer.Option(16, "--batch-size"), resamples: int = typer.Option(2000, "--resamples"),
        seed: int = typer.Option(0, "--seed"),
        check_against_decoder: int = typer.Option(0, "--check-against-decoder",
                                                  help="also decode N requests with SpeculativeDecoder and compare"),
        no_requests: bool = typer.Option(False, "--no-requests", help="leave per-request rows out of the file"),
        quiet: bool = typer.Option(False, "--quiet", help="no progress bars")) -> None:
    """Replay acceptance of every --draft on --sets; writes --out."""
    from eagle3.artifacts import atomic_write_json
    from eagle3.measure.replay import check_arguments, evaluate_drafts

    names = [s.strip() for s in sets.split(",") if s.strip()]
    try:
        drafts = parse_drafts(draft)
        if out.is_dir() or not out.parent.is_dir():
            raise ConfigError(f"--out {out}: expected a file path in an existing folder")
        check_arguments(target, drafts, names, max_new_tokens, num_steps, dtype, device, batch_size, resamples,
                        check_against_decoder)
    except (ConfigError, DataError) as e:
        _fail(str(e))
    from eagle3.errors import EngineUnsupported

    try:  # what only the loaded models can show (a draft this replay cannot run, a prompt past the context)
        result = evaluate_drafts(target, drafts, prompt_sets=names, max_new_tokens=max_new_tokens,
                                 num_steps=num_steps, dtype=dtype, device=device, batch_size=batch_size,
                                 resamples=resamples, seed=seed, check_against_decoder=check_against_decoder,
                                 include_requests=not no_requests, progress=not quiet)
    except (ConfigError, DataError, EngineUnsupported) as e:
        _fail(str(e))
    atomic_write_json(out, {"drafts": result})
    for name, r in result.items():
        typer.echo(_line(name, r))
    typer.echo(f"wrote {out}")


def main() -> int:
    """Entry of ``python -m eagle3.measure.replay_cli``: runs the typer app; returns its exit code."""
    try:
        app()
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
