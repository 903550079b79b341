"""The ``eagle3`` command line (typer). Each command is a thin call into the library or a flow.

Exit codes: 0 success; 1 the command ran and found a problem (invalid checkpoint, gate verdict other
than ready, acceptance below the minimum, a failed stage); 2 usage error or unreadable input.
Commands import ``flows``, ``tasks`` and the heavy parts of the library lazily, so ``eagle3 --help``
and the file-only commands start fast and never start Prefect.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import List, Optional

import typer

from eagle3.config import (BENCH_MAX_NEW_TOKENS, BENCH_NUM_PROMPTS, BENCH_PROMPTS,
                           BENCH_REQUEST_TIMEOUT_S, GATE_POLL_INTERVAL_S,
                           GATE_PROBE_TIMEOUT_S, GATE_STALL_TIMEOUT_S, GATE_TIMEOUT_S)
from eagle3.errors import ConfigError, DataError, Eagle3Error, EngineUnsupported

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="EAGLE-3 draft models from extraction to a served, measured draft.")

OverridesOpt = typer.Option(None, "-o", "--override", help="section.key=value (repeatable)")


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _run_flow(stage: str, config: Path, overrides: Optional[List[str]]) -> None:
    from eagle3.config import load_config

    try:
        cfg = load_config(config, overrides)  # fail fast on a bad config, before Prefect starts
        from eagle3.device_checks import check_devices

        check_devices(cfg)  # a GPU config on a machine without the GPU, before Prefect starts
        if stage in ("pipeline", "extract"):
            from eagle3.extract.precheck import check_before_run

            check_before_run(cfg)
        # lazy: Prefect is imported only for commands that run a flow
        from cli.run import check_target, run_flow_cli, stop_grace_s

        check_target(cfg)  # a target folder that is not there, before Prefect starts
        stop_grace_s()  # $EAGLE3_STOP_GRACE_S, checked before Prefect starts
    except ConfigError as e:
        _fail(str(e), 2)

    try:
        summary = run_flow_cli(stage, str(config), list(overrides or []))
    except Eagle3Error as e:
        _fail(f"{stage} failed: {type(e).__name__}: {e}", 1)
    if summary:
        typer.echo(summary)


@app.command()
def prepare(config: Path = typer.Argument(..., help="YAML run config"),
            override: Optional[List[str]] = OverridesOpt):
    """Prepare the real assets CONFIG needs (target model folder, conversations) in the cache;
    idempotent."""
    from eagle3.assets import resolve_target
    from eagle3.config import load_config
    from eagle3.extract.plan import data_source_path

    import logging

    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("eagle3").setLevel(logging.INFO)  # what a preparation kept and left out
    try:
        cfg = load_config(config, override)
        target = resolve_target(cfg)
        data = data_source_path(cfg)[1]
    except (ConfigError, DataError, OSError) as e:
        _fail(str(e), 2)
    typer.echo(f"target: {target}\ndata:   {data}\ncache:  {cfg.paths.resolved_cache_dir()}")


@app.command()
def regenerate(config: Path = typer.Argument(..., help="YAML run config (data.* selects the "
                                                       "conversations)"),
               out: Path = typer.Option(..., "--out", help="JSONL file to write (+ "
                                                           "<out>.manifest.json)"),
               override: Optional[List[str]] = OverridesOpt):
    """Regenerate the assistant turns of CONFIG's conversations with the target itself, once, into a
    file that many runs can share (-o data.source=file -o data.path=OUT). Uses data.regenerate
    (default hf; sglang serves the target with serve.* for it, or asks data.regenerate_url)."""
    from eagle3.config import load_config
    from eagle3.extract.regen import regenerate_file

    import logging

    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("eagle3").setLevel(logging.INFO)  # the server launched, chunks saved
    if out.resolve() == config.resolve():
        _fail(f"--out {str(out)!r}: expected a new file, got CONFIG itself", 2)
    note = "data.regenerate is none: regenerating with hf (the target in this process)"
    try:
        try:
            cfg = load_config(config, override)
        except ConfigError as e:  # data.source instructions needs a mode at load time
            if "DATA_NO_ANSWERS" not in str(e):
                raise
            cfg = load_config(config, [*(override or []), "data.regenerate=hf"])
            typer.echo(note)
        if cfg.data.regenerate == "none":
            typer.echo(note)
            cfg.data.regenerate = "hf"
        m = regenerate_file(cfg, out)
    except (Eagle3Error, OSError) as e:
        _fail(str(e), 2)
    except KeyboardInterrupt:
        _fail("interrupted: the finished chunks are kept; the same command goes on from them", 130)
    t, c = m["regeneration"]["turns"], m["counts"]
    typer.echo(f"regenerated {c['regenerated']} of {t['input']} assistant turns ({t['failed']} "
               f"failed, {t['skipped']} skipped, {t['empty']} blank, {t['truncated']} truncated) "
               f"in {m['seconds']:.1f} s -> {out}: {c['conversations']} conversations holding "
               f"{c['regenerated_in_file']} of them"
               + (f"; {gone} conversations with a blank assistant turn left out"
                  if (gone := c["unanswered_left_out"]) else ""))


@app.command()
def run(config: Path = typer.Argument(..., help="YAML run config"),
        override: Optional[List[str]] = OverridesOpt):
    """Run the whole pipeline (extract → train → convert+validate → deploy → bench) as the Prefect
    flow."""
    _run_flow("pipeline", config, override)


@app.command()
def extract(config: Path, override: Optional[List[str]] = OverridesOpt):
    """Run the extraction stage of CONFIG."""
    _run_flow("extract", config, override)


@app.command()
def train(config: Path, override: Optional[List[str]] = OverridesOpt):
    """Run the training stage of CONFIG (extraction must have run)."""
    _run_flow("train", config, override)


@app.command()
def deploy(config: Path, override: Optional[List[str]] = OverridesOpt):
    """Deploy the converted draft of CONFIG behind the readiness gate, benchmark it, and shut it
    down."""
    _run_flow("deploy", config, override)


@app.command()
def convert(args: List[str] = typer.Argument(..., help="CONFIG (pipeline stage) or SRC DST "
                                                       "(stand-alone)"),
            to: str = typer.Option("sglang", "--to", help="Serving engine format"),
            target: Optional[Path] = typer.Option(None, "--target", help="Target model folder "
                                                                         "(config.json)"),
            override: Optional[List[str]] = OverridesOpt):
    """Convert a draft: 'eagle3 convert CONFIG' (stage) or 'eagle3 convert SRC DST --to
    sglang'."""
    if len(args) == 1:
        _run_flow("convert", Path(args[0]), override)
        return
    if len(args) != 2:
        _fail(f"convert: expected CONFIG or SRC DST, got {len(args)} arguments", 2)
    from eagle3.convert.stage import convert as do_convert
    from eagle3.errors import CheckpointInvalid

    src, dst = Path(args[0]), Path(args[1])
    problems: list = []
    try:
        # validates once; DST only if valid
        # the CLI prints the recorded warnings below, once each
        manifest = do_convert(src, dst, engine=to, target_dir=target, log_warnings=False)
    except CheckpointInvalid as e:
        problems = e.problems or [e]
        manifest = None
    except (ConfigError, DataError, EngineUnsupported, OSError) as e:
        _fail(str(e), 2)
    except (ValueError, TypeError, KeyError) as e:  # a malformed field in SRC's config or tensors
        _fail(f"{src}: unreadable draft ({type(e).__name__}: {e})", 2)
    except Eagle3Error as e:
        _fail(f"{type(e).__name__}: {e}", 1)
    for p in problems:
        typer.echo(str(p))
    for w in ((manifest or {}).get("validation") or {}).get("warnings") or []:
        typer.echo(f"warning: {w}", err=True)
    if manifest is None:
        typer.echo(f"not converted: {src} fails validation for {to} ({len(problems)} problem(s)); "
                   f"{dst} not written")
    else:
        typer.echo(f"converted {src} -> {dst} ({to}); 0 problem(s); content "
                   f"{manifest['content_hash'][:12]}")
    raise typer.Exit(1 if problems else 0)


