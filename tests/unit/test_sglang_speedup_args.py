"""lab/sglang_speedup.py refuses a bad --draft, --modes or --concurrency with an argparse error
(exit 2, the flag and the value named) before it loads anything."""

from __future__ import annotations

import pytest

from lab.sglang_speedup import parse


def _error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        parse(["--out", "/tmp/x.json", *argv])
    assert e.value.code == 2
    return capsys.readouterr().err


def _serving(tmp_path, *files: str):
    d = tmp_path / "serving"
    d.mkdir()
    for f in files:
        (d / f).write_text("{}")
    return d


def test_draft_that_is_not_a_serving_folder_is_refused(tmp_path, capsys):
    missing = tmp_path / "nope"
    err = _error(capsys, "--draft", str(missing))
    assert f"--draft {missing}: " in err and "does not exist" in err
    f = tmp_path / "model.safetensors"
    f.write_text("")
    assert "got a file" in _error(capsys, "--draft", str(f))
    empty = _serving(tmp_path)
    err = _error(capsys, "--draft", str(empty))
    assert "missing config.json and *.safetensors" in err and "holds nothing" in err


def test_draft_without_weights_or_config_names_what_is_missing(tmp_path, capsys):
    only_config = _serving(tmp_path, "config.json")
    err = _error(capsys, "--draft", str(only_config))
    assert "missing *.safetensors" in err and "['config.json']" in err
    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    (ok / "model.safetensors").write_text("")
    assert parse(["--out", "/tmp/x.json", "--draft", str(ok)]).draft == str(ok)
    (ok / "config.json").write_text('{"architectures": ["Eagle3DraftModel"]}')  # a train folder
    err = _error(capsys, "--draft", str(ok))
    assert "config.json architectures: expected one of ['LlamaForCausalLMEagle3']" in err
    assert "got ['Eagle3DraftModel']" in err


