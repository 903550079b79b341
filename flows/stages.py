"""One flow per stage, so one stage can be (re-)run alone: ``eagle3 extract|train|convert|deploy CONFIG`` and
the Prefect deployments ``eagle3-extract/…`` etc. Each reads the previous stage's output from the run
directory (a DataError names the command that makes it when missing) and uses the same cached tasks as the
whole pipeline, so a stage whose inputs did not change is served from the cache unless ``refresh`` is set.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.common import (
    data_line,
    flow_run_label,
    finished_output,
    load_run_config,
    parent_run,
    publish_summary,
    run_stage,
    stage_dirs,
    untrained_config,
)
from tasks import tracking
from tasks.bench import acceptance_task, decision_task, gate_task
from tasks.convert import convert_task
from tasks.deploy import deploy_task, deploy_timeout_s
from tasks.extract import extract_task
from tasks.preflight import preflight_task
from tasks.train import train_task


def _variants(cfg: Any) -> list[tuple[str, Any]]:
    return [("trained", cfg)] + ([("untrained", untrained_config(cfg))] if cfg.bench.baseline_untrained else [])


def _command(stage: str, config_path: str, overrides: list[str] | None) -> str:
    """The command that produces ``stage``'s output for the same config and overrides (shell-quoted)."""
    import shlex

    return " ".join(["eagle3", stage, shlex.quote(str(config_path)),
                     *[f"-o {shlex.quote(o)}" for o in overrides or []]])


def _summary(cfg: Any, parent: str, flow_name: str, record: dict, **extra: Any) -> dict:
    _, exp_id = tracking.client_for(cfg)
    out = {"flow": flow_name, "config": cfg.name, "run_dir": str(cfg.run_dir()),
           "mlflow_uri": tracking.tracking_uri(cfg), "experiment_id": exp_id, "parent_run_id": parent,
           "stages": record, **extra}
    publish_summary(cfg, parent, f"{flow_name}: {cfg.name}", [f"- {k}: {v}" for k, v in record.items()])
    return out


@flow(name="eagle3-extract", flow_run_name=flow_run_label, log_prints=False)
def extract_flow(config_path: str, overrides: list[str] | None = None, refresh: bool = False) -> dict:
    """Hidden-state extraction of CONFIG into ``<run_dir>/extract``."""
    cfg = load_run_config(config_path, overrides)
    record: dict = {}
    with parent_run(cfg, "eagle3-extract", record) as parent:
        data = run_stage(extract_task, cfg=cfg, parent=parent, stage="extract",
                         out_dir=stage_dirs(cfg)["extract"], refresh=refresh, record=record)
        return _summary(cfg, parent, "eagle3-extract", record, data=data_line(data.dir))


@flow(name="eagle3-train", flow_run_name=flow_run_label, log_prints=False)
def train_flow(config_path: str, overrides: list[str] | None = None, refresh: bool = False) -> dict:
    """Train the draft (and the untrained baseline) on ``<run_dir>/extract``."""
    cfg = load_run_config(config_path, overrides)
    data = finished_output(stage_dirs(cfg)["extract"], "extract", _command("extract", config_path, overrides))
    record: dict = {}
    with parent_run(cfg, "eagle3-train", record) as parent:
        for variant, c in _variants(cfg):
            run_stage(train_task, cfg=c, parent=parent, stage="train", variant=variant, data=data,
                      out_dir=stage_dirs(c, variant)["train"], refresh=refresh, record=record)
        return _summary(cfg, parent, "eagle3-train", record)


@flow(name="eagle3-convert", flow_run_name=flow_run_label, log_prints=False)
def convert_flow(config_path: str, overrides: list[str] | None = None, refresh: bool = False) -> dict:
    """Convert + validate + equivalence-check the trained (and untrained) drafts into ``<run_dir>/serving*``."""
    cfg = load_run_config(config_path, overrides)
    data = finished_output(stage_dirs(cfg)["extract"], "extract", _command("extract", config_path, overrides))
    record: dict = {}
    with parent_run(cfg, "eagle3-convert", record) as parent:
        for variant, c in _variants(cfg):
            d = stage_dirs(c, variant)
            draft = finished_output(d["train"], "train", _command("train", config_path, overrides))
            run_stage(convert_task, cfg=c, parent=parent, stage="convert", variant=variant, draft=draft,
                      data=data, out_dir=d["serving"], refresh=refresh, record=record)
        return _summary(cfg, parent, "eagle3-convert", record)


@flow(name="eagle3-deploy", flow_run_name=flow_run_label, log_prints=False)
def deploy_flow(config_path: str, overrides: list[str] | None = None, refresh: bool = False) -> dict:
    """Pre-flight, deploy + benchmark the converted drafts behind the readiness gate, the acceptance figures, the
    decision, then the acceptance gate."""
    cfg = load_run_config(config_path, overrides)
    record: dict = {}
    results: dict = {}
    servings: dict = {}
    dirs = stage_dirs(cfg)
    data = finished_output(dirs["extract"], "extract", "") if (dirs["extract"] / "manifest.json").is_file() else None
    with parent_run(cfg, "eagle3-deploy", record) as parent:
        serving = finished_output(dirs["serving"], "convert", _command("convert", config_path, overrides))
        pre = run_stage(preflight_task, cfg=cfg, parent=parent, stage="preflight", record=record, serving=serving,
                        data=data)
        for variant, c in _variants(cfg):
            d = stage_dirs(c, variant)
            serving = finished_output(d["serving"], "convert", _command("convert", config_path, overrides))
            servings[variant] = serving
            results[variant] = run_stage(deploy_task, cfg=c, parent=parent, stage="deploy-bench", variant=variant,
                                         serving=serving, deploy_dir=d["deploy"], bench_dir=d["bench"],
                                         timeout_s=deploy_timeout_s(c), refresh=refresh, record=record)
        train = finished_output(dirs["train"], "train", "") if (dirs["train"] / "manifest.json").is_file() else None
        figures = acceptance_task(cfg, results["trained"], results.get("untrained"), servings["trained"], parent,
                                  train=train)
        decision_task(cfg, train, figures, parent, preflight=pre)  # recorded before the gate decides: pass or fail
        gate_task(cfg, figures)
        return _summary(cfg, parent, "eagle3-deploy", record, acceptance_length=figures.served,
                        acceptance_length_untrained=figures.untrained)


STAGE_FLOWS = {"extract": extract_flow, "train": train_flow, "convert": convert_flow, "deploy": deploy_flow}