@app.command()
def validate(
    directory: Path = typer.Argument(..., help="Draft checkpoint directory"),
    target: Optional[Path] = typer.Option(None, "--target", help="Target model folder"),
    data: Optional[Path] = typer.Option(None, "--data", help="Extraction output folder "
                                        "(manifest.json, token_freq.pt) or a conversations file "
                                        "(JSON/JSONL/.txt, tokenized with --target's tokenizer): "
                                        "compared with the draft, and the share of its target "
                                        "tokens the draft vocabulary holds"),
):
    """Check a draft against the SGLang profile. Exit 0 valid, 1 problems (one 'CODE: message' per
    line), 2 I/O. Warnings ('warning: CODE: message') go to stderr and do not fail."""
    from eagle3.convert.coverage import read_data
    from eagle3.convert.validate import validate_report

    if data is not None and not data.exists():
        _fail(f"--data {data}: not found; expected an extraction output folder or a "
              "conversations file", 2)
    try:
        data_manifest, counts, uncounted = (read_data(data, target) if data is not None
                                            else (None, None, None))
        found = validate_report(directory, target_dir=target, data_manifest=data_manifest,
                                token_counts=counts)
    except (ConfigError, DataError, EngineUnsupported, OSError) as e:
        _fail(str(e), 2)
    if uncounted:
        typer.echo(f"note: {uncounted}", err=True)
    problems = found.problems
    for p in problems:
        typer.echo(str(p))
    for w in found.warnings:
        typer.echo(f"warning: {w}", err=True)
    if "vocab_coverage" in found.figures:
        f = found.figures
        typer.echo(f"vocab coverage: {f['vocab_coverage']:.1%} of {f['tokens_counted']} target "
                   f"tokens in {data}", err=True)
    if not problems:
        typer.echo(f"{directory}: valid for sglang")
    raise typer.Exit(1 if problems else 0)


