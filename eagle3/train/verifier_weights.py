"""speculators' notices while it copies the target's (verifier's) embeddings and LM head into a
draft, checked against the target's files and replaced by one line saying why they are expected,
or turned into an error when a weight is really missing.

speculators (``Eagle3DraftModel._load_verifier_weights``; ``speculators/model.py``,
``speculators/utils/loading.py``) loads ``embed_tokens.weight`` and ``lm_head.weight`` through
``load_model_layers``, which logs through loguru:

- ``Tensor 'lm_head.weight' not found in weight_map.``: the draft then takes
  ``embed_tokens.weight`` as its LM head: right for ``tie_word_embeddings: true`` (SmolLM2), wrong
  for any other target, which is refused (``VERIFIER_LM_HEAD``).
- ``model.safetensors.index.json file not found. Checking for model.safetensors instead.``: a
  single-file checkpoint (speculators raises when ``model.safetensors`` is missing too).

Only these two exact messages are taken; every other message of that logger passes through.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eagle3.errors import ConfigError
from eagle3.target_config import target_config_json, text_config

log = logging.getLogger(__name__)

LM_HEAD_MISSING = re.compile(r"^Tensor 'lm_head\.weight' not found in weight_map\.$")
NO_INDEX = re.compile(r"^`?model\.safetensors\.index\.json`? file not found\. "
                      r"Checking for `?model\.safetensors`? instead\.$")


class _Filter:
    """Stands in for speculators' loguru logger: the two expected warnings go to ``seen``
    (``"lm_head"``, ``"no_index"``), everything else to the real logger."""

    def __init__(self, real: Any, seen: set[str]):
        self._real, self._seen = real, seen

    def warning(self, message: Any, *args: Any, **kwargs: Any) -> None:
        plain = not args and not kwargs
        kind = next((k for k, rx in (("lm_head", LM_HEAD_MISSING), ("no_index", NO_INDEX))
                     if plain and rx.match(str(message))), None)
        if kind:
            self._seen.add(kind)
        else:
            self._real.opt(depth=1).warning(message, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _tied(target_dir: Path) -> bool | None:
    """``tie_word_embeddings`` of the target's ``config.json`` (its ``text_config`` first, for
    multimodal configs); None when the key is absent (transformers' default is then True)."""
    conf = target_config_json(target_dir)
    for section in (text_config(conf), conf):
        if "tie_word_embeddings" in section:
            return bool(section["tie_word_embeddings"])
    return None


def check_seen(target_dir: str | Path, seen: set[str]) -> str | None:
    """The one line explaining the notices ``seen`` of the target's HF folder ``target_dir``, or
    None for none. ConfigError ``VERIFIER_LM_HEAD`` when the checkpoint has no ``lm_head.weight``
    and ``config.json``'s ``tie_word_embeddings`` is false."""
    if not seen:
        return None
    target_dir = Path(target_dir)
    parts = []
    if "no_index" in seen:
        parts.append("single-file checkpoint (model.safetensors, no index)")
    if "lm_head" in seen:
        tied = _tied(target_dir)
        if tied is False:
            raise ConfigError(
                f"VERIFIER_LM_HEAD: {target_dir}: the checkpoint has no lm_head.weight and "
                "config.json tie_word_embeddings is false; expected lm_head.weight in the "
                "checkpoint (an untied target) or tie_word_embeddings: true: the draft would take "
                "embed_tokens.weight as its LM head, which this target does not")
        why = "true" if tied else "absent, transformers' default true"
        parts.append(f"LM head tied to the embeddings (config.json tie_word_embeddings: {why}; "
                     "no lm_head.weight in the checkpoint), so the draft's LM head is "
                     "embed_tokens.weight, as the target's")
    return (f"target {target_dir}: {' and '.join(parts)}: speculators' warnings about it are "
            "expected and were checked against the target's files")


@contextmanager
def verifier_notices(target_dir: str | Path | None) -> Iterator[set[str]]:
    """Around a speculators call loading the target's weights into a draft
    (``load_verifier_weights``, ``Eagle3DraftModel.from_pretrained``): take the expected notices,
    then log one INFO line explaining them (:func:`check_seen`); yields the set of notices seen.
    ``target_dir`` None: notices pass through unchecked. ConfigError ``VERIFIER_LM_HEAD`` after the
    block."""
    from speculators.utils import loading

    seen: set[str] = set()
    if target_dir is None or not Path(target_dir).is_dir():
        yield seen
        return
    real = loading.logger
    loading.logger = _Filter(real, seen)
    try:
        yield seen
    finally:
        loading.logger = real
    line = check_seen(target_dir, seen)
    if line:
        log.info(line)
