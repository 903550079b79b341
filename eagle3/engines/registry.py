"""Which engine versions have a loader profile, and the one to use: ``get_profile(engine, version)``.

The only module that knows every engine; each engine's facts are in ``eagle3/engines/<engine>/profile.py``.
"""

from __future__ import annotations

from eagle3.engines.profile import EngineProfile
from eagle3.engines.sglang import profile as sglang_profile
from eagle3.engines.vllm import profile as vllm_profile
from eagle3.errors import EngineUnsupported

_ENGINES = {"sglang": sglang_profile, "vllm": vllm_profile}


def default_version(engine: str) -> str:
    """The engine version used when none is given: the first of the engine module's ``VERSIONS`` (SGLang:
    ``eagle3.engines.sglang.profile.VERSION``; vLLM: its unpinned profile). Raises EngineUnsupported for an
    engine without a profile."""
    if engine not in _ENGINES:
        raise EngineUnsupported(f"engine {engine!r}: no loader profile (known: {sorted(_ENGINES)})")
    return _ENGINES[engine].VERSIONS[0]


def get_profile(engine: str = "sglang", version: str | None = None) -> EngineProfile:
    """The loader profile of ``engine`` at ``version`` (None: :func:`default_version`).

    Raises EngineUnsupported naming the engine, the version asked and the versions that have a profile.
    """
    version = default_version(engine) if version is None else version
    module = _ENGINES[engine]
    if version not in module.VERSIONS:
        known = sorted(f"{e} {v}" for e, m in _ENGINES.items() for v in m.VERSIONS)
        raise EngineUnsupported(f"engine {engine!r} version {version!r}: no loader profile (known: {known})")
    return module.build(version)
