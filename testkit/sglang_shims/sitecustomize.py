"""Post-import hook for processes of ``.venv-sglang`` run by the conformance harness (test harness
only).

Python imports ``sitecustomize`` at start-up from ``PYTHONPATH``, so this also runs inside the
scheduler and detokenizer processes SGLang spawns. It installs a meta-path finder that, for each
module named in ``eagle3_sglang_patches.PATCHES``, lets the normal finder locate it, then wraps its
loader so the patch runs right after the module's own code (before any other module can
``from ... import`` the patched names). The installed package is never edited.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self._inner, self._patch = inner, patch

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._patch(module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, patches):
        self._patches = patches

    def find_spec(self, fullname, path, target=None):
        patch = self._patches.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


def _install() -> None:
    from eagle3_sglang_patches import PATCHES  # same directory, which is on PYTHONPATH

    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder(PATCHES))


_install()
