"""The target's SGLang model class, plus capture of its *last* layer's output before the final norm.

The pinned SGLang captures "output of layer k" as the input of layer k+1
(``set_eagle3_layers_to_capture`` adds 1), so the last layer's output cannot be captured
(``layers/logits_processor.py``). Training needs it, so this package registers, under the target's
architecture name, a subclass that accepts id ``L-1`` (handing SGLang the others), records the
input of ``model.norm`` (for a fused add-norm, ``hidden + residual``) with a forward hook, and
appends it to the aux list with a pre-hook on ``logits_processor``, so SGLang's packing, count
check and return path carry it.

``$EAGLE3_CAPTURE_CLASS`` = ``module:ClassName`` (set by the extraction worker) names the class to
wrap; one without ``model.norm`` or ``logits_processor`` raises at construction.
"""

from __future__ import annotations

import importlib
import os

import torch

SPEC = os.environ.get("EAGLE3_CAPTURE_CLASS", "")


def _base_class():
    if ":" not in SPEC:
        raise RuntimeError(f"$EAGLE3_CAPTURE_CLASS: expected 'module:ClassName', got {SPEC!r}")
    module, name = SPEC.split(":", 1)
    return getattr(importlib.import_module(module), name)


def _make_capture_class(base):
    class CaptureLastLayer(base):
        """``base`` whose EAGLE-3 capture also delivers the last layer's output (see module
        docstring)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for path in ("model.norm", "logits_processor"):
                obj = self
                for part in path.split("."):
                    if not hasattr(obj, part):
                        raise RuntimeError(f"{base.__module__}.{base.__name__}: attribute {path!r} "
                                           "expected for the last-layer capture, not found")
                    obj = getattr(obj, part)
            self._eagle3_capture_last = False
            self._eagle3_last = None
            self.model.norm.register_forward_hook(self._eagle3_record_final)
            self.logits_processor.register_forward_pre_hook(self._eagle3_append_final)

        def set_eagle3_layers_to_capture(self, layer_ids=None):
            n = int(self.config.num_hidden_layers)
            if layer_ids and int(layer_ids[-1]) == n - 1:
                self._eagle3_capture_last = True
                layer_ids = [int(i) for i in layer_ids[:-1]]
                if not layer_ids:
                    raise RuntimeError("EAGLE-3 capture: at least one aux layer besides the last "
                                       "one is required")
            return super().set_eagle3_layers_to_capture(layer_ids)

        def _eagle3_record_final(self, _module, args, output):
            if not self._eagle3_capture_last:
                return
            if isinstance(output, tuple) and len(args) > 1 and args[1] is not None:
                # fused add-norm: the updated residual = hidden + residual
                self._eagle3_last = output[1].clone()
            else:
                self._eagle3_last = args[0].clone()

        def _eagle3_append_final(self, _module, args):
            if (not self._eagle3_capture_last or self._eagle3_last is None or len(args) < 5
                    or args[4] is None):
                return None
            last, self._eagle3_last = self._eagle3_last, None
            aux = args[4]
            if isinstance(aux, torch.Tensor):
                aux = torch.cat([aux, last.to(aux.dtype)], dim=-1)
            else:
                aux = (type(aux)(list(aux) + [last.to(aux[0].dtype)]) if len(aux)
                       else type(aux)([last]))
            return (*args[:4], aux, *args[5:])

    CaptureLastLayer.__name__ = CaptureLastLayer.__qualname__ = base.__name__
    return CaptureLastLayer


EntryClass = [_make_capture_class(_base_class())] if SPEC else []
