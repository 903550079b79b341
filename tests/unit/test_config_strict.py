"""Config loading is strict and says why: unknown keys name their ``-o`` override and the nearest
known keys, numbers are numbers (no booleans, no quoted integers), and settings that load but are
likely mistakes (a key the settings leave unused, a serve.host reachable from other machines) are
warned about once, while the project's own configs load without any of these warnings."""

from __future__ import annotations

import logging

import pytest
from pydantic import BaseModel

from eagle3.config import RunConfig, load_config
from eagle3.errors import ConfigError
from tests.conftest import CONFIGS

NEW_CODES = ("UNUSED_KEY", "SERVE_HOST_EXPOSED")


def _error(path=None, overrides=()) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(path, list(overrides))
    return str(e.value)


# ---- unknown keys


def test_an_unknown_section_from_an_override_names_the_override():
    msg = _error(None, ["nosection.key=1"])
    line = msg.splitlines()[1].strip()
    assert line.startswith("UNKNOWN_KEY: nosection: expected a known section")
    assert line.endswith("[from -o nosection.key=1]")
    assert "train" in line and "serve" in line  # no close match: the sections are listed


@pytest.mark.parametrize(
    "override, suggested",
    [
        ("trian.epochs=1", "train.epochs"),
        ("train.epoch=1", "train.epochs"),
        ("target.tiny.sed=1", "target.tiny.seed"),
    ],
)
def test_an_unknown_key_suggests_the_nearest_known_keys(override, suggested):
    line = _error(None, [override]).splitlines()[1]
    assert f"did you mean {suggested}" in line and f"[from -o {override}]" in line
    assert line.strip().startswith("UNKNOWN_KEY: ")


def test_an_unknown_key_in_the_file_suggests_without_naming_an_override(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  epoch: 2\n")
    msg = _error(f, ["train.lr=0.01"])
    assert "UNKNOWN_KEY: train.epoch: expected a known key in section train" in msg
    assert "did you mean train.epochs" in msg and "[from -o" not in msg
    f.write_text("trian:\n  epochs: 2\n")
    assert "did you mean train.epochs" in _error(f)


# ---- numbers


def _int_fields(model=RunConfig, prefix=""):
    from eagle3.config import _number_kind

    for name, field in model.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            yield from _int_fields(sub, f"{prefix}{name}.")
        elif _number_kind(field.annotation) == (int, False):
            yield prefix + name


INT_FIELDS = sorted(_int_fields())


def test_the_int_fields_are_found():
    assert {
        "train.draft_vocab_size",
        "train.num_layers",
        "serve.port",
        "target.tiny.num_hidden_layers",
        "data.seed",
    } <= set(INT_FIELDS)


@pytest.mark.parametrize("key", INT_FIELDS)
def test_every_integer_field_refuses_a_boolean(key):
    msg = _error(None, [f"{key}=true"])
    assert (
        f"NUMBER_TYPE: {key}: expected an integer, got the boolean True" in msg
        and f"[from -o {key}=true]" in msg
    )


@pytest.mark.parametrize("raw", ["true", "false", "yes"])
def test_a_float_field_refuses_a_boolean(raw):
    assert "NUMBER_TYPE: train.epochs: expected a number, got the boolean" in _error(
        None, [f"train.epochs={raw}"]
    )


def test_fractional_epochs_are_kept_and_a_fractional_integer_is_refused():
    assert load_config(None, ["train.epochs=1.5"]).train.epochs == 1.5  # the schedule reads them
    assert "train.num_layers: Input should be a valid integer" in _error(
        None, ["train.num_layers=1.5"]
    )
    assert load_config(None, ["train.lr=1e-3"]).train.lr == 1e-3  # YAML's string '1e-3'


def test_a_quoted_integer_is_refused_with_a_clear_message(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text('train:\n  draft_vocab_size: "256"\n')
    line = _error(f).splitlines()[1].strip()
    assert line == (
        "NUMBER_TYPE: train.draft_vocab_size: expected an integer, got the string "
        "'256' (write the number without quotes)"
    )


def test_a_boolean_in_a_list_of_integers_is_refused():
    assert "expected an integer, got the boolean True (YAML reads" in _error(
        None, ["extract.aux_layer_ids=[1,true]"]
    )
    assert load_config(None, ["extract.aux_layer_ids=[1,2]"]).extract.aux_layer_ids == [1, 2]


# ---- warnings at load


def _warnings(caplog, overrides, path=None) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="eagle3.config"):
        load_config(path, overrides)
    return [r.getMessage() for r in caplog.records if r.name == "eagle3.config"]


def test_a_set_key_that_the_settings_leave_unused_is_warned_once(caplog):
    ov = ["extract.cache_max_gb=5", "name=unused-once"]
    got = _warnings(caplog, ov)
    assert len(got) == 1 and got[0].startswith(
        "UNUSED_KEY: extract.cache_max_gb is set (5.0) but extract.mode offline never reads it "
        "(read only with extract.mode cached)"
    )
    assert _warnings(caplog, ov) == []  # the same config again: parsed once, warned once
    assert _warnings(caplog, ["extract.mode=cached", "extract.cache_max_gb=5"]) == []


def test_dev_keys_are_unused_with_simulated_selection(caplog, tmp_path):
    got = _warnings(caplog, ["train.dev_prompts_file=/x", "train.dev_prompts=3"])
    assert sorted(m.split(" is set")[0] for m in got) == [
        "UNUSED_KEY: train.dev_prompts",
        "UNUSED_KEY: train.dev_prompts_file",
    ]
    assert all("train.select_best_by simulated never reads it" in m for m in got)
    p = tmp_path / "p.txt"
    p.write_text("hello\n")
    assert _warnings(caplog, ["train.select_best_by=measured", f"train.dev_prompts_file={p}"]) == []


@pytest.mark.parametrize(
    "host, every", [("0.0.0.0", True), ("::", True), ("10.1.2.3", False), ("myhost.example", False)]
)
def test_a_serve_host_reachable_from_other_machines_is_warned(caplog, host, every):
    got = _warnings(caplog, [f"serve.host='{host}'"])
    assert len(got) == 1 and got[0].startswith(f"SERVE_HOST_EXPOSED: serve.host {host!r} binds")
    assert ("every interface" in got[0]) == every


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_loopback_serve_host_is_not_warned(caplog, host):
    assert _warnings(caplog, [f"serve.host='{host}'", "name=loopback"]) == []


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_the_project_configs_load_without_these_warnings(caplog, path):
    from eagle3 import config as config_mod

    config_mod._PARSED.clear()  # a parse cached by another test would warn nothing
    got = _warnings(caplog, [], path)
    assert [m for m in got if m.startswith(NEW_CODES)] == []


def test_the_unused_keys_table_has_one_home():
    from eagle3.config_checks import UNUSED_UNLESS
    from tasks import stage_config

    assert stage_config.UNUSED_UNLESS is UNUSED_UNLESS
