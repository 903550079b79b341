#!/usr/bin/env bash
# The pipeline served by the real SGLang on a lent GPU machine without a network, one step per call
# (each call carries at most 64 MiB; the machine keeps /tmp/h200 while it stays warm):
#   wheels  carry .whl .benchdata/sg.jsonl.xz   pipeline wheels into /tmp/h200/site, ShareGPT
#           [.benchdata/instructions_en.jsonl.xz] (and the instruction prompts, when carried)
#   kit     carry .cache/sglang-kit             lab/gpu/sglang_kit.sh install -> /opt/sgl, doctors
#   gguf    carry .benchdata/gguf.partNN ...    collect the carried GGUF parts in /tmp/h200
#   target                                      join the parts, convert SmolLM2 to an HF folder
#   run CONFIG [eagle3 run args]                the pipeline; its run folder's small files, the
#                                               MLflow store and regenerated data come back
#   start CONFIG [eagle3 run args]              the pipeline in its own process session, so it
#                                               runs on across calls while the machine stays warm
#   stages CONFIG [args]                        extract, train and convert only (no deploy), in
#                                               its own process session like start
#   bg CMD [ARGS]                               any command (a lab script) in its own process
#                                               session like start, followed by wait
#   wait SECONDS [DIR]                          follow it until it ends or SECONDS pass; DIR's
#                                               small files are copied back at every poll
#   collect CONFIG                              bring back the run's small files, the MLflow store,
#                                               regenerated data and the serving draft (in parts)
#   speedup [lab/sglang_speedup.py args]        SGLang side by side (plain, chain, tree)
#   back PATH...                                bring back files (a folder's files, not its
#                                               subfolders): .jsonl compressed with xz, anything
#                                               over 15 MiB in 15 MiB parts (join with cat)
# Built here by lab/gpu/carry.sh (.whl, .benchdata) and lab/gpu/sglang_kit.sh build (the kit).
set -euo pipefail
cd "$(dirname "$0")/../.."
H=${H200_DIR:-/tmp/h200} OUT=${OUT:-/tmp/out}  # H200_DIR: elsewhere in tests
export EAGLE3_CACHE=$H/cache PYTHONPATH=$H/site:$PWD PYTHONUNBUFFERED=1
RUNS=$H/runs
mkdir -p "$H" "$OUT" "$EAGLE3_CACHE/data"
step=${1:?step}; shift
case "$step" in
  wheels)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$H/site" .whl/*.whl 2>&1 | grep -v '^WARNING' || true
    xz -dc .benchdata/sg.jsonl.xz > "$EAGLE3_CACHE/data/sharegpt_en.jsonl"
    if [ -f .benchdata/instructions_en.jsonl.xz ]; then  # data.source: instructions, when carried
      xz -dc .benchdata/instructions_en.jsonl.xz > "$EAGLE3_CACHE/data/instructions_en.jsonl"; fi
    python3 -c 'import prefect, mlflow, speculators; print("pipeline imports ok")' ;;
  kit)
    bash lab/gpu/sglang_kit.sh install .cache/sglang-kit/sglang516-kit.tar /opt/sgl | tail -1
    bash lab/gpu/sglang_kit.sh doctor /opt/sgl 2>&1 | tee "$OUT/kit_doctor.txt"
    python3 -m cli.main doctor --sglang-python /opt/sgl/bin/python 2>&1 | tee "$OUT/doctor.txt" ;;
  gguf)
    cp .benchdata/gguf.part* "$H/" && ls -l "$H"/gguf.part* ;;
  target)
    cat "$H"/gguf.part* > "$H/SmolLM2-135M-Instruct.Q4_1.gguf"
    python3 - "$H/SmolLM2-135M-Instruct.Q4_1.gguf" <<'EOF'
