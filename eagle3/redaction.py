"""What a config looks like in a record (MLflow params, manifests, logs): secrets masked, sections
flattened."""

from __future__ import annotations

import json
import re
from typing import Any

# A key is secret-looking when its last name part is one of these words (``hf_token``,
# ``WANDB_API_KEY``, ``db.password``), not when the word is merely inside it (``max_new_tokens`` is
# a setting, not a secret).
SECRET_KEY = re.compile(
    r"(^|[._-])(token|secret|password|passwd|api[_-]?key|access[_-]?key|credentials?|auth)$", re.I)


def is_secret_key(key: str) -> bool:
    """True for a config key or environment variable name that looks like it holds a secret."""
    return bool(SECRET_KEY.search(str(key)))


def redact(obj: Any) -> Any:
    """Copy of a config-like mapping with values under secret-looking keys replaced by ``'***'``."""
    if isinstance(obj, dict):
        return {k: ("***" if is_secret_key(k) else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj


def flatten(obj: dict, prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1e-3}}`` → ``{"train.lr": 1e-3}`` (lists kept as JSON strings)."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v
    return out
