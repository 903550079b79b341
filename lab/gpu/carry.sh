#!/usr/bin/env bash
# Build what a GPU machine without a network needs for lab/gpu_study.py, as ignored folders to carry:
#   .whl/        the Python 3.12 / x86_64 wheels the machine's image lacks (prefect, mlflow-skinny, speculators, ...)
#                resolved here with `pip install --dry-run --report` and downloaded with --no-deps, less the
#                packages the image already has (PRESENT below: torch's stack, transformers, numpy, ...)
#   .benchdata/  sg.jsonl.xz (the prepared English ShareGPT file, xz), question.jsonl.xz (MT-Bench),
#                test.jsonl.xz (GSM8K), instructions_en.jsonl.xz (data.source: instructions), and the SmolLM2 GGUF split into parts of at most PART_BYTES (each call's
#                carry is limited to 64 MiB in all)
# Usage: lab/gpu/carry.sh [PYTHON]      (PYTHON: the project's venv python, default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${1:-.venv/bin/python}
PART_BYTES=${PART_BYTES:-40000000}
# what the GPU image already holds: lab/gpu/image_packages.txt (`pip list --format=freeze` read on an
# nvidia-h200 machine, 2026-12-02); those names are not carried (their versions there are the ones used)
PRESENT="^($(sed -n 's/^\([A-Za-z0-9_.-]*\)\( @ \|==\).*/\1/p' lab/gpu/image_packages.txt | tr 'A-Z_' 'a-z-' | paste -sd'|'))\$"
# mlflow-skinny at the local mlflow's version: a newer one migrates the carried store to a schema the local
# MlflowClient refuses ("out-of-date database schema"), so the store that comes back could not be read here
MLFLOW=$("$PY" -c 'import importlib.metadata as m; print(m.version("mlflow"))' 2>/dev/null \
         || "$PY" -c 'import importlib.metadata as m; print(m.version("mlflow-skinny"))')
WANT=(speculators==0.9.0 "prefect==3.9.1" "mlflow-skinny==$MLFLOW" "gguf>=0.10" typer rich httpx psutil fastapi uvicorn
      pydantic pydantic-settings prometheus-client matplotlib loguru==0.7.3 "datasets>=4.0.0,<=5.1.0" openai aiohttp
      "transformers==5.17.0" "torch==2.13.0")
rm -rf .whl && mkdir -p .whl .benchdata
tmp=$(mktemp -d)
# resolved for this machine's Python (torch: the local CPU build, so no CUDA libraries enter the resolution);
# the pins are then downloaded as Python 3.12 wheels
"$PY" -m pip install -q --dry-run --ignore-installed --report "$tmp/report.json" "${WANT[@]}" 2>&1 | grep -v '^WARNING: Location' || true
"$PY" - "$tmp/report.json" "$PRESENT" > "$tmp/pins.txt" <<'EOF'
import json, re, sys
rep = json.load(open(sys.argv[1]))
skip = re.compile(sys.argv[2])
for item in rep["install"]:
    name = item["metadata"]["name"].lower().replace("_", "-")
    if not skip.match(name):
        print(f"{name}=={item['metadata']['version']}")
EOF
echo "wheels to carry: $(wc -l < "$tmp/pins.txt")"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  -d .whl -r "$tmp/pins.txt"
du -sh .whl
CACHE=$("$PY" -c 'from eagle3.config import PathsConfig; print(PathsConfig().resolved_cache_dir())')
SG=$(ls "$CACHE"/data/*sharegpt*en*.jsonl* 2>/dev/null | head -1 || true)
if [ -z "$SG" ]; then echo "no prepared ShareGPT file under $CACHE/data (run: make assets)" >&2; exit 2; fi
case "$SG" in *.gz) gzip -dc "$SG" ;; *.xz) xz -dc "$SG" ;; *) cat "$SG" ;; esac | xz -T2 -9 > .benchdata/sg.jsonl.xz
"$PY" - <<'EOF'
import lzma, pathlib
import eagle3.assets as A
for (pkg, rel), name in ((A.MTBENCH_PACKAGE, "question.jsonl"), (A.GSM8K_PACKAGE, "test.jsonl")):
    src = A.package_file(pkg, rel)
    pathlib.Path(f".benchdata/{name}.xz").write_bytes(lzma.compress(pathlib.Path(src).read_bytes()))
from eagle3.config import PathsConfig
ins = A.prepare_instructions(PathsConfig().resolved_cache_dir())  # data.source: instructions
pathlib.Path(".benchdata/instructions_en.jsonl.xz").write_bytes(lzma.compress(ins.read_bytes()))
EOF
GGUF=$("$PY" -c 'import eagle3.assets as A; print(A.package_file(*A.SMOLLM2_PACKAGE))')
rm -f .benchdata/gguf.part*
split -b "$PART_BYTES" -d "$GGUF" .benchdata/gguf.part
ls -l .benchdata
