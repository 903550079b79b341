"""Reports read back from MLflow: ``eagle3 decide RUN_ID`` (the recorded recommendation of a
pipeline (parent) run or a sweep) and a sweep's comparison table and markdown report.

The decision step of a flow stores ``Decision.tags()`` as ``eagle3.decision*`` tags and
``decision.md`` / ``decision.json`` as artifacts of the parent run; this reads them back. The
tracking store is ``$MLFLOW_TRACKING_URI`` when set, else the default local store
``sqlite:///<runs_dir>/mlflow.db`` of the default config (``runs/`` under the working directory).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from eagle3.config import RunConfig
from eagle3.errors import DataError

SWEEP_TAG = "eagle3.sweep_run_id"  # tag of a sweep point's parent run: the sweep's run id


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else ``RunConfig().mlflow_uri()``
    (``sqlite:///<cwd>/runs/mlflow.db``)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or RunConfig().mlflow_uri()


# stores the pipeline reads: SQLite (the default), an MLflow server, and the database servers of
# MLflow's SQLAlchemy store (a "+driver" suffix is allowed)
STORE_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql")


def _check_store(uri: str) -> None:
    """Refuse, with the URI named and what was expected, a store that cannot answer: a plain path
    or a ``file:`` URI (MLflow's retired file store), a scheme that is not a store
    (:data:`STORE_SCHEMES`), a SQLite file that does not exist (MLflow
    would create an empty one), an HTTP server that does not answer within 5 s (MLflow would retry
    for minutes)."""
    if "://" not in uri:
        hint = (f"sqlite:///{Path(uri).expanduser().resolve()}" if uri.endswith(".db")
                else "sqlite:///<path>/mlflow.db")
        raise DataError(f"MLflow store {uri!r}: expected a URI such as {hint} or "
                        "http://host:port, got a plain path")
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower()
    if scheme not in STORE_SCHEMES:
        raise DataError(f"MLflow store {uri}: expected a URI of scheme "
                        f"{', '.join(STORE_SCHEMES)} (e.g. sqlite:///<project>/runs/mlflow.db), "
                        f"got {scheme!r}" + (" (MLflow's retired file store)"
                                             if scheme == "file" else ""))
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        # MLflow would create an empty store there and then report the run as unknown
        raise DataError(f"MLflow store {uri}: no such database file; expected the store the "
                        "pipeline printed (eagle3 decide --tracking-uri, flows.sweep -o "
                        "tracking.mlflow_uri=, or MLFLOW_TRACKING_URI), "
                        "e.g. sqlite:///<project>/runs/mlflow.db")
    if uri.startswith("sqlite:///"):
        _check_sqlite_store(uri, Path(uri[len("sqlite:///"):]))
    if uri.startswith(("http://", "https://")):
        import httpx

        try:
            httpx.get(uri.rstrip("/") + "/health", timeout=5.0)
        except httpx.HTTPError as e:
            raise DataError(f"MLflow server {uri}: not reachable ({type(e).__name__}: {e}); "
                            f"expected a running tracking server (e.g. `make stack-up`)") from e


def _check_sqlite_store(uri: str, path: Path) -> None:
    """DataError unless ``path`` is an SQLite database holding MLflow's ``experiments`` and
    ``runs`` tables, read without writing (MLflow would add its schema to any database)."""
    import sqlite3

    with open(path, "rb") as f:
        head = f.read(16)
    if head != b"SQLite format 3\x00":
        got = f"a file starting {head[:12]!r}" if head else "an empty file"
        raise DataError(f"MLflow store {uri}: expected an SQLite database (a file starting "
                        f"'SQLite format 3'), got {got}")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error as e:
        raise DataError(f"MLflow store {uri}: not readable as SQLite ({e})") from e
    if not {"experiments", "runs"} <= tables:
        raise DataError(f"MLflow store {uri}: expected MLflow's tables (experiments, runs), found "
                        f"{sorted(tables)[:6] or 'none'}: another program's database, not the "
                        "store the pipeline printed")


def decision_text(run_id: str, tracking_uri: str | None = None) -> str:
    """The decision of ``run_id`` as text: the recommendation, its rule, the evidence
    (``decision.md``) and the acceptance lengths on the run (served, untrained, offline, simulated);
    for a sweep run also the table of its points (:func:`sweep_table`). Raises DataError when the
    run is unknown or has no decision yet."""
    uri = tracking_uri or default_tracking_uri()
    _check_store(uri)
    # a text command: no progress bars
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as e:
        hint = "" if tracking_uri else (" (the default store; pass --tracking-uri or set "
                                        "MLFLOW_TRACKING_URI?)")
        raise DataError(f"MLflow run {run_id!r} not found in {uri}{hint}: {e}") from e
    tags = run.data.tags
    if "eagle3.decision" not in tags:
        parent = tags.get("mlflow.parentRunId")
        if tags.get("eagle3.stage") and parent:
            raise DataError(f"MLflow run {run_id} is the {tags['eagle3.stage']} stage run of "
                            f"pipeline run {parent}; "
                            f"expected a pipeline (parent) or sweep run id: eagle3 decide {parent}")
        raise DataError(f"MLflow run {run_id} in {uri} has no eagle3.decision tag "
                        f"(status {run.info.status}; error: {tags.get('eagle3.error', 'none')}): "
                        f"the flow did not reach its decision step")
    where = f"decision.md of {run.info.artifact_uri}"
    try:
        body = client.download_artifacts(run_id, "decision.md")
        text = Path(body).read_text(encoding="utf-8").rstrip()
        if not text:
            text = _decision_from_tags(tags, f"{where}: an empty file")
    except (MlflowException, OSError, UnicodeDecodeError) as e:
        first = (str(e).splitlines() or [""])[0][:160]
        text = _decision_from_tags(tags, f"{where}: {type(e).__name__}: {first}")
    m = run.data.metrics
    lines = [text, ""]
    for key, label in (("acceptance_length", "trained draft"), ("acceptance_length_untrained",
                                                                "untrained baseline"),
                       ("acceptance_length_offline", "offline (in-process)"),
                       ("acceptance_length_simulated", "simulated (training validation)")):
        if key in m:
            lines.append(f"acceptance length, {label}: {m[key]:.3f}")
    if tags.get("prefect.flow_name") == "eagle3-sweep":
        lines += ["", "Sweep points (from MLflow; acceptance lengths count the bonus token; "
                  "dev_curve: first@step → best@step → last@step of the development "
                  "acceptance):", "",
                  format_table(sweep_table(run_id, uri)), ""]
    lines.append(f"MLflow run {run_id} ({run.info.status}) in {uri}")
    return "\n".join(lines)


TABLE_COLUMNS = ("data", "data_size", "schedule", "unique_tokens", "epochs_over_data",
                 "optimizer_steps", "simulated", "dev", "dev_curve", "served", "offline",
                 "offline_eval", "offline_eval_ci", "offline_gsm8k", "registered_model", "run_id")
DEV_CURVE_KEY = "dev/acceptance_length"  # logged by the train stage at each evaluation


def dev_curve(history: list[tuple[int, float]], prompts: float | None = None) -> str | None:
    """``"first@step → best@step → last@step"`` of a measured development-acceptance curve
    (``[(optimizer step, acceptance length)]``), with `` (N prompts)`` when ``prompts`` is given,
    or None for no curve: whether it still rose, or peaked and fell, in one cell."""
    if not history:
        return None
    best = max(history, key=lambda p: (p[1], -p[0]))  # the earliest of equal maxima
    return (" → ".join(f"{v:.3f}@{s}" for s, v in (history[0], best, history[-1]))
            + (f" ({int(prompts)} prompt{'' if int(prompts) == 1 else 's'})" if prompts else ""))


def _ci(metrics: dict, prefix: str) -> str | None:
    lo, hi = metrics.get(f"{prefix}.ci_low"), metrics.get(f"{prefix}.ci_high")
    return None if lo is None or hi is None else f"{lo:.3f}–{hi:.3f}"


def _stage_figure(run_id: str, tracking_uri: str, key: str) -> float | None:
    """The last value of ``key`` on the point's train stage run (the producing run when cached),
    or None."""
    from tasks.tracking import stage_metric_history

    history = stage_metric_history(run_id, "train", key, tracking_uri)
    return history[-1][1] if history else None


def _dev_history(run_id: str, tracking_uri: str) -> tuple[list[tuple[int, float]], float | None]:
    """The development-acceptance history a point's train stage logged, and its prompt count."""
    from tasks.tracking import stage_metric_history

    history = stage_metric_history(run_id, "train", DEV_CURVE_KEY, tracking_uri)
    counts = stage_metric_history(run_id, "train", "dev/num_prompts", tracking_uri) if history \
        else []
    return history, counts[-1][1] if counts else None


def _decision_from_tags(tags: dict[str, str], why: str) -> str:
    """The decision as the run's ``eagle3.decision*`` tags hold it (``Decision.tags``), when its
    ``decision.md`` artifact cannot be read (``why``): a store copied from another machine keeps
    the artifact paths of that machine. Says so, then lists the evidence tags."""
    prefix = "eagle3.decision."
    lines = [f"# Decision: **{tags['eagle3.decision']}**", "",
             f"Rule: `{tags.get(prefix + 'rule')}` (confidence: "
             f"{tags.get(prefix + 'confidence', 'not recorded')})", "",
             f"The decision's text could not be read ({why}); the evidence as the run's tags "
             "hold it:", ""]
    lines += [f"- {k[len(prefix):]}: {v}" for k, v in sorted(tags.items())
              if k.startswith(prefix) and k[len(prefix):] not in ("rule", "confidence")]
    return "\n".join(lines)


def sweep_table(sweep_run_id: str, tracking_uri: str) -> list[dict]:
    """The sweep's points as read back from MLflow: every run tagged ``eagle3.sweep_run_id = <sweep
    run>`` and FINISHED, sorted by (data variant, data size, schedule). Each row has
    :data:`TABLE_COLUMNS` — data variant, data size (conversations), schedule, unique training
    tokens, epochs over the data, optimizer steps, and the acceptance lengths (bonus token counted):
    simulated (training validation), dev (measured in training on the development prompts, the
    exported checkpoint's) and ``dev_curve`` (:func:`dev_curve` of the train stage's
    ``dev/acceptance_length`` history), served (engine, bench prompts), offline (in-process, the
    same bench prompts), offline_eval (in-process on the sweep's first evaluation set, all prompts,
    with its bootstrap interval ``offline_eval_ci``), offline_gsm8k — plus ``point``, ``run_dir``,
    ``eval_primary`` and per-set figures ``eval`` {set: {...}} (``turn1.acceptance_length`` ... for
    sets of several turns). Raises DataError when the sweep run is unknown."""

    from eagle3.train.metrics import FIRST_KEY

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        exp = client.get_run(sweep_run_id).info.experiment_id
    except MlflowException as e:
        raise DataError(f"MLflow run {sweep_run_id!r} not found in {tracking_uri}: {e}") from e
    rows = []
    for r in client.search_runs([exp], filter_string=f"tags.`{SWEEP_TAG}` = '{sweep_run_id}'",
                                max_results=1000):
        if r.info.status != "FINISHED":
            continue
        m, t = r.data.metrics, r.data.tags
        sets = sorted({k.split(".")[1] for k in m
                       if k.startswith("offline.") and k.endswith(".acceptance_length")})
        first = t.get("eagle3.sweep.eval_primary") or (sets[0] if sets else None)
        gsm = next((s for s in sets if s.startswith("gsm8k")), None)
        rows.append({"data": t.get("eagle3.sweep.data", "as-is"),
                     "point": t.get("eagle3.sweep.point"),
                     "data_size": int(t.get("eagle3.sweep.data_size", 0)),
                     "schedule": t.get("eagle3.sweep.schedule"),
                     "unique_tokens": m.get("sweep.unique_tokens"),
                     "epochs_over_data": m.get("sweep.epochs_over_data"),
                     "optimizer_steps": m.get("sweep.optimizer_steps"),
                     "simulated": m.get("acceptance_length_simulated"),
                     "simulated_first": _stage_figure(r.info.run_id, tracking_uri, FIRST_KEY),
                     "dev": m.get("acceptance_length_dev"),
                     "dev_all_positions": _stage_figure(r.info.run_id, tracking_uri,
                                                        "dev_acceptance_length_all_positions"),
                     # fixed for a run: its draft vocabulary and its development continuations
                     "dev_out_of_vocab": _stage_figure(r.info.run_id, tracking_uri,
                                                       "dev/out_of_draft_vocab_share"),
                     # no validation split (a tiny size): simulated on the training data
                     "simulated_on_train_split": _stage_figure(
                         r.info.run_id, tracking_uri, "val/on_train_split") == 1.0,
                     "dev_curve": dev_curve(*_dev_history(r.info.run_id, tracking_uri)),
                     "served": m.get("acceptance_length"),
                     "offline": m.get("acceptance_length_offline"),
                     "offline_eval": m.get(f"offline.{first}.acceptance_length") if first else None,
                     "offline_eval_ci": _ci(m, f"offline.{first}") if first else None,
                     "offline_gsm8k": m.get(f"offline.{gsm}.acceptance_length") if gsm else None,
                     "eval_primary": first,
                     "eval": {s: {k.split(".", 2)[2]: v for k, v in m.items()
                                  if k.startswith(f"offline.{s}.")}
                              for s in sets},
                     "registered_model": t.get("eagle3.registered_model"), "run_id": r.info.run_id,
                     "run_dir": t.get("eagle3.run_dir")})
    return sorted(rows, key=lambda x: (x["data"], x["data_size"], x["schedule"] or ""))


def format_table(rows: list[dict]) -> str:
    """:func:`sweep_table` rows as a markdown table (acceptance lengths to 3 decimals, epochs to 2;
    a simulated figure taken on the training data, with no validation split, marked so)."""
    def cell(k, v):
        if v is None:
            return "n/a"
        if k in ("unique_tokens", "optimizer_steps", "data_size"):
            return f"{int(v):,}"
        if k == "epochs_over_data":
            return f"{v:.2f}"
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    def marked(r, k):
        return cell(k, r.get(k)) + (" (train split)" if k == "simulated" and r.get(k) is not None
                                    and r.get("simulated_on_train_split") else "")
    head = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    return "\n".join(head + ["| " + " | ".join(marked(r, k) for k in TABLE_COLUMNS) + " |"
                             for r in rows])


GAP_NOTE = ("Each step left to right changes one thing. Simulated: teacher-forced on the data's "
            "own answers, averaged over every answer position. Simulated, first tokens: the same "
            "over the starts among each answer's first 64 tokens, the span the development "
            "measurement decodes (answer position: long answers that loop weigh their easy "
            "tokens). Development, every position: the "
            "exact replay of the target's own greedy continuations of held-out first turns, "
            "still averaged over every position a verify pass could start at (text and "
            "scoring). Development: the same replay counted per verify pass, as decoding visits "
            "positions — it jumps past the tokens a pass accepts, so easy stretches get fewer "
            "passes than their length (position sampling). Then the evaluation set's first turns "
            "(prompts) and second turns (turn position: a context holding the target's first "
            "answer). A positive difference is acceptance lost at that step; the three parts of "
            "simulated − development add up to it. Outside the vocabulary: the share of the "
            "development continuations' tokens the draft can never propose (training scores "
            "them against the target's best token inside the draft vocabulary). Acceptance "
            "lengths count the bonus token; "
            "n/a: not measured for that point (the turns and GSM8K: an offline evaluation, "
            "flows.sweep --eval-sets; every position: logged by training since it was added).")


def gap_table(rows: list[dict]) -> str:
    """Markdown: where simulated and measured acceptance part, per :func:`sweep_table` row —
    simulated, simulated over answers' first tokens, development over every position,
    development, the primary evaluation set's turn 1 and turn 2, GSM8K, and the differences
    (simulated − development, split into answer position = simulated − simulated over the first
    tokens, text and scoring = that − development over every position, and position sampling =
    development over every position − development; prompts = development − turn 1; turn
    position = turn 1 − turn 2), and the share of the development tokens outside the draft
    vocabulary, with :data:`GAP_NOTE` above it. A point without the first-tokens figure (trained
    before it was logged) has its answer position n/a and text and scoring from simulated."""
    def f(v):
        return "n/a" if v is None else f"{v:.3f}"

    def diff(a, b):  # of the figures as shown, so the parts add up to the whole
        return "n/a" if a is None or b is None else f"{round(a, 3) - round(b, 3):+.3f}"

    primary = next((r["eval_primary"] for r in rows if r.get("eval_primary")), "eval")
    head = [f"| point | simulated | simulated, first tokens | development, every position | "
            f"development | {primary} turn 1 | {primary} turn 2 | GSM8K | "
            "simulated − development | answer position | text and scoring | position sampling | "
            "prompts | turn position | outside the vocabulary |",
            "|---|" + "---|" * 14]
    body = []
    for r in rows:
        ev = (r.get("eval") or {}).get(r.get("eval_primary") or "", {})
        t1, t2 = ev.get("turn1.acceptance_length"), ev.get("turn2.acceptance_length")
        sim, every, dev = r["simulated"], r.get("dev_all_positions"), r.get("dev")
        first = r.get("simulated_first")
        mark = " (train split)" if sim is not None and r.get("simulated_on_train_split") else ""
        cells = [f"{f(sim)}{mark}", f(first), f(every), f(dev), f(t1), f(t2),
                 f(r.get("offline_gsm8k")), diff(sim, dev), diff(sim, first),
                 diff(sim if first is None else first, every), diff(every, dev), diff(dev, t1),
                 diff(t1, t2),
                 "n/a" if r.get("dev_out_of_vocab") is None else f"{r['dev_out_of_vocab']:.1%}"]
        body.append(f"| {r.get('point')} | " + " | ".join(cells) + " |")
    return "\n".join([GAP_NOTE, ""] + head + body)


def simulated_pivot(rows: list[dict]) -> str:
    """Markdown: simulated acceptance length (training validation, bonus token counted) with (data
    variant, schedule) as rows and data sizes (conversations) as columns, from :func:`sweep_table`
    rows."""
    sizes = sorted({r["data_size"] for r in rows})
    head = ["| data / schedule | " + " | ".join(f"{n:,} conv." for n in sizes) + " |",
            "|---|" + "---|" * len(sizes)]
    body = []
    for data, sched in sorted({(r["data"], r["schedule"] or "") for r in rows}):
        cells = []
        for n in sizes:
            r = next((x for x in rows if (x["data"], x["schedule"] or "") == (data, sched)
                      and x["data_size"] == n), None)
            cells.append("n/a" if r is None or r["simulated"] is None else
                         f"{r['simulated']:.3f}"
                         + (" train split" if r.get("simulated_on_train_split") else "")
                         + f" ({r['epochs_over_data'] or 0:.1f} ep, "
                         f"{int(r['optimizer_steps'] or 0)} steps, "
                         f"{int(r['unique_tokens'] or 0):,} tok)")
        body.append(f"| {data} / {sched} | " + " | ".join(cells) + " |")
    return "\n".join(head + body)


def sweep_report(sweep_run_id: str, tracking_uri: str, plot_copy: str | Path | None = None,
                 max_plot_bytes: int = 200_000) -> str:
    """A markdown report of a finished sweep, all read from MLflow: the comparison table, the
    simulated acceptance pivot, the decision (``eagle3 decide`` text) and the data-scaling plot
    (artifact ``data_scaling.png``, copied to ``plot_copy``, a file or a folder, when it is at
    most ``max_plot_bytes`` bytes)."""
    import shutil

    _check_store(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        run = client.get_run(sweep_run_id)
    except MlflowException as e:
        raise DataError(f"MLflow run {sweep_run_id!r} not found in {tracking_uri}: {e}") from e
    tags = run.data.tags
    if tags.get("prefect.flow_name") != "eagle3-sweep":
        parent = tags.get(SWEEP_TAG) or tags.get("mlflow.parentRunId")
        raise DataError(f"MLflow run {sweep_run_id}: expected a sweep's run (flow eagle3-sweep), "
                        f"got a run of {tags.get('prefect.flow_name', 'no flow')!r}"
                        + (f"; its sweep or parent run: {parent}" if parent else ""))
    rows = sweep_table(sweep_run_id, tracking_uri)
    plot_line = "data-scaling plot: not found"
    try:
        local = Path(client.download_artifacts(sweep_run_id, "data_scaling.png"))
        plot_line = f"data-scaling plot: MLflow artifact `data_scaling.png` of run {sweep_run_id}"
        if plot_copy is not None and local.stat().st_size <= max_plot_bytes:
            dest = Path(plot_copy) / local.name if Path(plot_copy).is_dir() else Path(plot_copy)
            shutil.copyfile(local, dest)
            plot_line += f", copied to `{dest}`"
    except Exception as e:  # noqa: BLE001 - reported in the text
        first = (str(e).splitlines() or [""])[0][:160]
        plot_line = (f"data-scaling plot: not available from {run.info.artifact_uri} "
                     f"({type(e).__name__}: {first})"
                     + (f"; --plot-copy {plot_copy}: nothing copied" if plot_copy else ""))
    return "\n".join(["## MLflow comparison", "", format_table(rows), "",
                      "## Where simulated and measured acceptance part", "", gap_table(rows), "",
                      "## Simulated acceptance length by schedule × data size", "",
                      simulated_pivot(rows), "",
                      f"- {plot_line}", "", "## Decision (`eagle3 decide`)", "", "```",
                      decision_text(sweep_run_id, tracking_uri), "```"])
