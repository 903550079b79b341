#!/usr/bin/env bash
# SGLang 0.5.16 for the offline H200 image (Python 3.12, torch 2.11.0+cu130, transformers 5.17,
# triton 3.6): sglang 0.5.16 pins torch==2.11.0 and its kernels (sglang-kernel 0.4.5) are built
# for CUDA 13.0 / torch 2.11; later sglang releases pin a torch that machine cannot get.
#   sglang_kit.sh build OUTDIR        networked machine: OUTDIR/sglang516-kit.tar (<= 60 MiB)
#   sglang_kit.sh install ARCHIVE DIR GPU machine: packages into DIR/site, DIR/env.sh to source,
#                                     DIR/bin/python (serve.sglang_python)
#   sglang_kit.sh doctor DIR          versions, kernel arch, stubs and patch, what SGLang will run
# Serve with: source DIR/env.sh; python3 -m sglang.launch_server $SGLANG_KIT_FLAGS ...
set -euo pipefail
KIT_NAME=sglang516-kit
# Wheels the image lacks (sglang's own requirements reachable on the llama + EAGLE-3 path), pinned.
# Taken from the image instead: torch, triton, transformers, tokenizers, numpy, safetensors, anyio,
# click, h11, psutil, requests, aiohttp, uvloop, einops, prometheus-client, cuda-bindings, tqdm.
PINS="sglang==0.5.16 sglang-kernel==0.4.5 flashinfer-python==0.6.14 apache-tvm-ffi==0.1.11
torchao==0.17.0 torch-memory-saver==0.0.10 compressed-tensors==0.20.1 cuda-python==13.4.4
gguf==0.19.0 openai==2.6.1 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 fastapi==0.165.0
starlette==1.10.0 uvicorn==0.55.0 python-multipart==0.0.34 watchfiles==1.3.0 pydantic==2.14.4
pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0 orjson==3.13.0
msgspec==0.23.0 pyzmq==27.3.0 pybase64==1.5.1 setproctitle==1.3.8 dill==0.4.1 loguru==0.7.3
interegular==0.3.3 partial-json-parser==0.2.1.1.post7 importlib-metadata==10.2.0
opentelemetry-api==1.45.2"
# Import-only stubs (top-level names). None is called with the flags in SGLANG_KIT_FLAGS:
#  IPython     sglang/utils.py:26 imports IPython.display at module level (notebook helpers)
#  xgrammar    srt/function_call/inkling_detector.py:9 and entrypoints/openai/protocol.py:58
#              import StructuralTag (a pydantic field type, so the stub gives a pydantic model);
#              grammars are off (--grammar-backend none)
#  jsonschema  srt/entrypoints/openai/serving_chat.py:25 (OpenAI chat tool schemas; /generate only)
#  soundfile   srt/entrypoints/openai/{realtime/session,streaming_asr}.py (audio endpoints)
#  helion      srt/layers/moe/moe_runner/triton_utils/{helion_utils,inkling_moe}.py, reached through
#              multimodal/processors/inkling.py (Inkling MoE kernels; decorators run at import)
#  deep_gemm   srt/layers/attention/dsa_backend.py:82 `if is_cuda(): import deep_gemm` (DeepSeek
#              sparse attention); env.sh sets SGLANG_ENABLE_JIT_DEEPGEMM=0 so that the stub's
#              presence never turns DeepGEMM on (deep_gemm_wrapper/configurer.py:28)
STUBS=IPython,xgrammar,jsonschema,soundfile,helion,deep_gemm
FLAGS="--attention-backend triton --sampling-backend pytorch --grammar-backend none"
FLAGS="$FLAGS --skip-tokenizer-init"
# triton attention: FlashAttention-3 (flash_ops.abi3.so, 1.1 GB) is never loaded; pytorch sampling:
# no flashinfer JIT sampling kernels; no grammar backend: xgrammar stays a stub; requests carry
# input_ids, so no tokenizer is needed on the server.

