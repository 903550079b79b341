"""The four stages, each as a step (its cached tasks, called in this process) and as a flow of its
own.

A step runs one stage's tasks on the inputs it is given and returns ``{name: result}``;
flows/pipeline.py's ``run_sequence`` calls them in order through a stage runner. A stage flow
(``eagle3-extract|train|convert| deploy``) runs one step alone, reading its inputs from the run
directory (a DataError names the command that makes a missing one); it is ``eagle3
extract|train|convert|deploy CONFIG``, the deployments ``eagle3-<stage>/<stage>-<config>`` and,
given ``parent_run_id``, a stage of ``eagle3-distributed`` on its work pool: it then logs under the
orchestrator's MLflow parent run and ends by writing its hand-over record (flows/handover.py),
leaving the decision and the acceptance gate to the orchestrator.
"""

from __future__ import annotations

import functools
import shlex
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from prefect import flow

from eagle3.config import RunConfig
from flows.common import (data_line, finished_output, flow_run_label, load_run_config, parent_run,
                          publish_summary, run_concurrently, run_stage, stage_dirs,
                          untrained_config)
from flows.handover import localized, write_handover
from tasks import tracking
from tasks.bench import acceptance_task, decision_task, gate_task, prefetch_offline_figure
from tasks.convert import convert_task
from tasks.deploy import deploy_task
from tasks.extract import extract_task
from tasks.preflight import preflight_task
from tasks.stage_config import record_latest
from tasks.train import train_task

STAGES = ("extract", "train", "convert", "deploy")


def variants(cfg: RunConfig) -> list[tuple[str, RunConfig]]:
    """``[("trained", cfg)]`` plus ``("untrained", train.max_steps=0)`` when
    ``bench.baseline_untrained``."""
    base = [("untrained", untrained_config(cfg))] if cfg.bench.baseline_untrained else []
    return [("trained", cfg), *base]


def flow_name(stage: str) -> str:
    """``eagle3-<stage>``: the flow of one stage (and the prefix of its deployments)."""
    return f"eagle3-{stage}"


# ---- steps
# ------------------------------------------------------------------------------------------------

def extract_step(cfg: RunConfig, parent: str, record: dict, *, refresh: bool = False,
                 out_dir: str | Path | None = None) -> dict:
    """Hidden states into ``out_dir`` (default ``<run_dir>/extract``): ``{"extract": StageResult}``.
    """
    out = Path(out_dir) if out_dir else stage_dirs(cfg)["extract"]
    return {"extract": run_stage(extract_task, cfg=cfg, parent=parent, stage="extract", out_dir=out,
                                 refresh=refresh, record=record)}


def _latest(*folders: Path) -> None:
    """Record each settings folder as the one this run used (``<folder>/../latest.json``)."""
    for f in folders:
        record_latest(f)


def train_step(cfg: RunConfig, parent: str, record: dict, *, data: Any,
               refresh: bool = False) -> dict:
    """The trained and the untrained draft on ``data``: ``{variant: StageResult}``."""
    out = {v: run_stage(train_task, cfg=c, parent=parent, stage="train", variant=v, data=data,
                        out_dir=stage_dirs(c, v)["train"], refresh=refresh, record=record)
           for v, c in variants(cfg)}
    _latest(*(stage_dirs(c, v)["train"] for v, c in variants(cfg)))
    return out


def convert_step(cfg: RunConfig, parent: str, record: dict, *, data: Any, drafts: dict,
                 refresh: bool = False) -> dict:
    """Convert + validate + equivalence-check each draft: ``{variant: StageResult}``."""
    out = {v: run_stage(convert_task, cfg=c, parent=parent, stage="convert", variant=v,
                        draft=drafts[v], data=data, out_dir=stage_dirs(c, v)["serving"],
                        refresh=refresh, record=record)
           for v, c in variants(cfg)}
    _latest(*(stage_dirs(c, v)["serving"] for v, c in variants(cfg)))
    return out


