"""The library never imports Prefect or MLflow (../shared/DESIGN.md, "Layers"): checked in a fresh
interpreter, after importing ``eagle3`` and every one of its submodules."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import eagle3

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib, json, pkgutil, sys
import eagle3
failed = {}
names = [m.name for m in pkgutil.walk_packages(eagle3.__path__, "eagle3.")]
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:  # a module that cannot import here is reported, not hidden
        failed[name] = f"{type(e).__name__}: {e}"
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("prefect", "mlflow"))
print(json.dumps({"modules": names, "failed": failed, "bad": bad}))
"""


def test_eagle3_imports_neither_prefect_nor_mlflow():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    expected = {m.name for m in pkgutil.walk_packages(eagle3.__path__, "eagle3.")}
    assert set(res["modules"]) == expected and len(expected) > 10
    assert res["failed"] == {}, res["failed"]
    assert res["bad"] == [], f"eagle3 pulled in {res['bad'][:10]}"


def test_library_source_has_no_orchestration_import():
    """Also lazily: no ``import prefect``/``import mlflow`` anywhere in eagle3/ (the subprocess test above
    cannot see imports inside functions that did not run)."""
    offenders = []
    for f in Path(eagle3.__file__).parent.rglob("*.py"):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            s = line.strip()
            if s.startswith(("import prefect", "from prefect", "import mlflow", "from mlflow")):
                offenders.append(f"{f.relative_to(REPO)}:{n}: {s}")
    assert offenders == []
