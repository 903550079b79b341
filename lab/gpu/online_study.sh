#!/usr/bin/env bash
# The GPU figures of lab/online_vs_offline.py in one background run on a lent GPU machine
# (lab/plans/online-h200-calls.md; start it with `bash lab/gpu/h200_sglang.sh bg bash THIS`).
# Each part writes its results JSON under $R after every case; a failed part does not stop the next.
#   1  SmolLM2, 3,000 ShareGPT conversations as they are, 1 epoch: offline, online
#      (lab/NOTEBOOK.md, 2026-12-07: online 0.444x offline on an H100)
#   2  SmolLM2, 300 conversations, 20 epochs (the GPU recipe's): offline, cached (0.45 GB window,
#      about half of the 0.87 GB an offline run stores)
#   3  the Llama-3.1-8B shape, random weights (SmolLM2's tokenizer), 300 conversations, 1 epoch:
#      offline, online (target and draft on one GPU)
#   4  part 2's cached mode with a 0.8 GB window (about 90 %)
# A CPU smoke of the same parts before a GPU session (a few minutes; no 8B shape):
#   CONFIG=configs/tiny-random.yaml DEVICE=cpu SMALL="-o data.num_conversations=12 \
#   -o data.max_seq_len=64 -o train.max_tokens_per_batch=48 -o train.draft_vocab_size=32" \
#   N=8 W1=0.0003 W2=0.0005 PARTS="1 2 4" RESULTS=/tmp/ovo-smoke bash lab/gpu/online_study.sh
# A session left with little device time runs part 1 alone on fewer conversations:
#   PARTS=1 N1=1000 (about a third of part 1's 8 minutes)
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${RESULTS:-/tmp/h200}
CONFIG=${CONFIG:-configs/smollm2-gpu.yaml}
DEVICE=${DEVICE:-cuda}
N=${N:-300}                           # conversations of parts 2 to 4
N1=${N1:-}                            # part 1's conversations (default: the config's, 3,000)
W1=${W1:-0.45} W2=${W2:-0.8}          # the windows of parts 2 and 4 (GB)
PARTS=${PARTS:-1 2 3 4}
if [[ -n $N1 && ! $N1 =~ ^[1-9][0-9]*$ ]]; then  # it names the results file too
  echo "N1=$N1: expected a whole number of conversations above 0" >&2; exit 2
fi
read -r -a SMALL <<< "${SMALL:-}"     # overrides of every part (the CPU smoke's sizes)
FAILED=0                              # parts that failed: the script's exit status counts them
ovo() { python3 lab/online_vs_offline.py "$CONFIG" --device "$DEVICE" \
          -o data.regenerate=none "${SMALL[@]}" "$@"; local rc=$?; echo "part exit $rc"
        [ "$rc" = 0 ] || FAILED=$((FAILED + 1)); }
part() { [[ " $PARTS " == *" $1 "* ]]; }
if part 1; then
  ovo --epochs 1 --modes offline online ${N1:+-o data.num_conversations="$N1"} \
    --work "$R/ovo1" --out "$R/ovo_smollm2_1ep${N1:+_n$N1}.json"
  rm -rf "$R/ovo1"  # 8.6 GB of stored states: the disk is needed for the 8B shape's 29 GB
fi
part 2 && ovo --epochs 20 --modes offline cached -o data.num_conversations="$N" \
    -o extract.cache_max_gb="$W1" --work "$R/ovo20" --out "$R/ovo_smollm2_20ep.json"
part 3 && ovo --epochs 1 --modes offline online -o data.num_conversations="$N" \
    -o target.kind=tiny-random -o target.tiny.hidden_size=4096 \
    -o target.tiny.num_hidden_layers=32 -o target.tiny.intermediate_size=14336 \
    -o target.tiny.num_attention_heads=32 -o target.tiny.num_key_value_heads=8 \
    --work "$R/ovo8b" --out "$R/ovo_llama8b_shape_1ep.json"
part 4 && ovo --epochs 20 --modes cached -o data.num_conversations="$N" \
    -o extract.cache_max_gb="$W2" --work "$R/ovo20b" --out "$R/ovo_smollm2_20ep_window08.json"
exit "$FAILED"