def deploy_step(cfg: RunConfig, parent: str, record: dict, *, data: Any, servings: dict,
                train: Any = None,
                refresh: bool = False) -> dict:
    """The pre-flight (before any engine starts), then both drafts served behind the readiness gate
    and benchmarked at once, the offline figure beside them, then the acceptance figures (``train``:
    the trained draft's train result, for the simulated figure). ``{variant: StageResult, "figures":
    AcceptanceFigures, "preflight": report}``.

    Each engine decodes on one thread (serve.cpu_threads), so on a 2-core CPU the pair takes about
    as long as one. In a worker thread Prefect's task timeout cannot interrupt anything: the stage
    is bounded by its own deadlines instead (the readiness gate's, each request's and the
    watchdog's)."""
    pre = run_stage(preflight_task, cfg=cfg, parent=parent, stage="preflight", record=record,
                    serving=servings["trained"], data=data)
    lines = variants(cfg)
    calls = {v: functools.partial(
        run_stage, deploy_task, cfg=c, parent=parent, stage="deploy-bench", variant=v,
        record=record, serving=servings[v], deploy_dir=stage_dirs(c, v)["deploy"],
        bench_dir=stage_dirs(c, v)["bench"], timeout_s=0, refresh=refresh) for v, c in lines}
    # the acceptance task reads the offline figure from its memo, or computes it when this failed
    calls["offline"] = functools.partial(prefetch_offline_figure, cfg, servings["trained"].dir)
    bench = run_concurrently(calls)
    _latest(*(stage_dirs(c, v)[k] for v, c in lines for k in ("deploy", "bench")))
    for k in ["deploy-bench" if v == "trained" else f"deploy-bench ({v})" for v, _ in lines]:
        if k in record:  # the record keeps the trained-then-untrained order
            record[k] = record.pop(k)
    figures = acceptance_task(cfg, bench["trained"], bench.get("untrained"), servings["trained"],
                              parent,
                              train=train)
    return {**{v: bench[v] for v, _ in lines}, "figures": figures, "preflight": pre}


STEPS = {"extract": extract_step, "train": train_step, "convert": convert_step,
         "deploy": deploy_step}


# ---- stage flows
# ------------------------------------------------------------------------------------------

def _command(stage: str, config_path: str, overrides: list[str] | None,
             orchestrated: bool = False) -> str:
    """What makes ``stage``'s output for the same config and overrides (shell-quoted)."""
    if orchestrated:
        return (f"prefect deployment run '{flow_name(stage)}/{stage}-<config>' (or the whole "
                f"pipeline, 'eagle3-distributed/<config>') for config {config_path} with overrides "
                f"{list(overrides or [])}")
    return " ".join(["eagle3", stage, shlex.quote(str(config_path)),
                     *[f"-o {shlex.quote(o)}" for o in overrides or []]])


def _inputs(stage: str, cfg: RunConfig, command: Any, train_result: dict | None) -> dict:
    """The step's inputs, read from the run directory (``command(stage)``: what makes a missing
    one)."""
    def need(d: Path, s: str) -> Any:
        return finished_output(d, s, command(s))

    def have(d: Path, s: str) -> Any:
        return finished_output(d, s, "") if (d / "manifest.json").is_file() else None

    dirs = stage_dirs(cfg)
    if stage == "extract":
        return {}
    if stage == "deploy":
        train = localized(cfg, train_result) if train_result else have(dirs["train"], "train")
        return {"data": have(dirs["extract"], "extract"), "train": train,
                "servings": {v: need(stage_dirs(c, v)["serving"], "convert") for v,
                             c in variants(cfg)}}
    data = need(dirs["extract"], "extract")
    if stage == "train":
        return {"data": data}
    return {"data": data, "drafts": {v: need(stage_dirs(c, v)["train"], "train") for v,
                                     c in variants(cfg)}}


