"""The layers (docs/DESIGN.md, "Layers"): the library never imports Prefect or MLflow (checked in
a fresh interpreter, after importing ``eagle3`` and every one of its submodules), imports point down
the layers in every direction, there is no import circle, and no module outgrows the size limit."""

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
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    expected = {m.name for m in pkgutil.walk_packages(eagle3.__path__, "eagle3.")}
    assert set(res["modules"]) == expected and len(expected) > 10
    assert res["failed"] == {}, res["failed"]
    assert res["bad"] == [], f"eagle3 pulled in {res['bad'][:10]}"


def test_library_source_has_no_orchestration_import():
    """Also lazily: no ``import prefect``/``import mlflow`` anywhere in eagle3/ (the subprocess test
    above cannot see imports inside functions that did not run)."""
    offenders = []
    for f in Path(eagle3.__file__).parent.rglob("*.py"):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            s = line.strip()
            if s.startswith(("import prefect", "from prefect", "import mlflow", "from mlflow")):
                offenders.append(f"{f.relative_to(REPO)}:{n}: {s}")
    assert offenders == []


# Three homes. The product, top to bottom: cli -> flows -> tasks -> eagle3 (the library). Beside it
# the reference engine (refengine: started by module name, as SGLang is) and the lab (benchmarks,
# studies, GPU-machine scripts); testkit holds fixtures shared by the tests and the lab. The homes
# beside the product may import it; the product never imports them. Each entry: a folder and the
# top-level packages it must never import, lazily or not.
OUTSIDE_PRODUCT = ("refengine", "lab", "testkit", "tests")
FORBIDDEN = {
    "eagle3": ("tasks", "flows", "cli", *OUTSIDE_PRODUCT, "prefect", "mlflow"),
    "tasks": ("flows", "cli", *OUTSIDE_PRODUCT),
    "flows": ("cli", *OUTSIDE_PRODUCT),
    "cli": OUTSIDE_PRODUCT,
    "refengine": ("tasks", "flows", "cli", "lab", "testkit", "tests", "prefect", "mlflow"),
    "testkit": ("tasks", "flows", "cli", "lab", "tests"),
    "lab": ("tests",),
}
MAX_LINES = 600  # one concept per module: ~500 lines is a signal, 600 the limit


def _sources(top: str):
    for f in sorted((REPO / top).rglob("*.py")):
        if "sglang_shims" in f.parts or "plugin" in f.parts:
            continue  # run inside SGLang's interpreter, not part of this layering
        name = ".".join(f.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        yield name, f


def _imports(name: str, f: Path) -> set[str]:
    from tasks.code_closure import _imported_names

    return _imported_names(f, name)


def test_imports_point_down_the_layers():
    offenders = []
    for top, banned in FORBIDDEN.items():
        for name, f in _sources(top):
            for imp in _imports(name, f):
                if imp.split(".")[0] in banned:
                    offenders.append(f"{f.relative_to(REPO)} imports {imp}")
    assert offenders == []


def test_no_import_circle():
    """No two modules of the project import each other, directly or through others (lazy imports
    count)."""
    mods = {n: f for top in FORBIDDEN for n, f in _sources(top)}
    graph = {n: {i for i in _imports(n, f) if i in mods and i != n} for n, f in mods.items()}
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


def test_no_module_over_the_size_limit():
    big = [
        f"{f.relative_to(REPO)}: {n} lines"
        for top in FORBIDDEN
        for _, f in _sources(top)
        if (n := len(f.read_text().splitlines())) > MAX_LINES
    ]
    assert big == [], f"modules over {MAX_LINES} lines (split them by reason)"


MAX_COLUMNS = 100
CHECKED = ("eagle3", "tasks", "flows", "cli", "refengine", "lab", "testkit", "tests")


def _long_lines(files) -> list[str]:
    """``file:line: N columns`` for each line of ``files`` over MAX_COLUMNS characters
    (not bytes)."""
    return [
        f"{f.relative_to(REPO) if f.is_relative_to(REPO) else f}:{n}: {len(line)} columns"
        for f in files
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > MAX_COLUMNS
    ]


def test_long_lines_counts_characters_not_bytes(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("×" * 100 + "\n" + "x" * 101 + "\n", encoding="utf-8")
    assert _long_lines([f]) == [f"{f}:2: 101 columns"]


def test_no_line_over_100_columns():
    """Every .py file of the product, the reference engine, the lab, the test kit and the tests
    (the SGLang-side shims and plugins included): what `make lint` checks, held in the suite."""
    long = _long_lines(f for top in CHECKED for f in sorted((REPO / top).rglob("*.py")))
    assert long == [], f"lines over {MAX_COLUMNS} columns:\n" + "\n".join(long)
