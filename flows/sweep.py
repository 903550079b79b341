"""Flow ``eagle3-sweep``: the pipeline over data variants × data sizes × training schedules, then
the decision.

Each point is the whole pipeline as a subflow, on its own run directory
(``<name>-<data>-n<size>-<schedule>``), with its own MLflow parent run nested under the sweep's run
(``mlflow.parentRunId``) and tagged ``eagle3.sweep_run_id``, ``eagle3.sweep.point`` / ``.data`` /
``.data_size`` / ``.schedule`` (and the point's unique tokens, epochs over the data, optimizer steps
as metrics), so the comparison table is read back from MLflow (``tasks.reports.sweep_table``).
Points of one (data variant, size) share one extraction (``<sweep run dir>/extract-<data>-n<size>``:
the extraction key does not depend on the schedule). With ``eval_sets`` every finished point's draft
is also measured offline on those prompt sets (``tasks.evaluate``: replayed greedy chain decoding,
with bootstrap intervals), logged on the point's run as ``offline.<set>.*``. The sweep's run holds
``sweep.json``, the table (``sweep_table.md``), the data-scaling and training-length plots and the
decision ("more data" / "longer training" / "regenerate data" / "fix serving integration" / "stop").
A point that fails is recorded as failed and left out of the decision; every point runs with
``data.on_short=fail``, so one whose data gives fewer conversations than its size fails
(``DATA_SHORT``) before its extraction: its label would overstate its data.

Long sweeps span several sessions: ``deadline_s`` stops starting new points after that many seconds
(the rest are returned as ``pending``), and ``sweep_run_id`` continues an earlier sweep's MLflow
run: points it already finished are not run again (their rows come from MLflow), others run (cached
stages are skipped).

Command line (Prefect's ephemeral API, like ``eagle3 run``)::

    python -m flows.sweep configs/smollm2-cpu.yaml --size 64 --size 128 -o
    paths.runs_dir=/tmp/sweep-runs
"""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

from prefect import flow

from eagle3.artifacts import read_manifest
from eagle3.errors import DataError, Eagle3Error
from flows.common import flow_run_label, load_run_config, parent_run, reopen_run
from flows.summary import decide_command
from flows.pipeline import eagle3_pipeline
from tasks import tracking
from flows.sweep_decision import decide_and_plot, publish_points
from tasks.reports import SWEEP_TAG, format_table, sweep_report, sweep_table
from tasks.stage_config import latest_output

# schedule name → train overrides: (a) a few epochs with cosine decay, (b) a long constant-LR run
# with evaluations every 50 optimizer steps (best-by-simulated-acceptance export picks the
# checkpoint).
DEFAULT_SCHEDULES = {"epochs3-cosine": ["train.schedule=epochs", "train.epochs=3"],
                     "constant-long": ["train.schedule=constant", "train.epochs=6",
                                       "train.eval_every=50"]}
# data variant name → data overrides (e.g. a regenerated conversations file)
DEFAULT_DATA = {"as-is": []}


def point_key(data: str, size: int, schedule: str) -> str:
    """``<data>-n<size>-<schedule>``: a point's name in the sweep (run directory, MLflow tag, flow
    run name)."""
    return f"{data}-n{size}-{schedule}"


def point_result(summary: dict, data: str, size: int, schedule: str) -> dict:
    """A finished point's coordinates and figures from its summary and its draft manifest
    (``<run_dir>/train/manifest.json``): data variant, data size (conversations asked),
    ``conversations`` (trained and validated on: ``counts.train_samples + val_samples``),
    schedule, unique tokens (``counts.train_positions``), epochs over the data, optimizer steps,
    served / offline / simulated acceptance."""
    m = read_manifest(latest_output(summary["run_dir"], "train"))
    counts = m.get("counts") or {}
    return {"data": data, "data_size": size, "schedule": schedule,
            "conversations": (counts.get("train_samples") or 0) + (counts.get("val_samples") or 0),
            "key": point_key(data, size, schedule),
            "unique_tokens": (m.get("counts") or {}).get("train_positions"),
            "acceptance_length": summary["acceptance_length"],
            "offline": summary.get("acceptance_length_offline"),
            "simulated": summary.get("acceptance_length_simulated"),
            "epochs": m.get("epochs_over_data"), "optimizer_steps": m.get("optimizer_steps"),
            "parent_run_id": summary["parent_run_id"], "run_dir": summary["run_dir"],
            "registered_model": summary.get("registered_model")}