@app.command("wait-ready")
def wait_ready(url: str = typer.Option(..., "--url"),
               pid: Optional[int] = typer.Option(None, "--pid", help="Server process id (crash and "
                                                                     "CPU-time signals)"),
               log: Optional[Path] = typer.Option(None, "--log", help="Server log file (growth is "
                                                                      "a progress signal)"),
               stall_timeout: float = typer.Option(GATE_STALL_TIMEOUT_S, "--stall-timeout",
                                                   help="seconds without progress → stalled"),
               timeout: float = typer.Option(GATE_TIMEOUT_S, "--timeout", help="overall deadline, "
                                                                               "seconds"),
               poll_interval: float = typer.Option(GATE_POLL_INTERVAL_S, "--poll-interval"),
               probe_timeout: float = typer.Option(GATE_PROBE_TIMEOUT_S, "--probe-timeout",
                                                   help="deadline of the generation probe, s"),
               diagnostics: Optional[Path] = typer.Option(
                   None, "--diagnostics", help="where to save stack dumps and logs")):
    """Wait until a server is really ready; exit 0 ready, 1 crashed/stalled/timed out, 2 bad
    arguments."""
    import psutil

    from eagle3.serve.readiness import wait_ready as do_wait

    if pid is not None and not psutil.pid_exists(pid):
        _fail(f"wait-ready: --pid: expected a running process, got {pid} (no such process)", 2)
    if log is not None and not log.is_file():
        _fail(f"wait-ready: --log: expected the server's log file, got {str(log)!r} (not a "
              "file)", 2)
    if diagnostics is not None:
        try:  # made now, so a folder that cannot be made is a bad argument, not a late traceback
            diagnostics.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            _fail(f"wait-ready: --diagnostics: expected a folder that can be made, got "
                  f"{str(diagnostics)!r} ({e.strerror or e})", 2)
    try:
        result = do_wait(url, pid=pid, log_path=log, timeout_s=timeout,
                         stall_timeout_s=stall_timeout,
                         poll_interval_s=poll_interval, probe_timeout_s=probe_timeout,
                         diagnostics_dir=diagnostics)
    except ConfigError as e:
        _fail(f"wait-ready: {e}", 2)
    typer.echo(result.summary())
    raise typer.Exit(0 if result.verdict == "ready" else 1)


