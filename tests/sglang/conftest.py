"""Conformance tests against the real SGLang 0.5.23: shared skip rule and the run's
summary line."""

from __future__ import annotations

import pytest

from testkit.sglang_harness import sglang_env_missing

# Filled by the tier-1 fixture and the extraction test; printed at the end of the run (CI logs carry
# the numbers).
SUMMARY: dict = {}
EXTRACT_SUMMARY: dict = {}
EAGLE31_SUMMARY: dict = {}

requires_sglang_env = pytest.mark.skipif(
    sglang_env_missing() is not None, reason=sglang_env_missing() or "SGLang environment present"
)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the checkpoints checked and the largest forward difference against SGLang."""
    if SUMMARY:
        terminalreporter.write_line(
            "SGLang 0.5.23 conformance: {checkpoints} checkpoints loaded through "
            "LlamaForCausalLMEagle3.load_weights ({corpus} from the broken corpus); largest "
            "|project - SGLang| over {forwards} EXTEND forwards: "
            "logits {max_logit_diff:.3g}, hidden {max_hidden_diff:.3g}".format(**SUMMARY)
        )
    if EXTRACT_SUMMARY:
        terminalreporter.write_line(
            "SGLang 0.5.23 extraction backend vs hf backend: {samples} samples, {tokens} tokens, "
            "{slots} slots; largest |SGLang - HF| / max|HF| = {worst:.3g}".format(**EXTRACT_SUMMARY)
        )
    for name, fig in sorted(EAGLE31_SUMMARY.items()):
        terminalreporter.write_line(f"SGLang 0.5.23 on the trained EAGLE-3.1 draft {name}: {fig}")
