"""speculators' notices while it reads the target's embeddings and LM head: a tied target's
"lm_head.weight not found" and a single-file checkpoint's "no index" become one explained line; an
untied target without its LM head is refused (VERIFIER_LM_HEAD); other notices pass through."""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("speculators")

from loguru import logger as loguru_logger  # noqa: E402
from speculators.utils.loading import load_model_layers  # noqa: E402

from eagle3.errors import ConfigError  # noqa: E402
from eagle3.train.verifier_weights import verifier_notices  # noqa: E402

NAMES = ["embed_tokens.weight", "lm_head.weight"]


def _target(path, *, tied: bool, drop_lm_head: bool = False):
    """A 1-layer Llama of hidden size 16 and vocabulary 32, saved as one model.safetensors."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    conf = LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=32,
        tie_word_embeddings=tied,
    )
    LlamaForCausalLM(conf).save_pretrained(path)
    if drop_lm_head:  # an untied target whose LM head was lost on the way
        sd = load_file(path / "model.safetensors")
        sd.pop("lm_head.weight")
        save_file(sd, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture
def loguru_lines():
    lines: list[str] = []
    sink = loguru_logger.add(lambda m: lines.append(m.record["message"]), level="WARNING")
    yield lines
    loguru_logger.remove(sink)


def test_tied_target_gives_one_explained_line(tmp_path, loguru_lines, caplog):
    target = _target(tmp_path / "tied", tied=True)
    # without the wrapper speculators warns twice (no index; no lm_head.weight)
    load_model_layers(NAMES, str(target))
    assert any("lm_head.weight" in x for x in loguru_lines), loguru_lines
    loguru_lines.clear()
    with caplog.at_level(logging.INFO, logger="eagle3.train.verifier_weights"):
        with verifier_notices(target) as seen:
            got = load_model_layers(NAMES, str(target))
    assert "lm_head.weight" not in got and seen == {"lm_head", "no_index"}
    assert loguru_lines == []
    mine = [r.getMessage() for r in caplog.records if r.name == "eagle3.train.verifier_weights"]
    assert len(mine) == 1 and "tie_word_embeddings: true" in mine[0], mine
    assert "single-file checkpoint" in mine[0] and str(target) in mine[0]


def test_untied_target_without_lm_head_is_refused(tmp_path, loguru_lines):
    target = _target(tmp_path / "lost", tied=False, drop_lm_head=True)
    with pytest.raises(ConfigError) as e:
        with verifier_notices(target):
            load_model_layers(NAMES, str(target))
    msg = str(e.value)
    assert msg.startswith("VERIFIER_LM_HEAD: ") and "lm_head.weight" in msg
    assert "tie_word_embeddings is false" in msg and str(target) in msg


def test_untied_target_with_its_lm_head_says_nothing_and_other_notices_pass(
    tmp_path, loguru_lines, caplog
):
    target = _target(tmp_path / "untied", tied=False)
    with caplog.at_level(logging.INFO, logger="eagle3.train.verifier_weights"):
        with verifier_notices(target) as seen:
            got = load_model_layers([*NAMES, "no.such.weight"], str(target))
    assert "lm_head.weight" in got and seen == {"no_index"}
    # a notice the wrapper does not know about still reaches the console
    assert any("no.such.weight" in x for x in loguru_lines), loguru_lines
    mine = [r.getMessage() for r in caplog.records if r.name == "eagle3.train.verifier_weights"]
    assert len(mine) == 1 and "LM head" not in mine[0]


def test_absent_tie_key_counts_as_transformers_default(tmp_path, loguru_lines, caplog):
    target = _target(tmp_path / "default", tied=True)
    conf = json.loads((target / "config.json").read_text())
    conf.pop("tie_word_embeddings", None)
    (target / "config.json").write_text(json.dumps(conf))
    with caplog.at_level(logging.INFO, logger="eagle3.train.verifier_weights"):
        with verifier_notices(target):
            load_model_layers(NAMES, str(target))
    assert any("transformers' default true" in r.getMessage() for r in caplog.records)