@app.command()
def bench(
    config: Optional[Path] = typer.Argument(None, help="CONFIG runs the pipeline's deploy+bench "
                                            "stage"),
    url: Optional[str] = typer.Option(None, "--url", help="A running SGLang-compatible server"),
    prompts: str = typer.Option(BENCH_PROMPTS, "--prompts",
                                help="mtbench | gsm8k | humaneval | FILE"),
    num_prompts: int = typer.Option(BENCH_NUM_PROMPTS, "--num-prompts"),
    max_new_tokens: int = typer.Option(BENCH_MAX_NEW_TOKENS, "--max-new-tokens"),
    temperature: float = typer.Option(0.0, "--temperature"),
    concurrency: int = typer.Option(1, "--concurrency"),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer",
                                             help="Folder with the target's tokenizer"),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for report.json and plots"),
    baseline_url: Optional[str] = typer.Option(None, "--baseline-url",
                                               help="Same target without speculation"),
    chat_template_kwargs: Optional[str] = typer.Option(
        None, "--chat-template-kwargs", help='Template switches as JSON, e.g. '
        '\'{"enable_thinking": false}\' (the ones the draft was trained with)'),
    request_timeout: float = typer.Option(
        BENCH_REQUEST_TIMEOUT_S, "--request-timeout",
        help="Seconds one request may take before the benchmark fails (a server that never "
        "answers /generate)"),
    override: Optional[List[str]] = OverridesOpt,
):
    """Measure acceptance length against --url, or run the bench stage of CONFIG."""
    if config is not None:
        _run_flow("deploy", config, override)
        return
    if not url:
        _fail("bench: give CONFIG or --url URL", 2)
    if override:  # --url mode reads no config: an override would change nothing
        _fail(f"bench: -o/--override {override} is not used with --url (it overrides a CONFIG's "
              "settings; --url measures with the flags: --prompts, --num-prompts, "
              "--max-new-tokens, --temperature, --concurrency, --tokenizer, --request-timeout)", 2)
    from eagle3.measure.bench import no_speculative_fields, run_bench

    try:
        kwargs = json.loads(chat_template_kwargs) if chat_template_kwargs else None
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ValueError(f"expected a JSON object, got {type(kwargs).__name__}")
    except ValueError as e:
        _fail("bench: --chat-template-kwargs: expected a JSON object, got "
              f"{chat_template_kwargs!r} ({e})", 2)
    if not (math.isfinite(request_timeout) and request_timeout > 0):
        _fail(f"bench: --request-timeout: expected a finite number of seconds > 0, got "
              f"{request_timeout}", 2)
    try:
        report = run_bench(url, prompts=prompts, num_prompts=num_prompts,
                           max_new_tokens=max_new_tokens,
                           temperature=temperature, concurrency=concurrency,
                           tokenizer_dir=tokenizer, out_dir=out,
                           baseline_url=baseline_url, chat_template_kwargs=kwargs,
                           request_timeout_s=request_timeout)
    except (ConfigError, DataError, OSError) as e:
        _fail(str(e), 2)
    except Eagle3Error as e:
        import httpx

        if isinstance(e.__cause__, httpx.ConnectError):  # nothing listens there
            try:
                where = e.__cause__.request.url.copy_with(path="/", query=None)
            except RuntimeError:  # no request attached
                where = url
            _fail(f"bench: no server at {str(where).rstrip('/')} ({e}); start one, or check "
                  "--url / --baseline-url", 1)
        coded = re.match(r"[A-Z][A-Z0-9_]+: ", str(e))  # the message names its own code
        _fail(str(e) if coded else f"{type(e).__name__}: {e}", 1)
    for w in report.get("summary", {}).get("warnings") or []:  # measured, but something unchecked
        typer.echo(f"warning: {w}", err=True)
    typer.echo(json.dumps(report.get("summary", report), indent=2, default=str))
    nothing = no_speculative_fields(report)
    if nothing:  # the report is written, but no acceptance was measured: not a success
        _fail(nothing, 1)