def tag_point(cfg, sweep_run_id: str, row: dict) -> None:
    """Nest a point's parent run under the sweep's run and store its sweep coordinates: tags
    :data:`SWEEP_TAG`, ``mlflow.parentRunId``,
    ``eagle3.sweep.point``/``.data``/``.data_size``/``.schedule``; metrics ``sweep.unique_tokens``,
    ``sweep.epochs_over_data``, ``sweep.optimizer_steps``."""
    run = row["parent_run_id"]
    tracking.set_parent_tags(cfg, run, {SWEEP_TAG: sweep_run_id, tracking.PARENT_TAG: sweep_run_id,
                                        "eagle3.sweep.point": row["key"],
                                        "eagle3.sweep.data": row["data"],
                                        "eagle3.sweep.data_size": row["data_size"],
                                        "eagle3.sweep.schedule": row["schedule"]})
    tracking.log_parent_metrics(cfg, run, {"sweep.unique_tokens": row["unique_tokens"],
                                           "sweep.epochs_over_data": row["epochs"],
                                           "sweep.optimizer_steps": row["optimizer_steps"]})


# set per point
SWEEP_OWNED = ("data.num_conversations", "data.on_short", "name", "bench.baseline_untrained")
_OWNED_HOW = "(--size, data.on_short=fail, the point's name, no untrained baseline)"


def _point_overrides(base: list[str], cfg_name: str, data: list[str], size: int, key: str,
                     sched: list[str]) -> list[str]:
    return [*base, *data, f"data.num_conversations={size}", "data.on_short=fail", *sched,
            f"name={cfg_name}-{key}", "bench.baseline_untrained=false"]


