"""What a new user meets with extract.mode and train.select_best_by: a train config whose
extract.mode differs from the extract folder's is refused; unused keys stay out of the cache keys;
measured selection without dev prompts is refused at load; the cache size is within 1 kB to 1 PB;
MLflow names the real mode and one name per figure; the cut warning is logged once."""

import json
import logging
import math
from pathlib import Path

import pytest

from eagle3.config import load_config
from eagle3.errors import ConfigError
from eagle3.extract.stage import extract

# imported here, not in a test: its first import sets up Prefect's logging, which replaces the
# root logger's handlers, caplog's among them
from flows.common import untrained_config
from tests.conftest import REPO

CONFIG = REPO / "configs" / "tiny-random.yaml"
BASE = [
    "data.num_conversations=12",
    "data.max_seq_len=64",
    "train.draft_vocab_size=32",
    "train.max_tokens_per_batch=48",
    "train.epochs=1",
    "train.log_every=1",
]
WINDOW = ["extract.cache_max_gb=0.0003"]


def _cfg(runs: Path, mode: str = "offline", *more: str):
    window = WINDOW if mode == "cached" else []
    return load_config(
        CONFIG, [f"paths.runs_dir={runs}", *BASE, f"extract.mode={mode}", *window, *more]
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{mode: (runs dir, extract dir)} of an offline, an online and a cached extraction."""
    root = tmp_path_factory.mktemp("modes")
    out = {}
    for mode in ("offline", "online", "cached"):
        d = root / mode / "extract"
        extract(_cfg(root / "runs", mode), d, progress=False)
        out[mode] = (root / "runs", d)
    return out


# ---- extract.mode against the folder


@pytest.mark.parametrize(
    "want, got",
    [("offline", "online"), ("online", "offline"), ("online", "cached"), ("cached", "online")],
)
def test_train_refuses_a_folder_of_another_mode(folders, tmp_path, want, got):
    from eagle3.train.stage import train

    runs, data = folders[got]
    cfg = _cfg(runs, want)
    for c in (cfg, untrained_config(cfg)):  # the baseline too
        with pytest.raises(ConfigError) as e:
            train(c, data, tmp_path / "out", progress=False)
        msg = str(e.value)
        assert msg.startswith("EXTRACT_MODE_MISMATCH: ")
        assert f"{data / 'manifest.json'}: mode expected {want!r}" in msg
        assert f"got {got!r}" in msg and f"train with -o extract.mode={got}" in msg
        redo = (
            f"(eagle3 extract CONFIG -o extract.mode={want}"
            + (f" -o extract.cache_max_gb={WINDOW[0].split('=')[1]}" if want == "cached" else "")
            + (" with this run's other -o overrides)")
        )
        assert redo in msg  # the extract command carries the mode an override may have set
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_train_refuses_a_cached_folder_of_another_window(folders, tmp_path):
    from eagle3.train.online import check_data_mode

    runs, data = folders["cached"]
    assert check_data_mode(_cfg(runs, "cached"), data) == "cached"
    other = load_config(
        CONFIG, [f"paths.runs_dir={runs}", *BASE, "extract.mode=cached", "extract.cache_max_gb=0.5"]
    )
    with pytest.raises(
        ConfigError,
        match=r"EXTRACT_CACHE_MISMATCH: .*online.cache_max_bytes "
        r"expected 500000000 .*got 300000 \(mode 'cached' "
        r"in both\); run the extract stage with this "
        r"config's window \(eagle3 extract CONFIG -o "
        r"extract.mode=cached -o extract.cache_max_gb=0.5 "
        r"with this run's other -o overrides\) "
        r"or train with -o extract.cache_max_gb=0.0003$",
    ):
        check_data_mode(other, data)


def test_untrained_baseline_records_the_mode_it_ran_and_no_cut_warning(folders, tmp_path, caplog):
    from eagle3.train.stage import train

    runs, data = folders["online"]
    cfg = _cfg(runs, "online", "train.max_steps=1")
    with caplog.at_level(logging.WARNING, logger="eagle3.train.data"):
        base = train(untrained_config(cfg), data, tmp_path / "base", progress=False)
        assert not [r for r in caplog.records if "cuts" in r.getMessage()]
        trained = train(cfg, data, tmp_path / "trained", progress=False)
    cuts = [r for r in caplog.records if "cuts" in r.getMessage()]
    assert len(cuts) == 1  # the run that trains says it, once
    assert base["extract_mode"] == trained["extract_mode"] == "online"
    assert base["optimizer_steps"] == 0 and base["warnings"] == []
    off_runs, off_data = folders["offline"]
    off = train(
        _cfg(off_runs, "offline", "train.max_steps=0"), off_data, tmp_path / "off", progress=False
    )
    assert off["extract_mode"] == "offline" and "online" not in off


def test_a_new_window_is_written_where_the_old_one_was(folders, tmp_path):
    """A cached extraction re-run with another extract.cache_max_gb supersedes the folder, so the
    train stage reads the new window instead of refusing the old one again."""
    import shutil

    from eagle3.train.online import check_data_mode
    from tasks.extract import extract_superseding

    runs, data = folders["cached"]
    d = tmp_path / "extract"
    shutil.copytree(data, d)
    other = _cfg(runs, "cached", "extract.cache_max_gb=0.5")
    extract_superseding(other, d)
    assert json.loads((d / "online.json").read_text())["cache_max_bytes"] == 500_000_000
    assert check_data_mode(other, d) == "cached"
    same = json.loads((d / "manifest.json").read_text())
    assert extract(other, d, progress=False) == same  # the same plan again: reused as it is


def test_shard_size_and_workers_are_warned_unused_online():
    from eagle3.config_checks import config_warnings

    cfg = load_config(
        CONFIG,
        [
            "extract.mode=online",
            "extract.shard_size=7",
            "extract.stall_timeout_s=9",
            "extract.sglang_startup_timeout_s=5",
        ],
    )
    warned = [w for w in config_warnings(cfg) if w.startswith("UNUSED_KEY: extract.")]
    for key, reader in (
        ("shard_size", "mode offline"),
        ("stall_timeout_s", "mode offline"),
        ("sglang_startup_timeout_s", "backend sglang"),
    ):
        assert any(
            w.startswith(f"UNUSED_KEY: extract.{key} ") and f"read only with extract.{reader}" in w
            for w in warned
        ), key
    assert not any(
        "shard_size" in w for w in config_warnings(load_config(CONFIG, ["extract.shard_size=7"]))
    )


# ---- unused keys out of the keys


def test_unused_keys_change_no_key_and_used_ones_do(tmp_path):
    from tasks.stage_config import sections_hash, settings_digest

    def h(*ov):
        cfg = load_config(CONFIG, [f"paths.runs_dir={tmp_path}", *ov])
        return (
            sections_hash(cfg, "extract"),
            sections_hash(cfg, "train"),
            settings_digest(cfg, ("extract", "train")),
        )

    assert h() == h("extract.cache_max_gb=5")  # offline: the window is unused
    assert h("extract.mode=online") == h("extract.mode=online", "extract.cache_max_gb=5")
    assert h("extract.mode=cached", "extract.cache_max_gb=1") != h(
        "extract.mode=cached", "extract.cache_max_gb=2"
    )
    assert h() == h(
        "train.dev_prompts=3", "train.dev_max_new_tokens=9", "train.dev_prompts_file=/x"
    )  # simulated: the dev keys are unused
    online = ("extract.mode=online",)  # no shard is written and no worker started online
    unread_online = (
        "extract.shard_size=7",
        "extract.num_gpus=2",
        "extract.stall_timeout_s=9",
        "extract.startup_timeout_s=9",
        "extract.sglang_request_timeout_s=5",
        "extract.sglang_startup_timeout_s=5",
        "extract.sglang_env={A: b}",
    )
    assert h(*online) == h(*online, *unread_online)
    assert h() == h("extract.sglang_request_timeout_s=5")  # backend hf: never read
    assert h() != h("extract.shard_size=7")  # offline shards by it
    measured = ("train.select_best_by=measured",)
    assert h(*measured) != h(*measured, "train.dev_prompts=3")
    assert h(*measured) != h(*measured, "train.dev_max_new_tokens=9")


def test_a_finished_draft_is_not_superseded_for_an_unused_key(tmp_path):
    from eagle3.artifacts import write_manifest
    from tasks.train import supersede_finished

    cfg = load_config(CONFIG, [f"paths.runs_dir={tmp_path}"])
    out = tmp_path / "train"
    out.mkdir()
    write_manifest(out, "draft_checkpoint", config=cfg.train.model_dump(mode="json"))
    unused = load_config(CONFIG, [f"paths.runs_dir={tmp_path}", "train.dev_prompts=3"])
    assert supersede_finished(unused, out) is None and (out / "manifest.json").is_file()
    other = load_config(CONFIG, [f"paths.runs_dir={tmp_path}", "train.lr=0.5"])
    assert supersede_finished(other, out) == tmp_path / "train.superseded"


# ---- measured selection and its dev prompts


@pytest.mark.parametrize(
    "ov, why",
    [
        ("data.val_fraction=0", "data.val_fraction 0.0"),
        ("data.num_conversations=1", "data.num_conversations 1"),
    ],
)
def test_measured_selection_without_dev_prompts_is_refused_at_load(ov, why):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIG, ["train.select_best_by=measured", ov])
    line = str(e.value).splitlines()[1].strip()
    assert line.startswith("NO_DEV_PROMPTS: train.select_best_by measured: expected dev prompts")
    assert why in line and "Value error" not in line
    load_config(CONFIG, ["train.select_best_by=measured", ov, "train.dev_prompts_file=p.txt"])
    load_config(CONFIG, [ov])  # simulated selection needs none


def test_dev_prompts_file_is_named_and_a_directory_is_called_one(tmp_path):
    from eagle3.train.stage import check_settings

    for path, what in ((tmp_path, "a directory"), (tmp_path / "none.txt", "not found")):
        cfg = load_config(
            CONFIG, ["train.select_best_by=measured", f"train.dev_prompts_file={path}"]
        )
        with pytest.raises(ConfigError) as e:
            check_settings(cfg)
        assert str(e.value) == (
            f"DEV_PROMPTS_FILE: train.dev_prompts_file: expected a prompts "
            f"file (JSONL, JSON or text: the eagle3 bench --prompts FILE "
            f"formats), got {str(path)!r} ({what})"
        )
    (tmp_path / "p.txt").write_text("hello\n")
    check_settings(
        load_config(
            CONFIG,
            ["train.select_best_by=measured", f"train.dev_prompts_file={tmp_path / 'p.txt'}"],
        )
    )


def test_one_dev_prompt_is_warned_once_and_recorded(folders, tmp_path, caplog):
    from eagle3.train.stage import train

    runs, data = folders["offline"]
    assert len(json.loads((data / "manifest.json").read_text())["splits"]["val"]) == 1
    cfg = _cfg(
        runs,
        "offline",
        "train.select_best_by=measured",
        "train.max_steps=2",
        "train.eval_every=1",
        "train.dev_max_new_tokens=4",
    )
    with caplog.at_level(logging.WARNING, logger="eagle3.train.stage"):
        m = train(cfg, data, tmp_path / "out", progress=False)
    said = [r.getMessage() for r in caplog.records if "DEV_ONE_PROMPT" in r.getMessage()]
    assert len(said) == 1  # three evaluations, one warning
    assert said[0].startswith(
        "DEV_ONE_PROMPT: train.select_best_by=measured picks the best "
        "checkpoint by the acceptance on 1 dev prompt"
    )
    assert m["warnings"] == said and m["dev_prompts"] == 1


# ---- the cache size


@pytest.mark.parametrize("value", ["inf", ".inf", "nan", "-1", "0", "1e-12", "0.0000009", "1e30"])
@pytest.mark.parametrize("mode", ["cached", "offline"])
def test_cache_size_must_be_between_a_kilobyte_and_a_petabyte(value, mode):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIG, [f"extract.mode={mode}", f"extract.cache_max_gb={value}"])
    lines = str(e.value).splitlines()
    assert len(lines) == 2
    assert (
        lines[1]
        .strip()
        .startswith(
            "CACHE_SIZE_INVALID: extract.cache_max_gb: expected a "
            "size in GB from 1e-06 (1 kB) to 1e+06 (1 PB)"
        )
    )
    got = float(lines[1].split(", got ")[1].split(" ")[0])
    assert math.isnan(got) if value == "nan" else got == float(value.lstrip("."))


@pytest.mark.parametrize(
    ("gb", "nbytes"), [("1e-6", 1_000), ("0.57", 570_000_000), ("1e6", 10**15)]
)
def test_cache_size_in_bytes_is_rounded_not_truncated(gb, nbytes):
    cfg = load_config(CONFIG, ["extract.mode=cached", f"extract.cache_max_gb={gb}"])
    assert cfg.extract.cache_max_bytes == nbytes


def test_cached_mode_without_a_size_is_one_clean_line():
    with pytest.raises(ConfigError) as e:
        load_config(CONFIG, ["extract.mode=cached"])
    lines = str(e.value).splitlines()
    assert lines[1] == (
        "  CACHE_SIZE_MISSING: extract.cache_max_gb: expected the window's size "
        "in GB (1e-06 to 1e+06) with extract.mode cached, got none [from -o "
        "extract.mode=cached]"
    )
    assert len(lines) == 2


# ---- MLflow


def test_offline_runs_log_the_extract_mode_param(tmp_path):
    from tasks.tracking import config_params, stage_params

    cfg = load_config(CONFIG, [f"paths.runs_dir={tmp_path}"])
    assert config_params(cfg)["extract.mode"] == "offline"
    assert stage_params(cfg, "extract")["extract.mode"] == "offline"
    assert "extract.mode" not in stage_params(cfg, "train")
    assert "mode" not in cfg.extract.model_dump(mode="json")  # the keys stay as they were


def test_cached_runs_are_tagged_cached_with_one_name_per_figure(folders, tmp_path):
    from mlflow import MlflowClient

    from tasks import tracking
    from tasks.extract import extract_task
    from tasks.results import StageResult
    from tasks.train import train_task

    runs = tmp_path / "runs"
    cfg = _cfg(runs, "cached", "train.max_steps=3")
    parent = tracking.start_pipeline_run(cfg, flow_run_id="f-1", flow_name="test")
    ex = extract_task.fn(cfg, tmp_path / "extract", parent)
    tr = train_task.fn(cfg, ex, tmp_path / "train", parent)
    client = MlflowClient(tracking.tracking_uri(cfg))
    ex_run, tr_run = client.get_run(ex.mlflow_run_id), client.get_run(tr.mlflow_run_id)
    assert ex_run.data.tags["eagle3.extract_mode"].startswith("cached: ")
    assert tr_run.data.tags["eagle3.extract_mode"].startswith("cached (")
    assert ex_run.data.metrics["cache_max_bytes"] == 300_000
    assert "timings.extract_s" not in ex_run.data.metrics  # nothing extracted there
    assert ex_run.data.params["extract.mode"] == "cached"
    got = tr_run.data.metrics
    for gone in ("tokens_recomputed", "extract_tokens_per_s"):
        assert gone not in got
    for k in ("cache_max_bytes", "cache_bytes", "cache_samples", "cache_hits", "cache_hit_tokens"):
        assert k in got, k
    manifest = json.loads((tmp_path / "train" / "manifest.json").read_text())
    history = client.get_metric_history(tr.mlflow_run_id, "extract/tokens_recomputed")
    last = max(m.step for m in history)
    assert last == manifest["optimizer_steps"] == 3
    # the series ends at the total (the final evaluation's forwards included)
    assert (
        max(m.value for m in history if m.step == last) == manifest["online"]["tokens_recomputed"]
    )
    assert isinstance(tr, StageResult) and tr.metrics["cache_hits"] >= 0
    with pytest.raises(ConfigError, match="EXTRACT_MODE_MISMATCH"):
        train_task.fn(_cfg(runs, "online"), ex, tmp_path / "train2", parent)


def test_readme_lists_the_mode_keys_within_its_length():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for key in ("extract.mode", "extract.cache_max_gb", "train.select_best_by"):
        assert f"`{key}" in text, key


def test_superseding_an_extraction_of_another_mode_warns_about_the_data_once(tmp_path, caplog):
    from tasks.extract import extract_superseding

    out = tmp_path / "extract"
    extract(_cfg(tmp_path / "runs", "online"), out, progress=False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="eagle3.extract.stage"):
        m = extract_superseding(_cfg(tmp_path / "runs", "offline"), out)
    assert "mode" not in m and (out / "hidden_states").is_dir()  # replaced by the offline one
    said = [r for r in caplog.records if "records skipped" in r.getMessage()]
    assert len(said) == 1


def test_offline_extraction_logs_the_bytes_it_stored_under_online_s_name(tmp_path):
    from mlflow import MlflowClient

    from tasks import tracking
    from tasks.extract import extract_task

    cfg = _cfg(tmp_path / "runs", "offline")
    parent = tracking.start_pipeline_run(cfg, flow_run_id="f-2", flow_name="test")
    ex = extract_task.fn(cfg, tmp_path / "extract", parent)
    got = MlflowClient(tracking.tracking_uri(cfg)).get_run(ex.mlflow_run_id).data.metrics
    stored = json.loads((tmp_path / "extract" / "manifest.json").read_text())["bytes"]
    assert stored > 0 and got["hidden_state_bytes_on_disk"] == stored


@pytest.mark.parametrize("mode", ["online", "cached"])
def test_online_modes_with_the_sglang_backend_are_refused_at_load(mode):
    window = WINDOW if mode == "cached" else []
    with pytest.raises(
        ConfigError,
        match=rf"MODE_BACKEND: extract.backend: expected 'hf' with "
        rf"extract.mode={mode} \(the target runs inside the training process, "
        r"through transformers\), got 'sglang'",
    ):
        load_config(CONFIG, [f"extract.mode={mode}", *window, "extract.backend=sglang"])
