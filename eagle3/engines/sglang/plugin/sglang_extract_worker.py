"""The SGLang side of the ``sglang`` extraction backend: runs ONLY in SGLang's environment
(``serve.sglang_python``).

Started by :mod:`eagle3.extract.sglang_backend` as ``<sglang python> sglang_extract_worker.py
JOB.json``; never imports ``eagle3`` (that environment has a different torch). Steps:

1. Resolve ``architectures[0]`` through SGLang's registry; refuse a class without
   ``set_eagle3_layers_to_capture``.
2. Start the offline ``Engine`` with ``enable_return_aux_hidden_states=True``,
   ``speculative_algorithm="EAGLE3"`` (no draft loaded), ``return_aux_hidden_state_layer_ids`` in
   SGLang's convention (id k = output of layer k; ``L-1`` via ``eagle3_sglang_capture``),
   ``skip_tokenizer_init``, ``disable_radix_cache`` (a cached prefix returns only the suffix's
   states), ``chunked_prefill_size=-1``, plus the job's ``engine_args``.
3. Print ``EAGLE3-READY {...}``, then per stdin line ``{"ids": [[token ids], ...], "out":
   "path.safetensors"}`` run one greedy prefill per prompt and save states ``[T, S, H]`` (S = ids,
   model dtype) as ``s0, s1, ...`` (temp name, then rename); print ``EAGLE3-RESULT {"out": ...,
   "rows": [...]}``. ``{"quit": true}`` or EOF ends; a failure prints ``EAGLE3-ERROR {"error":
   ...}`` and exits 1.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

DTYPES = {"bfloat16": "bfloat16", "float32": "float32", "float16": "float16", "auto": "auto"}


def _say(kind: str, payload: dict) -> None:
    sys.stdout.write(f"EAGLE3-{kind} {json.dumps(payload)}\n")
    sys.stdout.flush()


def resolve_class(target_dir: str) -> str:
    """``module:Class`` of SGLang's implementation of the target's architecture (RuntimeError if
    none, or if it cannot capture EAGLE-3 aux states)."""
    from sglang.srt.models.registry import ModelRegistry

    arch = json.loads((Path(target_dir) / "config.json").read_text())["architectures"][0]
    cls, _ = ModelRegistry.resolve_model_cls([arch])
    if not hasattr(cls, "set_eagle3_layers_to_capture"):
        raise RuntimeError(f"{target_dir}/config.json: architecture {arch} -> "
                           f"{cls.__module__}.{cls.__name__} has no set_eagle3_layers_to_capture; "
                           "this SGLang cannot capture EAGLE-3 aux hidden states for it")
    return f"{cls.__module__}:{cls.__name__}"


def start_engine(job: dict):
    import sglang

    os.environ["EAGLE3_CAPTURE_CLASS"] = resolve_class(job["target_dir"])
    os.environ["SGLANG_EXTERNAL_MODEL_PACKAGE"] = "eagle3_sglang_capture"
    kwargs = dict(model_path=job["target_dir"], dtype=DTYPES[job["dtype"]],
                  skip_tokenizer_init=True, enable_return_aux_hidden_states=True,
                  speculative_algorithm="EAGLE3",
                  return_aux_hidden_state_layer_ids=list(job["layer_ids"]),
                  disable_radix_cache=True, chunked_prefill_size=-1, log_level="warning")
    kwargs.update(job.get("engine_args") or {})
    return sglang.Engine(**kwargs), os.environ["EAGLE3_CAPTURE_CLASS"]


def serve(engine, n_slots: int, dtype: str) -> None:
    import torch
    from safetensors.torch import save_file

    store = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype, torch.float32)
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("quit"):
            return
        ids = [list(map(int, x)) for x in req["ids"]]
        outs = engine.generate(input_ids=ids,
                               sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                               return_hidden_states=True)
        tensors, rows = {}, []
        for i, (x, o) in enumerate(zip(ids, outs)):
            meta = o.get("meta_info") or {}
            got = meta.get("hidden_states")
            if not got:
                raise RuntimeError(f"prompt {i}: SGLang returned no hidden_states (meta_info keys "
                                   f"{sorted(meta)})")
            hs = torch.tensor(got[0], dtype=torch.float32)
            if hs.dim() != 2 or hs.shape[0] != len(x) or hs.shape[1] % n_slots:
                raise RuntimeError(f"prompt {i}: hidden_states shape {tuple(hs.shape)}, expected "
                                   f"[{len(x)}, {n_slots} x hidden]")
            tensors[f"s{i}"] = hs.view(len(x), n_slots, -1).to(store).contiguous()
            rows.append(len(x))
        tmp = req["out"] + ".tmp"
        save_file(tensors, tmp)
        os.replace(tmp, req["out"])
        _say("RESULT", {"out": req["out"], "rows": rows})


def watch_parent(interval_s: float = 1.0) -> None:
    """A daemon thread that ends this worker's process group once its parent is gone."""
    import signal
    import threading
    import time

    parent = os.getppid()

    def loop() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=loop, daemon=True, name="eagle3-parent-watch").start()


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[1]).read_text())
    # started in its own session by eagle3.extract.sglang_backend: safe to end the group
    if os.getpgid(0) == os.getpid():
        watch_parent()
    engine = None
    try:
        engine, cls = start_engine(job)
        _say("READY", {"class": cls, "layer_ids": job["layer_ids"]})
        serve(engine, len(job["layer_ids"]), job["dtype"])
    except BaseException as e:  # the traceback to the log, its end to the parent (on stdout)
        sys.stderr.write(traceback.format_exc())
        _say("ERROR", {"error": f"{type(e).__name__}: {e}",
                       "traceback": "".join(traceback.format_exc().splitlines(True)[-4:])})
        return 1
    finally:
        if engine is not None:
            engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