build() {
  local out=${1:?OUTDIR}; mkdir -p "$out"; out=$(cd "$out" && pwd)
  local st; st=$(mktemp -d); trap "rm -rf '$st'" EXIT
  mkdir -p "$st/$KIT_NAME/wheels" "$st/kx"
  local plat=""
  for n in 2_5 2_17 2_24 2_26 2_28 2_34; do plat="$plat --platform manylinux_${n}_x86_64"; done
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux1_x86_64 $plat \
    -d "$st/dl" $PINS 2>&1 | grep -v '^WARNING: Location' || true
  mv "$st"/dl/*.whl "$st/$KIT_NAME/wheels/"
  # sglang-kernel (383 MB) trimmed to a Hopper GPU: keep the Python files, sm90/common_ops,
  # spatial_ops, triton_kernels and the dist-info (so its version reads 0.4.5); drop
  # flash_ops (FA3, only sgl_kernel/flash_attn.py loads it), flashmla_ops (MLA models),
  # infllm_ops (InfLLM-V2 attention) and sm100/ (Blackwell).
  local kw; kw=$(ls "$st/$KIT_NAME"/wheels/sglang_kernel-*.whl)
  (cd "$st/kx" && python3 -m zipfile -e "$kw" . && rm -rf sgl_kernel/sm100 \
    sgl_kernel/flash_ops.abi3.so sgl_kernel/flashmla_ops.abi3.so sgl_kernel/infllm_ops*.so)
  rm "$kw"
  tar -C "$st/kx" -cf - . | xz -T0 -6 > "$st/$KIT_NAME/sgl_kernel-sm90.tar.xz"
  mkdir -p "$st/$KIT_NAME/site"
  echo "import sglang_kit_stubs  # noqa: F401" > "$st/$KIT_NAME/site/sitecustomize.py"
  cat > "$st/$KIT_NAME/site/sglang_kit_stubs.py" <<EOF
"""Import-only stubs for modules SGLang 0.5.16 imports but the llama/EAGLE-3 path never calls.
Appended to sys.meta_path, so a real installed module always wins. Names: see sglang_kit.sh."""
import importlib.abc, importlib.machinery, sys, types

NAMES = set("$STUBS".split(","))


class _Any:  # inert placeholder: callable (import-time decorators), falsy, empty
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k): return _Any()
    def __getattr__(self, n): return _Any()
    def __bool__(self): return False
    def __iter__(self): return iter(())
    def __mro_entries__(self, bases): return (object,)
    def __or__(self, o): return object
    def __ror__(self, o): return object


class _Stub(types.ModuleType):
    def __getattr__(self, n):
        if n.startswith("__"):
            raise AttributeError(n)
        if n == "StructuralTag":  # used as a pydantic field type in openai/protocol.py
            import pydantic
            cfg = pydantic.ConfigDict(extra="allow")
            return type(n, (pydantic.BaseModel,), {"model_config": cfg})
        return _Any()


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in NAMES:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        m = _Stub(spec.name)
        m.__path__, m.__version__, m.__sglang_kit_stub__ = [], "0.0.0", True
        return m

    def exec_module(self, module):
        pass


sys.meta_path.append(_Finder())
EOF
  cp "${BASH_SOURCE[0]}" "$st/$KIT_NAME/sglang_kit.sh"
  (cd "$st/$KIT_NAME" && ls wheels > MANIFEST && sha256sum wheels/* *.tar.xz >> MANIFEST)
  tar -C "$st" -cf "$out/$KIT_NAME.tar" "$KIT_NAME"
  local mib=$(( $(stat -c %s "$out/$KIT_NAME.tar") / 1048576 ))
  echo "$out/$KIT_NAME.tar: $mib MiB, $(ls "$st/$KIT_NAME/wheels" | wc -l) wheels"
  [ "$mib" -le 60 ] || { echo "kit over 60 MiB" >&2; exit 1; }
}

install() {
  local arc=${1:?ARCHIVE} dir=${2:?DIR}; mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
  local st; st=$(mktemp -d); trap "rm -rf '$st'" EXIT
  tar -C "$st" -xf "$arc"; local k=$st/$KIT_NAME
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$dir/site" "$k"/wheels/*.whl 2>&1 | grep -v '^WARNING' || true
  tar -C "$dir/site" -xJf "$k/sgl_kernel-sm90.tar.xz"
  cp "$k"/site/*.py "$k/sglang_kit.sh" "$k/MANIFEST" "$dir/"
  mv "$dir/sitecustomize.py" "$dir/sglang_kit_stubs.py" "$dir/site/"
  # Patch: AutoConfig.register(name, cls) -> (..., exist_ok=True) in sglang/srt/configs/*.py.
  # The image's transformers 5.17 already registers qwen3_asr (sglang pins 5.12.1), so
  # configs/qwen3_asr.py:167 raises ValueError when sglang.srt.configs is imported.
  grep -rl 'AutoConfig.register(' "$dir/site/sglang/srt/configs" | xargs sed -i -E \
    's/AutoConfig\.register\(([^)]*)\)$/AutoConfig.register(\1, exist_ok=True)/'
  cat > "$dir/env.sh" <<EOF
export PYTHONPATH=$dir/site\${PYTHONPATH:+:\$PYTHONPATH}
export SGLANG_ENABLE_JIT_DEEPGEMM=0
export SGLANG_KIT_FLAGS="$FLAGS"
EOF
  # DIR/bin/python: an interpreter with the kit's environment, for a config's serve.sglang_python
  # (the pipeline's launcher starts `serve.sglang_python -m sglang.launch_server ...`).
  mkdir -p "$dir/bin"
  printf '#!/bin/sh\n. %s/env.sh\nexec python3 "$@"\n' "$dir" > "$dir/bin/python"
  chmod +x "$dir/bin/python"
  echo "installed into $dir/site; use: source $dir/env.sh, or serve.sglang_python: $dir/bin/python"
}

doctor() {
  local dir=${1:?DIR}; dir=$(cd "$dir" && pwd)
  # shellcheck disable=SC1091
  source "$dir/env.sh"
  echo "flags: $SGLANG_KIT_FLAGS"
  python3 - "$dir/site" <<'EOF'
import importlib.machinery, importlib.metadata as md, os, sys, subprocess, glob
site = sys.argv[1]
import sglang_kit_stubs as S, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda)
for n in ("sglang", "sglang-kernel", "flashinfer-python", "transformers", "triton", "torchao"):
    try: print(f"  {n} {md.version(n)}")
    except md.PackageNotFoundError: print(f"  {n} MISSING")
cc = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
print("gpu:", torch.cuda.get_device_name() if cc else "none", "capability", cc)
for so in sorted(glob.glob(f"{site}/sgl_kernel/**/*.so", recursive=True)):
    try:
        out = subprocess.run(["cuobjdump", "--list-elf", so], capture_output=True, text=True).stdout
        arch = sorted({w.split(".")[-2] for w in out.split() if ".sm_" in w}) or ["?"]
    except FileNotFoundError:
        arch = ["(no cuobjdump)"]
    print(f"  kernel {os.path.relpath(so, site)} {os.path.getsize(so) >> 20} MiB arch {arch}")
for n in sorted(S.NAMES):
    real = importlib.machinery.PathFinder.find_spec(n)
    print(f"  stub {n}: {'real module wins: ' + str(real.origin) if real else 'stubbed'}")
sc = [p for p in sys.path[1:] if os.path.exists(os.path.join(p, "sitecustomize.py"))]
print("  sitecustomize on path:", sc)
pat = open(f"{site}/sglang/srt/configs/qwen3_asr.py").read().count("exist_ok=True")
print("  exist_ok patch lines in configs/qwen3_asr.py:", pat)
import sglang, sgl_kernel
from sglang.srt.models.llama import LlamaForCausalLM
from sglang.srt.layers.deep_gemm_wrapper.configurer import ENABLE_JIT_DEEPGEMM
import sglang.srt.models.llama_eagle3 as E
print("sglang", sglang.__version__, "imports; sgl_kernel ops from",
      getattr(sgl_kernel.common_ops, "__file__", "?").split("sgl_kernel/")[-1],
      "| DeepGEMM", ENABLE_JIT_DEEPGEMM, "| EAGLE-3 draft", E.EntryClass,
      "| target aux capture", hasattr(LlamaForCausalLM, "set_eagle3_layers_to_capture"))
EOF
}

cmd=${1:-}; shift || true
case "$cmd" in
  build|install|doctor) "$cmd" "$@" ;;
  *) sed -n 2,8p "$0"; exit 2 ;;
esac
