"""The SGLang release's source read statically (``ast``, wheel or directory): does the target's
class capture EAGLE-3 aux hidden states (failure class 11)? Only if it implements
``set_eagle3_layers_to_capture`` (``model_runner_components/attention_backend_setup.py``:
``configure_aux_hidden_state_capture``).
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

from eagle3.engines.sglang.profile import VERSION
from eagle3.errors import DataError, EngineUnsupported

CAPTURE_METHOD = "set_eagle3_layers_to_capture"
MODELS_DIR = "sglang/srt/models/"


class EngineSource:
    """An engine's released source, read-only: ``root`` is a wheel or the folder holding
    ``sglang/``; DataError when neither."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        if self.root.is_file() and self.root.suffix == ".whl":
            self._base: Path | zipfile.Path = zipfile.Path(self.root)
        elif self.root.is_dir():
            self._base = self.root
        else:
            raise DataError(f"{self.root}: expected an engine wheel (.whl) or a source directory, "
                            "found neither")

    def __repr__(self) -> str:
        return f"EngineSource({str(self.root)!r})"

    def read(self, relpath: str) -> str:
        """Text of ``relpath`` (e.g. ``sglang/srt/models/llama_eagle3.py``), a leading UTF-8 byte
        order mark dropped as Python's own import does; DataError if absent."""
        path = self._base.joinpath(relpath)
        if not path.is_file():
            raise DataError(f"{self.root}: {relpath} not found")
        return path.read_text(encoding="utf-8-sig")

    def list(self, prefix: str) -> list[str]:
        """Relative paths of the ``.py`` files directly under ``prefix`` (ending in '/')."""
        folder = self._base.joinpath(prefix)
        return sorted(f"{prefix}{p.name}" for p in folder.iterdir()
                      if p.name.endswith(".py") and p.is_file()) if folder.is_dir() else []

    def version(self) -> str | None:
        """``Version:`` of ``*.dist-info/METADATA``, else ``sglang/version.py``; None if neither."""
        metas = sorted((d.joinpath("METADATA") for d in self._base.iterdir()
                        if d.name.endswith(".dist-info")), key=str)
        found = [m.group(1) for meta in metas if meta.is_file() and (m := re.search(
            r"^Version:\s*(\S+)", meta.read_text(encoding="utf-8", errors="replace"), re.M))]
        if found:
            return found[0]
        try:
            text = self.read("sglang/version.py")
        except DataError:
            return None
        m = re.search(r"""(?:__version__|version)\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", text)
        return m.group(1) if m else None


def find_engine_source(engine: str = "sglang", version: str = VERSION, *,
                       cache_dir: str | Path | None = None,
                       download: bool = False) -> EngineSource:
    """The source of ``engine==version``: ``$EAGLE3_<ENGINE>_SOURCE``, ``<cache_dir>/wheels/``, or
    with ``download`` ``pip download --no-deps``. EngineUnsupported naming what was tried;
    DataError on a bad path."""
    env = f"EAGLE3_{engine.upper()}_SOURCE"
    if os.environ.get(env):
        return EngineSource(os.environ[env])
    tried, pattern = [f"${env} (unset)"], f"{engine}-{version}-*.whl"
    wheels = Path(cache_dir).expanduser() / "wheels" if cache_dir else None
    if wheels is not None:
        if found := sorted(wheels.glob(pattern)):
            return EngineSource(found[0])
        tried.append(f"{wheels}/{pattern} (none)")
        if download:
            wheels.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   f"{engine}=={version}", "-d", str(wheels)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if found := sorted(wheels.glob(pattern)):
                return EngineSource(found[0])
            tried.append(f"`{' '.join(cmd)}` (exit {proc.returncode}: "
                         f"{proc.stderr.strip()[-300:]})")
    raise EngineUnsupported(f"{engine} {version}: released source not found; tried "
                            f"{'; '.join(tried)}")


class _ClassInfo(NamedTuple):
    bases: tuple[str, ...]
    methods: frozenset[str]


def _parse_module(source: EngineSource, relpath: str) -> tuple[dict[str, _ClassInfo],
                                                               dict[str, str], list[str]]:
    """Classes of one model file, its ``from X import name`` map, and its ``EntryClass`` names."""
    classes: dict[str, _ClassInfo] = {}
    imports: dict[str, str] = {}
    entry: list[str] = []
    for node in ast.parse(source.read(relpath), filename=relpath).body:
        if isinstance(node, ast.ClassDef):
            bases = tuple(b.id if isinstance(b, ast.Name) else
                          b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases)
            fns = (ast.FunctionDef, ast.AsyncFunctionDef)
            classes[node.name] = _ClassInfo(bases, frozenset(n.name for n in node.body
                                                             if isinstance(n, fns)))
        elif isinstance(node, ast.ImportFrom) and node.module:
            imports.update({alias.asname or alias.name: node.module for alias in node.names})
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass"
                                                   for t in node.targets):
            v = node.value
            items = v.elts if isinstance(v, (ast.List, ast.Tuple)) else [v]
            entry.extend(i.id for i in items if isinstance(i, ast.Name))
    return classes, imports, entry


class ModelIndex:
    """Which registered classes of ``sglang/srt/models/*.py`` implement a method; bases followed
    within the models folder (same file or ``from <module> import <name>``)."""

    def __init__(self, source: EngineSource, models_dir: str = MODELS_DIR):
        self.source = source
        self._modules: dict[str, tuple[dict[str, _ClassInfo], dict[str, str]]] = {}
        self.entry_classes: dict[str, str] = {}  # class name -> module
        for rel in source.list(models_dir):
            try:
                classes, imports, entry = _parse_module(source, rel)
            except SyntaxError as e:
                raise DataError(f"{source.root}: {rel} does not parse ({e})") from e
            mod = rel[:-3].replace("/", ".")
            self._modules[mod] = (classes, imports)
            self.entry_classes.update({n: mod for n in entry if n not in self.entry_classes})
        if not self.entry_classes:
            raise DataError(f"{source.root}: no EntryClass found under {models_dir}")

    def implements(self, class_name: str, method: str = CAPTURE_METHOD,
                   module: str | None = None) -> bool:
        """``class_name`` (registered unless ``module`` is given) has ``method``; KeyError for a
        class that is not registered."""
        module = module or self.entry_classes.get(class_name)
        if module is None:
            raise KeyError(class_name)
        return self._has(module, class_name, method, set())

    def _has(self, module: str | None, name: str, method: str, seen: set) -> bool:
        if (module, name) in seen or module not in self._modules:
            return False
        seen.add((module, name))
        classes, imports = self._modules[module]
        info = classes.get(name)
        if info is None:  # imported into this module: follow the import (None: not a model module)
            return self._has(imports.get(name), name, method, seen)
        return method in info.methods or any(
            self._has(module if b in classes else imports.get(b), b, method, seen)
            for b in info.bases)



@functools.lru_cache(maxsize=4)
def _cached_index(root: str, mtime_ns: int) -> ModelIndex:
    return ModelIndex(EngineSource(root))


def model_index(source: EngineSource) -> ModelIndex:
    """:class:`ModelIndex` of ``source``, cached by path and mtime."""
    return _cached_index(str(source.root), source.root.stat().st_mtime_ns)


def check_aux_capture(target_class: str, *, engine: str = "sglang", version: str = VERSION,
                      source: EngineSource | None = None) -> dict:
    """Does ``engine==version`` capture aux states for ``target_class``? Read from ``source``, else
    ``EngineProfile.aux_capture_classes``. Returns ``{"class", "engine", "version", "captures":
    True, "module", "how"}``; EngineUnsupported when it does not (or is not registered)."""
    found = {"class": target_class, "engine": engine, "version": version, "captures": True}
    if source is None:
        from eagle3.engines.registry import get_profile

        get_profile(engine, version).require_aux_capture(target_class)
        return {**found, "module": None, "how": "pinned profile list"}
    index = model_index(source)
    if target_class not in index.entry_classes:
        raise EngineUnsupported(f"target class {target_class}: not a registered model class "
                                f"(EntryClass) of {engine} {version} ({source.root}); it cannot "
                                "serve as the target")
    if not index.implements(target_class):
        raise EngineUnsupported(
            f"target class {target_class} ({index.entry_classes[target_class]}): {engine} "
            f"{version} does not implement {CAPTURE_METHOD} for it, so the EAGLE-3 draft would "
            "receive no aux hidden states")
    return {**found, "module": index.entry_classes[target_class],
            "how": f"read from {source.root}"}
