"""Hand-overs across machines that mount the shared storage at different paths: cache
keys name the output folder relative to the runs directory, a cached result is re-pointed at this
machine's path of the same folder, and the trainer accepts hidden states whose manifest names the
same target at another path."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

pytest.importorskip("prefect")

from eagle3.artifacts import read_manifest, sha256_file, write_manifest  # noqa: E402
from eagle3.config import load_config  # noqa: E402
from eagle3.errors import DataError  # noqa: E402
from tasks import caching  # noqa: E402
from tasks.results import StageResult  # noqa: E402


def _stage_dir(path, text: str):
    path.mkdir(parents=True, exist_ok=True)
    (path / "payload.txt").write_text(text)
    write_manifest(path, "hidden_states")
    return path


def _two_mounts(tmp_path):
    """The same runs directory as two machines see it: a copy at another absolute path (same
    content)."""
    a, b = tmp_path / "gpu-node" / "runs", tmp_path / "cpu-node" / "mnt" / "runs"
    _stage_dir(a / "tiny" / "extract", "states")
    shutil.copytree(a, b)
    return a, b


def test_cache_key_names_the_output_relative_to_the_runs_directory(tmp_path):
    a, b = _two_mounts(tmp_path)
    key = lambda root, out: caching.stage_key(  # noqa: E731
        "train",
        load_config(None, [f"paths.runs_dir={root}"]),
        root / out,
        inputs={"data": root / "tiny" / "extract"},
    )
    assert key(a, "tiny/train") == key(b, "tiny/train")
    assert key(a, "tiny/train") != key(a, "tiny/train-other")
    cfg = load_config(None, [f"paths.runs_dir={a}"])
    assert caching.run_relative(a / "tiny" / "train", cfg) == "tiny/train"
    assert caching.run_relative(tmp_path / "elsewhere", cfg) == str(
        (tmp_path / "elsewhere").resolve()
    )


def test_cached_result_is_re_pointed_at_this_machines_path(tmp_path):
    a, b = _two_mounts(tmp_path)
    made_on_a = StageResult(
        "extract",
        a / "tiny" / "extract",
        read_manifest(a / "tiny" / "extract")["content_hash"],
        "run-1",
    )
    moved = caching.relocate(made_on_a, b / "tiny" / "extract")
    assert moved == StageResult("extract", b / "tiny" / "extract", made_on_a.content_hash, "run-1")
    assert made_on_a.dir == a / "tiny" / "extract" and caching.output_matches(moved)
    assert caching.relocate({"dir": str(a / "tiny" / "extract")}, b / "tiny" / "extract") == {
        "dir": str(a / "tiny" / "extract")
    }  # not a StageResult (an older cached form): unchanged
    # another content at the local path, or nothing there: left as it was (output_matches decides)
    _stage_dir(b / "tiny" / "extract", "other states")
    assert caching.relocate(made_on_a, b / "tiny" / "extract") == made_on_a
    assert caching.relocate(made_on_a, b / "tiny" / "nothing") == made_on_a


def _target(path, weight: float):
    """A minimal target folder: config.json and one safetensors file."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text(
        json.dumps({"hidden_size": 4, "num_hidden_layers": 2, "vocab_size": 8})
    )
    save_file({"embed.weight": torch.full((8, 4), weight)}, str(path / "model.safetensors"))
    return path


def test_trainer_accepts_the_same_target_at_another_path_and_refuses_another(tmp_path):
    from eagle3.artifacts import weights_hash
    from eagle3.train.data import _check_target

    made = _target(tmp_path / "gpu-node" / "cache" / "models" / "t", 1.0)
    manifest = {
        "target": {
            "path": str(made),
            "config_hash": sha256_file(made / "config.json"),
            "weights_hash": weights_hash(made),
            "hidden_size": 4,
            "num_layers": 2,
            "vocab_size": 8,
        }
    }
    conf = SimpleNamespace(hidden_size=4, num_hidden_layers=2, vocab_size=8)
    here = tmp_path / "cpu-node" / "assets" / "models" / "t"
    shutil.copytree(made, here)
    _check_target(tmp_path, manifest, here, conf)  # same bytes, other mount point: accepted
    _check_target(tmp_path, manifest, made, conf)

    other = _target(tmp_path / "other" / "t", 2.0)  # same config, other weights
    with pytest.raises(
        DataError, match=r"dataset made from another target: target.path .*gpu-node.*weights differ"
    ):
        _check_target(tmp_path, manifest, other, conf)
    old = {
        "target": {"path": str(made), "hidden_size": 4}
    }  # a manifest without the hashes: paths must agree
    with pytest.raises(DataError, match="dataset made from another target"):
        _check_target(tmp_path, old, here, conf)


def test_equivalence_reads_the_target_where_this_machine_has_it(tmp_path, tiny_target_dir):
    """A speculators draft names its target (verifier) by the path it had where training ran;
    convert + equivalence on another machine (asset cache mounted elsewhere) must use this machine's
    target folder."""
    from eagle3.convert.equivalence import check_equivalence
    from eagle3.convert.stage import convert
    from testkit.broken_corpus import make_speculators_draft

    gpu_node_target = tmp_path / "gpu-node" / "cache" / "tiny"
    shutil.copytree(tiny_target_dir, gpu_node_target)
    draft = make_speculators_draft(gpu_node_target, tmp_path / "train")
    assert json.loads((draft / "config.json").read_text())["speculators_config"]["verifier"][
        "name_or_path"
    ] == str(gpu_node_target)
    shutil.rmtree(gpu_node_target)  # this machine has the target only at its own mount point
    convert(draft, tmp_path / "serving", target_dir=tiny_target_dir)
    report = check_equivalence(
        draft, tmp_path / "serving", target_dir=tiny_target_dir, atol=1e-4, num_tokens=16
    )
    assert report["passed"]