@app.command()
def preflight(config: Path = typer.Argument(..., help="YAML run config"),
              override: Optional[List[str]] = OverridesOpt):
    """Check CONFIG's launch before any engine starts: aux capture of the target's class in the
    engine, memory on the GPUs the launch will use, the settings the engine will really run, the
    environment, template switches. Uses the run's converted draft and extraction when they exist
    (else the draft is sized from the config). Exit 0 passed, 1 problems (one 'CODE: message' a
    line), 2 bad config or unreadable input."""
    from eagle3.config import load_config

    try:
        from eagle3.serve.preflight import preflight_of_run

        from eagle3.device_checks import device_problems

        cfg = load_config(config, override)
        from tasks.stage_config import output_dirs

        dirs = output_dirs(cfg)  # the folders of this config's settings
        report = preflight_of_run(cfg, dirs["serving"], dirs["extract"])
        # listed as a failed check, the others still run; serve.device once (the memory check's)
        named = {p.message.split(":", 1)[0] for p in report.problems if p.code == "DEVICE_MISSING"}
        missing = [m for m in device_problems(cfg) if m.split(":", 1)[0] not in named]
        if missing:
            from eagle3.convert.checkpoint import Problem
            from eagle3.serve.preflight import Check

            report.checks.insert(0, Check("devices", "failed", f"{len(missing)} device(s) "
                                          "this machine does not have (DEVICE_MISSING below)"))
            report.problems[:0] = [Problem("DEVICE_MISSING", m) for m in missing]
    except (ConfigError, DataError, EngineUnsupported, OSError) as e:
        _fail(str(e), 2)
    for line in report.lines():
        typer.echo(line)
    typer.echo(f"pre-flight {'passed' if report.passed else 'failed'} for serve.engine "
               f"{report.engine}")
    raise typer.Exit(0 if report.passed else 1)


@app.command()
def decide(run_id: str = typer.Argument(..., help="MLflow run id of a pipeline (parent) run or a "
                                                  "sweep"),
           tracking_uri: Optional[str] = typer.Option(
               None, "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else "
                                            "sqlite:///runs/mlflow.db "
               "under the current directory)")):
    """Print the recorded "more data / longer training / fix serving / stop" recommendation of a
    run."""
    from tasks.reports import decision_text  # lazy: reads MLflow

    if not run_id.strip():
        _fail("RUN_ID: expected an MLflow run id (32 hex digits), got an empty string", 2)
    if tracking_uri is not None and not tracking_uri.strip():
        _fail("--tracking-uri: expected an MLflow store URI (e.g. sqlite:///runs/mlflow.db), "
              "got an empty string; leave the option out for the default store", 2)
    try:
        typer.echo(decision_text(run_id, tracking_uri))
    except Eagle3Error as e:
        _fail(str(e), 1)


@app.command()
def doctor(sglang_python: Optional[str] = typer.Option(
        None, help="The interpreter that serves SGLang (a config's serve.sglang_python): its "
                   "version against the pinned releases")):
    """Check the environment: torch and device, SGLang, free disk, Prefect and MLflow servers."""
    from eagle3.doctor import run_doctor

    ok = run_doctor(echo=typer.echo, sglang_python=sglang_python)
    raise typer.Exit(0 if ok else 1)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