def test_draft_given_as_the_run_serving_folder_follows_its_latest_json(tmp_path, capsys):
    serving = tmp_path / "run" / "serving"
    digest = serving / "41c45d7a6a35"
    digest.mkdir(parents=True)
    (digest / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    (digest / "model.safetensors").write_text("")
    (serving / "latest.json").write_text('{"dir": "41c45d7a6a35"}')
    assert parse(["--out", "/tmp/x.json", "--draft", str(serving)]).draft == str(digest)
    (serving / "latest.json").write_text('{"dir": "../elsewhere"}')
    err = _error(capsys, "--draft", str(serving))
    assert "--draft: " in err and "latest.json: key 'dir'" in err and "'../elsewhere'" in err
    (serving / "latest.json").write_text('{"dir": "gone"}')
    err = _error(capsys, "--draft", str(serving))
    assert f"--draft {serving}: its latest.json names the folder 'gone', which does not" in err


def test_assets_must_be_a_folder_with_a_prompt_set(tmp_path, capsys):
    err = _error(capsys, "--shape", "smollm2", "--assets", str(tmp_path / "none"))
    assert "--assets: expected a folder, got " in err and "none'" in err
    err = _error(capsys, "--shape", "smollm2", "--assets", str(tmp_path))
    assert f"--assets {tmp_path}: expected at least one of question.jsonl" in err
    (tmp_path / "question.jsonl.xz").write_bytes(b"")
    assert parse(["--out", "/tmp/x.json", "--shape", "smollm2",
                  "--assets", str(tmp_path)]).assets == str(tmp_path)


@pytest.mark.parametrize(
    "raw, item", [("1,x", "'x'"), ("0", "'0'"), ("1,,4", "''"), ("2.5", "'2.5'"), ("-1", "'-1'")]
)
def test_concurrency_must_be_a_comma_list_of_positive_ints(capsys, raw, item):
    err = _error(capsys, "--shape", "smollm2", f"--concurrency={raw}")
    assert "--concurrency: expected a comma list of positive integers" in err
    assert f"got {raw!r} ({item} is not a positive integer)" in err


@pytest.mark.parametrize(
    "raw, what", [("plain,fast", "unknown ['fast']"), (",", "no mode"), ("", "no mode")]
)
def test_modes_must_name_known_modes(capsys, raw, what):
    err = _error(capsys, "--shape", "smollm2", f"--modes={raw}")
    assert "--modes: expected a comma list of plain, chain, tree" in err and what in err


def test_good_arguments_parse_as_before(tmp_path):
    a = parse(
        [
            "--out",
            "/tmp/x.json",
            "--shape",
            "llama8b",
            "--modes",
            "plain, chain",
            "--concurrency",
            "1,4,16",
        ]
    )
    assert a.modes == ["plain", "chain"] and a.concurrency == [1, 4, 16]


@pytest.mark.parametrize("topk", ["0", "1", "-3", "65"])
def test_tree_topk_must_make_a_tree_within_the_configs_bounds(capsys, topk):
    err = _error(capsys, "--shape", "smollm2", f"--tree-topk={topk}")
    assert "--tree-topk: expected an integer in 2..64" in err and f"got {topk}" in err
    assert "top-k 1 is chain drafting" in err


@pytest.mark.parametrize("tokens", ["0", "1", "5000"])
def test_tree_draft_tokens_within_the_configs_bounds(capsys, tokens):
    err = _error(capsys, "--shape", "smollm2", f"--tree-draft-tokens={tokens}")
    assert "--tree-draft-tokens: expected an integer in 2..4096" in err and f"got {tokens}" in err


def test_a_missing_config_is_an_error_line_not_a_traceback(tmp_path, capsys):
    from lab.sglang_speedup import main

    missing = tmp_path / "nope.yaml"
    assert (
        main(["--out", str(tmp_path / "o.json"), "--modes", "plain", "--config", str(missing)]) == 2
    )
    err = capsys.readouterr().err
    assert f"error: config file {missing}: not found" in err and "Traceback" not in err


def _fake_sglang_python(tmp_path, version: str) -> str:
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\necho {version}\n")  # imports "sglang" and reports this version
    py.chmod(0o755)
    return str(py)


def test_sglang_advice_is_per_release_not_make_sglang_env_for_every_version(tmp_path):
    from eagle3.config import load_config
    from eagle3.engines.sglang.profile import RELEASES, VERSION
    from lab.sglang_speedup import sglang_env_problem
    from tests.conftest import CONFIGS

    other = next(v for v in RELEASES if v != VERSION)
    py = _fake_sglang_python(tmp_path, VERSION)
    cfg = load_config(
        CONFIGS / "tiny-random.yaml",
        [f"serve.sglang_python={py}", f"convert.engine_version={other}"],
    )
    why = sglang_env_problem(cfg, ["plain", "tree", "reference-chain"])
    assert why.startswith(
        "serve.sglang_python (modes plain,tree): expected the Python of an "
        f"environment with sglang=={other}"
    )
    assert f"got SGLang {VERSION} in {py}" in why
    assert f"pip install sglang=={other}" in why and "fix: make sglang-env" not in why
    if other == "0.5.16":
        assert "lab/gpu/sglang_kit.sh" in why
    assert sglang_env_problem(cfg, ["reference-plain"]) is None
    cfg = load_config(
        CONFIGS / "tiny-random.yaml",
        [f"serve.sglang_python={py}", f"convert.engine_version={VERSION}"],
    )
    assert sglang_env_problem(cfg, ["plain", "chain"]) is None
    missing = load_config(
        CONFIGS / "tiny-random.yaml",
        [f"serve.sglang_python={tmp_path / 'none'}", f"convert.engine_version={VERSION}"],
    )
    why = sglang_env_problem(missing, ["chain"])
    assert f"got {tmp_path / 'none'} is not an executable file" in why
    assert "fix: make sglang-env" in why