@contextmanager
def _parent(cfg: RunConfig, parent_run_id: str | None, name: str, record: dict) -> Iterator[str]:
    """The orchestrator's MLflow parent run (which it finishes or fails), else this flow's own."""
    if parent_run_id:
        yield parent_run_id
        return
    with parent_run(cfg, name, record) as parent:
        yield parent


def run_stage_flow(stage: str, config_path: str, overrides: list[str] | None,
                   parent_run_id: str | None,
                   refresh: bool, train_result: dict | None = None) -> dict:
    """One stage flow's body: the hand-over record when orchestrated (``parent_run_id``), else the
    summary (after the decision and then the acceptance gate, for deploy)."""
    cfg = load_run_config(config_path, overrides)
    command = functools.partial(_command, config_path=config_path, overrides=overrides,
                                orchestrated=bool(parent_run_id))
    inputs = _inputs(stage, cfg, command, train_result)
    record: dict = {}
    name = flow_name(stage)
    with _parent(cfg, parent_run_id, name, record) as parent:
        results = STEPS[stage](cfg, parent, record, refresh=refresh, **inputs)
        if parent_run_id:
            return write_handover(cfg, stage, record, results)
        extra: dict = {}
        if stage == "extract":
            extra["data"] = data_line(results["extract"].dir)
        if stage == "deploy":
            figures = results["figures"]
            decision_task(cfg, inputs["train"], figures, parent, preflight=results["preflight"])
            gate_task(cfg, figures)  # after the decision is recorded: pass or fail
            extra = {"acceptance_length": figures.served,
                     "acceptance_length_untrained": figures.untrained}
        _, exp_id = tracking.client_for(cfg)
        publish_summary(cfg, parent, f"{name}: {cfg.name}", [f"- {k}: {v}" for k,
                                                             v in record.items()])
        return {"flow": name, "config": cfg.name, "run_dir": str(cfg.run_dir()),
                "mlflow_uri": tracking.tracking_uri(cfg), "experiment_id": exp_id,
                "parent_run_id": parent, "stages": record, **extra}


@flow(name=flow_name("extract"), flow_run_name=flow_run_label, log_prints=False)
def extract_flow(config_path: str, overrides: list[str] | None = None,
                 parent_run_id: str | None = None,
                 refresh: bool = False) -> dict:
    """Hidden-state extraction of CONFIG into ``<run_dir>/extract``."""
    return run_stage_flow("extract", config_path, overrides, parent_run_id, refresh)


@flow(name=flow_name("train"), flow_run_name=flow_run_label, log_prints=False)
def train_flow(config_path: str, overrides: list[str] | None = None,
               parent_run_id: str | None = None,
               refresh: bool = False) -> dict:
    """Train the draft (and the untrained baseline) on ``<run_dir>/extract``."""
    return run_stage_flow("train", config_path, overrides, parent_run_id, refresh)


@flow(name=flow_name("convert"), flow_run_name=flow_run_label, log_prints=False)
def convert_flow(config_path: str, overrides: list[str] | None = None,
                 parent_run_id: str | None = None,
                 refresh: bool = False) -> dict:
    """Convert + validate + equivalence-check the drafts of ``<run_dir>/train*`` into ``serving*``.
    """
    return run_stage_flow("convert", config_path, overrides, parent_run_id, refresh)


@flow(name=flow_name("deploy"), flow_run_name=flow_run_label, log_prints=False)
def deploy_flow(config_path: str, overrides: list[str] | None = None,
                parent_run_id: str | None = None,
                train_result: dict | None = None, refresh: bool = False) -> dict:
    """Pre-flight, deploy + benchmark the converted drafts, the acceptance figures; alone, also the
    decision and then the acceptance gate. ``train_result``: the trained draft's train result in
    ``flows.handover.portable`` form (default: read from ``<run_dir>/train`` when there)."""
    return run_stage_flow("deploy", config_path, overrides, parent_run_id, refresh, train_result)


STAGE_FLOWS = {"extract": extract_flow, "train": train_flow, "convert": convert_flow,
               "deploy": deploy_flow}
