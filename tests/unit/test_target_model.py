import pytest
import torch

from eagle3.errors import ConfigError
from eagle3.target_model import (
    capture_hidden_states,
    default_aux_layer_ids,
    load_target,
    validate_aux_layer_ids,
)


def test_default_rule_and_range_errors():
    assert default_aux_layer_ids(30) == [2, 15, 27]
    assert default_aux_layer_ids(8) == [2, 4, 5]
    with pytest.raises(ConfigError, match=r"4 layers"):
        default_aux_layer_ids(4)
    with pytest.raises(ConfigError, match=r"\[31\] out of range.*30 layers"):
        validate_aux_layer_ids([2, 15, 31], 30)
    with pytest.raises(ConfigError, match="strictly increasing"):
        validate_aux_layer_ids([15, 2, 27], 30)
    # L itself (the last layer's output) is stored anyway and no engine can capture it as an aux
    # state
    with pytest.raises(
        ConfigError,
        match=r"ids \[30\] out of range.*expected HF hidden_states indices in \[1, 29\]",
    ):
        validate_aux_layer_ids([2, 15, 30], 30)
    with pytest.raises(ConfigError, match=r"ids \[0\] out of range"):
        validate_aux_layer_ids([0, 15, 27], 30)
    validate_aux_layer_ids([1, 15, 29], 30)


def test_capture_matches_hf_hidden_states_and_prenorm_last(tiny_target_dir):
    model, tok = load_target(tiny_target_dir, "float32", "cpu")
    ids = tok("hello world, this is a test", return_tensors="pt").input_ids
    n = model.config.num_hidden_layers
    with capture_hidden_states(model, [2, 4, n]) as cap, torch.no_grad():
        out = model(ids, output_hidden_states=True)
    assert torch.equal(cap[2], out.hidden_states[2])
    assert torch.equal(cap[4], out.hidden_states[4])
    # transformers 5.x: hidden_states[-1] is after the final norm; the capture is before it
    assert torch.allclose(model.model.norm(cap[n]), out.hidden_states[n], atol=1e-6)
    assert not torch.allclose(cap[n], out.hidden_states[n])