import sys
from pathlib import Path
import eagle3.assets as A
gguf = Path(sys.argv[1])
orig = A.package_file
A.package_file = lambda pkg, rel: gguf if pkg == A.SMOLLM2_PACKAGE[0] else orig(pkg, rel)
print("target:", A.prepare_smollm2(Path(__import__("os").environ["EAGLE3_CACHE"])))
EOF
    ;;
  run)
    cfg=${1:?config}; shift
    rc=0; timeout -s TERM "${RUN_TIMEOUT:-540}" python3 -m cli.main run "$cfg" \
      -o paths.runs_dir=$RUNS "$@" \
      2>&1 | tee "$OUT/run.log" || rc=$?
    bash "$0" collect "$cfg"
    echo "run exit $rc"; exit "$rc" ;;
  start)
    cfg=${1:?config}; shift
    rm -f "$H/run.rc"
    # a new process session outlives the call; the machine keeps it while it stays warm
    setsid nohup bash -c 'python3 -m cli.main run "$@" > "'"$H"'/run.log" 2>&1; echo $? > "'"$H"'/run.rc"' \
      _ "$cfg" -o paths.runs_dir=$RUNS "$@" > /dev/null 2>&1 < /dev/null &
    sleep 20; tail -5 "$H/run.log" ;;
  stages)
    cfg=${1:?config}; shift
    rm -f "$H/run.rc"
    setsid nohup bash -c 'for s in extract train convert; do
        python3 -m cli.main "$s" "$@" || { echo $? > "'"$H"'/run.rc"; exit; }; done
      echo 0 > "'"$H"'/run.rc"' _ "$cfg" -o paths.runs_dir=$RUNS "$@" \
      > "$H/run.log" 2>&1 < /dev/null &
    sleep 20; tail -5 "$H/run.log" ;;
  bg)
    rm -f "$H/run.rc"
    setsid nohup bash -c '"$@"; echo $? > "'"$H"'/run.rc"' _ "$@" > "$H/run.log" 2>&1 < /dev/null &
    sleep 10; tail -5 "$H/run.log" ;;
  wait)
    end=$(( $(date +%s) + ${1:?seconds} )); keep=${2:-}
    # with DIR: its small files (the study's periodic store copy, results) copied at every poll,
    # so that a call ended by the session's device time still brings back the latest ones
    keep_copy() { [ -n "$keep" ] && [ -d "$keep" ] && find "$keep" -maxdepth 1 -type f \
      -size -15M ! -name '*.jsonl' ! -name '.*' -exec cp -u {} "$OUT/" \; ; true; }
    while [ ! -f "$H/run.rc" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; keep_copy; done
    keep_copy
    grep -v -E '^\s*$' "$H/run.log" | tail -40; cp "$H/run.log" "$OUT/"
    if [ -f "$H/run.rc" ]; then echo "run exit $(cat "$H/run.rc")"; else echo "still running"; fi ;;
  collect)
    cfg=${1:?config}
    name=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["name"])' "$cfg")
    (cd "$RUNS" && find "$name" -type f -size -4M \( -name '*.json' -o -name '*.log' \
      -o -name '*.md' -o -name '*.png' -o -name '*.txt' -o -name '*.jsonl' \) -print0 \
      | tar --null -czf "$OUT/run_files.tgz" -T - ) || true
    cp "$RUNS/mlflow.db" "$OUT/" 2>/dev/null || true
    cp "$H/run.log" "$OUT/" 2>/dev/null || true
    # regenerated conversations (the slowest input to remake), for a later machine to reuse
    find "$RUNS" -name 'regenerated-*.jsonl' -exec sh -c 'xz -T0 -c "$1" > "$2/$(basename "$1").xz"' \
      _ {} "$OUT" \;
    # the serving draft, in parts under the 16 MiB a returned file may have
    if [ -d "$RUNS/$name/serving" ]; then
      tar -C "$RUNS" -cf - "$name/serving" | split -b 15M -d - "$OUT/serving.tar.part"
    fi
    ls -l "$OUT" ;;
  speedup)
    python3 lab/sglang_speedup.py -o paths.runs_dir=$RUNS "$@" 2>&1 | tee "$OUT/speedup.log" ;;
  back)
    for p in "$@"; do
      for f in $( [ -d "$p" ] && find "$p" -maxdepth 1 -type f || echo "$p" ); do
        [ -f "$f" ] || { echo "back: no file $f"; continue; }
        b=$(basename "$f"); src=$f
        if [[ "$b" == *.jsonl ]]; then xz -T0 -c "$f" > "$H/$b.xz"; src=$H/$b.xz; b=$b.xz; fi
        if [ "$(stat -c %s "$src")" -gt $((15 * 1024 * 1024)) ]; then
          split -b 15M -d "$src" "$OUT/$b.part"
        else cp "$src" "$OUT/$b"; fi
      done
    done
    ls -l "$OUT" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
