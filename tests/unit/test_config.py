import pytest

from eagle3.config import apply_overrides, load_config
from eagle3.redaction import redact
from eagle3.errors import ConfigError
from tests.conftest import CONFIGS


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    cfg = load_config(path)
    assert cfg.name
    assert "#" in path.read_text().splitlines()[0], (
        f"{path.name}: first line must be a header comment"
    )


def test_overrides_are_typed():
    cfg = load_config(
        CONFIGS / "tiny-random.yaml",
        [
            "train.lr=0.01",
            "extract.aux_layer_ids=[1,2,3]",
            "serve.port=null",
            "bench.temperature=0.5",
        ],
    )
    assert cfg.train.lr == 0.01
    assert cfg.extract.aux_layer_ids == [1, 2, 3]
    assert cfg.serve.port is None
    assert cfg.bench.temperature == 0.5


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match=r"train\.learning_rate"):
        load_config(CONFIGS / "tiny-random.yaml", ["train.learning_rate=1"])


def test_wrong_type_names_key_and_value():
    with pytest.raises(ConfigError, match=r"train\.epochs.*'many'"):
        load_config(None, ["train.epochs=many"])


def test_a_bad_value_from_an_override_is_attributed_to_it(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"tiny-random.yaml with -o overrides: invalid configuration\n"
        r"  CONFIG_VALUE: train.compile_mode: .*\(got 'fast'\) "
        r"\[from -o train.compile_mode=fast\]",
    ):
        load_config(CONFIGS / "tiny-random.yaml", ["train.lr=0.01", "train.compile_mode=fast"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  compile_mode: fast\n")
    with pytest.raises(ConfigError) as err:  # from the file: no override named
        load_config(bad, ["train.lr=0.01"])
    assert "(got 'fast')" in str(err.value) and "[from -o" not in str(err.value)


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="no '='"):
        apply_overrides({}, ["train.lr"])


def test_missing_and_non_mapping_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(bad)


def test_redact_hides_secret_looking_keys():
    assert redact(
        {"a": 1, "hf_token": "x", "env": {"WANDB_API_KEY": "k", "NCCL_DEBUG": "INFO"}}
    ) == {"a": 1, "hf_token": "***", "env": {"WANDB_API_KEY": "***", "NCCL_DEBUG": "INFO"}}


def test_settings_that_mention_tokens_are_not_secrets():
    from eagle3.redaction import is_secret_key

    for key in (
        "max_new_tokens",
        "max_tokens_per_batch",
        "speculative_num_draft_tokens",
        "regenerate_max_new_tokens",
    ):
        assert not is_secret_key(key), key
    for key in (
        "hf_token",
        "HF_TOKEN",
        "WANDB_API_KEY",
        "db.password",
        "aws_secret",
        "OPENAI_APIKEY",
        "token",
    ):
        assert is_secret_key(key), key
    cfg = load_config(CONFIGS / "tiny-random.yaml")
    assert (
        redact(cfg.model_dump(mode="json"))["bench"]["max_new_tokens"] == cfg.bench.max_new_tokens
    )


def test_a_config_is_parsed_once_per_file_content_and_overrides(tmp_path, monkeypatch):
    """One parse per run: the CLI's check and the flow's load share one validation; copies are
    independent; an edited file is parsed again."""
    from eagle3 import config as config_mod

    calls = []
    real = config_mod._parse
    monkeypatch.setattr(config_mod, "_parse", lambda *a: calls.append(a) or real(*a))
    f = tmp_path / "c.yaml"
    f.write_text("name: one\ntrain:\n  lr: 0.001\n")
    a = config_mod.load_config(f, ["train.epochs=2"])
    b = config_mod.load_config(f, ["train.epochs=2"])
    assert len(calls) == 1 and a == b and a is not b
    b.train.max_steps = 0
    assert config_mod.load_config(f, ["train.epochs=2"]).train.max_steps is None
    config_mod.load_config(f, ["train.epochs=3"])
    assert len(calls) == 2
    f.write_text("name: two\n")
    assert config_mod.load_config(f, ["train.epochs=2"]).name == "two" and len(calls) == 3


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_an_empty_config_file_is_refused_not_taken_as_all_defaults(tmp_path, text):
    p = tmp_path / "empty.yaml"
    p.write_text(text)
    with pytest.raises(
        ConfigError, match=r"empty\.yaml: expected a mapping of sections .* got an empty document"
    ):
        load_config(p)


def test_convert_engine_version_must_be_a_pinned_release():
    from eagle3.engines.sglang.profile import RELEASES, VERSION

    assert load_config(None).convert.engine_version == VERSION and VERSION in RELEASES
    with pytest.raises(ConfigError) as e:
        load_config(None, ["convert.engine_version=0.6.0"])
    msg = str(e.value)
    assert "convert.engine_version" in msg and f"{sorted(RELEASES)}" in msg and "'0.6.0'" in msg


@pytest.mark.parametrize("name", ["../../etc", "a/b", "..", ".", "a\\b"])
def test_run_name_that_leaves_the_runs_dir_is_refused(name):
    with pytest.raises(ConfigError, match=r"name: .*one folder name"):
        load_config(None, [f"name={name}"])
    assert load_config(None, ["name=ok-name.v2"]).name == "ok-name.v2"


@pytest.mark.parametrize("kind", ["tiny-random", "smollm2"])
def test_target_path_is_refused_for_a_kind_that_never_reads_it(kind):
    # it would be ignored yet change the cache keys (a retrain for nothing)
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "tiny-random.yaml", [f"target.kind={kind}", "target.path=/x"])
    msg = str(e.value)
    assert f"target.path: Value error, target.kind '{kind}'" in msg
    assert "never reads target.path" in msg and "target.kind=hf" in msg
    assert "(got '/x') [from -o target.path=/x]" in msg
    cfg = load_config(CONFIGS / "tiny-random.yaml", ["target.kind=hf", "target.path=/x"])
    assert (cfg.target.kind, cfg.target.path) == ("hf", "/x")


@pytest.mark.parametrize("raw", ["0.5", "1", "0.523"])
def test_engine_version_read_as_a_number_names_the_releases(raw):
    from eagle3.engines.sglang.profile import RELEASES

    with pytest.raises(ConfigError) as e:
        load_config(None, [f"convert.engine_version={raw}"])
    msg = str(e.value)
    assert "convert.engine_version: Value error, expected a string naming a pinned SGLang " in msg
    assert f"{sorted(RELEASES)}" in msg and f"got the number {raw}" in msg
    assert load_config(None, ["convert.engine_version='0.5.16'"]).convert.engine_version == "0.5.16"
