"""The loader profile to use: ``get_profile(engine, version)``, for the releases the profile
pins."""

from __future__ import annotations

from eagle3.engines.profile import EngineProfile
from eagle3.engines.sglang import profile as sglang_profile
from eagle3.errors import EngineUnsupported

_ENGINES = {"sglang": sglang_profile}


def default_version(engine: str) -> str:
    """The version used when none is given (SGLang: ``eagle3.engines.sglang.profile.VERSION``).
    EngineUnsupported for an engine without a profile."""
    if engine not in _ENGINES:
        raise EngineUnsupported(f"engine {engine!r}: no loader profile (known: {sorted(_ENGINES)})")
    return _ENGINES[engine].VERSION


def get_profile(engine: str = "sglang", version: str | None = None) -> EngineProfile:
    """The loader profile of ``engine`` at ``version`` (None: :func:`default_version`);
    EngineUnsupported naming the engine, the version asked and the releases that have a profile."""
    version = default_version(engine) if version is None else version
    module = _ENGINES[engine]
    if version not in module.RELEASES:
        known = sorted(f"{e} {v}" for e, m in _ENGINES.items() for v in m.RELEASES)
        raise EngineUnsupported(f"engine {engine!r} version {version!r}: no loader profile "
                                f"(known: {known})")
    return module.build(version)