def default_sizes(num_conversations: int) -> list[int]:
    """The sweep's data sizes when none are given: half and all of ``data.num_conversations``
    (just the one size when half of it is no conversation)."""
    n = num_conversations
    return [n // 2, n] if n >= 2 else [n]


def _key(override: str) -> str:
    return override.split("=", 1)[0].strip()


def _value(override: str):
    """The value an override sets, as the config would read it (YAML; a number written as text,
    such as ``1e-3``, compared as a number)."""
    from eagle3.overrides import _parse_value

    v = _parse_value(override.split("=", 1)[1].strip()) if "=" in override else None
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


def overridden_settings(overrides: list[str], schedules: dict[str, list[str]]) -> str | None:
    """Why ``overrides`` (the sweep's ``-o`` settings for every point) would not take effect, or
    None: a key the sweep sets for each point (:data:`SWEEP_OWNED`) or one a schedule sets (a
    point's schedule overrides come after the base ones, so the base value would be dropped in
    silence). A schedule that sets the same value (``1e-3`` and ``0.001`` alike) is no
    conflict."""
    for name, sched in schedules.items():
        if owned := [o for o in sched if _key(o) in SWEEP_OWNED]:
            return (f"schedule {name}: {owned[0]}: the sweep sets {_key(owned[0])} for each point "
                    f"{_OWNED_HOW}; leave it out")
    for o in overrides:
        k = _key(o)
        if k in SWEEP_OWNED and not (k == "data.on_short" and _value(o) == "fail"):
            return f"-o {o}: the sweep sets {k} for each point {_OWNED_HOW}; leave it out"
        setting = {name: v for name, sched in schedules.items() for v in sched
                   if _key(v) == k and _value(v) != _value(o)}
        if setting:
            shown = ", ".join(f"{n}: {v}" for n, v in setting.items())
            return (f"-o {o}: overridden by the sweep's schedules ({shown}); set it in each "
                    "schedule instead (--schedule NAME=key=value,...)")
    return None


def sweep_points(sizes: list[int], schedules: dict, data: dict,
                 points: list | None) -> list[tuple[str, int, str]]:
    """The (data variant, size, schedule) triples to run: ``points`` (each ``[data, size,
    schedule]``; names checked against ``data`` and ``schedules``), else the whole grid in (data,
    size, schedule) order. Raises DataError naming an unknown variant or schedule."""
    if points is None:
        return [(d, int(n), s) for d in data for n in sizes for s in schedules]
    out = []
    for i, pt in enumerate(points):
        if len(pt) != 3:
            raise DataError(f"sweep points[{i}]: expected [data, size, schedule], got {pt!r}")
        d, n, s = pt
        if d not in data or s not in schedules:
            raise DataError(f"sweep points[{i}] = {pt!r}: expected data in {sorted(data)} and "
                            f"schedule in {sorted(schedules)}")
        out.append((str(d), int(n), str(s)))
    return out


def _finished_points(cfg, sweep_run_id: str) -> set[str]:
    """Point keys that already have a FINISHED parent run under this sweep (resume)."""
    client, exp = tracking.client_for(cfg)
    runs = client.search_runs([exp], filter_string=f"tags.`{SWEEP_TAG}` = '{sweep_run_id}'",
                              max_results=1000)
    return {r.data.tags.get("eagle3.sweep.point") for r in runs if r.info.status == "FINISHED"}


def _run_points(cfg, config_path: str, overrides: list[str], todo: list, scheds: dict, data: dict,
                parent: str,
                deadline: float | None) -> tuple[list[dict], dict, list[str]]:
    """Run the ``todo`` points in order; once ``deadline`` (a ``time.monotonic()`` value) has passed
    no further point starts, but the first one always does (a call whose set-up outlasted its
    deadline still makes progress). Returns (results, failed {point: message}, pending point keys).
    Raises KeyboardInterrupt before a point when a termination signal arrived during the sweep
    (:func:`flows.stopping.stop_requested`)."""
    results, failed, pending = [], {}, []
    from flows.stopping import stop_requested

    for i, (d, size, s) in enumerate(todo):
        key = point_key(d, size, s)
        if stop_requested():  # the point that was running caught the interrupt as its failure
            raise KeyboardInterrupt(f"a termination signal arrived: {key} and the points after "
                                    "it were not started")
        if i > 0 and deadline is not None and time.monotonic() > deadline:
            pending.append(key)
            continue
        point = _point_overrides(overrides, cfg.name, data[d], size, key, scheds[s])
        state = eagle3_pipeline.with_options(flow_run_name=key)(
            config_path=config_path, overrides=point,
            extract_dir=str(cfg.run_dir() / f"extract-{d}-n{size}"), return_state=True)
        if state.is_completed():
            results.append(point_result(state.result(), d, size, s))
            tag_point(cfg, parent, results[-1])
        else:
            failed[key] = state.message or state.name
    return results, failed, pending


@flow(name="eagle3-sweep", flow_run_name=flow_run_label, log_prints=False)
def sweep_flow(config_path: str, overrides: list[str] | None = None,
               data_sizes: list[int] | None = None,
               schedules: dict[str,
                               list[str]] | None = None, target_acceptance: float | None = None,
               data: dict[str, list[str]] | None = None, points: list[list] | None = None,
               eval_sets: list[str] | None = None, eval_max_new_tokens: int = 256,
               deadline_s: float | None = None, sweep_run_id: str | None = None,
               evaluate_with_pending: bool = False) -> dict:
    """Run the pipeline for every point (module docstring) and decide.

    Defaults: sizes = half and all of ``data.num_conversations``; schedules =
    :data:`DEFAULT_SCHEDULES`; data = :data:`DEFAULT_DATA` (the config's data as it is); points =
    the whole grid. ``eval_sets``: prompt sets of ``eagle3.measure.replay`` (e.g. ``["mtbench2",
    "gsm8k200"]``) for the offline evaluation of every point, ``eval_max_new_tokens`` tokens each,
    once no point is pending (or anyway with ``evaluate_with_pending``: the last session of a sweep
    that ran out of time). Raises DataError when every point failed (and none finished earlier).
    """
    from tasks.evaluate import evaluate_points

    t0 = time.monotonic()
    cfg = load_run_config(config_path, overrides)
    sizes = list(data_sizes or default_sizes(cfg.data.num_conversations))
    scheds, variants = dict(schedules or DEFAULT_SCHEDULES), dict(data or DEFAULT_DATA)
    if why := overridden_settings(list(overrides or []), scheds):
        raise DataError(f"sweep {cfg.name}: {why}")
    if bad := [n for n in sizes if isinstance(n, bool) or not isinstance(n, int) or n < 1]:
        raise DataError(f"sweep {cfg.name}: data sizes: expected integers >= 1 (conversations), "
                        f"got {bad}")
    todo = sweep_points(sizes, scheds, variants, points)
    run = parent_run(cfg, "eagle3-sweep") if sweep_run_id is None else reopen_run(cfg, sweep_run_id)
    with run as parent:
        tracking.set_parent_tags(cfg, parent, {"eagle3.sweep.sizes": ",".join(map(str, sizes)),
                                               "eagle3.sweep.schedules": ",".join(scheds),
                                               "eagle3.sweep.data": ",".join(variants)})
        done = _finished_points(cfg, parent) if sweep_run_id else set()
        todo = [p for p in todo if point_key(*p) not in done]
        results, failed, pending = _run_points(cfg, config_path, list(overrides or []), todo,
                                               scheds, variants, parent,
                                               None if deadline_s is None else t0 + deadline_s)
        # the continuations are generated once for all
        not_evaluated = {}
        if eval_sets and (evaluate_with_pending or not pending):
            not_evaluated = evaluate_points(cfg, parent, eval_sets,
                                            eval_max_new_tokens)["not_evaluated"]
        rows = sweep_table(parent, tracking.tracking_uri(cfg))
        tracking.log_parent_artifact(cfg, parent, {"results": results, "failed": failed,
                                                   "pending": pending,
                                                   "not_evaluated": not_evaluated,
                                                   "rows": rows}, "sweep.json")
        if not rows:
            raise DataError(f"sweep {cfg.name}: every point failed: {failed}")
        decision = decide_and_plot(cfg, parent, rows, target_acceptance, pending, not_evaluated,
                                   failed)
        publish_points(cfg, parent, rows, failed, pending, decision)
    return {"flow": "eagle3-sweep", "config": cfg.name, "run_dir": str(cfg.run_dir()),
            "mlflow_uri": tracking.tracking_uri(cfg), "parent_run_id": parent, "results": results,
            "failed": failed, "pending": pending, "decision": decision.recommendation,
            "decision_rule": decision.rule,
            "plot": str(cfg.run_dir() / "sweep" / parent / "data_scaling.png"),
            "experiment_id": tracking.client_for(cfg)[1], "stages": {}}


def _schedule(text: str) -> tuple[str, list[str]]:
    """``NAME=KEY=VALUE,KEY=VALUE`` (``--schedule``) as ``(NAME, ["KEY=VALUE", ...])``. Raises
    argparse.ArgumentTypeError naming what is missing."""
    import argparse

    name, _, rest = text.partition("=")
    name = name.strip()
    items = [i.strip() for i in rest.split(",") if i.strip()]
    if not name or not items or any("=" not in i or not _key(i) for i in items):
        raise argparse.ArgumentTypeError(
            f"--schedule {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE...], e.g. "
            "long=train.schedule=constant,train.max_steps=400")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise argparse.ArgumentTypeError(
            f"--schedule {text!r}: expected a NAME of letters, digits, '.', '_' and '-' (it "
            f"names the point's run and folder), got {name!r}")
    keys = [_key(i) for i in items]
    if twice := sorted({k for k in keys if keys.count(k) > 1}):
        raise argparse.ArgumentTypeError(
            f"--schedule {text!r}: expected each key once, got {twice} more than once")
    return name, items


def _argument_problem(a) -> str | None:
    """What is wrong with ``flows.sweep``'s arguments, before anything loads, or None."""
    import argparse

    if a.eval_tokens is not None and a.eval_tokens < 1:
        return f"--eval-tokens: expected >= 1, got {a.eval_tokens}"
    if bad := [n for n in a.size or [] if n < 1]:
        return f"--size: expected a number of conversations >= 1, got {bad}"
    if a.size and len(set(a.size)) != len(a.size):
        return f"--size: expected distinct sizes, got {a.size}"
    if a.eval_sets is not None and not all(p.strip() for p in a.eval_sets.split(",")):
        return f"--eval-sets: expected comma-separated set names, got {a.eval_sets!r}"
    sets = [p.strip() for p in (a.eval_sets or "").split(",") if p.strip()]
    if len(set(sets)) != len(sets):
        return f"--eval-sets: expected distinct set names, got {a.eval_sets!r}"
    if a.eval_tokens is not None and a.eval_sets is None and a.report is None:
        return f"--eval-tokens {a.eval_tokens}: only with --eval-sets (no offline evaluation runs)"
    if a.target is not None and not 1.0 < a.target < float("inf"):
        return (f"--target: expected a finite acceptance length above 1.0 (it counts the bonus "
                f"token, so 1.0 is no speculation at all), got {a.target}")
    try:
        names = [_schedule(t)[0] for t in a.schedule]
    except argparse.ArgumentTypeError as e:
        return str(e)
    if len(set(names)) != len(names):
        return f"--schedule: expected distinct names, got {names}"
    if a.report is not None:
        if not a.report.strip():
            return "--report: expected a sweep run id (32 hex digits), got an empty string"
        given = [f for f, v in (("--size", a.size), ("--schedule", a.schedule),
                                ("--eval-sets", a.eval_sets), ("--eval-tokens", a.eval_tokens),
                                ("--target", a.target)) if v is not None and v != []]
        if given:
            return f"--report reads a finished sweep: {', '.join(given)} would be ignored"
        return _plot_copy_problem(a.plot_copy)
    if a.plot_copy is not None:
        return "--plot-copy: only with --report (a running sweep logs its plots to MLflow)"
    return None


def _plot_copy_problem(dest: str | None) -> str | None:
    """Why ``--plot-copy dest`` cannot take the plot, or None: it must be a folder, or a ``.png``
    file path in an existing folder."""
    if dest is None:
        return None
    if not dest.strip():
        return "--plot-copy: expected a folder or a .png path, got an empty string"
    path = Path(dest)
    if path.is_dir():
        return None
    if dest.endswith(("/", "\\")):
        return f"--plot-copy {dest}: expected an existing folder, got a folder that does not exist"
    if path.suffix.lower() != ".png":
        got = "an existing file" if path.exists() else "a path that does not exist"
        return (f"--plot-copy {dest}: expected an existing folder or a path ending in .png, got "
                f"{got}")
    if not path.parent.is_dir():
        return f"--plot-copy {dest}: expected its folder {path.parent} to exist, it does not"
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.sweep CONFIG [--size N ...] [-o key=value ...] [--target X]``: run the
    sweep on Prefect's ephemeral API, print the table, the decision and the MLflow ids. Returns the
    exit status: 0, 1 when the sweep or any point failed (the decision covers fewer points than
    asked), 2 for arguments or a config refused before any point ran."""
    import argparse

    from flows.common import local_prefect, stop_ephemeral_server
    from flows.stopping import (SignalRecord, ended_message, raise_if_terminated, stop_grace_s,
                                terminate_as_interrupt, terminating_signal)

    ap = argparse.ArgumentParser(prog="python -m flows.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--size", type=int, action="append",
                    help="data size in conversations (repeatable; default: half and all of "
                    "data.num_conversations)")
    ap.add_argument("--schedule", action="append", default=[], metavar="NAME=KEY=VALUE,...",
                    help="a training schedule of the sweep: its name and the overrides it sets, "
                    "e.g. long=train.schedule=constant,train.max_steps=400,train.eval_every=50 "
                    "(repeatable; default: epochs3-cosine = train.schedule=epochs,train.epochs=3 "
                    "and constant-long = train.schedule=constant,train.epochs=6,"
                    "train.eval_every=50)")
    ap.add_argument("-o", "--override", action="append", default=[],
                    help="section.key=value (repeatable)")
    ap.add_argument("--target", type=float, default=None, help="acceptance length at which to stop")
    ap.add_argument("--eval-sets", default=None, metavar="SETS",
                    help="comma-separated prompt sets every point is also evaluated on offline "
                    "(e.g. mtbench2,gsm8k200). The first set is the report's primary one: "
                    "mtbench2 (MT-Bench, both turns) first fills its turn columns; a gsm8k<N> "
                    "set fills its GSM8K column; mtbench is first turns only")
    ap.add_argument("--eval-tokens", type=int, default=None,
                    help="with --eval-sets: new tokens per prompt (default 256)")
    ap.add_argument("--report", metavar="SWEEP_RUN_ID",
                    help="print the markdown report of a finished sweep "
                    "(tracking store of CONFIG + overrides) instead of running one")
    ap.add_argument("--plot-copy", default=None,
                    help="with --report: copy the data-scaling plot here (a folder, or a .png "
                    "file in an existing folder; a plot already there is replaced)")
    a = ap.parse_args(argv)
    if why := _argument_problem(a):
        ap.error(why)
    schedules = dict(_schedule(text) for text in a.schedule) or None
    try:
        grace_s = stop_grace_s()  # $EAGLE3_STOP_GRACE_S, checked before Prefect starts
        cfg = load_run_config(a.config, a.override)
        if a.report is not None:
            print(sweep_report(a.report, tracking.tracking_uri(cfg), a.plot_copy))
            return 0
        from eagle3.extract.precheck import check_before_run

        # every point's config as the flow will load it (a schedule, or a size, the config
        # refuses, e.g. a validation split too small for measured selection), now; the data
        # file again only for a schedule that changes data or extraction settings
        sizes = a.size or default_sizes(cfg.data.num_conversations)
        # data.path (read whole when small) and the aux layers, as `eagle3 extract` checks them
        usable = check_before_run(cfg)
        for name, sched in (schedules or DEFAULT_SCHEDULES).items():
            own = any(_key(o).startswith(("data.", "extract.")) for o in sched)
            for size in sizes:
                key = point_key(next(iter(DEFAULT_DATA)), size, name)
                where = f"--schedule {name}: point {key}" if schedules else f"point {key}"
                try:
                    point = load_run_config(a.config, _point_overrides(
                        a.override, cfg.name, [], size, key, sched))
                    if own and size == sizes[0]:  # a schedule's own data or extraction settings
                        usable_here = check_before_run(point)
                except Eagle3Error as e:
                    raise DataError(f"{where}: {e}") from e
                have = usable_here if own else usable
                if have is not None and have < size:  # data.on_short=fail: certain to fail
                    path = point.data.path
                    raise DataError(f"DATA_SHORT: {where}: data.path {path} holds {have} usable "
                                    f"conversations, fewer than the point's size {size}; every "
                                    "point runs with data.on_short=fail (lower --size or add "
                                    "data)")
        if why := overridden_settings(a.override, schedules or DEFAULT_SCHEDULES):
            raise DataError(why)
        if cfg.data.on_short == "warn" and "on_short" in cfg.data.model_fields_set:
            print(f"note: {a.config}: data.on_short=warn is replaced by fail for every point (a "
                  "point's data must hold its size)", file=sys.stderr)
        eval_sets = [s.strip() for s in (a.eval_sets or "").split(",") if s.strip()] or None
        if eval_sets:  # an unknown set name fails now, not after every point has trained
            from eagle3.measure.offline import load_conversations

            for s in eval_sets:
                load_conversations(s)
    except Eagle3Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # a SIGTERM/SIGHUP/Ctrl-C ends the sweep as an interrupt, within $EAGLE3_STOP_GRACE_S
    previous = terminate_as_interrupt()
    record = SignalRecord(grace_s)
    record.install()
    ended_by = None
    try:
        with local_prefect(cfg):
            state = sweep_flow(config_path=a.config, overrides=a.override, data_sizes=a.size,
                               schedules=schedules, target_acceptance=a.target, return_state=True,
                               eval_sets=eval_sets, eval_max_new_tokens=a.eval_tokens or 256)
            raise_if_terminated(record)
            if not state.is_completed():
                print(f"sweep failed: {state.message}")
                return 1
            out = state.result()
    except KeyboardInterrupt:
        ended_by = terminating_signal(record)
        if ended_by is None:  # Ctrl-C: Python's own exit for an interrupt (130)
            raise
    finally:
        record.uninstall()
        stop_ephemeral_server()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if ended_by is not None:
        print(ended_message("the sweep", ended_by), file=sys.stderr, flush=True)
        return 128 + ended_by
    print(format_table(sweep_table(out["parent_run_id"], out["mlflow_uri"])))
    print(f"failed points: {out['failed'] or 'none'}")
    status = 1 if out["failed"] else 0  # a decision over fewer points than asked
    print(f"decision: {out['decision']} (rule {out['decision_rule']}); plot {out['plot']}")
    print(f"MLflow: {out['mlflow_uri']} sweep parent run {out['parent_run_id']}  "
          f"({decide_command(out['mlflow_uri'], out['parent_run_id'])})")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
