"""Pre-flight: ``extract.backend sglang`` needs SGLang whatever serves, and the advice for a
missing SGLang names the route for the configured release."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3.config import load_config
from eagle3.engines.sglang.profile import RELEASES, VERSION
from eagle3.errors import EngineUnsupported
from eagle3.engines.sglang import environment
from eagle3.serve import preflight

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp_path, *more):
    missing = tmp_path / "no-env" / "bin" / "python"
    return load_config(None, ["serve.engine=reference", f"serve.sglang_python={missing}", *more])


def test_sglang_extraction_is_checked_when_the_reference_engine_serves(tmp_path):
    cfg = _cfg(tmp_path, "extract.backend=sglang")
    check, problems = preflight._check_extraction(cfg, "reference")
    assert check.name == "extraction" and check.status == "failed"
    (p,) = problems
    assert p.code == "ENGINE_MISSING" and p.message.startswith("extract.backend sglang: ")
    assert (
        f"serve.sglang_python: expected the Python of an environment with sglang=={VERSION}"
        in p.message
        and str(tmp_path / "no-env") in p.message
    )
    assert "make sglang-env" in p.message and "extract.backend hf" in p.message
    # the reference engine itself passes; the report carries the extraction problem
    assert preflight._check_engine(cfg, "reference")[1] == []


def test_hf_extraction_passes_and_sglang_engine_is_not_judged_twice(tmp_path):
    assert preflight._check_extraction(_cfg(tmp_path), "reference")[1] == []
    cfg = _cfg(tmp_path, "extract.backend=sglang")
    check, problems = preflight._check_extraction(cfg, "sglang")
    assert problems == [] and check.status == "passed"
    assert RELEASES[VERSION]["return_aux_flag"] in check.detail


def test_release_without_aux_return_is_refused_for_sglang_extraction(tmp_path):
    old = next(v for v, r in RELEASES.items() if r["return_aux_flag"] is None)
    cfg = _cfg(tmp_path, "extract.backend=sglang", f"convert.engine_version={old}")
    (p,) = preflight._check_extraction(cfg, "reference")[1]
    assert p.code == "EXTRACT_NO_AUX_RETURN" and p.code in preflight.ENGINE_CODES
    assert f"convert.engine_version {old}" in p.message and "extract.backend hf" in p.message


def test_engine_missing_advice_follows_the_configured_release(tmp_path):
    old = next(v for v in RELEASES if v != VERSION)
    cfg = _cfg(tmp_path, f"convert.engine_version={old}")
    (p,) = preflight._check_engine(cfg, "sglang")[1]
    assert p.code == "ENGINE_MISSING" and f"sglang=={old}" in p.message
    assert f"python3 -m venv DIR && DIR/bin/pip install sglang=={old}" in p.message
    assert f"make sglang-env builds {VERSION}" in p.message
    assert "fix: make sglang-env" not in p.message
    (p,) = preflight._check_engine(_cfg(tmp_path), "sglang")[1]
    assert "fix: make sglang-env and set serve.sglang_python" in p.message


def test_offline_kits_install_the_release_they_are_listed_for():
    makefile = (ROOT / "Makefile").read_text()
    assert f"SGLANG_VERSION := {VERSION}" in makefile  # what make sglang-env builds
    for version, kit in environment.OFFLINE_KITS.items():
        assert version in RELEASES
        assert f"sglang=={version} " in (ROOT / kit).read_text()
        assert kit in environment.install_advice(version)


def test_help_flag_is_refused_for_the_reference_engine_too(tmp_path):
    cfg = _cfg(tmp_path, "serve.extra_args=['--help']")
    check, (p,) = preflight._check_settings(cfg, "reference")
    assert check.status == "failed" and p.code == "EXTRA_ARG_HELP"
    assert "serve.extra_args '--help'" in p.message
    assert "reference engine prints its help" in p.message
    assert preflight._check_settings(_cfg(tmp_path), "reference")[1] == []


def test_sglang_extraction_advice_follows_the_configured_release(tmp_path, monkeypatch):
    """The extraction stage's own check (``extract.stage._check_backend``) gives the same route as
    the pre-flight: another release than the profile's gets its own install, not the Makefile's."""
    from eagle3.extract.stage import _check_backend

    old = next(v for v in RELEASES if v != VERSION)
    # a release that can return aux states, so the check reaches the missing interpreter
    monkeypatch.setitem(RELEASES[old], "return_aux_flag", "--enable-return-aux-hidden-states")
    cfg = _cfg(tmp_path, "extract.backend=sglang", f"convert.engine_version={old}")
    with pytest.raises(EngineUnsupported) as e:
        _check_backend(cfg)
    msg = str(e.value)
    assert f"sglang=={old}" in msg and environment.install_advice(old) in msg
    assert "fix: make sglang-env)" not in msg and "extract.backend=hf" in msg
    with pytest.raises(EngineUnsupported, match=r"fix: make sglang-env\), or use"):
        _check_backend(_cfg(tmp_path, "extract.backend=sglang"))
