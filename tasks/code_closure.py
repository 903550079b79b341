"""The library code a stage runs: the import closure of its entry modules, for cache keys.

A stage's cache key must change whenever any module the stage runs changes (else an edited check or
accept rule serves a stale cached result). Hand-kept module lists drift; this reads the imports
instead. Starting from the stage's entry modules, it follows every ``import``/``from … import`` of
``eagle3`` modules found anywhere in a module's source — also inside functions (lazy imports run
too) - plus the ``__init__.py`` of every package on the way (importing ``a.b.c`` runs ``a/__init__``
and ``a/b/__init__``). Modules are read as files under ``root`` (the folder that holds ``eagle3/``),
never imported.

Imports made from strings (``python -m eagle3.train.worker``, ``importlib.import_module``) are not
seen: a stage names such modules (and folders run in another interpreter, e.g. the SGLang plugin) as
entries itself.
"""

from __future__ import annotations

import ast
import hashlib
import threading
from pathlib import Path

PACKAGE = "eagle3"
# Prefect computes cache keys of concurrent tasks in threads; CPython 3.11's ast.parse from two
# threads at once can raise "SystemError: AST constructor recursion depth mismatch"
_PARSE_LOCK = threading.Lock()


def module_file(root: Path, name: str) -> Path | None:
    """``root/a/b/c.py`` or ``root/a/b/c/__init__.py`` for module ``a.b.c``; None when neither
    exists."""
    base = root.joinpath(*name.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def _imported_names(path: Path, module: str) -> set[str]:
    """Dotted names this file imports (``import x.y`` → x.y; ``from x import y`` → x and x.y;
    relative imports resolved against ``module``)."""
    with _PARSE_LOCK:  # CPython 3.11's ast.parse is not thread-safe (python/cpython#106905)
        tree = ast.parse(path.read_text(), filename=str(path))
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(p for p in [*parts, base] if p)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
    return out


def closure(root: Path, entries: tuple[str, ...] | list[str]) -> dict[str, Path]:
    """Every ``eagle3`` module the entries reach: ``{module name: file}``, entries included.

    An entry may also be a folder path relative to ``root`` (e.g. ``eagle3/engines/sglang/plugin``):
    all its ``*.py`` files are included as ``<folder>:<relative file>`` without following their
    imports (they run in another interpreter). Raises FileNotFoundError naming an entry that does
    not exist.
    """
    root = Path(root)
    found: dict[str, Path] = {}
    todo: list[str] = []
    for e in entries:
        if "/" in e:
            folder = root / e
            if not folder.is_dir():
                raise FileNotFoundError(f"code closure entry {e!r}: expected a folder under "
                                        f"{root}, found none")
            for f in sorted(folder.rglob("*.py")):
                found[f"{e}:{f.relative_to(folder)}"] = f
            continue
        if module_file(root, e) is None:
            raise FileNotFoundError(f"code closure entry {e!r}: expected a module under {root}, "
                                    "found none")
        todo.append(e)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        f = module_file(root, name)
        if f is None:
            continue  # an attribute imported from a module (from a.b import func), not a module
        found[name] = f
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages' __init__
        todo += [n for n in _imported_names(f,
                                            name) if n.split(".")[0] == PACKAGE and n not in found]
    return dict(sorted(found.items()))


def code_hash(root: Path, entries: tuple[str, ...] | list[str]) -> str:
    """sha256 (hex, 16 chars) over the names and bytes of :func:`closure`'s files, in name order."""
    h = hashlib.sha256()
    for name, f in closure(root, entries).items():
        h.update(f"{name}\n".encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]
